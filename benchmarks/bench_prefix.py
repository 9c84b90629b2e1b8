"""Shared-prefix reuse: ganda's scoring and generation with and without it, and lm-eval's HFLM,
side by side in one process on SmolLM2-135M-Instruct (CPU, fp32).

Every question of an MMLU subject shares its header (and in 5-shot its five exemplars), every
GSM8K CoT question the 8 exemplars, every BBH question of a subtask its 3 exemplars. ganda runs
such a prefix once per group under the active interventions and continues each request from its
cached state; ``--no-prefix-cache`` is ganda's path without it (each example one forward, its
choices packed behind the context). lm-eval 0.4.13 ``HFLM`` runs the same MMLU questions
(lm-eval's default MMLU template over the vendored CSVs, offline, see ``ganda.lmeval``) at batch
sizes 1 and 8. CPU seconds are this process's (``time.process_time``), one torch thread;
predictions are compared question by question:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_prefix.py            # ~100 MMLU questions per case
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_prefix.py --quick    # a few minutes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

import ganda
from ganda.evaluation import evaluate
from ganda.interventions import AblateHeads
from ganda.lmeval import mmlu_task, sample_predictions, simple_evaluate
from ganda.tasks import get_task

SUBJECTS = ["anatomy", "astronomy"]
HEADS = "L11H2,L16H8,L16H0,L20H7"


def timed(fn: Any) -> tuple[float, float, Any]:
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def ganda_arm(ad: Any, task: Any, ivs: list, limit: int, prefix: bool) -> dict[str, Any]:
    cpu, wall, res = timed(lambda: evaluate(ad, task, ivs, limit=limit, progress=False, prefix_cache=prefix))
    return {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "accuracy": res.accuracy, "res": res}


def lm_eval_arm(ad: Any, shots: int, ivs: list, limit: int, batch: int) -> dict[str, Any]:
    tasks = [mmlu_task(s, shots=shots) for s in SUBJECTS]
    cpu, wall, res = timed(lambda: simple_evaluate(ad, tasks, ivs, limit=limit, log_samples=True,
                                                   batch_size=batch))
    preds = [p for s in SUBJECTS for p in sample_predictions(res, f"ganda_mmlu_{s}")[:limit]]
    acc = sum(p["pred"] == p["gold"] for p in preds) / len(preds)
    return {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "accuracy": acc, "preds": preds}


def agreement(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    same = sum(x["pred"] == y["pred"] for x, y in zip(a, b, strict=True))
    dll = max(abs(u - v) for x, y in zip(a, b, strict=True) for u, v in zip(x["loglik"], y["loglik"], strict=True))
    return {"same_prediction": f"{same}/{len(a)}", "max_abs_loglik_diff": float(f"{dll:.2e}")}


def mmlu_case(ad: Any, shots: int, ivs: list, limit: int, batches: list[int]) -> dict[str, Any]:
    task = get_task("mmlu", shots=shots, subjects=SUBJECTS)
    on = ganda_arm(ad, task, ivs, limit, True)
    lm = {b: lm_eval_arm(ad, shots, ivs, limit, b) for b in batches}
    off = ganda_arm(ad, task, ivs, limit, False)
    best = min(lm, key=lambda b: lm[b]["cpu_s"])
    row: dict[str, Any] = {
        "questions": len(on["res"].predictions),
        "ganda_prefix": {k: on[k] for k in ("cpu_s", "wall_s", "accuracy")},
        "ganda_no_prefix": {k: off[k] for k in ("cpu_s", "wall_s", "accuracy")},
        "prefix_vs_no_prefix": agreement(on["res"].predictions, off["res"].predictions),
        "lm_eval": {f"batch_{b}": {k: v[k] for k in ("cpu_s", "wall_s", "accuracy")} for b, v in lm.items()},
        "lm_eval_best_batch": best,
        "prefix_vs_lm_eval": agreement(on["res"].predictions, lm[best]["preds"]),
        "speedup_cpu_vs_lm_eval_best": round(lm[best]["cpu_s"] / on["cpu_s"], 2),
        "speedup_wall_vs_lm_eval_best": round(lm[best]["wall_s"] / on["wall_s"], 2),
        "speedup_cpu_vs_no_prefix": round(off["cpu_s"] / on["cpu_s"], 2),
    }
    return row


def generation_case(ad: Any, name: str, opts: dict[str, Any], limit: int) -> dict[str, Any]:
    task = get_task(name, **opts)
    on = ganda_arm(ad, task, [], limit, True)
    off = ganda_arm(ad, task, [], limit, False)
    same = sum(p["generated"] == q["generated"] for p, q in zip(on["res"].predictions, off["res"].predictions,
                                                                  strict=True))
    return {"questions": on["res"].n, "options": opts,
            "ganda_prefix": {k: on[k] for k in ("cpu_s", "wall_s", "accuracy")},
            "ganda_no_prefix": {k: off[k] for k in ("cpu_s", "wall_s", "accuracy")},
            "same_generation": f"{same}/{on['res'].n}",
            "speedup_cpu_vs_no_prefix": round(off["cpu_s"] / on["cpu_s"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 MMLU questions per subject, 2 generation questions")
    ap.add_argument("--per-subject", type=int, default=None, help="MMLU questions per subject (default 50)")
    ap.add_argument("--gen", type=int, default=None, help="GSM8K and BBH questions (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="generation budget (default: the task's)")
    ap.add_argument("--cases", default="mmlu5,mmlu0,mmlu5-ablated,gsm8k,bbh")
    ap.add_argument("--batches", default=None, help="lm-eval batch sizes, e.g. 1,8 (default 1,8; --quick: 8)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/prefix.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    per = args.per_subject or (10 if args.quick else 50)
    gen = args.gen or (2 if args.quick else 4)
    mnt = args.max_new_tokens or (64 if args.quick else None)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([8] if args.quick else [1, 8])
    ad = ganda.load_model("smollm2-135m", device="cpu")
    cases = args.cases.split(",")
    report: dict[str, Any] = {"model": ad.spec, "subjects": SUBJECTS, "per_subject": per, "threads": 1}
    gopts = {"max_new_tokens": mnt} if mnt else {}
    best = batches
    for case in cases:
        t0 = time.perf_counter()
        if case == "mmlu5":
            report[case] = mmlu_case(ad, 5, [], per, batches)
            best = [report[case]["lm_eval_best_batch"]]
        elif case == "mmlu0":
            report[case] = mmlu_case(ad, 0, [], per, batches)
        elif case == "mmlu5-ablated":
            report[case] = {"heads": HEADS, **mmlu_case(ad, 5, [AblateHeads(HEADS)], per, best)}
        elif case == "gsm8k":
            report[case] = generation_case(ad, "gsm8k-cot", {"shots": 8, **gopts}, gen)
        elif case == "bbh":
            report[case] = generation_case(ad, "bbh", {"subtask": "date_understanding", "shots": 3, "cot": True,
                                                       **gopts}, gen)
        print(case, f"({time.perf_counter() - t0:.0f} s)", json.dumps(report[case]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
