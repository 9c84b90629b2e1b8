"""Does the G&A bottleneck reach beyond MMLU (GSM8K, BBH, dialogue)? (``ganda extends``)

Each task is run three times on the same examples: intact, with the given G&A heads
zero-ablated, and with a *control* set of as many random heads drawn from the same layers
(never one of the G&A heads; seeded). Accuracies come with Wilson 95% intervals; results go to
``OUT/extends.json`` and ``OUT/extends.csv``, and each run's per-example predictions (the
generations, for GSM8K/BBH) to ``OUT/predictions/<task>.<condition>.jsonl``.
"""

from __future__ import annotations

import csv
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from .. import runio
from ..errors import GandaError
from ..evaluation import evaluate
from ..heads import HeadId, expand, format_heads
from ..interventions import AblateHeads, Intervention, describe_all
from ..knowledge import evaluate_knowledge
from ..models.base import ModelAdapter
from ..stats import wilson
from ..tasks import get_task

DEFAULT_TASKS = "gsm8k-cot,bbh,dream,dream-letters,mmlu,knowledge"
CONDITIONS = ("intact", "ablated", "control")


def control_heads(adapter: ModelAdapter, heads: list[HeadId], seed: int = 0) -> list[HeadId]:
    """As many random heads per layer (and mixer kind) as ``heads`` has, none of them in ``heads``."""
    rng = random.Random(f"extends-control-{seed}")
    chosen: set[HeadId] = set(heads)
    out: list[HeadId] = []
    by_mixer: dict[tuple[int, str | None], list[HeadId]] = {}
    for h in heads:
        by_mixer.setdefault((h.layer, h.kind), []).append(h)
    for (layer, kind), hs in sorted(by_mixer.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        mixer = adapter.mixer(layer, kind)
        pool = [adapter.canonical(HeadId(layer, i, mixer.kind)) for i in range(mixer.num_heads)]
        pool = [p for p in pool if p not in chosen]
        if len(pool) < len(hs):
            raise GandaError(
                f"layer {layer} has only {len(pool)} heads outside the G&A set, {len(hs)} needed for the control"
            )
        pick = rng.sample(pool, len(hs))
        out.extend(pick)
        chosen.update(pick)
    return sorted(out)


def _knowledge(adapter: ModelAdapter, interventions: list[Intervention], limit: int | None, seed: int = 0,
               progress: bool = True) -> dict[str, Any] | None:
    t0 = time.perf_counter()
    r = evaluate_knowledge(adapter, interventions, limit, seed=seed, progress=progress)
    d = r.to_json() if hasattr(r, "to_json") else dict(r) if isinstance(r, dict) else {"value": r}
    if isinstance(d.get("tasks"), dict):
        # {"tasks": {name: {"n", "acc", "ci95"}}, "mean": ...}: the paper's knowledge score is the mean acc
        per = d["tasks"]
        n = sum(int(t.get("n", 0)) for t in per.values())
        return {"n": n, "correct": None, "accuracy": d.get("mean"), "ci95": None,
                "seconds": d.get("seconds", time.perf_counter() - t0), "detail": d}
    n, correct = d.get("n"), d.get("correct")
    acc = d.get("accuracy", d.get("score", d.get("mean")))
    row = {"n": n, "correct": correct, "accuracy": acc, "seconds": d.get("seconds", time.perf_counter() - t0),
           "detail": d}
    row["ci95"] = list(wilson(int(correct), int(n))) if n and correct is not None else d.get("ci95")
    return row


def run_extends(adapter: ModelAdapter, heads: str, tasks: list[str], *, limit: int | None = None, seed: int = 0,
                out: Path | None = None, options: dict[str, dict[str, Any]] | None = None,
                conditions: tuple[str, ...] = CONDITIONS, progress: bool = True) -> dict[str, Any]:
    """Every task intact, with ``heads`` ablated and with the control heads ablated (module
    docstring); returns the JSON it writes to ``out`` (after every run, so an interrupted sweep
    keeps what it finished)."""
    ga = expand(heads, adapter)
    if not ga:
        raise GandaError("--heads is empty")
    ctrl = control_heads(adapter, ga, seed)
    ivs: dict[str, list[Intervention]] = {"intact": [], "ablated": [AblateHeads(ga)], "control": [AblateHeads(ctrl)]}
    options = options or {}
    rows: list[dict[str, Any]] = []
    header = {"model": adapter.spec, "heads": format_heads(ga), "control_heads": format_heads(ctrl),
              "limit": limit, "seed": seed}
    # every task is built (its options, its data, a lab model's world) before any of them runs
    built = {name: get_task(name, adapter=adapter, **options.get(name, {})) for name in tasks if name != "knowledge"}
    pred_dir = out / "predictions" if out else None
    if pred_dir:
        pred_dir.mkdir(parents=True, exist_ok=True)
    for name in tasks:
        task = built.get(name)
        for cond in conditions:
            t0 = time.perf_counter()
            if task is None:
                k = _knowledge(adapter, ivs[cond], limit, seed, progress)
                if k is None:
                    break
                row = {"task": "knowledge", "condition": cond, **{x: k[x] for x in ("n", "correct", "accuracy", "ci95")},
                       "seconds": round(time.perf_counter() - t0, 2),
                       "config": {"task": "knowledge", "per_task": k["detail"].get("tasks")},
                       "interventions": describe_all(ivs[cond])}
            else:
                res = evaluate(adapter, task, ivs[cond], limit=limit, seed=seed, progress=progress)
                row = {"task": name, "condition": cond, "n": res.n, "correct": res.correct,
                       "accuracy": res.accuracy, "ci95": list(res.ci95), "seconds": round(res.seconds, 2),
                       "config": res.config, "interventions": res.interventions}
                if pred_dir:
                    with runio.atomic_open(pred_dir / f"{name}.{cond}.jsonl") as f:
                        for p in res.predictions:
                            f.write(json.dumps(p) + "\n")
            rows.append(row)
            if out:  # after every run, so an interrupted sweep keeps what it finished
                write_results({**header, "results": rows}, out)
            acc = row["accuracy"]
            acc_s = "n/a" if acc is None else f"{acc:.3f}"
            print(f"{row['task']:>14} {cond:>8}: {acc_s} (n={row['n']}, {row['seconds']:.0f}s)", file=sys.stderr)
    result = {**header, "results": rows}
    if out:
        write_results(result, out)
    return result


def write_results(result: dict[str, Any], out: Path) -> None:
    runio.write_text(out / "extends.json", json.dumps(result, indent=2, default=str) + "\n")
    with runio.atomic_open(out / "extends.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "condition", "n", "correct", "accuracy", "ci_low", "ci_high", "seconds", "heads"])
        for r in result["results"]:
            ci = r.get("ci95") or [None, None]
            heads = {"intact": "", "ablated": result["heads"], "control": result["control_heads"]}[r["condition"]]
            w.writerow([r["task"], r["condition"], r["n"], r["correct"], r["accuracy"], ci[0], ci[1],
                        r["seconds"], heads])
