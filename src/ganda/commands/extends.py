"""``ganda extends``: does the G&A bottleneck reach beyond MMLU (GSM8K, BBH, dialogue)?

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
import warnings
from pathlib import Path
from typing import Any

import typer

from .. import runio
from ..errors import GandaError
from ..heads import HeadId, expand, format_heads
from ..interventions import AblateHeads, Intervention, describe_all
from ..stats import wilson

DEFAULT_TASKS = "gsm8k-cot,bbh,dream,dream-letters,mmlu,knowledge"
CONDITIONS = ("intact", "ablated", "control")


def control_heads(adapter: Any, heads: list[HeadId], seed: int = 0) -> list[HeadId]:
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


def parse_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["bbh.cot=false", "gsm8k-cot.shots=4"]`` -> ``{"bbh": {"cot": False}, ...}``."""
    out: dict[str, dict[str, Any]] = {}
    for it in items:
        if "=" not in it or "." not in it.split("=", 1)[0]:
            raise GandaError(f"--option {it!r}: expected TASK.KEY=VALUE, e.g. bbh.cot=false")
        lhs, val = it.split("=", 1)
        task, key = lhs.split(".", 1)
        v: Any = val
        if val.lower() in ("true", "false"):
            v = val.lower() == "true"
        else:
            try:
                v = int(val)
            except ValueError:
                pass
        out.setdefault(task, {})[key] = v
    return out


def _knowledge(adapter: Any, interventions: list[Intervention], limit: int | None, seed: int = 0,
               progress: bool = True) -> dict[str, Any] | None:
    try:
        from ..tasks.knowledge import evaluate_knowledge  # type: ignore[attr-defined]
    except ImportError:
        warnings.warn("ganda.tasks.knowledge.evaluate_knowledge is not available: skipping 'knowledge'",
                      stacklevel=2)
        return None
    t0 = time.perf_counter()
    try:
        r = evaluate_knowledge(adapter, interventions, limit, seed=seed, progress=progress)
    except TypeError:  # an older signature
        r = evaluate_knowledge(adapter, interventions, limit)
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


def run_extends(adapter: Any, heads: str, tasks: list[str], *, limit: int | None = None, seed: int = 0,
                out: Path | None = None, options: dict[str, dict[str, Any]] | None = None,
                conditions: tuple[str, ...] = CONDITIONS, progress: bool = True) -> dict[str, Any]:
    """The library side of ``ganda extends`` (returns the JSON it writes)."""
    from ..scoring import evaluate
    from ..tasks import get_task

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


def register(app: typer.Typer) -> None:
    @app.command()
    def extends(
        model: str = typer.Argument(..., help="alias, .gguf file or local HF directory"),
        heads: str = typer.Option(..., "--heads", help="the G&A heads to ablate, e.g. L16H22,L17H24"),
        tasks: str = typer.Option(DEFAULT_TASKS, "--tasks", help="comma-separated task names (registry) or 'knowledge'"),
        limit: int | None = typer.Option(None, "--limit", help="examples per task (seeded sample)"),
        seed: int = typer.Option(0, "--seed", help="sample and control-head seed"),
        out: Path = typer.Option(Path("runs/extends"), "--out", "-o", help="directory for JSON, CSV, predictions"),
        option: list[str] = typer.Option([], "--option", help="task option TASK.KEY=VALUE (repeatable), e.g. bbh.cot=false"),
        data_dir: str | None = typer.Option(None, "--data-dir", help="DREAM data directory (non-commercial licence)"),
        conditions: str = typer.Option(",".join(CONDITIONS), "--conditions",
                                       help="which of intact,ablated,control to run"),
        allow_pickle: bool = typer.Option(False, help="allow *.bin/*.pt weights (runs pickle)"),
    ) -> None:
        """Each task intact vs G&A heads ablated vs as many random heads from the same layers ablated."""
        from ..heads import split_spec
        from ..models import load_model
        from ..tasks import get_task
        from .core import at_least

        names = [t.strip() for t in tasks.split(",") if t.strip()]
        if not names:
            raise GandaError(f"--tasks: no task names in {tasks!r}")
        if not split_spec(heads):
            raise GandaError(f"--heads: no head ids in {heads!r} (expected e.g. L16H22,L17H24)")
        at_least("--limit", limit)
        opts = parse_options(option)
        stray = [t for t in opts if t not in names]
        if stray:
            raise GandaError(f"--option {stray[0]}.*: task {stray[0]!r} is not among --tasks {','.join(names)}")
        if data_dir:
            dreams = [n for n in names if n.startswith("dream")]
            if not dreams:
                raise GandaError("--data-dir is the DREAM data directory, and --tasks has no dream task")
            for n in dreams:
                opts.setdefault(n, {})["data_dir"] = data_dir
        for n in names:  # unknown names, bad options, missing data: refused before the model loads
            if n != "knowledge":
                get_task(n, **opts.get(n, {}))
            elif opts.get(n):
                raise GandaError("--option knowledge.*: the knowledge tasks take no options")
        conds = tuple(c.strip() for c in conditions.split(",") if c.strip())
        bad = [c for c in conds if c not in CONDITIONS]
        if bad or not conds:
            raise GandaError(f"--conditions: expected some of {','.join(CONDITIONS)}, got {conditions!r}")
        runio.claim_run_dir(out)
        adapter = load_model(model, allow_pickle=allow_pickle)
        result = run_extends(adapter, heads, names, limit=limit, seed=seed, out=out, options=opts,
                             conditions=conds)
        for r in result["results"]:
            ci = r.get("ci95") or [float("nan"), float("nan")]
            acc = r["accuracy"]
            print(f"{r['task']:>14} {r['condition']:>8}  acc {acc if acc is None else round(acc, 4)}"
                  f"  CI [{ci[0]:.3f}, {ci[1]:.3f}]  n={r['n']}")
        print(f"wrote {out}/extends.json and {out}/extends.csv (control heads: {result['control_heads']})")
