"""Mamba-1's chunked selective scan against transformers' sequential one: AtP* over every head of a
random Falcon-Mamba, beside one forward + backward of the same prompts, on the CPU.

Per scan (``chunked``: ganda's, what ``torch_path`` gives Mamba-1 mixers; ``sequential``:
transformers' loop, one step per token), on the same model and prompts (MMLU 5-shot, SmolLM2's
tokenizer with ids folded into the model's vocabulary):

* ``forward_backward``: one forward of the prompts (right-padded, one batch) on the PyTorch path
  and a backward from the last position's log-sum-exp, with input gradients only (what
  attribution's VJPs compute), wall and process CPU seconds;
* ``atp*``: ``ganda.attribution.attribute(method="atp*")`` over every head (every channel), wall
  and CPU seconds, and its ratio to the forward + backward;
* the peak resident memory of each, and (both scans run) how far apart their AtP* estimates are;
* for the chunked scan, what ``ganda plan``'s ``cpu`` row predicts for both (process CPU time).

    python benchmarks/bench_scan.py [--hidden 4096] [--expand 2] [--state 16] [--layers 2] [--vocab 4096]
        [--n 4] [--scans chunked,sequential] [--threads 1] [--out FILE]
    python benchmarks/bench_scan.py --exactness     # the chunked scan against the sequential one and float64
    python benchmarks/bench_scan.py --plan-only [--hidden 4096 ...]   # the planner's rows alone (meta device)

``--exactness``: on the tiny Mamba-1, Falcon-Mamba and Jamba models of ``tiny_model`` (``tests/checks.py``)
(two rows of random tokens, 1 to 747 long), the largest difference relative to the largest entry
of outputs, final states and gradients (u, Δ, A, B, C, D, z, Δ bias, initial state) of the first
mixer's scan, chunked against sequential and each against a float64 sequential scan; and whole
models in bfloat16 on the PyTorch path, chunked and sequential logits against the float32 ones.

Random weights: the numbers are the cost of the code paths, not science.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))  # checks.py: the tests' tiny models


def clocked(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``fn()``, its wall and process CPU seconds and the peak resident memory above the start."""
    from peak_rss import PeakRSS

    rss = PeakRSS(interval=0.01).start()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    clock = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
    clock["peak_bytes"] = rss.stop()
    return out, clock


def build(args: argparse.Namespace, meta: bool = False) -> Any:
    from bench_gpu import tokenizer
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    import ganda

    torch.manual_seed(0)
    cfg = FalconMambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, expand=args.expand,
                            state_size=args.state, num_hidden_layers=args.layers)
    with torch.device("meta" if meta else "cpu"):
        model = FalconMambaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tok = tokenizer(ROOT / "tokenizers" / "smollm2-135m", args.vocab)
    return ganda.from_model(model, tok, spec=f"falcon-mamba {args.layers}x{args.hidden} (random)")


def forward_backward(adapter: Any, exs: list[Any]) -> dict[str, float]:
    """One forward + backward of the prompts on the PyTorch path, input gradients only."""
    from ganda.models.ssm.common import torch_path
    from ganda.scoring import encode, pad_rows

    ids, mask = pad_rows(adapter, [encode(adapter, ex.prompt) for ex in exs])
    emb = adapter.model.get_input_embeddings()

    def run() -> None:
        with torch_path(adapter.model):
            x = emb(ids).detach().requires_grad_(True)
            out = adapter.model(inputs_embeds=x, attention_mask=mask).logits
            out[:, -1].float().logsumexp(-1).sum().backward()

    _, clock = clocked(run)
    return {**clock, "tokens": int(ids.shape[1]), "rows": int(ids.shape[0])}


def planned(adapter: Any, exs: list[Any], rows: int, tokens: int) -> dict[str, float]:
    """``ganda plan``'s ``cpu`` row for the chunked scan: AtP* without its exact check, and one
    forward + backward (input gradients) of ``rows`` padded rows of ``tokens``."""
    from ganda import plan
    from ganda.scoring import encode

    prof, dev = plan.profile(adapter), plan.device("cpu")
    w = plan.workload_from_examples(exs, lambda t: encode(adapter, t))
    p = plan.plan(prof, "attribution", w, dev, method="atp*", verify_top=0, active=0, audit=0)
    atp = sum(ph["seconds"] for ph in p.phases if not ph["phase"].startswith("exact check"))
    layers = list(range(len(prof.layers)))
    fb = plan.Phase("forward+backward", 1, rows, tokens, layers, tokens, backward=dev.vjp_cost, scan=plan.CHUNKED)
    return {"atp*_s": atp, "forward_backward_s": fb.seconds(prof, dev)}


def run_scan(adapter: Any, exs: list[Any], scan: str) -> tuple[dict[str, Any], list[float]]:
    import ganda.models.ssm.common as common
    from ganda.attribution import attribute
    from ganda.models.ssm.selective_scan import selective_scan, sequential_scan

    common.selective_scan = selective_scan if scan == "chunked" else sequential_scan  # what torch_path swaps in
    try:
        fb = forward_backward(adapter, exs)
        res, clock = clocked(lambda: attribute(adapter, exs, method="atp*", progress=False))
    finally:
        common.selective_scan = selective_scan
    row = {"scan": scan, "forward_backward": fb, "atp*": {**clock, "heads": len(res.heads)},
           "planned_cpu": planned(adapter, exs, fb["rows"], fb["tokens"]) if scan == "chunked" else None,
           "atp*_over_forward_backward_wall": clock["wall_s"] / fb["wall_s"],
           "atp*_over_forward_backward_cpu": clock["cpu_s"] / fb["cpu_s"]}
    return row, list(res.estimate)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


def _scan_all(scan: Callable[..., Any], args: tuple, kwargs: dict, h0: torch.Tensor | None) -> list[torch.Tensor]:
    """[y, final state, gradients...] of ``scan`` on leaf copies of the arguments."""
    leaf = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in (*args, *kwargs.values(), h0)]
    n = len(args)
    kw = dict(zip(kwargs, leaf[n:-1], strict=True))
    y, state = scan(*leaf[:n], **{**kw, "return_last_state": True, "initial_state": leaf[-1]})
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().add((state * state).sum()).backward()
    return [y, state, *[t.grad for t in leaf if isinstance(t, torch.Tensor) and t.grad is not None]]


def exactness() -> list[dict[str, Any]]:
    import importlib

    from checks import tiny_model

    from ganda.models.ssm.common import torch_path
    from ganda.models.ssm.selective_scan import selective_scan, sequential_scan

    rows = []
    for family in ("mamba", "falcon_mamba", "jamba"):
        model = tiny_model(family)
        mod = importlib.import_module(type(model).__module__)
        for T in (1, 7, 64, 747):
            seen: list[tuple[tuple, dict]] = []
            ids = torch.randint(0, 60, (2, T), generator=torch.Generator().manual_seed(T))
            with torch.no_grad(), torch_path(model):
                mod.mamba_selective_scan = lambda *a, seen=seen, **k: seen.append((a, k)) or sequential_scan(*a, **k)
                model(ids)
            args, kwargs = seen[0]
            to64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
            kw64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                    for k, v in kwargs.items()}
            for init in (False, True):
                h0 = torch.randn(2, args[0].shape[1], args[2].shape[-1], generator=torch.Generator().manual_seed(1)) \
                    if init else None
                c = _scan_all(selective_scan, args, kwargs, h0)
                q = _scan_all(sequential_scan, args, kwargs, h0)
                r = _scan_all(sequential_scan, tuple(to64), kw64, None if h0 is None else h0.double())
                rows.append({"family": family, "T": T, "initial_state": init,
                             "chunked_vs_sequential": max(_rel(a, b) for a, b in zip(c, q, strict=True)),
                             "chunked_vs_float64": max(_rel(a, b) for a, b in zip(c, r, strict=True)),
                             "sequential_vs_float64": max(_rel(a, b) for a, b in zip(q, r, strict=True))})
            logits = {}
            for dtype in (torch.float32, torch.bfloat16):
                model.to(dtype)
                for name, scan in (("chunked", selective_scan), ("sequential", sequential_scan)):
                    with torch.no_grad(), torch_path(model):
                        mod.mamba_selective_scan = scan
                        logits[(dtype, name)] = model(ids[:1]).logits.float()
            model.float()
            ref = logits[(torch.float32, "sequential")]
            rows.append({"family": family, "T": T, "bf16_logits": True,
                         "chunked_vs_sequential": _rel(logits[(torch.bfloat16, "chunked")],
                                                       logits[(torch.bfloat16, "sequential")]),
                         "chunked_bf16_vs_fp32": _rel(logits[(torch.bfloat16, "chunked")], ref),
                         "sequential_bf16_vs_fp32": _rel(logits[(torch.bfloat16, "sequential")], ref),
                         "fp32_chunked_vs_sequential": _rel(logits[(torch.float32, "chunked")], ref)})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4, help="MMLU 5-shot prompts")
    ap.add_argument("--scans", default="chunked,sequential")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--exactness", action="store_true", help="the exactness table instead of the timings")
    ap.add_argument("--plan-only", action="store_true", help="what the planner's cpu row predicts, nothing run")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.exactness:
        for row in exactness():
            print(json.dumps({k: f"{v:.1e}" if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        return
    from bench_gpu import examples_for

    adapter = build(args, meta=args.plan_only)
    exs = examples_for(args.n, 5)
    if args.plan_only:
        from ganda.scoring import encode

        lengths = [len(encode(adapter, ex.prompt)) for ex in exs]
        print(json.dumps({"prompt_tokens": lengths,
                          "planned_cpu": planned(adapter, exs, len(exs), max(lengths))}))
        return
    with torch.no_grad():  # one-off set-up of the first call: not in any row's time
        adapter.forward(torch.arange(1, 33)[None] % args.vocab)
    lengths = [len(adapter.tokenizer(ex.prompt).input_ids) for ex in exs]
    result: dict[str, Any] = {"config": {**vars(args), "out": None, "d_inner": args.hidden * args.expand},
                              "prompt_tokens": lengths, "machine": platform.machine(),
                              "torch": torch.__version__, "rows": []}
    estimates = {}
    for scan in args.scans.split(","):
        row, estimates[scan] = run_scan(adapter, exs, scan)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    if len(estimates) == 2:
        a, b = (torch.tensor(v) for v in estimates.values())
        result["atp*_max_diff_relative"] = float((a - b).abs().max() / b.abs().max())
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
