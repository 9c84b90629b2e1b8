"""A head's KV-retrieval effect under zero, mean and resample ablation, and at each position class.

Loads the model once and, for each seed, scores ``--limit`` KV prompts intact and with each head
ablated (:func:`ganda.acts.head_profile`: zero, mean and resample at every position, then zero
at the segment ends, the queried key, the final position and elsewhere), every drop with a
paired bootstrap 95% interval over the prompts. Prints one table per head and seed and writes
the rows as JSON::

    .venv/bin/python benchmarks/ablation_kinds.py smollm2-135m --pairs 5 --heads L19H1,L16H2 --limit 40 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ganda import load_model
from ganda.acts import head_profile, verdict, where
from ganda.scoring import evaluate_examples
from ganda.sites import CLASSES
from ganda.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--heads", required=True, help="comma-separated heads, each profiled alone")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--where-seeds", default="0", help="seeds on which each head is also ablated at each position "
                    "class alone (the rows path: several times slower than the kinds)")
    ap.add_argument("--kinds", default="zero,mean,resample", help="ablation kinds at every position")
    ap.add_argument("--classes", default=",".join(CLASSES), help="the position classes of --where-seeds")
    ap.add_argument("--where-heads", default=None, help="heads also ablated at each position class (default: the first)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    adapter = load_model(args.model, device="cpu")
    task = get_task("kv", pairs=args.pairs)
    rows = []
    where_seeds = {int(s) for s in args.where_seeds.split(",") if s.strip()}
    where_heads = set((args.where_heads or args.heads.split(",")[0]).split(","))
    for seed in (int(s) for s in args.seeds.split(",")):
        exs = task.examples(limit=args.limit, seed=seed)
        base = evaluate_examples(adapter, exs, progress=False)
        print(f"{args.model} kv{args.pairs} seed {seed}: intact {100 * base.accuracy:.1f}% "
              f"[{100 * base.ci_low:.1f}, {100 * base.ci_high:.1f}] (n={base.n})", flush=True)
        for head in args.heads.split(","):
            t0 = time.perf_counter()
            prof = head_profile(adapter, exs, head, base=base, seed=seed, kinds=args.kinds.split(","),
                                classes=args.classes.split(",") if seed in where_seeds and head in where_heads else ())
            for r in prof:
                print(f"  {head:7s} {r['ablation']:8s} at {r['positions']:9s} acc {100 * r['accuracy']:5.1f}%  "
                      f"drop {100 * r['drop']:5.1f} [{100 * r['drop_ci_low']:5.1f}, {100 * r['drop_ci_high']:5.1f}]  "
                      f"margin drop {r['margin_drop']:6.3f} [{r['margin_drop_ci_low']:6.3f}, "
                      f"{r['margin_drop_ci_high']:6.3f}]", flush=True)
            print(f"  {verdict(prof)}\n  {where(prof)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            rows += [{"model": args.model, "pairs": args.pairs, "seed": seed, "n": base.n,
                      "intact": base.accuracy, **r} for r in prof]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
