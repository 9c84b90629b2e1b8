"""Time and peak memory to materialise one SSM head's implicit attention on this machine.

Realistic per-head sizes: Llamba-8B / Mamba-2 heads (d_state N=64, head_dim P=128) and a
Falcon-Mamba-7B channel (N=16). For L in (1024, 4096): the full L×L map and the last-row mode.
Inputs are random SSM parameters (the math does not depend on where they came from); capture
needs one forward pass of the real model, which is not included.

Usage: python benchmarks/bench_materialize.py [--lengths 1024 4096] [--repeat 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

import torch

from ganda.models.ssm.materialize import (
    SelectiveParams,
    SSDParams,
    selective_channel_map,
    selective_maps,
    ssd_head_map,
)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident memory above the starting point, sampled every millisecond."""

    def __enter__(self) -> PeakRSS:
        self.start = _rss()
        self.peak = self.start
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, _rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.start) / 2**20


def ssd_params(L: int, N: int = 64, P: int = 128, H: int = 1) -> SSDParams:
    g = torch.Generator().manual_seed(0)
    delta = torch.nn.functional.softplus(torch.randn(L, H, generator=g))
    return SSDParams(x=torch.randn(L, H, P, generator=g), B=torch.randn(L, H, N, generator=g),
                     C=torch.randn(L, H, N, generator=g), log_decay=-delta * 0.5, col_scale=delta,
                     D=torch.ones(H))


def sel_params(L: int, N: int = 16, E: int = 1) -> SelectiveParams:
    g = torch.Generator().manual_seed(0)
    return SelectiveParams(x=torch.randn(L, E, generator=g), delta=torch.rand(L, E, generator=g),
                           A=-torch.arange(1, N + 1, dtype=torch.float32)[None].expand(E, N),
                           B=torch.randn(L, N, generator=g), C=torch.randn(L, N, generator=g), D=torch.ones(E))


@torch.no_grad()
def impulse_ssd_map(p: SSDParams, head: int) -> torch.Tensor:
    """Baseline: the map read off the recurrence itself, one unit impulse per column, stepped
    token by token (what you would do with a black-box scan): O(L^2 N) work in L Python steps."""
    L = p.x.shape[0]
    g = p.group(head)
    B, C, a = p.B[:, g].float(), p.C[:, g].float(), p.log_decay[:, head].float()
    w = p.col_scale[:, head].float() if p.col_scale is not None else torch.ones(L)
    state = torch.zeros(L, B.shape[1])  # one state per impulse column s
    out = torch.empty(L, L)
    for t in range(L):
        state.mul_(torch.exp(a[t]))
        state[t] += w[t] * B[t]
        out[t] = state @ C[t]
    return out


@torch.no_grad()
def impulse_selective_map(p: SelectiveParams, channel: int) -> torch.Tensor:
    """Baseline for a Mamba-1 channel: the same impulse-response recurrence (diagonal decay per state dim)."""
    L = p.x.shape[0]
    A, d = p.A[channel].float(), p.delta[:, channel].float()
    state = torch.zeros(L, A.shape[0])
    out = torch.empty(L, L)
    for t in range(L):
        state.mul_(torch.exp(d[t] * A))
        state[t] += d[t] * p.B[t].float()
        out[t] = state @ p.C[t].float()
    return out


def measure(fn, repeat: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    times, mem = [], 0.0
    for _ in range(repeat):
        with PeakRSS() as pk:
            t = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t)
            del out
        mem = max(mem, pk.mib)
    return min(times), mem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--invariants", action="store_true", help="also measure the invariants on tiny models")
    ap.add_argument("--end-to-end", action="store_true",
                    help="also time materialize() on a 2-layer random Llamba (d_model 1024, 8 heads of 128, N=64)")
    args = ap.parse_args()
    rows = []
    baselines: list[tuple[str, int, float, float, float, float]] = []
    for L in args.lengths:
        p = ssd_params(L)
        s = sel_params(L)
        cases = [
            ("Mamba-2 / Llamba head (N=64)", "full", lambda p=p: ssd_head_map(p, 0)),
            ("Mamba-2 / Llamba head (N=64)", "last row", lambda p=p, L=L: ssd_head_map(p, 0, rows=[L - 1])),
            ("Mamba-1 channel (N=16)", "full", lambda s=s: selective_channel_map(s, 0)),
            ("Mamba-1 channel (N=16)", "last row", lambda s=s, L=L: selective_channel_map(s, 0, rows=[L - 1])),
        ]
        for name, mode, fn in cases:
            sec, mib = measure(fn, args.repeat)
            out_mib = (L * L if mode == "full" else L) * 4 / 2**20
            rows.append((name, L, mode, sec, mib, out_mib))
            print(f"{name:30s} L={L:5d} {mode:8s} {sec * 1000:9.1f} ms  peak +{mib:7.1f} MiB  (output {out_mib:.2f} MiB)")
        # the baseline, side by side: impulse responses through the recurrence (same maps)
        for name, fast, slow in (("Mamba-2 / Llamba head (N=64)", lambda p=p: ssd_head_map(p, 0),
                                  lambda p=p: impulse_ssd_map(p, 0)),
                                 ("Mamba-1 channel (N=16)", lambda s=s: selective_channel_map(s, 0),
                                  lambda s=s: impulse_selective_map(s, 0))):
            ref, got = slow(), fast()
            err = float((ref - got).abs().max() / ref.abs().max())
            sec_b, _ = measure(slow, max(1, args.repeat - 1))
            sec_f = next(r[3] for r in rows if r[0] == name and r[1] == L and r[2] == "full")
            sec_r = next(r[3] for r in rows if r[0] == name and r[1] == L and r[2] == "last row")
            baselines.append((name, L, sec_b, sec_f, sec_r, err))
            print(f"{name:30s} L={L:5d} impulse baseline {sec_b * 1000:9.1f} ms: full {sec_b / sec_f:.1f}x, "
                  f"last row {sec_b / sec_r:.0f}x faster; max rel diff {err:.1e}")
    # Whole layers in the rows mode that head discovery uses (final query + 10 summary rows).
    Ld = 512
    rows10 = list(range(Ld - 11, Ld))
    layer_cases = [
        ("Llamba-8B layer: 32 heads (N=64)", lambda: [ssd_head_map(lp, h, rows=rows10) for h in range(32)]),
        ("Falcon-Mamba-7B layer: 8192 channels (N=16)", lambda: selective_maps(ls, range(8192), rows=rows10)),
    ]
    lp, ls = ssd_params(Ld, H=32), sel_params(Ld, E=8192)
    for name, fn in layer_cases:
        sec, mib = measure(fn, args.repeat)
        rows.append((name, Ld, "11 rows", sec, mib, 0.0))
        print(f"{name:30s} L={Ld:5d} 11 rows  {sec * 1000:9.1f} ms  peak +{mib:7.1f} MiB")
    if args.end_to_end:
        from ganda.models.loading import from_model
        from ganda.models.ssm.llamba import LlambaConfig, LlambaForCausalLM
        from ganda.models.ssm.materialize import materialize

        torch.manual_seed(0)
        model = LlambaForCausalLM(LlambaConfig(
            vocab_size=1000, d_model=1024, n_layer=2, mlp_cfg={"intermediate_size": 2048},
            ssm_cfg={"d_state": 64, "n_v_heads": 8, "n_qk_heads": 8, "chunk_size": 128}))
        ad = from_model(model)
        for L in args.lengths:
            ids = torch.randint(0, 1000, (1, L))
            for mode, r in (("full", None), ("last row", [L - 1])):
                with torch.no_grad():
                    sec, mib = measure(lambda ids=ids, r=r: materialize(ad, ids, "L1H0", rows=r), args.repeat)
                name = "end to end: Llamba-like forward + capture + 1 head"
                rows.append((name, L, mode, sec, mib, (L * L if r is None else L) * 4 / 2**20))
                print(f"{name} L={L:5d} {mode:8s} {sec * 1000:9.1f} ms  peak +{mib:7.1f} MiB")
    load = os.getloadavg()[0]
    lines = [
        "## Materialising one SSM head (implicit attention)",
        "",
        f"`python benchmarks/bench_materialize.py` on {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, load average {load:.1f} at the end. "
        "Best of "
        f"{args.repeat}; peak = resident memory above the starting point (1 ms sampling).",
        "",
        "| head | L | rows | time | peak memory | output |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, L, mode, sec, mib, out_mib in rows:
        out = f"{out_mib:.2f} MiB" if out_mib else "-"
        lines.append(f"| {name} | {L} | {mode} | {sec * 1000:.1f} ms | {mib:.1f} MiB | {out} |")
    lines += [
        "",
        "Against the baseline run side by side: the same map read off the recurrence with one unit impulse per",
        "column, stepped token by token (`impulse_ssd_map` / `impulse_selective_map` in this script).",
        "",
        "| head | L | impulse baseline | ganda full | ratio | ganda last row | ratio | max rel. diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, L, sb, sf, sr, err in baselines:
        lines.append(f"| {name} | {L} | {sb * 1000:.1f} ms | {sf * 1000:.1f} ms | **{sb / sf:.1f}×** | "
                     f"{sr * 1000:.2f} ms | **{sb / sr:.0f}×** | {err:.1e} |")
    if args.invariants:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support module
        from checks import invariant_rows

        lines += [
            "",
            "## SSM invariants on tiny random models (worst case over all mixers)",
            "",
            "Relative errors of M·x + D·x against the mixer's own output captured in the real forward "
            "(``full``; ``ssm`` = the M·x part alone, ``share`` = ‖M·x‖/‖y‖), max |Δlogits| between "
            "hook ablation and zeroed out_proj columns, and last-row masking (change before / at the last "
            "position).",
            "",
            "| family | class | recon full | worst head | M·x part | share | ablation ≡ columns | "
            "last-row: before | last-row: last |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in invariant_rows():
            lines.append(
                f"| {r['family']} | {r['class']} | {r['recon_full']:.1e} | {r['recon_worst_head']:.1e} | "
                f"{r['recon_ssm']:.1e} | {r['ssm_share']:.2f} | {r['ablation_equiv']:.1e} | "
                f"{r['lastrow_before']:.1e} | {r['lastrow_last']:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
