"""Section 3 of the paper: cumulative layer pruning (Fig. 2) and remove-and-restore (Fig. 3).

**Pruning curve.** For k = N, N-s, ..., 1 keep only the first k decoder layers (final norm and LM
head kept, no healing) and score MMLU and the knowledge tasks on the same examples.

**Minimal model (the drop rule).** Walk the curve from the full model downwards and look at every
pair of consecutive evaluated points (k_prev > k). The *critical drop* is the pair with the largest
one-step MMLU decrease ``mmlu(k_prev) - mmlu(k)`` (ties: the pair met first while pruning from the
end, i.e. the largest k_prev). The minimal model keeps the first ``k_prev`` layers, i.e. layers
``0..k_prev-1``: every layer up to and including the last one before the drop. With step 1 the
*critical layer* is ``k`` (0-based), the layer whose removal causes the drop, and it is the last
layer of the minimal model. This is the paper's "smallest subnetwork that retains all layers up to
(and including) the layer before the sharp drop in MMLU". The summary also records the drop size,
and whether it is significant (the two Wilson 95% intervals do not overlap).

**Remove-and-restore.** On the minimal model (first m layers), for each layer i < m remove layer
i only, score, and put it back. The *critical layers* are those whose removal costs at least half
of the minimal model's margin above chance (``drop >= 0.5 * (score_min - chance)``, chance 0.25
for MMLU, 1/N for kvN), sorted by
drop; the paper finds the last two layers (Gather and Aggregate layers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..distributed import map_units, on_ray, prompt_shards
from ..effects import predicted
from ..engine import LayerCalls, logprobs, run_layers
from ..errors import GandaError
from ..figures import bars, curves
from ..interventions import KeepLayers, truncate
from ..knowledge import group_score
from ..models.base import ModelAdapter
from ..prepared import ROWS, Prepared, prepare
from ..progress import tqdm
from ..scoring import score_example
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult, Scorer, acc, chance, flat_scores, is_group, pct, task_score, task_series


def find_drop(points: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """The largest one-step decrease along ``(k, score)`` points sorted by decreasing k."""
    pts = sorted(points, key=lambda p: -p[0])
    if len(pts) < 2:
        raise GandaError("need at least two pruning points to find a drop")
    best = None
    for (k_prev, a), (k, b) in zip(pts, pts[1:], strict=False):
        drop = a - b
        if best is None or drop > best["drop"] + 1e-12:
            best = {"minimal_layers": k_prev, "critical_layer": k_prev - 1, "removed_to": k,
                    "drop_from": a, "drop_to": b, "drop": drop}
    assert best is not None
    return best


def _targets(p: Prepared) -> list[list[tuple[int, int, int]]]:
    """Per choice, the (row, position, token) triples of the row layout whose log-probs sum to its
    log-likelihood (scoring.score_choices' layout)."""
    return [[(r, k, tok) for (r, k), tok in zip(where, cont, strict=True)]
            for where, cont in zip(p.sites(ROWS), p.conts, strict=True)]


def _score_positions(p: Prepared, ids: torch.Tensor
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[tuple[int, int], int]]:
    """The (row, position) pairs to score, as a row and a position tensor, and where each choice
    token's pair is among them; positions with the same token prefix share a residual (shared
    context), so each prefix is scored once."""
    rep: dict[tuple[int, ...], int] = {}
    where: dict[tuple[int, int], int] = {}
    pos: list[tuple[int, int]] = []
    ids_list = ids.tolist()
    for choice in _targets(p):
        for r, t, _tok in choice:
            key = tuple(ids_list[r][: t + 1])
            if key not in rep:
                rep[key] = len(pos)
                pos.append((r, t))
            where[(r, t)] = rep[key]
    rows = torch.tensor([r for r, _ in pos], device=ids.device)
    return (rows, torch.tensor([t for _, t in pos], device=ids.device)), where


def _read(logp: torch.Tensor, base: int, where: dict[tuple[int, int], int], p: Prepared) -> list[float]:
    return [float(sum(logp[base + where[(r, t)], tok] for r, t, tok in choice)) for choice in _targets(p)]


@torch.no_grad()
def truncation_logliks(adapter: ModelAdapter, p: Prepared, ks: Sequence[int]) -> dict[int, list[float]]:
    """Choice log-likelihoods of the first-k-layer model for every k, from ONE pass of the layers.

    The residual after layer k-1 is the same in every truncation that keeps layer k-1, so the
    k-layer model's outputs are the final norm + LM head applied to it (both position-wise). The
    residuals at the scored positions go through the model's own head in one batched call
    (:func:`ganda.engine.logprobs`), so no family-specific code is needed. ``k`` counts the running layers."""
    layers = adapter.active_layers()
    ids, mask = p.row_tensors(adapter)
    (rr, tt), where = _score_positions(p, ids)
    need = sorted({layers[k - 1] for k in ks})
    got = run_layers(adapter, ids, attention_mask=mask, stop=need[-1],
                     capture=[f"L{i}.resid_out" for i in need], at=(rr, tt))
    ks = list(ks)
    logp = logprobs(adapter, torch.cat([got[f"L{layers[k - 1]}.resid_out"] for k in ks]))
    return {k: _read(logp, j * len(rr), where, p) for j, k in enumerate(ks)}


@torch.no_grad()
def removal_logliks(adapter: ModelAdapter, p: Prepared, m: int) -> dict[int | None, list[float]]:
    """Choice log-likelihoods of the first-m-layer model (key None) and of it with each layer i
    removed (key i), sharing the prefix: with layer i removed, layers 0..i-1 compute what they
    compute in the intact pass, so layer i+1 starts from layer i's recorded *input* (the layers
    after it replayed, :class:`ganda.engine.LayerCalls`). ``m`` counts the running layers and the
    keys are positions among them."""
    ids, mask = p.row_tensors(adapter)
    (rr, tt), where = _score_positions(p, ids)
    calls = LayerCalls(adapter, ids, mask, inputs=True, stop=adapter.active_layers()[m - 1])
    assert calls.inputs is not None and calls.final is not None
    finals: list[torch.Tensor] = [calls.final[rr, tt]]
    for j in range(m):  # without layer j, the layers after it start from j's input
        x = calls.inputs[j]
        for k in range(j + 1, m):
            x = calls.run(k, x)
        finals.append(x[rr, tt])
    logp = logprobs(adapter, torch.cat(finals))
    keys: list[int | None] = [None, *range(m)]
    return {key: _read(logp, j * len(rr), where, p) for j, key in enumerate(keys)}


def _close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) <= 1e-3 * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def _shortcut_holds(adapter: ModelAdapter, example: Any, fast: Any, intervention: Any) -> bool:
    """Whether a one-pass shortcut (``fast``: prepared prompt -> one variant's choice
    log-likelihoods) gives on ``example`` what a real forward under ``intervention`` gives, so that
    a family whose blocks do not fit the stand-in trick falls back to full forwards."""
    try:
        got = fast(prepare(adapter, example))
    except Exception:  # noqa: BLE001 - unusual block signatures: use the slow path
        return False
    with intervention.apply(adapter):
        return _close(got, score_example(adapter, example).loglik)


def fast_truncation_scores(
    adapter: ModelAdapter, examples: Sequence[Any], ks: Sequence[int], *, progress: bool = False
) -> dict[int, dict[str, Any]] | None:
    """Accuracy of every first-k-layer model (None where the shortcut does not apply).

    The shortcut is verified once against a real truncated forward, so a family whose blocks
    do not fit the stand-in trick falls back to full forwards. The prompts are scored in shards
    (:func:`ganda.distributed.prompt_shards`: one here, several on Ray) whose counts add up."""
    if not examples:
        return None
    n = len(adapter.decoder_layers())
    k = next((k for k in ks if k != n), None)
    if k is not None and not _shortcut_holds(adapter, examples[0], lambda p: truncation_logliks(adapter, p, [k])[k],
                                             truncate(k)):
        return None
    return _sharded_scores(adapter, _truncation_counts, examples, list(ks), list(ks), progress, "prune")


def _sharded_scores(adapter: ModelAdapter, fn: Any, examples: Sequence[Any], arg: Any, keys: list[Any],
                    progress: bool, label: str) -> dict[Any, dict[str, Any]]:
    """Each key's accuracy over ``examples``, from ``fn(adapter, shard, arg, progress)``'s counts of
    each prompt shard (on Ray inside :func:`ganda.distributed.ray_sweeps`); ``label`` names the
    units in errors."""
    shards = prompt_shards(len(examples))
    units = [(list(examples[lo:hi]), arg, progress) for lo, hi in shards]
    names = [f"({label}, prompts {lo}-{hi - 1})" for lo, hi in shards]
    correct = dict.fromkeys(keys, 0)
    for part in map_units(adapter, fn, units, names):
        for key in keys:
            correct[key] += part[key]
    n = len(examples)
    return {key: task_score(correct[key] / n, n, correct[key]) for key in keys}


def _count_correct(adapter: ModelAdapter, examples: Sequence[Any], keys: list[Any], logliks: Any, desc: str,
                   progress: bool) -> dict[Any, int]:
    """How many of ``examples`` each model variant (key) gets right; ``logliks(adapter, prepared)``
    returns every variant's choice log-likelihoods from one pass."""
    correct = dict.fromkeys(keys, 0)
    for ex in tqdm(examples, desc=desc, leave=False, disable=not progress):
        p = prepare(adapter, ex)
        lls = logliks(adapter, p)
        for key in keys:
            correct[key] += int(predicted(lls[key]) == p.gold)
    return correct


def _truncation_counts(adapter: ModelAdapter, examples: Sequence[Any], ks: list[int], progress: bool) -> dict[int, int]:
    """How many of ``examples`` each first-k-layer model gets right (one pass of the layers per example)."""
    return _count_correct(adapter, examples, ks, lambda a, p: truncation_logliks(a, p, ks), "prune (one pass)",
                          progress)


def fast_removal_scores(
    adapter: ModelAdapter, examples: Sequence[Any], m: int, *, progress: bool = False
) -> dict[int | None, dict[str, Any]] | None:
    """Accuracy of the m-layer model and of it minus each layer (None where the shortcut does not apply)."""
    i = m // 2
    if not examples or not _shortcut_holds(adapter, examples[0], lambda p: removal_logliks(adapter, p, m)[i],
                                           KeepLayers([j for j in range(m) if j != i])):
        return None
    return _sharded_scores(adapter, _removal_counts, examples, m, [None, *range(m)], progress, "remove-restore")


def _removal_counts(adapter: ModelAdapter, examples: Sequence[Any], m: int, progress: bool) -> dict[int | None, int]:
    """How many of ``examples`` the m-layer model (key None) and it minus each layer get right."""
    return _count_correct(adapter, examples, [None, *range(m)], lambda a, p: removal_logliks(a, p, m),
                          "remove-restore (shared prefix)", progress)


def _fast_scores(scorer: Scorer, name: str, run: Any) -> dict[Any, dict[str, Any]] | None:
    """Every condition's score of one name in the task list through a fast path ``run`` (examples ->
    {condition: summary}); a group's members one by one, then their mean (:func:`group_score`).
    None when the shortcut is unavailable."""
    if not is_group(name):
        return run(scorer._task_examples(name)[1])
    per_task = {}
    for member, examples in tqdm(scorer.members(name), desc=name, leave=False, disable=not scorer.progress):
        res = run(examples)
        if res is None:
            return None
        per_task[member] = res
    return {cond: group_score({t: per_task[t][cond] for t in per_task}) for cond in next(iter(per_task.values()))}


def _scores_by_condition(adapter: ModelAdapter, scorer: Scorer, keys: list[Any], fast: Any,
                         conds: list[tuple[list[Any], str]], desc: str) -> tuple[dict[Any, dict[str, Any]], list[str]]:
    """Every task's score under each condition (``keys`` and ``conds`` in the same order): through the
    fast path ``fast`` (examples -> {key: summary}; None: off) where it serves a task, else with full
    forwards (:func:`_slow_scores`); and the tasks that took full forwards."""
    per: dict[Any, dict[str, Any]] = {k: {} for k in keys}
    slow_tasks = []
    for name in scorer.tasks:
        got = _fast_scores(scorer, name, fast) if fast is not None else None
        if got is None:
            slow_tasks.append(name)
        else:
            for k in keys:
                per[k][name] = got[k]
    if slow_tasks:
        for k, scores in zip(keys, _slow_scores(adapter, scorer, slow_tasks, conds, desc), strict=True):
            per[k].update(scores)
    return per, slow_tasks


def _slow_scores(adapter: ModelAdapter, scorer: Scorer, tasks: list[str], conds: list[tuple[list[Any], str]],
                 desc: str) -> Iterator[dict[str, Any]]:
    """``tasks`` scored with full forwards under each condition ``(interventions, label)``, in order:
    here with ``scorer``'s examples, or on Ray one condition a unit (each worker builds the same examples)."""
    if on_ray():
        units = [(tasks, scorer.limit, scorer.knowledge_limit, scorer.seed, scorer.sample, ivs, label)
                 for ivs, label in conds]
        yield from map_units(adapter, _scores_under, units, [f"({desc}, {label})" for _, label in conds])
        return
    sub = replace(scorer, adapter=adapter, tasks=tasks)
    sub._examples = scorer._examples  # the same examples
    for ivs, label in tqdm(conds, desc=desc, leave=False, disable=not scorer.progress):
        yield sub.score(ivs, label=label)


def _scores_under(adapter: ModelAdapter, tasks: list[str], limit: int | None, klimit: int | None, seed: int,
                  sample: bool, ivs: list[Any], label: str) -> dict[str, Any]:
    """One condition of :func:`_slow_scores` on a Ray worker."""
    return Scorer(adapter, tasks, limit=limit, knowledge_limit=klimit, seed=seed, progress=False,
                  sample=sample).score(ivs, label=label)


@dataclass
class PruneResult(ExperimentResult):
    kind: str = "prune"
    title = "Layer pruning curve"

    def headline(self) -> str:
        s = self.summary
        if "minimal_layers" not in s:
            return ""
        drop_task = self.config.get("drop_task", "MMLU")
        return (f"Minimal model: **{s['minimal_layers']} layers** (0-{s['minimal_layers'] - 1}); the largest one-step "
                f"{drop_task} drop is when layer **{s.get('critical_layer')}** is removed ({pct(s.get('drop_from'))} → "
                f"{pct(s.get('drop_to'))})" + ("." if s.get("significant", True) else
                " — *not significant* (the Wilson intervals overlap: the curve may be flat noise)."))

    def draw(self, out_dir: Path) -> list[Path]:
        rows = sorted(self.rows, key=lambda r: r["layers"])
        x = [r["layers"] for r in rows]
        series, bands = task_series(rows)
        vlines = {}
        if "minimal_layers" in self.summary:
            vlines[f"minimal model ({self.summary['minimal_layers']} layers)"] = self.summary["minimal_layers"]
        return [curves(x, series, Path(out_dir) / "prune.png", bands=bands, xlabel="layers kept (first k)",
                       hlines={"MMLU chance": chance("mmlu")} if "mmlu" in series else None, vlines=vlines,
                       title=f"Cumulative layer pruning: {self.model}")]


def prune_curve(
    adapter: ModelAdapter,
    scorer: Scorer,
    *,
    step: int = 1,
    min_layers: int = 1,
    drop_task: str = "mmlu",
    fast_path: bool = True,
) -> PruneResult:
    """Score the first-k-layer models for k = N, N-step, ..., min_layers (Fig. 2)."""
    n = len(adapter.decoder_layers())
    if step < 1:
        raise GandaError("--layers step must be >= 1")
    if not 1 <= min_layers <= n:
        raise GandaError(f"--min-layers must be between 1 and the model's {n} layers, got {min_layers}")
    ks = list(range(n, min_layers - 1, -step))
    if ks[-1] != min_layers and min_layers >= 1:
        ks.append(min_layers)
    def fast(exs: Sequence[Any]) -> Any:
        return fast_truncation_scores(adapter, exs, ks, progress=scorer.progress)

    conds = [([] if k == n else [truncate(k)], f"k={k}") for k in ks]
    per_k, slow_tasks = _scores_by_condition(adapter, scorer, ks, fast if fast_path else None, conds, "prune")
    rows = []
    for k in ks:
        scores = {t: per_k[k].get(t) for t in scorer.tasks}
        rows.append({"layers": k, "removed": n - k, **flat_scores(scores)})
    result = PruneResult(model=adapter.spec, config={**scorer.config(), "step": step, "num_layers": n,
                                                   "drop_task": drop_task}, rows=rows)
    if slow_tasks != list(scorer.tasks):
        result.notes.append("scored with one pass of the layers per example (truncation to k layers = final norm + "
                            "LM head on the residual after layer k-1, checked against a real truncated forward); "
                            f"full forwards for: {', '.join(slow_tasks) or '-'}")
    pts = [(r["layers"], r[drop_task]) for r in rows if r.get(drop_task) is not None]
    if len(pts) >= 2:
        d = find_drop(pts)
        lo_prev = next(r for r in rows if r["layers"] == d["minimal_layers"]).get(f"{drop_task}_ci_low")
        hi_next = next(r for r in rows if r["layers"] == d["removed_to"]).get(f"{drop_task}_ci_high")
        d["significant"] = bool(lo_prev is not None and hi_next is not None and lo_prev > hi_next)
        if step > 1:
            result.notes.append(f"step {step}: the drop is located to within {step} layers; rerun with step 1 near it")
        result.summary = {**d, "full_" + drop_task: rows[0][drop_task]}
        if "knowledge" in scorer.tasks and rows[0].get("knowledge") is not None:
            mrow = next(r for r in rows if r["layers"] == d["minimal_layers"])
            result.summary["full_knowledge"] = rows[0]["knowledge"]
            result.summary["minimal_knowledge"] = mrow.get("knowledge")
    return result


@dataclass
class RemoveRestoreResult(ExperimentResult):
    kind: str = "remove_restore"
    title = "One layer removed and restored"

    def headline(self) -> str:
        layers = self.summary.get("critical_layers")
        return "" if layers is None else f"Layers whose removal hurts MMLU most: **{layers}**."

    def draw(self, out_dir: Path) -> list[Path]:
        rows = [r for r in self.rows if r.get("removed_layer") is not None]
        base = next((r for r in self.rows if r.get("removed_layer") is None), {})
        labels = [str(r["removed_layer"]) for r in rows]
        series, errors = task_series(rows)
        hl = {f"minimal {t}": base[t] for t in series if base.get(t) is not None}
        hl["MMLU chance"] = chance("mmlu")
        return [bars(labels, series, Path(out_dir) / "remove_restore.png", errors=errors, hlines=hl,
                     title=f"Remove one layer and restore (minimal model, {self.summary.get('minimal_layers')} layers)",
                     ylabel="accuracy with the layer removed")]


def remove_restore(
    adapter: ModelAdapter, scorer: Scorer, minimal_layers: int, *, drop_task: str = "mmlu", fast_path: bool = True
) -> RemoveRestoreResult:
    """Fig. 3: on the first ``minimal_layers`` layers, remove each layer once and restore it."""
    n = len(adapter.decoder_layers())
    if not 1 <= minimal_layers <= n:
        raise GandaError(f"minimal model of {minimal_layers} layers: the model has {n}")
    keep = list(range(minimal_layers))
    def fast(exs: Sequence[Any]) -> Any:
        return fast_removal_scores(adapter, exs, minimal_layers, progress=scorer.progress)

    conds = [([KeepLayers(keep)], "minimal")] + [([KeepLayers([j for j in keep if j != i])], f"-L{i}") for i in keep]
    per, _ = _scores_by_condition(adapter, scorer, [None, *keep], fast if fast_path else None, conds, "remove-restore")
    base = {t: per[None].get(t) for t in scorer.tasks}
    rows: list[dict[str, Any]] = [{"removed_layer": None, **flat_scores(base)}]
    for i in keep:
        rows.append({"removed_layer": i, **flat_scores({t: per[i].get(t) for t in scorer.tasks})})
    result = RemoveRestoreResult(model=adapter.spec, rows=rows,
                                 config={**scorer.config(), "minimal_layers": minimal_layers, "drop_task": drop_task})
    b = acc(base, drop_task)
    summary: dict[str, Any] = {"minimal_layers": minimal_layers, f"minimal_{drop_task}": b}
    if b is not None:
        drops = sorted(((b - r[drop_task], r["removed_layer"]) for r in rows[1:] if r.get(drop_task) is not None),
                       reverse=True)
        margin = b - chance(drop_task)
        summary["critical_layers"] = [layer for d, layer in drops if margin > 0 and d >= 0.5 * margin]
        summary["largest_drops"] = [{"layer": layer, "drop": d} for d, layer in drops[:5]]
        if "knowledge" in base and base["knowledge"] is not None:
            summary["minimal_knowledge"] = base["knowledge"]["accuracy"]
    result.summary = summary
    return result


@dataclass
class PruneOptions(Options):
    layers: int = option(1, "pruning step: score every LAYERS-th truncation", low=1)
    min_layers: int = option(1, "smallest number of kept layers", low=1)
    remove_restore: bool = option(False, "Fig. 3 on the minimal model")
    minimal: int | None = option(None, "minimal model size (skips the curve)", low=1)
    drop_task: str | None = option(None, "task whose drop defines the minimal model (default: mmlu if scored, else "
                                   "the first task)")

    def check(self) -> None:
        self.needs("minimal", "remove_restore", "sizes the minimal model of")  # the curve alone has no use for it


class Prune(ScoredExperiment):
    """Cumulative layer pruning (Fig. 2) and the minimal model; --remove-restore: Fig. 3."""

    name = "prune"
    Options = PruneOptions
    phases = "ganda.plan:prune_phases"
    takes = frozenset({"ray"})

    def out_name(self, options: PruneOptions) -> str:  # type: ignore[override]
        return "remove_restore" if options.remove_restore else "prune"

    def check_tasks(self, options: PruneOptions, tasks: list[str]) -> None:  # type: ignore[override]
        if options.drop_task is not None and options.drop_task not in tasks:
            raise GandaError(f"--drop-task {options.drop_task} is not among --task {','.join(tasks)}")

    def run_tasks(self, adapter: ModelAdapter, scorer: Scorer, options: PruneOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> Any:
        drop = options.drop_task or ("mmlu" if "mmlu" in scorer.tasks else scorer.tasks[0])
        minimal = options.minimal
        if not options.remove_restore or minimal is None:
            curve = prune_curve(adapter, scorer, step=options.layers, min_layers=options.min_layers, drop_task=drop)
            if not options.remove_restore:
                return self.finish(curve, out_dir)
            self.finish(curve, out_dir / "prune")
            if "minimal_layers" not in curve.summary:
                raise GandaError("could not find the minimal model; pass --minimal N")
            minimal = int(curve.summary["minimal_layers"])
        return self.finish(remove_restore(adapter, scorer, minimal, drop_task=drop), out_dir)
