"""Naive single-head ablation loop vs the fast sweep engine (``ganda.sweep``), side by side.

All arms score the same prompts with every head of SmolLM2-135M ablated in turn; the script
checks that the per-head accuracies and every per-prompt prediction are identical
(log-likelihoods to 1e-3), prints the times and their ratios, and writes
``benchmarks/results/sweep.json``. Arms (``--arms``, run in this order):

* ``fast``: ``run_sweep`` as shipped;
* ``per-head``: the same engine with the LM head called once per (head, prompt) and the intact
  baseline given its own pass (what the batched LM head replaces), to isolate that part;
* ``naive``: ``AblateHeads`` + ``score_example`` per head (what ``evaluate_examples`` runs,
  shared-prefix reuse included);
* ``naive-rows``: the same with ``GANDA_PREFIX_CACHE=0``: every ``context + choice`` row
  scored whole, lm-eval's layout.

``--ablation mean`` runs every arm under mean-ablation (each head's slice set to its mean over the
prompts): ``naive`` is then the per-head scoring loop that a ranking's mean-ablation verification
would be without the sweep engine.

    .venv/bin/python benchmarks/bench_sweep.py --task kv --pairs 4 --n 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

import ganda
from ganda import sweep
from ganda.engine import logprobs
from ganda.heads import expand
from ganda.sweep import run_sweep, scored_by
from ganda.tasks import get_task


class PerHeadLMHead(sweep._FastEngine):
    """The fast engine with one LM-head call per (head, prompt) over that head's read positions
    (a position read by several choices read once per choice) and a separate intact pass."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.final = None

    def _read_out(self, finals, b):
        out = [[] for _ in range(b)]
        for x, rd in zip(finals, self.reads, strict=True):
            rows = torch.tensor([rd.rows[s] for s in rd.site])
            pos = torch.tensor([rd.pos[s] for s in rd.site])
            for bi in range(b):
                lp = logprobs(self.adapter, x[rows + bi * rd.copy, pos])
                vals = lp[torch.arange(len(rd.site)), torch.tensor(rd.target)]
                sums, k = [], 0
                for n in rd.lengths:
                    sums.append(float(vals[k : k + n].sum()))
                    k += n
                out[bi].append(sums)
        return out


def lm_head_rows(adapter) -> None:
    """CPU milliseconds per row of one LM-head call (final norm, LM head, log-softmax) by row count."""
    d = adapter.model.config.hidden_size
    for k in (1, 15, 60, 135, 341, 682):
        h = torch.randn(k, d)
        with torch.no_grad():
            logprobs(adapter, h)
            best = float("inf")
            for _ in range(3):
                c = time.process_time()
                logprobs(adapter, h)
                best = min(best, time.process_time() - c)
        print(f"{k:4d} rows: {best * 1000:6.0f} ms CPU, {best * 1000 / k:.2f} ms a row", flush=True)


def per_head_scores(adapter, examples, packed, batches):
    engine = PerHeadLMHead(adapter, packed)
    for batch in batches:
        yield engine.score(None if batch[0] is None else batch[0].layer, batch)


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
    ap.add_argument("--arms", default="fast,per-head,naive", help="fast first; then any of per-head, naive, naive-rows")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--ablation", default="zero", choices=("zero", "mean"))
    ap.add_argument("--lm-head-rows", action="store_true", help="only time one LM-head call by its number of rows")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    adapter = ganda.load_model(args.model)
    if args.lm_head_rows:
        return lm_head_rows(adapter)
    opts = {"pairs": args.pairs} if args.task == "kv" else {}
    examples = get_task(args.task, **opts).examples(limit=args.n, seed=args.seed)
    heads = expand(args.heads, adapter) if args.heads else adapter.heads()

    results, times = {}, {}
    for arm in args.arms.split(","):
        t, c = time.perf_counter(), time.process_time()
        if arm == "fast":
            results[arm] = run_sweep(adapter, examples, heads=heads, progress=True, ablation=args.ablation)
        elif arm == "per-head":
            with scored_by(per_head_scores):
                results[arm] = run_sweep(adapter, examples, heads=heads, progress=True, ablation=args.ablation)
        elif arm == "naive":
            results[arm] = run_sweep(adapter, examples, heads=heads, progress=True, naive=True,
                                         ablation=args.ablation)
        elif arm == "naive-rows":  # lm-eval's layout: every choice row scored whole, no shared-prefix reuse
            os.environ["GANDA_PREFIX_CACHE"] = "0"
            try:
                results[arm] = run_sweep(adapter, examples, heads=heads, progress=True, naive=True,
                                         ablation=args.ablation)
            finally:
                os.environ.pop("GANDA_PREFIX_CACHE")
        else:
            raise SystemExit(f"unknown arm {arm!r}")
        times[arm] = (time.perf_counter() - t, time.process_time() - c)
        print(f"{arm}: {times[arm][0]:.1f} s wall, {times[arm][1]:.1f} s CPU", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # the arms so far, should the run be stopped
        Path(args.out).write_text(json.dumps({"partial": True, "argv": sys.argv[1:], "load_average": os.getloadavg(),
                                              "seconds_wall_cpu": times}, indent=2) + "\n")

    fast = results["fast"]
    checks = {}
    for arm, other in results.items():
        if arm == "fast":
            continue
        checks[arm] = {
            "identical_accuracies": all(a["acc"] == b["acc"] for a, b in zip(fast.records, other.records, strict=True)),
            "identical_predictions": all(a["pred"] == b["pred"] and a["pred_norm"] == b["pred_norm"]
                                         for a, b in zip([fast.baseline, *fast.records],
                                                         [other.baseline, *other.records], strict=True)),
            "max_abs_loglik_diff": max(
                abs(x - y)
                for a, b in zip([fast.baseline, *fast.records], [other.baseline, *other.records], strict=True)
                for la, lb in zip(a["loglik"], b["loglik"], strict=True)
                for x, y in zip(la, lb, strict=True)
            ),
        }
    top = fast.top(5)
    result = {
        "command": f"python benchmarks/bench_sweep.py --task {args.task} --pairs {args.pairs} --n {args.n} "
        f"--seed {args.seed} --threads {args.threads} --arms {args.arms} --ablation {args.ablation}" + (f" --heads '{args.heads}'" if args.heads else ""),
        "model": args.model,
        "task": args.task,
        "task_options": opts,
        "n_prompts": len(examples),
        "n_heads": len(heads),
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "seconds": {arm: round(w, 1) for arm, (w, _) in times.items()},
        "cpu_seconds": {arm: round(c, 1) for arm, (_, c) in times.items()},
        "ratio_vs_fast": {arm: round(times[arm][0] / times["fast"][0], 2) for arm in times if arm != "fast"},
        "cpu_ratio_vs_fast": {arm: round(times[arm][1] / times["fast"][1], 2) for arm in times if arm != "fast"},
        "load_average_at_end": list(os.getloadavg()),
        "checks": checks,
        "baseline_acc": fast.baseline["acc"],
        "top_heads": [{"head": r["head"], "acc": r["acc"], "drop": fast.drop(r)} for r in top],
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    bad = [arm for arm, c in checks.items() if not (c["identical_accuracies"] and c["identical_predictions"]
                                                    and c["max_abs_loglik_diff"] <= 1e-3)]
    if bad:
        raise SystemExit(f"the fast sweep and {', '.join(bad)} disagree")


if __name__ == "__main__":
    main()
