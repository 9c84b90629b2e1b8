"""Run lm-evaluation-harness tasks on a ganda model with G&A heads ablated, offline.

Also cross-checks lm-eval against ganda's own scorers on the same questions (per-question
predictions and accuracy), which is how docs/lmeval.md was produced::

    pip install 'ganda[eval]'          # lm-eval==0.4.13
    python examples/lmeval_bridge.py --model smollm2-135m --subjects abstract_algebra,anatomy \\
        --limit 20 --heads L11H2,L16H8 --arc 20 --out runs/lmeval_bridge.json
    python examples/lmeval_bridge.py --subjects "" --arc 100 --batch-size 8   # ARC-Easy only

``--limit`` is the number of questions per subject (lm-eval's ``--limit``: the first N).
``--arc N`` scores the first N ARC-Easy questions (ganda's vendored data) with lm-eval and with
ganda's ``arc_easy`` task and prints the per-question agreement (acc and acc_norm predictions).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ganda import AblateHeads, load_model
from ganda.lmeval import arc_easy_cross_check, mmlu_task, sample_predictions, simple_evaluate
from ganda.scoring import evaluate_examples
from ganda.tasks.mmlu import DATA_DIR, MMLUTask, read_split


def ganda_mmlu(adapter, subject: str, limit: int | None, interventions, shots: int = 0):
    task = MMLUTask(shots=shots, subjects=[subject])
    rows = read_split(str(DATA_DIR), "test", subject)[:limit]
    examples = [task.build(subject, q, ch, g) for q, ch, g in rows]
    return evaluate_examples(adapter, examples, interventions, task_name=f"mmlu_{subject}", progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--subjects", default="abstract_algebra")
    ap.add_argument("--limit", type=int, default=10, help="questions per subject (first N)")
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--heads", default=None, help="heads to ablate (e.g. L11H2,L16H8); none = intact")
    ap.add_argument("--arc", type=int, default=0,
                    help="also cross-check ARC-Easy (lm-eval vs ganda) on the first N questions")
    ap.add_argument("--batch-size", default="4")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    adapter = load_model(args.model)
    ivs = [AblateHeads(args.heads)] if args.heads else []
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
    report: dict = {"model": adapter.spec, "interventions": [], "shots": args.shots, "subjects": {}}
    if subjects:
        tasks = [mmlu_task(s, shots=args.shots) for s in subjects]
        t0 = time.perf_counter()
        res = simple_evaluate(adapter, tasks, ivs, limit=args.limit, log_samples=True, batch_size=args.batch_size)
        report["lm_eval_seconds"] = round(time.perf_counter() - t0, 1)
        report["interventions"] = res["ganda"]["interventions"]
        total = agree = c_lm = c_ga = 0
        t1 = time.perf_counter()
        for s in subjects:
            name = f"ganda_mmlu_{s}"
            lm = sample_predictions(res, name)[: args.limit]
            ga = ganda_mmlu(adapter, s, args.limit, ivs, args.shots)
            same = sum(a["pred"] == b["pred"] for a, b in zip(lm, ga.predictions, strict=True))
            max_dll = max(abs(x - y) for a, b in zip(lm, ga.predictions, strict=True)
                          for x, y in zip(a["loglik"], b["loglik"], strict=True))
            acc_lm = sum(a["pred"] == a["gold"] for a in lm)
            report["subjects"][s] = {"n": len(lm), "same_prediction": same, "lm_eval_correct": acc_lm,
                                     "ganda_correct": ga.correct, "max_abs_loglik_diff": max_dll}
            total, agree, c_lm, c_ga = total + len(lm), agree + same, c_lm + acc_lm, c_ga + ga.correct
            print(f"{s}: n={len(lm)} same predictions {same}/{len(lm)}; acc lm-eval {acc_lm / len(lm):.3f} "
                  f"ganda {ga.accuracy:.3f}; max |dlogp| {max_dll:.2e}")
        report["ganda_seconds"] = round(time.perf_counter() - t1, 1)
        report["total"] = {"n": total, "same_prediction": agree, "lm_eval_accuracy": c_lm / max(1, total),
                           "ganda_accuracy": c_ga / max(1, total)}
        print(json.dumps(report["total"]))
    if args.arc:
        r = arc_easy_cross_check(adapter, args.arc, ivs, batch_size=args.batch_size)
        report["arc_easy"] = r
        n = r["n"]
        print(f"ARC-Easy: n={n} same requests {r['same_requests']}/{n}; same acc prediction "
              f"{r['same_pred']}/{n}; same acc_norm prediction {r['same_pred_norm']}/{n}")
        print(f"  acc lm-eval {r['lm_eval_acc']:.3f} ganda {r['ganda_acc']:.3f}; acc_norm lm-eval "
              f"{r['lm_eval_acc_norm']:.3f} ganda {r['ganda_acc_norm']:.3f}; max |dlogp| "
              f"{r['max_abs_loglik_diff']:.2e}; {r['lm_eval_seconds']:.1f} s lm-eval, {r['ganda_seconds']:.1f} s ganda")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
