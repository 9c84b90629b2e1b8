"""Does the G&A bottleneck reach beyond MMLU (GSM8K, BBH, dialogue)? (``ganda extends``)

Each task is run three times on the same examples: intact, with the given G&A heads
zero-ablated, and with a *control* set of as many heads drawn at random (seeded) from the same
layers among the heads whose own ablation is within noise: each candidate is ablated alone on the
run's multiple-choice prompts, and only a head whose accuracy-drop 95% interval (paired bootstrap
over prompts) contains 0 and whose gold-margin drop is within noise (its interval contains 0, or
it is at most 15% of the intact margin) can be drawn, so a control is never itself a causal head.
The result records the rule and every candidate's measured effect (``controls``) and each control
head's own (``control_effects``). Accuracies come with Wilson 95% intervals; results go to
``OUT/extends.json`` and ``OUT/extends.csv``, and each run's per-example predictions (the
generations, for GSM8K/BBH) to ``OUT/predictions/<task>.<condition>.jsonl``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .. import runio
from ..distributed import map_units, on_ray, prompt_shards
from ..errors import GandaError
from ..evaluation import evaluate_on
from ..generation import CHUNK, generation_tally
from ..heads import HeadId, expand, format_heads, require_heads
from ..intervals import bounds, ci, split_all
from ..interventions import AblateHeads, Intervention, describe_all
from ..knowledge import KNOWLEDGE_TASKS, evaluate_knowledge
from ..models.base import ModelAdapter
from ..scoring import EvalResult, choice_labels
from ..sweep import single_ablations
from ..tasks import get_task
from ..tasks.base import Task
from .base import Options, ScoredExperiment, option, parse_options
from .common import (
    ExperimentResult,
    paired_difference,
    pct,
    per_prompt,
    points_ci,
    pool_over,
    prediction_records,
    prompt_set,
    read_json_object,
    run_row,
)

DEFAULT_TASKS = "gsm8k-cot,bbh,dream,dream-letters,mmlu,knowledge"
CONDITIONS = ("intact", "ablated", "control")


NOISE_MARGIN = 0.15  # a margin drop at most this fraction of the intact margin is within noise
CONTROL_RULE = ("ablated alone on the run's multiple-choice prompts: accuracy-drop 95% interval contains 0, "
                f"and margin-drop 95% interval contains 0 or |margin drop| <= {NOISE_MARGIN:g} x the intact margin")


def _by_mixer(adapter: ModelAdapter, heads: list[HeadId]) -> list[tuple[list[HeadId], list[HeadId]]]:
    """Per mixer of the G&A heads (by layer, then kind): its heads among them, and its other heads (the
    candidate controls). Heads are compared canonically, so one mixer is one group however it was named."""
    heads = [adapter.canonical(h) for h in heads]
    by: dict[tuple[int, str | None], list[HeadId]] = {}
    for h in heads:
        by.setdefault((h.layer, h.kind), []).append(h)
    out = []
    for (layer, kind), hs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        mixer = adapter.mixer(layer, kind)
        out.append((hs, [h for i in range(mixer.num_heads)
                         if (h := adapter.canonical(HeadId(layer, i, mixer.kind))) not in heads]))
    return out


def screen_controls(adapter: ModelAdapter, heads: list[HeadId], examples: list[Any], seed: int = 0) -> dict[str, Any]:
    """Each candidate control head's exact single-head ablation effect on ``examples``, and whether
    it is within noise (:data:`CONTROL_RULE`): a control must not be a causal head itself."""
    sw = single_ablations(adapter, examples, [h for _, others in _by_mixer(adapter, heads) for h in others])
    baseline = sw.baseline
    base_c, base_m = sw.per_prompt(baseline), sw.per_prompt(baseline, "margin")
    base_margin = sum(base_m) / len(base_m)
    effects: dict[str, dict[str, Any]] = {}
    for rec in sw.records:
        c, m = sw.per_prompt(rec), sw.per_prompt(rec, "margin")
        acc = paired_difference(base_c, c, seed, name="acc_drop")
        mar = paired_difference(base_m, m, seed, name="margin_drop")
        (a_low, a_high), (m_low, m_high) = bounds(acc, "acc_drop"), bounds(mar, "margin_drop")
        noise = (a_low <= 0 <= a_high
                 and (m_low <= 0 <= m_high or abs(mar["margin_drop"]) <= NOISE_MARGIN * abs(base_margin)))
        effects[rec["head"]] = {**acc, **mar, "within_noise": noise}
    return {"rule": CONTROL_RULE, "n": len(examples), "baseline_accuracy": baseline["acc"],
            "baseline_margin": base_margin, "candidates": effects}


def control_heads(adapter: ModelAdapter, heads: list[HeadId], seed: int = 0,
                  screen: dict[str, Any] | None = None) -> list[HeadId]:
    """As many random heads per layer (and mixer kind) as ``heads`` has, none of them in ``heads``
    and, given a :func:`screen_controls` result, only heads it found within noise."""
    rng = random.Random(f"extends-control-{seed}")
    out: list[HeadId] = []
    for hs, pool in _by_mixer(adapter, heads):  # a mixer's draw cannot meet another's pool
        if screen is not None:
            pool = [p for p in pool if screen["candidates"][str(p)]["within_noise"]]
        if len(pool) < len(hs):
            which = " whose single ablation is within noise" if screen is not None else ""
            raise GandaError(f"layer {hs[0].layer} has only {len(pool)} heads outside the G&A set{which}, "
                             f"{len(hs)} needed for the control")
        out.extend(rng.sample(pool, len(hs)))
    return sorted(out)


# tasks built for a model, by (model, name, options): each built once per run (a Ray worker keeps its own)
_TASKS: dict[tuple[int, str, str], Task] = {}


def _task(adapter: ModelAdapter, name: str, options: dict[str, Any]) -> Task:
    key = (id(adapter), name, json.dumps(options, sort_keys=True, default=str))
    if key not in _TASKS:
        _TASKS[key] = get_task(name, adapter=adapter, **options)
    return _TASKS[key]


def _examples(task: Task, limit: int | None, seed: int, k: int = 0) -> list[Any]:
    """Prompt set ``k`` of a task (:func:`ganda.experiments.common.prompt_set`: seed ``seed + k``)."""
    examples = prompt_set(lambda n, s: task.examples(limit=n, seed=s), limit, seed, k)[0]
    if not examples:
        raise GandaError(f"task {task.name!r} gave no examples to score (limit={limit})")
    return examples


def _shard(adapter: ModelAdapter, name: str, options: dict[str, Any], interventions: list[Intervention],
           limit: int | None, seed: int, lo: int, hi: int | None, progress: bool, k: int = 0) -> EvalResult:
    """One task under one condition on prompt set ``k``'s prompts ``lo:hi`` (all of them:
    :func:`ganda.evaluation.evaluate`); ``seed`` is the run's, set k's is ``seed + k``."""
    task = _task(adapter, name, options)
    examples = _examples(task, limit, seed, k)
    part = examples[lo:hi]
    res = evaluate_on(adapter, task, part, interventions, limit=limit, seed=seed + k, progress=progress)
    if lo:
        for i, (ex, p) in enumerate(zip(part, res.predictions, strict=True)):
            p["id"] = ex.key(task.name, lo + i)
    return res


def _merge(adapter: ModelAdapter, task: Task, examples: list[Any], parts: list[EvalResult]) -> EvalResult:
    """A task's shards as the one result of a run on all its prompts (counts and predictions in order)."""
    if len(parts) == 1:
        return parts[0]
    preds = [p for r in parts for p in r.predictions]
    n, correct = len(preds), sum(bool(p["correct"]) for p in preds)
    first, mc = parts[0], task.kind == "mc"
    # the first shard's config with the whole run's count and tallies: a run on all the prompts
    config = {**first.config, "n": n, **({} if mc else generation_tally(task, preds))}
    norm = sum(bool(p["correct_norm"]) for p in preds) if mc else None
    res = EvalResult.from_counts(first.task, adapter, correct, n, time.perf_counter(), interventions=None,
                                 config=config, predictions=preds, correct_norm=norm)
    res.seconds, res.interventions = sum(r.seconds for r in parts), first.interventions
    if mc:
        res.answer_labels = choice_labels(examples)
    return res


def run_extends(adapter: ModelAdapter, heads: str, tasks: list[str], *, limit: int | None = None, seed: int = 0,
                out: Path | None = None, options: dict[str, dict[str, Any]] | None = None,
                conditions: tuple[str, ...] = CONDITIONS, progress: bool = True, prompt_sets: int = 1,
                ablation: str = "zero") -> dict[str, Any]:
    """Every task intact, with ``heads`` ablated and with the control heads ablated (module
    docstring); returns the JSON it writes to ``out`` (after every run, so an interrupted sweep
    keeps what it finished). ``ablation``: what the ablated and control heads' slices become
    (:mod:`ganda.ablation`; the mean and resample donors are each task's scored prompts).

    ``prompt_sets`` K > 1 runs the whole comparison (control screen and draw included) on K prompt
    sets, set k with seed ``seed + k`` and prompts disjoint from the sets before it where the task
    allows (:func:`ganda.experiments.common.prompt_sets`). The result's top level is set 1's, and
    ``prompt_sets`` (each set's seed, control heads and rows), ``pooled`` (each task and condition
    pooled over the sets, :func:`ganda.stats.pool_sets`) and ``findings`` (on how many sets the G&A
    ablation costs more than the control, per task) are added; ``prompt_sets.csv`` has one row per
    set, task and condition and a pooled row per task and condition."""
    ga = expand(heads, adapter)
    if not ga:
        raise GandaError("--heads is empty")
    options = options or {}
    try:
        sets, results = [], []
        for k in range(prompt_sets):
            res, correct = _run_set(adapter, ga, tasks, k, limit=limit, seed=seed, out=out, options=options,
                                    conditions=conditions, progress=progress, ablation=ablation)
            if prompt_sets == 1:
                return res
            results.append(res)
            sets.append(_set_record(adapter, k=k, seed=seed, limit=limit, options=options, result=res, correct=correct))
        result = {**results[0], "prompt_sets": prompt_sets, "seeds": [seed + k for k in range(prompt_sets)], "sets": sets,
                  **robustness(sets)}
        if out:
            write_results(result, out)
        return result
    finally:  # this run's tasks (a worker's stay with its model)
        for key in [k for k in _TASKS if k[0] == id(adapter)]:
            del _TASKS[key]


def _run_set(adapter: ModelAdapter, ga: list[HeadId], tasks: list[str], k: int, *, limit: int | None, seed: int,
             out: Path | None, options: dict[str, dict[str, Any]], conditions: tuple[str, ...], progress: bool,
             ablation: str = "zero") -> tuple[dict[str, Any], dict[tuple[str, str], list[float]]]:
    """Prompt set ``k`` of :func:`run_extends`: its result (written to ``out`` for set 0) and each
    (task, condition)'s per-prompt correctness (the paired drops' input)."""
    rows: list[dict[str, Any]] = []
    correct: dict[tuple[str, str], list[float]] = {}
    # every task is built (its options, its data, a lab model's world) before any of them runs
    built = {name: _task(adapter, name, options.get(name, {})) for name in tasks if name != "knowledge"}
    screened = {**built, **({m: _task(adapter, m, {}) for m in KNOWLEDGE_TASKS} if "knowledge" in tasks
                            else {})}  # the knowledge group's tasks are multiple choice too
    ctrl, controls = _controls(adapter, ga, screened, limit, seed, k) if "control" in conditions else ([], None)
    ivs: dict[str, list[Intervention]] = {"intact": [], "ablated": [AblateHeads(ga, how=ablation, seed=seed + k)],
                                          "control": [AblateHeads(ctrl, how=ablation, seed=seed + k)]}
    header = {"model": adapter.spec, "heads": format_heads(ga), "control_heads": format_heads(ctrl),
              "limit": limit, "seed": seed + k, "ablation": ablation}
    if controls is not None:
        header["controls"] = controls
        header["control_effects"] = {str(h): controls["candidates"][str(h)] for h in ctrl}
    pred_dir = (out / "predictions" / (f"set-{k + 1}" if k else "")) if out else None
    if pred_dir:
        pred_dir.mkdir(parents=True, exist_ok=True)
    units, names, groups = _work_units(built, tasks, conditions, ivs, options, limit=limit, seed=seed, k=k,
                                       progress=progress)
    results = map_units(adapter, _unit, units, names)
    for name, cond, n_units in groups:
        task = built.get(name)
        t0 = time.perf_counter()
        parts = [next(results) for _ in range(n_units)]
        if task is None:
            row = _knowledge_row(parts[0], cond, ivs[cond], time.perf_counter() - t0)
        else:
            res = _merge(adapter, task, _examples(task, limit, seed, k) if n_units > 1 else [], parts)
            row = {"task": name, "condition": cond, "n": res.n, "correct": res.correct,
                   "accuracy": res.accuracy, **ci((res.ci_low, res.ci_high)), "seconds": round(res.seconds, 2),
                   "config": res.config, "interventions": res.interventions}
            correct[(name, cond)] = per_prompt(res)
            if pred_dir:
                with runio.atomic_open(pred_dir / f"{name}.{cond}.jsonl") as f:
                    for p in res.predictions:
                        f.write(json.dumps(p) + "\n")
        rows.append(row)
        if out and k == 0:  # after every run, so an interrupted sweep keeps what it finished
            write_results({**header, "results": rows}, out)
        acc = row["accuracy"]
        acc_s = "n/a" if acc is None else f"{acc:.3f}"
        at = f" set {k + 1}" if k else ""
        print(f"{row['task']:>14} {cond:>8}{at}: {acc_s} (n={row['n']}, {row['seconds']:.0f}s)", file=sys.stderr)
    result = {**header, "results": rows}
    if out and k == 0:
        write_results(result, out)
    return result, correct


def _work_units(built: dict[str, Task], tasks: list[str], conditions: tuple[str, ...],
                ivs: dict[str, list[Intervention]], options: dict[str, dict[str, Any]], *, limit: int | None,
                seed: int, k: int, progress: bool
                ) -> tuple[list[tuple[Any, tuple[Any, ...]]], list[str], list[tuple[str, str, int]]]:
    """Prompt set ``k``'s work units, ``(function, arguments)``: each task under each condition on a
    shard of its prompts (one shard in this process; on Ray, shards sized so that every worker gets
    some, a generation task's aligned to its batches), their names, and per (task, condition) how
    many units hold it, in order (the knowledge group, ``built`` lacking it, is one unit)."""
    units: list[tuple[Any, tuple[Any, ...]]] = []
    names: list[str] = []
    groups: list[tuple[str, str, int]] = []  # (task, condition, units)
    for name in tasks:
        task = built.get(name)
        shards: list[tuple[int, int | None]] = [(0, None)]
        if task is not None and on_ray():
            n_ex = len(_examples(task, limit, seed, k))
            shards = prompt_shards(n_ex, len(tasks) * len(conditions),
                                   align=1 if task.kind == "mc" else CHUNK)
        for cond in conditions:
            for lo, hi in shards:
                if task is None:
                    units.append((partial(evaluate_knowledge, seed=seed + k, progress=progress), (ivs[cond], limit)))
                else:
                    units.append((_shard, (name, options.get(name, {}), ivs[cond], limit, seed, lo, hi, progress, k)))
                names.append(f"({name}, {cond}" + (f", prompts {lo}-{hi - 1})" if hi is not None else ")"))
            groups.append((name, cond, len(shards)))
    return units, names, groups


def _knowledge_row(kn: dict[str, Any], cond: str, ivs: list[Intervention], seconds: float) -> dict[str, Any]:
    """The knowledge group's row under one condition (:func:`ganda.knowledge.evaluate_knowledge`): the
    paper's knowledge score is its members' mean accuracy, with no interval or count of its own
    (``n``: the examples in all); each member's own in ``config``."""
    return {"task": "knowledge", "condition": cond, "n": sum(int(t.get("n", 0)) for t in kn["tasks"].values()),
            "correct": None, "accuracy": kn.get("mean"), **ci(None), "seconds": round(seconds, 2),
            "config": {"task": "knowledge", "per_task": kn.get("tasks")}, "interventions": describe_all(ivs)}


FINDING = {"control": "the G&A ablation costs more than the control (control accuracy minus ablated, paired over "
                       "prompts: 95% interval above 0)",
           "intact": "the G&A ablation costs accuracy (intact minus ablated, paired over prompts: 95% interval above 0)"}


def _difference(a: list[float] | None, b: list[float] | None, seed: int) -> dict[str, Any]:
    """Accuracy over per-prompt results ``a`` minus ``b``, paired over the prompts with a 95% interval;
    none for the knowledge group, which keeps no per-prompt results (nor an interval of its own)."""
    if a is None or b is None:
        return {"drop": None, **ci(None, "drop")}
    return paired_difference(a, b, seed)


def _set_record(adapter: ModelAdapter, *, k: int, seed: int, limit: int | None, options: dict[str, dict[str, Any]],
                result: dict[str, Any], correct: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    """Prompt set ``k`` of :func:`run_extends`: its seed, control heads and per task and condition the
    accuracy, the drop from intact and, as ``finding``, the G&A ablation's cost beyond the control's."""
    by = {(r["task"], r["condition"]): r for r in result["results"]}
    rows, finding = [], {}
    for (name, cond), r in by.items():
        row = {"task": name, "condition": cond, "n": r["n"], "accuracy": r["accuracy"], **ci(bounds(r))}
        if cond != "intact" and (name, "intact") in by:
            row.update(_difference(correct.get((name, "intact")), correct.get((name, cond)), seed + k))
        rows.append(row)
        ref = "control" if (name, "control") in by else "intact"
        if cond == "ablated" and (name, ref) in by:
            d = _difference(correct.get((name, ref)), correct.get((name, cond)), seed + k)
            finding[name] = {"against": ref, "cost": d["drop"], **ci(bounds(d, "drop"), "cost")}
    disjoint = {name: prompt_set(lambda n, s, t=_task(adapter, name, options.get(name, {})): t.examples(limit=n, seed=s),
                                 limit, seed, k)[1] for name, _ in by if name != "knowledge"}
    return {"set": k + 1, "seed": seed + k, "disjoint": disjoint, "control_heads": result["control_heads"],
            "rows": rows, "finding": finding}


def robustness(sets: list[dict[str, Any]]) -> dict[str, Any]:
    """What K prompt sets of :func:`run_extends` say together: each task and condition's accuracy
    and drop pooled over the sets (:func:`ganda.stats.pool_sets`), and per task on how many sets the
    finding (:data:`FINDING`) holds, with its pooled cost."""
    pooled: list[dict[str, Any]] = []
    for row in sets[0]["rows"]:
        each = [next(r for r in s["rows"] if (r["task"], r["condition"]) == (row["task"], row["condition"]))
                for s in sets]
        out = {"task": row["task"], "condition": row["condition"], "n": sum(r["n"] or 0 for r in each)}
        for name, key in (("accuracy", ""), ("drop", "drop")):
            if all(r.get(name) is not None for r in each):
                p = pool_over(each, name, within=(0.0, 1.0) if name == "accuracy" else (-1.0, 1.0), interval=key)
                out.update({name: p["estimate"], **ci(bounds(p), key), f"{name}_between_sd": p["between_sd"]})
        pooled.append(out)
    findings = {}
    for task, f in sets[0]["finding"].items():
        each = [s["finding"].get(task) or {"cost": None, "cost_ci_low": None, "cost_ci_high": None} for s in sets]
        if any(e["cost"] is None for e in each):
            continue
        p = pool_over(each, "cost", within=(-1.0, 1.0))
        findings[task] = {"criterion": FINDING[f["against"]], "against": f["against"], "holds_on": p["holds_on"],
                          "k": p["k"], "holds": p["holds"], "cost": p["estimate"], **ci(bounds(p), "cost"),
                          "between_sd": p["between_sd"], "pooled_holds": p["pooled_holds"], "method": p["method"]}
    return {"pooled": pooled, "findings": findings}


def sets_sentence(result: dict[str, Any]) -> str:
    """Per task, on how many of the K prompt sets the G&A ablation costs more than the control (or
    than intact, without a control), where it does not, and the pooled cost; empty for one set."""
    sets = result.get("sets") or []
    if len(sets) < 2:
        return ""
    lines = []
    for task, f in (result.get("findings") or {}).items():
        what = "more than the control" if f["against"] == "control" else "accuracy"
        misses = [f"set {s['set']} (seed {s['seed']}): {points_ci(s['finding'][task], 'cost')}"
                  for s, ok in zip(sets, f["holds"], strict=True) if not ok]
        lines.append(f"{task}: the G&A ablation costs {what} on {f['holds_on']} of {f['k']} prompt sets "
                     f"(seeds {result['seeds'][0]}-{result['seeds'][-1]})"
                     + (f"; not on {', '.join(misses)}" if misses else "")
                     + f"; pooled {points_ci(f, 'cost')}")
    return "\n".join(lines)


def set_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``prompt_sets.csv``: one row per prompt set, task and condition, then a pooled row per task and condition."""
    rows = [{"set": s["set"], "seed": s["seed"], "disjoint": s["disjoint"].get(r["task"], ""),
             "control_heads": s["control_heads"], **r} for s in result["sets"] for r in s["rows"]]
    return rows + [{"set": "pooled", "seed": ",".join(map(str, result["seeds"])), "disjoint": "", "control_heads": "",
                    **r} for r in result["pooled"]]


def _controls(adapter: ModelAdapter, ga: list[HeadId], built: dict[str, Task], limit: int | None, seed: int,
              k: int = 0) -> tuple[list[HeadId], dict[str, Any]]:
    """The control heads, screened on prompt set ``k``'s multiple-choice prompts and drawn with
    seed ``seed + k`` (module docstring)."""
    mc = {name: _examples(t, limit, seed, k) for name, t in built.items() if t.kind == "mc"}
    if not mc:
        raise GandaError("the control heads are screened on the run's multiple-choice prompts and --task has none: "
                         "add one (e.g. mmlu), or leave control out of --conditions")
    screen = screen_controls(adapter, ga, [e for exs in mc.values() for e in exs], seed=seed + k)
    screen["tasks"] = {name: len(exs) for name, exs in mc.items()}
    return control_heads(adapter, ga, seed + k, screen), screen


def control_sentence(result: dict[str, Any]) -> str:
    """One line: the control heads, each with its own measured effect, and how they were chosen."""
    eff = result.get("control_effects")
    if eff is None:
        return f"control heads: {result.get('control_heads') or 'none'}"
    each = ", ".join(f"{h} (acc drop {e['acc_drop']:+.3f} [{e['acc_drop_ci_low']:+.3f}, {e['acc_drop_ci_high']:+.3f}], "
                     f"margin drop {e['margin_drop']:+.2f})" for h, e in eff.items())
    c = result["controls"]
    n_ok = sum(e["within_noise"] for e in c["candidates"].values())
    return (f"control heads: {each}; drawn from the {n_ok} of {len(c['candidates'])} candidate heads whose single "
            f"ablation is within noise on {c['n']} prompts ({', '.join(c['tasks'])}; intact margin "
            f"{c['baseline_margin']:.2f})")


def _unit(adapter: ModelAdapter, fn: Any, args: tuple[Any, ...]) -> Any:
    """One work unit of :func:`run_extends`: ``fn`` is :func:`_shard` or the knowledge group's
    :func:`ganda.knowledge.evaluate_knowledge`."""
    return fn(adapter, *args)


def write_results(result: dict[str, Any], out: Path) -> None:
    runio.write_json(out / "extends.json", result)
    if result.get("sets"):
        runio.write_csv(out / "prompt_sets.csv", set_rows(result))
    heads = {"intact": "", "ablated": result["heads"], "control": result["control_heads"]}
    rows = []
    for r in result["results"]:
        low, high = bounds(r)
        rows.append({"task": r["task"], "condition": r["condition"], "n": r["n"], "correct": r["correct"],
                     "accuracy": r["accuracy"], "ci_low": low, "ci_high": high, "seconds": r["seconds"],
                     "heads": heads[r["condition"]]})
    runio.write_csv(out / "extends.csv", rows)


# ---- the result, as ganda.results.load and ganda report read it ---------------------------------

@dataclass
class ExtendsResult(ExperimentResult):
    """A ``ganda extends`` run directory: ``extends.json`` (one result per task and condition) and,
    per task and condition, its examples in ``predictions/<task>.<condition>.jsonl``."""

    kind: str = "extends"
    run_dir: Path | None = field(default=None, repr=False, compare=False)

    title = "G&A heads ablated beyond MMLU, against a control"
    files = ("extends.json",)

    @classmethod
    def read(cls, run_dir: Path) -> ExtendsResult:
        return cls.of(read_json_object(Path(run_dir) / "extends.json"), run_dir)

    @classmethod
    def of(cls, written: dict[str, Any], run_dir: Path) -> ExtendsResult:
        """The result of a comparison as ``extends.json`` holds it, its predictions in ``run_dir``."""
        d = split_all(written)
        rows = [r for r in d.get("results") or [] if isinstance(r, dict)]
        summary = {"heads": d.get("heads"), "control_heads": d.get("control_heads"),
                   **{f"{r.get('task')}.{r.get('condition')}": r.get("accuracy") for r in rows}}
        res = cls(model=d.get("model") or "", config={k: d.get(k) for k in ("limit", "seed", "ablation")},
                  summary=summary, rows=rows, run_dir=Path(run_dir),
                  extra={k: v for k, v in d.items() if k not in ("model", "results")})
        res.written = d
        return res

    def tables(self, run: str) -> dict[str, list[dict[str, Any]]]:
        """One run row, one row per task and condition, and each condition's examples."""
        tasks = ",".join(dict.fromkeys(r["task"] for r in self.rows))
        runs = [run_row(run, self.kind, self.model, tasks, self.config.get("limit"), None,
                        {"heads": self.extra.get("heads"), "control_heads": self.extra.get("control_heads")})]
        preds = []
        for r in self.rows:
            path = (self.run_dir or Path(run)) / "predictions" / f"{r['task']}.{r['condition']}.jsonl"
            if path.is_file():
                preds += prediction_records(path, run=run, condition=r["condition"])
        return {"runs": runs, "rows": [{"run": run, **{k: v for k, v in r.items() if not isinstance(v, dict)}}
                                       for r in self.rows], "predictions": preds}

    def headline(self) -> str:
        """Per task: its accuracy intact, with the G&A heads ablated and with the control heads ablated."""
        by: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            by.setdefault(r["task"], {})[r["condition"]] = r.get("accuracy")
        what = {"intact": "intact", "ablated": f"**{self.extra.get('heads')}** ablated",
                "control": f"control {self.extra.get('control_heads') or ''} ablated".replace("  ", " ")}
        lines = [f"{task}: " + ", ".join(f"{what.get(c, c)} **{pct(a)}**" for c, a in conds.items()) + "."
                 for task, conds in by.items()]
        return "\n".join([*lines, *filter(None, [sets_sentence(self.extra)])])


@dataclass
class ExtendsOptions(Options):
    heads: str = option("", "the G&A heads to ablate, e.g. L16H22,L17H24", required=True)
    task: str = option(DEFAULT_TASKS, f"comma-separated tasks: registered task names or 'knowledge' (default "
                       f"{DEFAULT_TASKS})", short="-t")
    tasks: str | None = option(None, "another spelling of --task", hidden=True)
    task_option: list[str] | None = option(None, "task option TASK.KEY=VALUE (repeatable), e.g. bbh.cot=false",
                                           flag="--option")
    data_dir: str | None = option(None, "DREAM data directory (non-commercial licence)")
    conditions: str = option(",".join(CONDITIONS), "which of intact,ablated,control to run")
    prompt_sets: int = option(1, "prompt sets the comparison runs on (set k: seed seed+k, prompts disjoint where the "
                              "task allows), pooled and counted", low=1, high=100,
                              why="each one repeats the whole measurement")
    ablation: str = option("zero", "zero|mean|resample (over each task's scored prompts; the control heads are drawn "
                           "by their zero-ablation effect): what an ablated head's slice becomes (docs/heads.md)",
                           choices=("zero", "mean", "resample"))

    def names(self) -> list[str]:
        """The task names of ``--task`` or of its other spelling ``--tasks`` (never both, differing)."""
        if self.tasks is not None and self.task not in (DEFAULT_TASKS, self.tasks):
            raise GandaError(f"--task {self.task} and --tasks {self.tasks}: --tasks is another spelling of --task, "
                             "give one")
        text = self.tasks if self.tasks is not None else self.task
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names:
            raise GandaError(f"{self.flag('task')}: no task names in {text!r}")
        return names

    def task_options(self) -> dict[str, dict[str, Any]]:
        """``--option TASK.KEY=VALUE`` and ``--data-dir`` as each task's options, checked by the task."""
        names = self.names()
        opts = parse_options(self.task_option, per_task=True)
        stray = [t for t in opts if t not in names]
        if stray:
            raise GandaError(f"--option {stray[0]}.*: task {stray[0]!r} is not among --task {','.join(names)}")
        if self.data_dir:
            dreams = [n for n in names if n.startswith("dream")]
            if not dreams:
                raise GandaError("--data-dir is the DREAM data directory, and --task names no dream task")
            for n in dreams:
                opts.setdefault(n, {})["data_dir"] = self.data_dir
        return opts

    def conds(self) -> tuple[str, ...]:
        conds = tuple(c.strip() for c in self.conditions.split(",") if c.strip())
        if [c for c in conds if c not in CONDITIONS] or not conds:
            raise GandaError(f"--conditions: expected some of {','.join(CONDITIONS)}, got {self.conditions!r}")
        return conds

    def check(self) -> None:
        if not self.heads:
            raise GandaError(f"{self.flag('heads')} is required: the G&A heads to ablate")
        require_heads(self.flag("heads"), self.heads)
        opts = self.task_options()
        for n in self.names():  # unknown names, bad options, missing data: refused before the model loads
            if n != "knowledge":
                get_task(n, **opts.get(n, {}))
            elif opts.get(n):
                raise GandaError("--option knowledge.*: the knowledge tasks take no options")
        self.conds()


class Extends(ScoredExperiment):
    """Each task intact vs G&A heads ablated vs as many heads from the same layers ablated, drawn at
    random among those whose own ablation is within noise on the run's multiple-choice prompts."""

    name = "extends"
    inputs = "model"  # each task's prompts, options and data are its own
    Options = ExtendsOptions
    default_limit = None
    default_out = "runs/extends"
    report_html = False  # extends.json, extends.csv, prompt_sets.csv, result.json
    takes = frozenset({"ray"})

    def check_run(self, options: ExtendsOptions, run: Any) -> None:  # type: ignore[override]
        if options.ablation != "zero" and run.ray is not None:  # a shard's mean would be over the shard's prompts only
            raise GandaError(f"--ablation {options.ablation} runs in this process only; drop --ray")

    def run_tasks(self, adapter: ModelAdapter, scorer: Any, options: ExtendsOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> dict[str, Any]:
        result = run_extends(adapter, options.heads, options.names(), limit=run.limit, seed=run.seed, out=out_dir,
                             options=options.task_options(), conditions=options.conds(),
                             prompt_sets=options.prompt_sets, ablation=options.ablation, progress=run.progress)
        ExtendsResult.of(result, out_dir).save_json(out_dir, command=self.command)
        return result

    def show(self, result: dict[str, Any], options: ExtendsOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        for r in result["results"]:
            lo, hi = (float("nan") if x is None else x for x in (r.get("ci_low"), r.get("ci_high")))
            acc = r["accuracy"]
            print(f"{r['task']:>14} {r['condition']:>8}  acc {acc if acc is None else round(acc, 4)}"
                  f"  CI [{lo:.3f}, {hi:.3f}]  n={r['n']}")
        if options.ablation != "zero":
            print(f"ablation: {options.ablation}")
        print(control_sentence(result))
        if options.prompt_sets > 1:
            print(sets_sentence(result))
        print(f"wrote {out_dir}/extends.json, {out_dir}/extends.csv"
              + (f", {out_dir}/prompt_sets.csv" if options.prompt_sets > 1 else "") + f" and {out_dir}/result.json")

