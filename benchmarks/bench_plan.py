"""Calibrate ``ganda plan``'s CPU row and check its predictions against measured runs.

    .venv/bin/python benchmarks/bench_plan.py [--calibrate-only] [--only NAME,...] [--out FILE]

**Calibration** (each in a fresh process, one torch thread, process CPU time): the fp32 and bf16
matmul rates, the cost of one decoder-layer call (a 1-token forward of a tiny Llama, whose
FLOPs are negligible), the cost of one step of Mamba-1's sequential PyTorch scan (a tiny
Falcon-Mamba at 512 tokens, minus its FLOPs and layer calls) and the memory the runtime holds
besides tensors (first forward of a tiny model). Put the printed numbers into ``plan.DEVICES["cpu"]``.

**Validation**: every experiment the planner knows (eval, exact sweep, attribution ranking, prune,
transplant, maps) on SmolLM2-135M and the lab models, each in a fresh process: predicted vs
measured CPU time (process time, one thread, so other jobs on the machine do not count) and
peak resident memory above the process's size before the model was loaded. Writes
``benchmarks/results/plan.json`` and prints the markdown table of docs/scale.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

import ganda
from ganda import from_model
from ganda import plan as planner
from ganda.attribution import rank_heads
from ganda.experiments.common import Scorer
from ganda.experiments.prune import prune_curve
from ganda.experiments.transplant import transplant_sweep
from ganda.heads import expand
from ganda.plan import DEVICES
from ganda.scoring import encode, evaluate_examples
from ganda.sweep import run_sweep
from ganda.tasks import get_task

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # importable from the tests too
from checks import tiny_model  # noqa: E402
from conftest import make_byte_tokenizer, make_tiny_llama  # noqa: E402  (the tests' tiny models)
from peak_rss import PeakRSS  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "plan.json"

# the ranking rule the attribution cases were recorded with (a case's extra options override it)
ATTRIBUTION_RULE = {"method": "atp*", "verify_top": 30, "active": 0, "audit": 10}
# name: (model, experiment, task, n, extra options)
CASES: dict[str, tuple[str, str, str, int, dict[str, Any]]] = {
    "smollm2 eval mmlu": ("smollm2-135m", "eval", "mmlu", 24, {}),
    "smollm2 eval kv": ("smollm2-135m", "eval", "kv", 40, {}),
    "gemma3-270m eval kv": ("gemma3-270m", "eval", "kv", 40, {}),
    "gemma3-270m sweep kv (12 heads)": ("gemma3-270m", "sweep", "kv", 8, {"heads": "L0H*,L9H*,L17H*"}),
    "gemma3-270m attribution kv": ("gemma3-270m", "attribution", "kv", 8, {"verify_top": 4, "audit": 0}),
    "smollm2 sweep letters (27 heads)": ("smollm2-135m", "sweep", "letters", 4, {"heads": "L0H*,L15H*,L29H*"}),
    "smollm2 attribution letters": ("smollm2-135m", "attribution", "letters", 8, {"verify_top": 6, "audit": 2}),
    "smollm2 prune mmlu": ("smollm2-135m", "prune", "mmlu", 16, {}),
    "smollm2 maps (all 270 heads)": ("smollm2-135m", "maps", "mmlu", 1, {}),
    "lab-llama eval lab-mmlu": ("lab-llama", "eval", "lab-mmlu", 200, {}),
    "lab-llama sweep lab-mmlu": ("lab-llama", "sweep", "lab-mmlu", 64, {}),
    "lab-llama attribution lab-mmlu": ("lab-llama", "attribution", "lab-mmlu", 64, {}),
    "lab-llama prune lab-mmlu": ("lab-llama", "prune", "lab-mmlu", 200, {}),
    "lab-mamba2 eval lab-mmlu": ("lab-mamba2", "eval", "lab-mmlu", 200, {}),
    "lab-mamba2 sweep lab-mmlu": ("lab-mamba2", "sweep", "lab-mmlu", 32, {}),
    "lab-mamba2 maps lab-mmlu": ("lab-mamba2", "maps", "lab-mmlu", 16, {}),
    "lab-hybrid eval lab-mmlu": ("lab-hybrid", "eval", "lab-mmlu", 200, {}),
    "lab-hybrid transplant lab-mmlu": ("lab-hybrid", "transplant", "lab-mmlu", 100, {"donor": "lab-llama-wd"}),
}


def _tiny_mamba2(vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return Mamba2ForCausalLM(Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_heads=8,
                                          head_dim=8, state_size=8, n_groups=2, expand=2, chunk_size=16)).eval()


def _child_calibrate() -> dict[str, Any]:
    """Raw rates and, for the overhead constants, tiny-model runs with their zero-overhead plans."""


    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        a @ b
        reps = 20 if dtype == torch.float32 else 8
        t0 = time.process_time()
        for _ in range(reps):
            a @ b
        out[f"matmul_{str(dtype).removeprefix('torch.')}"] = reps * 2 * 1024**3 / (time.process_time() - t0)
    # a decoder-sized matmul (128 tokens x 1024 -> 2816): the fraction of the peak rate models reach
    a, b = torch.randn(128, 1024), torch.randn(1024, 2816)
    a @ b
    t0 = time.process_time()
    for _ in range(40):
        a @ b
    out["util"] = 40 * 2 * 128 * 1024 * 2816 / (time.process_time() - t0) / out["matmul_float32"]
    tok = make_byte_tokenizer()
    ad = from_model(make_tiny_llama(64, layers=8))
    with torch.no_grad():
        ids = torch.randint(0, 64, (1, 1))
        reps = 300
        t0 = time.process_time()
        for _ in range(reps):
            ad.forward(ids)
        out["layer_call"] = (time.process_time() - t0) / reps / 8
        fm = from_model(tiny_model("falcon_mamba"))
        T = 512
        ids = torch.randint(0, 60, (1, T))
        fm.forward(ids)
        t0 = time.process_time()
        for _ in range(3):
            fm.forward(ids)
        out["scan_step"] = (time.process_time() - t0) / 3 / (len(fm.original_layers()) * T) \
            - out["layer_call"] / T
        # a Mamba-2 layer's chunked PyTorch path runs many more small ops than a Llama layer
        tm = from_model(_tiny_mamba2(64))
        one = torch.randint(0, 60, (1, 1))
        tm.forward(one)
        t0 = time.process_time()
        for _ in range(reps):
            tm.forward(one)
        out["ssd_layer_call"] = max(0.0, (time.process_time() - t0) / reps / len(tm.original_layers()) - out["layer_call"])
    bare = dataclasses.replace(planner.DEVICES["cpu"], flops={"float32": out["matmul_float32"],
                                                               "bfloat16": out["matmul_bfloat16"]},
                               util=out["util"], layer_overhead=out["layer_call"],
                               scan_step=out["scan_step"], ssd_layer_overhead=out["ssd_layer_call"], example_overhead=0.0, call_overhead=0.0, map_overhead=0.0,
                               score_overhead=0.0, token_overhead=0.0,
                               act_bandwidth=1e30)
    unit = dataclasses.replace(bare, act_bandwidth=1.0)
    unit_no_ssd = dataclasses.replace(unit, ssd_traffic_scale=0.0)
    runs = []

    def timed(name: str, fn: Any, experiment: str, workload: Any, p: Any, **opts: Any) -> None:
        fn()  # warm
        t0 = time.process_time()
        fn()
        meas = time.process_time() - t0
        t_bare = planner.plan(p, experiment, workload, bare, **opts).seconds
        phases = planner._phases(p, experiment, workload, dict(opts))[0]
        runs.append({"name": name, "measured": meas, "bare": t_bare,
                     "traffic_bytes": planner.plan(p, experiment, workload, unit_no_ssd, **opts).seconds - t_bare,
                     "ssd_traffic_bytes": (planner.plan(p, experiment, workload, unit, **opts).seconds
                                           - planner.plan(p, experiment, workload, unit_no_ssd, **opts).seconds),
                     "calls": sum(ph.calls for ph in phases), "examples": sum(ph.examples for ph in phases),
                     "scored": sum(ph.scored for ph in phases),
                     "example_tokens": sum(ph.examples * ph.tokens for ph in phases),
                     "maps": sum(getattr(ph, "n_maps", 0) * ph.calls for ph in phases)})


    tl = from_model(make_tiny_llama(len(tok)), tok)
    tm = from_model(_tiny_mamba2(len(tok)), tok)
    letters = get_task("letters").examples(limit=64, seed=0)
    kv = get_task("kv", pairs=3).examples(limit=32, seed=0)
    short = get_task("letters", options=2, words=1).examples(limit=128, seed=0)
    long = get_task("letters", options=4, words=2, shots=3).examples(limit=32, seed=0)
    for label, ad_, exs in (("llama", tl, letters), ("mamba2", tm, letters), ("llama kv", tl, kv),
                            ("llama short", tl, short), ("llama 3-shot", tl, long)):
        w = planner.workload_from_examples(exs, lambda t, a=ad_: encode(a, t))
        prof = planner.profile(ad_)
        timed(f"eval {label}", lambda a=ad_, e=exs: evaluate_examples(a, e, progress=False), "eval", w, prof)
        if label in ("llama", "mamba2"):
            timed(f"sweep {label}", lambda a=ad_, e=exs: run_sweep(a, e[:16], progress=False), "sweep",
                  dataclasses.replace(w, n=16), prof, layer_skip=ad_.skips_layers())
    w = planner.workload_from_examples(letters, lambda t: encode(tl, t))
    timed("prune llama", lambda: prune_curve(tl, Scorer(tl, ["letters"], limit=32, progress=False)), "prune",
          dataclasses.replace(w, n=32), planner.profile(tl))
    ids = torch.randint(0, 300, (1, 64))
    timed("maps mamba2", lambda: tm.attention_maps(ids, tm.heads()), "maps",
          planner.Workload(n=1, tokens=64, max_tokens=64), planner.profile(tm))
    out["runs"] = runs
    return out


def _child_runtime(arg: str) -> dict[str, Any]:
    """RSS a fresh process adds to load a tiny model directory and run one forward of one token,
    beyond its weights (the planner's ``runtime``: libraries, tokenizer, allocator), then to run one
    experiment on 64 prompts: the heap that experiment's code path grows on its first run beyond
    what it keeps (``act_floor``: activations smaller than it reuse that heap)."""
    experiment, directory = arg.split(":", 1)
    torch.set_num_threads(1)
    exs = get_task("letters").examples(limit=64, seed=0)
    with PeakRSS() as mem:
        ad = ganda.load_model(directory, device="cpu", dtype=torch.float32)
        with torch.no_grad():
            ad.forward(torch.tensor([[1]]))
        loaded = mem.proc.memory_info().rss - mem.base
        if experiment == "eval":
            evaluate_examples(ad, exs, progress=False)
        elif experiment == "sweep":
            run_sweep(ad, exs, progress=False)
        else:
            rank_heads(ad, exs, progress=False, **ATTRIBUTION_RULE)
    w = planner.workload_from_examples(exs, lambda t: encode(ad, t))
    pl = planner.plan(planner.profile(ad), experiment, w, "cpu", layer_skip=ad.skips_layers(),
                      **(ATTRIBUTION_RULE if experiment == "attribution" else {}))
    m = pl.memory
    runtime = loaded - m["weights"]
    return {"family": ad.family, "experiment": experiment, "delta": mem.peak - mem.base, "runtime": runtime,
            "planned_activations": m["activations"],
            "floor": mem.peak - mem.base - m["weights"] - m["kept"] - runtime}


def _child_case(name: str) -> dict[str, Any]:

    torch.set_num_threads(1)
    model, experiment, task_name, n, extra = CASES[name]

    with PeakRSS() as mem:
        ad = ganda.load_model(model, device="cpu", dtype=torch.float32)
        donor = ganda.load_model(extra["donor"], device="cpu", dtype=torch.float32) if "donor" in extra else None
        loaded = mem.proc.memory_info().rss - mem.base  # weights, model objects, tokenizer
        # mmlu: a seeded sample of n questions across the subjects (its --limit is n per subject)
        task = get_task(task_name, adapter=ad, **({"sample": True} if task_name == "mmlu" else {}))
        examples = task.examples(limit=n, seed=0)
        prof = planner.profile(ad)
        w = planner.workload_from_examples(examples, lambda t: encode(ad, t))
        opts: dict[str, Any] = {"layer_skip": ad.skips_layers()}
        if "heads" in extra:
            opts["heads_per_layer"] = planner.heads_per_layer(ad, extra["heads"])
        if experiment == "attribution":
            opts.update({k: extra.get(k, v) for k, v in ATTRIBUTION_RULE.items()})
        if experiment == "maps":
            opts["rows"] = None
        mem.peak = mem.proc.memory_info().rss  # from here: the experiment's peak (task data excluded)
        pre_rss = mem.peak
        t0 = time.process_time()
        w0 = time.perf_counter()
        _run(ad, experiment, task_name, examples, extra, donor)
        cold = time.process_time() - t0
    # time: a second run in the same process, as the calibration measures (the first pays one-off
    # initialisation, a tenth of a second that only sub-second runs notice); memory: the first run
    t0 = time.process_time()
    w0 = time.perf_counter()
    _run(ad, experiment, task_name, examples, extra, donor)
    seconds = time.process_time() - t0
    wall = time.perf_counter() - w0
    pl = planner.plan(prof, experiment, w, "cpu", **opts)
    return {"name": name, "model": model, "experiment": experiment, "task": task_name, "n": n,
            "tokens": w.tokens, "measured_s": seconds, "cold_s": cold, "wall_s": wall, "predicted_s": pl.seconds,
            "measured_bytes": loaded + mem.peak - pre_rss, "loaded_bytes": loaded,
            "predicted_bytes": pl.memory["total"], "memory": pl.memory, "flops": pl.flops}


def _run(ad: Any, experiment: str, task_name: str, examples: list[Any], extra: dict[str, Any], donor: Any) -> None:


    if experiment == "eval":
        evaluate_examples(ad, examples, progress=False)
    elif experiment == "sweep":
        heads = expand(extra["heads"], ad) if "heads" in extra else None
        run_sweep(ad, examples, heads=heads, progress=False)
    elif experiment == "attribution":
        rank_heads(ad, examples, progress=False, **{k: extra.get(k, v) for k, v in ATTRIBUTION_RULE.items()})
    elif experiment == "prune":
        scorer = Scorer(ad, [task_name], limit=len(examples), progress=False, sample=task_name == "mmlu")
        prune_curve(ad, scorer)
    elif experiment == "transplant":
        scorer = Scorer(ad, [task_name], limit=len(examples), progress=False, sample=task_name == "mmlu")
        transplant_sweep(ad, donor, scorer)
    elif experiment == "maps":
        with torch.no_grad():
            for ex in examples:  # every head of every layer from one call, as `ganda attn --heads 'L*H*'`
                ad.attention_maps(torch.tensor([encode(ad, ex.prompt)]), ad.heads())
    else:  # pragma: no cover
        raise ValueError(experiment)


def _spawn(arg: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    res = subprocess.run([sys.executable, __file__, "--child", arg], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{arg} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--calibrate-only", action="store_true")
    ap.add_argument("--only")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.child:
        if args.child == "calibrate":
            out = _child_calibrate()
        elif args.child.startswith("runtime:"):
            out = _child_runtime(args.child.removeprefix("runtime:"))
        else:
            out = _child_case(args.child)
        print(json.dumps(out))
        return


    cal = _spawn("calibrate")
    tok = make_byte_tokenizer()
    cal["runtime"] = {}
    for label, model in (("transformer", make_tiny_llama(len(tok), ctx=512)), ("ssm", _tiny_mamba2(len(tok)))):
        d = tempfile.mkdtemp()
        model.save_pretrained(d)
        tok.save_pretrained(d)
        cal["runtime"][label] = _spawn(f"runtime:eval:{d}")["runtime"]
        if label == "transformer":
            cal["act_floor"] = {x: _spawn(f"runtime:{x}:{d}")["floor"] for x in ("eval", "sweep", "attribution")}
    # scipy only for this fit (not one of ganda's dependencies)
    from scipy.optimize import nnls

    # non-negative least squares over the tiny runs: seconds per activation byte, per example, per
    # model call and per head map, on top of the matmul and layer-call terms measured directly
    A = np.array([[r["traffic_bytes"], r["ssd_traffic_bytes"], r["examples"], r["calls"], r["maps"], r["scored"],
                   r["example_tokens"]] for r in cal["runs"]], float)
    b = np.array([r["measured"] - r["bare"] for r in cal["runs"]], float)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale, b)
    inv_bw, inv_ssd, ex_ov, call_ov, map_ov, score_ov, tok_ov = x / scale
    cal["fitted"] = {"act_bandwidth": 1 / inv_bw if inv_bw > 0 else None,
                     "ssd_traffic_scale": inv_ssd / inv_bw if inv_bw > 0 else None, "example_overhead": ex_ov,
                     "call_overhead": call_ov, "map_overhead": map_ov, "score_overhead": score_ov,
                     "token_overhead": tok_ov}
    for r, fit in zip(cal["runs"], A @ (x / scale), strict=True):
        print(f"  calibration run {r['name']}: measured {r['measured']:.3f} s, fitted {r['bare'] + fit:.3f} s")
    print(f"calibration: fp32 {cal['matmul_float32'] / 1e9:.1f} GFLOP/s (util {cal['util']:.2f}), bf16 {cal['matmul_bfloat16'] / 1e9:.1f} "
          f"GFLOP/s, layer call {cal['layer_call'] * 1e6:.0f} us (+{cal['ssd_layer_call'] * 1e6:.0f} us Mamba-2), "
          f"scan step {cal['scan_step'] * 1e6:.1f} us, "
          f"activation bandwidth {(1 / inv_bw if inv_bw > 0 else float('inf')) / 1e9:.2f} GB/s "
          f"(SSD path x{inv_ssd / inv_bw if inv_bw > 0 else 0:.1f}), "
          f"example {ex_ov * 1e3:.2f} ms, model call {call_ov * 1e3:.2f} ms, head map {map_ov * 1e3:.3f} ms, "
          f"scored row {score_ov * 1e6:.0f} us, prompt token {tok_ov * 1e6:.1f} us, "
          f"runtime {cal['runtime']['transformer'] / 2**20:.0f} MiB (+{(cal['runtime']['ssm'] - cal['runtime']['transformer']) / 2**20:.0f} MiB "
          f"with SSM layers), activation floor: "
          + ", ".join(f"{x} {v / 2**20:.0f} MiB" for x, v in cal["act_floor"].items()))
    cpu = DEVICES["cpu"]
    print(f"planner's cpu row: fp32 {cpu.flops['float32'] / 1e9:.1f} GFLOP/s (util {cpu.util:.2f}), bf16 {cpu.flops['bfloat16'] / 1e9:.1f}, "
          f"layer call {cpu.layer_overhead * 1e6:.0f} us (+{cpu.ssd_layer_overhead * 1e6:.0f} us Mamba-2), "
          f"scan step {cpu.scan_step * 1e6:.1f} us, example "
          f"{cpu.example_overhead * 1e3:.2f} ms, model call {cpu.call_overhead * 1e3:.2f} ms, head map "
          f"{cpu.map_overhead * 1e3:.3f} ms, scored row {cpu.score_overhead * 1e6:.0f} us, prompt token {cpu.token_overhead * 1e6:.1f} us, "
          f"activation bandwidth {cpu.act_bandwidth / 1e9:.2f} GB/s (SSD path x{cpu.ssd_traffic_scale:.1f}), "
          f"runtime {cpu.runtime / 2**20:.0f} MiB (+{cpu.ssm_runtime / 2**20:.0f} MiB with SSM layers), activation floor: "
          + ", ".join(f"{x} {v / 2**20:.0f} MiB" for x, v in cpu.act_floor.items()))
    result: dict[str, Any] = {"calibration": cal, "cases": []}
    if not args.calibrate_only:
        names = [n.strip() for n in args.only.split(",")] if args.only else list(CASES)
        for name in names:
            row = _spawn(name)
            result["cases"].append(row)
            print(_row(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


def _row(r: dict[str, Any]) -> str:
    dt = r["predicted_s"] / r["measured_s"] - 1
    dm = r["predicted_bytes"] / r["measured_bytes"] - 1
    return (f"| {r['name']} | {r['n']} | {r['tokens']:.0f} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | "
            f"{dt:+.0%} | {r['measured_bytes'] / 2**20:.0f} | {r['predicted_bytes'] / 2**20:.0f} | {dm:+.0%} |")


if __name__ == "__main__":
    main()
