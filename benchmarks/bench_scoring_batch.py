"""Scoring many examples: one example per forward (the baseline, lm-eval's request layout) vs
several examples in one right-padded forward (``ganda.scoring.score_examples``, the default for
models under 20M parameters).

The lab programme scores thousands of 200-prompt evaluations on models of 0.2-0.3M parameters,
where a forward of one prompt costs mostly Python and per-call overhead. Both arms score the same
examples under the same intervention, alternating arm by arm ``--repeats`` times (best time kept),
one torch thread; the predictions and log-likelihoods are compared:

    .venv/bin/python benchmarks/bench_scoring_batch.py [--n 200] [--repeats 3] [--out benchmarks/results/scoring_batch.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import ganda
from ganda.interventions import AblateHeads, apply
from ganda.scoring import BATCH_ROWS, score_examples
from ganda.tasks import get_task

CASES = [  # model, head whose query-position ablation the second condition applies
    ("lab-llama", "L1H1"),
    ("lab-mamba2", "L0H7"),
    ("lab-hybrid", "L3H1"),
    ("lab-distilled", "L1H0"),
]
TASKS = [("lab-mmlu", {}), ("lab-kv", {"pairs": 4})]


def timed(fn) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/scoring_batch.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, head in CASES:
        ad = ganda.load_model(name, device="cpu")
        for task, opts in TASKS:
            ex = get_task(task, adapter=ad, **opts).examples(limit=args.n, seed=0)
            for label, ivs in (("intact", []), (f"{head} ablated at the final position",
                                                [AblateHeads(head, positions="query")])):
                t_one, t_many = [], []
                with apply(ad, ivs):
                    for _ in range(args.repeats):
                        t, one = timed(lambda: score_examples(ad, ex, batch_rows=1))  # noqa: B023
                        t_one.append(t)
                        t, many = timed(lambda: score_examples(ad, ex, batch_rows=BATCH_ROWS))  # noqa: B023
                        t_many.append(t)
                diff = max(abs(a - b) for x, y in zip(one, many, strict=True) for a, b in zip(x.loglik, y.loglik, strict=True))
                same = sum(x.pred == y.pred for x, y in zip(one, many, strict=True))
                row = {"model": name, "task": task + (f"{opts['pairs']}" if opts else ""), "condition": label,
                       "n": len(ex), "one_per_forward_s": min(t_one), "batched_s": min(t_many),
                       "speedup": min(t_one) / min(t_many), "same_predictions": same, "max_abs_loglik_diff": diff}
                rows.append(row)
                print(f"{name:14s} {row['task']:9s} {label:38s} {row['one_per_forward_s']:6.2f} s -> "
                      f"{row['batched_s']:5.2f} s  {row['speedup']:4.1f}x  same {same}/{len(ex)}  max diff {diff:.1e}",
                      flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"n": args.n, "repeats": args.repeats, "threads": 1,
                                          "batch_rows": BATCH_ROWS, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
