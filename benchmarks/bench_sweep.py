"""Naive single-head ablation loop vs the fast sweep engine (``ganda.sweep``), side by side.

Both score the same prompts with every head of SmolLM2-135M ablated in turn; the script checks
that the per-head accuracies and every per-prompt prediction are identical (log-likelihoods to
1e-3), prints both times and their ratio, and writes ``benchmarks/results/sweep.json``.

    .venv/bin/python benchmarks/bench_sweep.py --task kv --pairs 4 --n 8
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import ganda
from ganda.heads import expand
from ganda.sweep import run_sweep
from ganda.tasks import get_task


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except Exception:  # pragma: no cover
        pass
    return platform.processor() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="kv")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", default=None, help="only these heads (e.g. 'L0H*,L15H*,L29H*'); default all")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep.json"))
    args = ap.parse_args()

    adapter = ganda.load_model(args.model)
    opts = {"pairs": args.pairs} if args.task == "kv" else {}
    examples = get_task(args.task, **opts).examples(limit=args.n, seed=args.seed)
    heads = expand(args.heads, adapter) if args.heads else adapter.heads()

    t, c = time.perf_counter(), time.process_time()
    fast = run_sweep(adapter, examples, heads=heads, progress=True)
    t_fast, c_fast = time.perf_counter() - t, time.process_time() - c
    print(f"fast: {t_fast:.1f} s wall, {c_fast:.1f} s CPU", flush=True)
    t, c = time.perf_counter(), time.process_time()
    naive = run_sweep(adapter, examples, heads=heads, progress=True, naive=True)
    t_naive, c_naive = time.perf_counter() - t, time.process_time() - c

    same_acc = all(a["acc"] == b["acc"] for a, b in zip(fast.records, naive.records, strict=True))
    same_pred = all(a["pred"] == b["pred"] for a, b in zip(fast.records, naive.records, strict=True))
    max_diff = max(
        abs(x - y)
        for a, b in zip([fast.baseline, *fast.records], [naive.baseline, *naive.records], strict=True)
        for la, lb in zip(a["loglik"], b["loglik"], strict=True)
        for x, y in zip(la, lb, strict=True)
    )
    top = fast.top(5)
    result = {
        "command": f"python benchmarks/bench_sweep.py --task {args.task} --pairs {args.pairs} --n {args.n} --seed {args.seed}"
        + (f" --heads '{args.heads}'" if args.heads else ""),
        "model": args.model,
        "task": args.task,
        "task_options": opts,
        "n_prompts": len(examples),
        "n_heads": len(heads),
        "cpu": cpu_model(),
        "threads": __import__("torch").get_num_threads(),
        "seconds_naive": round(t_naive, 1),
        "seconds_fast": round(t_fast, 1),
        "ratio": round(t_naive / t_fast, 2),
        "cpu_seconds_naive": round(c_naive, 1),
        "cpu_seconds_fast": round(c_fast, 1),
        "cpu_ratio": round(c_naive / c_fast, 2),
        "load_average_at_end": list(__import__("os").getloadavg()),
        "identical_accuracies": same_acc,
        "identical_predictions": same_pred,
        "max_abs_loglik_diff": max_diff,
        "baseline_acc": fast.baseline["acc"],
        "top_heads": [{"head": r["head"], "acc": r["acc"], "drop": fast.drop(r)} for r in top],
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not (same_acc and same_pred):
        raise SystemExit("fast and naive sweeps disagree")


if __name__ == "__main__":
    main()
