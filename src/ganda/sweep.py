"""Exhaustive single-head ablation sweeps, fast and resumable.

``run_sweep(adapter, examples)`` ablates every head of every layer, one at a time, and scores
the same multiple-choice examples under each ablation. It returns (and writes) per-head
accuracy, per-prompt predictions and choice log-likelihoods that equal those of the naive
loop ::

    for head in adapter.heads():
        evaluate_examples(adapter, examples, [AblateHeads([head])])

(predictions identical, log-likelihoods to float tolerance; ``naive=True`` runs exactly that
loop, and the tests and ``benchmarks/bench_sweep.py`` check the two agree), but much faster:

* **Layer skipping.** Ablating a head of layer L leaves layers 0..L-1 untouched, so the
  residual stream entering layer L is taken from one intact pass per prompt and only layers
  L..end are recomputed. Layers are visited in order, so only the current layer's residual
  per prompt is held in memory (one intact pass is advanced a layer at a time).
* **Head batching.** The heads of a layer are ablated in one forward: the residual is
  repeated once per head along the batch dimension and a per-row mask at the output
  projection's input zeroes a different head in each row.
* **Examples grouped.** Consecutive examples run as one batch (their packed layouts right-padded
  to the longest, a pad seen by no real token) when a batch ablates few heads, so that a forward
  holds a few hundred tokens on a CPU (:class:`Batching`, ``GANDA_FORWARD_TOKENS``): verifying
  one or two heads of a layer then costs per row what the whole layer's batch does. Grouping
  changes an example's log-likelihoods only by float rounding (at most 2.3e-5 on SmolLM2 KV6).
* **Shared context.** An example's choices are packed into one sequence: the tokens all its
  ``context + choice`` rows share are run once and each choice's remaining tokens follow,
  with a block attention mask (each choice sees the shared prefix and itself) and position
  ids that continue the prefix. That is the KV-cache trick without a cache object; for
  single-token choices (MMLU letters) it is exactly one forward of the context.
* **Logits only where read, for every head at once.** The LM head runs only at the positions
  whose next-token log-probabilities are summed, not at every position, and once per example
  and batch of heads: each LM-head call streams the whole output embedding (49,152 × 576 for
  SmolLM2) however few rows it gets, so the distinct read rows of all heads of a batch share one
  call (a position that several choices read, such as the last context token, is read once).
* **No pass of its own for the intact model.** Its scores come from the final residuals of the
  pass that records each layer's inputs.

The fast path runs decoder layers by hand through the forward engine
(:class:`ganda.engine.LayerCalls`): one intact pass records the arguments the model itself gives
each decoder layer (its rotary embeddings, masks, position ids) and replays them, so each family's
own conventions are kept. Families declare what it may use (:meth:`ModelAdapter.skips_layers`,
:meth:`ModelAdapter.packs_choices`): Llama-layout Transformers skip layers and pack choices;
other families (SSMs, hybrids) run full forwards (still batched over heads, with the per-row
mask). Head and layer ids are those of the model as loaded, so a sweep runs inside layer edits
too (``RemoveLayers``, ``KeepLayers``): it ablates the heads of the running layers.

Resumable: ``out_dir/progress.jsonl`` (a :class:`ganda.runio.Journal`) gets one JSON line per
finished head (flushed immediately). A run killed at any point (even SIGKILL) continues where it stopped, and heads
are computed in fixed batches (a partially written batch is recomputed whole), so the final
``results.jsonl`` / ``results.csv`` / ``heatmap.png`` are identical to an uninterrupted run's.
The progress header records the weights' fingerprint (:func:`weights_fingerprint`) and dtype: a
resume on changed weights is refused rather than mixing two models' numbers. ``out_dir`` is
locked for the run (:func:`ganda.runio.run_dir_lock`), so two sweeps never write into one
directory, and every result file is written atomically.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import runio
from .ablation import check_batched_ablation, reference_means
from .effects import effect, margin, mean_margin_or_nan, ordered, split
from .engine import LayerCalls, Trace, logprobs
from .errors import GandaError, env_number
from .figures import pyplot, save_figure
from .fingerprint import fingerprint
from .finite import check_scores
from .heads import HeadId, expand, require_heads, running_heads
from .interventions import AblateHeads, apply, row_ablations
from .models.base import ModelAdapter
from .models.loading import model_path
from .options import Options, option
from .prepared import BatchItem, Prepared, batch_item, make_batch, prepare_all
from .progress import tqdm
from .scoring import ChoiceScores, examples_digest, score_example
from .stats import paired_intervals
from .tasks.base import Example

# ---------------------------------------------------------------------------------------------
# the engines


@dataclass
class _Reads:
    """Where a group of examples' choice log-probabilities are read, in one head's copy of the
    group's batch rows (:class:`_FastEngine` runs several examples as one batch).

    ``rows``/``pos``: the distinct (row, position) sites of every example of the group in turn
    (choices that share the last context token read the same site once); per read, in choice
    order: its site and target token; ``choices``: how many choices each example has."""

    copy: int  # batch rows per head copy
    rows: list[int]
    pos: list[int]
    site: list[int]
    target: list[int]
    lengths: list[int]  # reads per choice, the group's examples in turn
    choices: list[int]


def _reads(items: list[BatchItem]) -> _Reads:
    """The distinct read sites of ``items``, whose rows in turn make one copy (packed: example j is
    row j; in rows: the group is one example whose rows are the copy's)."""
    sites: dict[tuple[int, int], int] = {}
    site, target, lengths = [], [], []
    r0 = 0
    for it in items:
        for row, positions, targets in it.reads:
            for k, tok in zip(positions, targets, strict=True):
                site.append(sites.setdefault((r0 + row, k), len(sites)))
                target.append(tok)
            lengths.append(len(targets))
        r0 += len(it.rows)
    return _Reads(r0, [r for r, _ in sites], [k for _, k in sites], site, target, lengths,
                  [len(it.reads) for it in items])


# Rows of final residuals per LM-head call: the call streams the whole [V, d_model] output
# embedding however few rows it gets, so the read rows of every head of a batch share one call;
# the bound keeps the [rows, V] fp32 logits near 64 MiB (341 rows of SmolLM2's 49,152-token vocabulary).
_LM_HEAD_LOGITS = 1 << 24

# Tokens per layer forward that the layer-skipping engine aims for on a CPU: a forward of one short
# row costs far more per row than one of several hundred tokens (SmolLM2, one CPU thread, layers
# 5-29 of 16 KV6 prompts of ~61 tokens: 5.0 CPU s one prompt a forward, 2.9 s all 16 in one; a
# layer's 9 heads on one prompt, 549 tokens, are within 6% of the best, and 16 prompts of them 43%
# slower). On a GPU a forward's cost hardly grows with its rows until they are many, so the budget
# there is set by memory instead. GANDA_FORWARD_TOKENS overrides both (1: every example alone).
FORWARD_TOKENS_CPU = 768
FORWARD_TOKENS_GPU = 32768


def forward_tokens(gpu: bool = False) -> int:
    """The token budget of one layer forward: ``GANDA_FORWARD_TOKENS`` where set, else the CPU's or a GPU's."""
    return int(env_number("GANDA_FORWARD_TOKENS", FORWARD_TOKENS_GPU if gpu else FORWARD_TOKENS_CPU, "tokens",
                          low=1, whole=True))


@dataclass(frozen=True)
class Batching:
    """How :class:`_FastEngine` shapes its forwards: ``examples`` consecutive examples to a forward
    and, when that is more than one, no more heads of a batch to a forward than keep examples x
    heads x width within ``tokens`` (a layer of many heads then runs in several forwards, so that
    grouping the examples, which helps batches of one or two heads, does not swell the big ones)."""

    examples: int = 1
    tokens: int = 0

    def heads_per_forward(self, width: int, heads: int) -> int:
        """Heads of a batch of ``heads`` that one forward of examples ``width`` tokens wide holds."""
        if self.examples == 1 or not self.tokens:
            return heads
        return max(1, min(heads, self.tokens // (self.examples * max(1, width))))


def batching(packed: Sequence[Prepared], batches: Sequence[Sequence[HeadId | None]], gpu: bool = False) -> Batching:
    """The engine's :class:`Batching` for ``batches``: as many examples a forward as keep the median
    batch's heads times the examples' mean packed width within :func:`forward_tokens` (one at least)."""
    width = sum(len(p.tokens) for p in packed) / max(1, len(packed))
    return batching_for(width, [len(b) for b in batches if b and b[0] is not None], forward_tokens(gpu))


def batching_for(width: float, head_batches: Sequence[int], tokens: int) -> Batching:
    """:func:`batching` from the mean packed width, each head batch's size and the token budget
    (what ``ganda plan`` knows of a run)."""
    sizes = sorted(head_batches) or [1]
    return Batching(max(1, math.floor(tokens / (sizes[len(sizes) // 2] * max(1.0, width)))), tokens)


def _groups(adapter: ModelAdapter, packed: Sequence[Prepared], size: int) -> list[list[int]]:
    """Example indices run as one batch: the packable examples among ``i*size .. i*size+size-1``
    (fixed blocks, so a shard starting at a multiple of ``size`` groups as the whole set does);
    an example that does not pack runs alone."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(packed):
        key = (i // size, -1) if adapter.packs_choices(len(p.tokens)) else (i // size, i)
        groups.setdefault(key, []).append(i)
    return sorted(groups.values())


class _FastEngine:
    """Layer skipping: each example's intact residual is advanced a layer at a time, and a batch
    of ablations of one layer runs only that layer and the ones after it (:class:`LayerCalls`).
    Examples run several to a forward (right-padded packed layouts, :func:`ganda.prepared.make_batch`;
    :class:`Batching`); a group's read rows under every head of a batch go through the LM head together."""

    @torch.no_grad()
    def __init__(self, adapter: ModelAdapter, packed: list[Prepared], shape: Batching = Batching(),
                 means: dict[tuple[int, str], torch.Tensor] | None = None) -> None:
        self.adapter = adapter
        self.packed = packed
        self.shape = shape
        self.means = means  # mean ablation (ganda.ablation); None: zero
        self.groups = _groups(adapter, packed, max(1, shape.examples))
        self.calls: list[LayerCalls] = []
        self.reads: list[_Reads] = []  # per group
        dtype = next(adapter.model.parameters()).dtype
        for idx in self.groups:
            packs = adapter.packs_choices(len(packed[idx[0]].tokens))
            items = [batch_item(packed[i], i, packs) for i in idx]
            if packs:
                batch = make_batch(adapter, items, True, dtype)
                self.calls.append(LayerCalls(adapter, batch.ids, batch.mask, batch.position_ids))
            else:  # one example, the scorer's own rows
                self.calls.append(LayerCalls(adapter, *packed[idx[0]].row_tensors(adapter)))
            self.reads.append(_reads(items))
        self.layers = self.calls[0].layers if self.calls else adapter.active_layers()
        self.state = [c.h0 for c in self.calls]
        # the recording pass's last residual is the intact model's: the baseline needs no pass of its own
        self.final: list[torch.Tensor] | None = [c.final for c in self.calls if c.final is not None]
        for c in self.calls:
            c.final = None
        self.at = 0  # position (in the running layers) of the layer the state enters

    def advance_to(self, pos: int) -> None:
        """Move each group's intact residual forward to the input of the running layer at ``pos``."""
        if pos < self.at:
            raise RuntimeError("layers must be visited in order")
        with torch.no_grad():
            while self.at < pos:
                self.state = [c.run(self.at, h) for h, c in zip(self.state, self.calls, strict=True)]
                self.at += 1

    @torch.no_grad()
    def score(self, layer: int | None, heads: Sequence[HeadId | None]) -> list[list[list[float]]]:
        """Per batch entry, per example, the choices' summed log-likelihoods (``layer``: the id of
        the layer whose heads are ablated; None: from the first running layer)."""
        finals, self.final = self.final, None
        if layer is None and finals is not None and all(h is None for h in heads):  # the intact model
            return self._read_out([f.repeat(len(heads), 1, 1) for f in finals], len(heads))
        start = 0 if layer is None else self.layers.index(layer)
        self.advance_to(start)
        finals = []
        for calls, h in zip(self.calls, self.state, strict=True):
            step = self.shape.heads_per_forward(h.shape[1], len(heads))
            parts = [self._run_from(start, calls, h, heads[i : i + step]) for i in range(0, len(heads), step)]
            finals.append(parts[0] if len(parts) == 1 else torch.cat(parts))  # head-major rows, as one forward's
        return self._read_out(finals, len(heads))

    def _run_from(self, start: int, calls: LayerCalls, h: torch.Tensor, heads: Sequence[HeadId | None]) -> torch.Tensor:
        """The final residuals ``[len(heads) * rows, T, d]`` of ``h`` (a group's state at ``start``) run
        on with ``heads[i]`` ablated in copy i."""
        b = len(heads)
        edit = row_ablations(self.adapter, heads, self.means)
        x = h.repeat(b, 1, 1) if b > 1 else h
        for pos in range(start, len(self.layers)):
            if pos == start and edit:
                with Trace(self.adapter, edit=edit):
                    x = calls.run(pos, x, b)
            else:
                x = calls.run(pos, x, b)
        return x

    def _read_out(self, finals: list[torch.Tensor], b: int) -> list[list[list[float]]]:
        """Summed choice log-likelihoods from each group's final residuals ``[b * copy, T, d]``.

        Per group, the distinct read rows of all ``b`` head copies go through the LM head in one
        call (split only past :data:`_LM_HEAD_LOGITS`), then are scattered back to their choices."""
        vocab = getattr(getattr(self.adapter.model, "config", None), "vocab_size", None) or 1 << 15
        step = max(1, _LM_HEAD_LOGITS // vocab)
        out: list[list[list[float]]] = [[[] for _ in self.packed] for _ in range(b)]
        for x, rd, idx in zip(finals, self.reads, self.groups, strict=True):
            dev, u, n_c = x.device, len(rd.rows), len(rd.lengths)
            copies = torch.arange(b, device=dev)[:, None] * rd.copy
            rows = (copies + torch.tensor(rd.rows, device=dev)[None]).reshape(-1)
            hidden = x[rows, torch.tensor(rd.pos, device=dev).repeat(b)]  # [b * u, d]
            site = (torch.arange(b, device=dev)[:, None] * u + torch.tensor(rd.site, device=dev)[None]).reshape(-1)
            target = torch.tensor(rd.target, device=dev).repeat(b)
            vals = torch.empty(site.shape[0], dtype=torch.float32, device=dev)
            for s in range(0, hidden.shape[0], step):
                lp = logprobs(self.adapter, hidden[s : s + step])
                sel = (site >= s) & (site < s + step)
                vals[sel] = lp[site[sel] - s, target[sel]]
            lengths = torch.tensor(rd.lengths, device=dev).repeat(b)
            seg = torch.repeat_interleave(torch.arange(b * n_c, device=dev), lengths)  # read -> (head, choice)
            sums = torch.zeros(b * n_c, dtype=torch.float32, device=dev).index_add_(0, seg, vals).tolist()
            for bi in range(b):
                at = bi * n_c
                for i, k in zip(idx, rd.choices, strict=True):
                    out[bi][i] = sums[at : at + k]
                    at += k
        return out


class _FallbackEngine:
    """Full forwards (families that do not skip layers), batched over heads with per-row masks."""

    def __init__(self, adapter: ModelAdapter, packed: list[Prepared],
                 means: dict[tuple[int, str], torch.Tensor] | None = None) -> None:
        self.adapter = adapter
        self.packed = packed
        self.dev = adapter.device
        self.means = means

    @torch.no_grad()
    def score(self, layer: int | None, heads: Sequence[HeadId | None]) -> list[list[list[float]]]:
        b = len(heads)
        edit = row_ablations(self.adapter, heads, self.means)
        out: list[list[list[float]]] = [[] for _ in range(b)]
        for i, p in enumerate(self.packed):
            ids, mask = p.row_tensors(self.adapter)
            c = ids.shape[0]
            ids_b = ids.repeat(b, 1)
            mask_b = mask.repeat(b, 1) if mask is not None else None
            with Trace(self.adapter, edit=edit):
                logp = torch.log_softmax(self.adapter.forward(ids_b, attention_mask=mask_b).float(), -1)
            reads = [(row, torch.tensor(ks, device=self.dev), torch.tensor(ts, device=self.dev))
                     for row, ks, ts in batch_item(p, i, False).reads]
            for bi in range(b):
                out[bi].append([float(logp[bi * c + row, ks, ts].sum()) for row, ks, ts in reads])
        return out


# ---------------------------------------------------------------------------------------------
# records, files, resume


def sweep_record(head: HeadId | None, packed: list[Prepared], logliks: list[list[float]]) -> dict[str, Any]:
    """One line of a sweep's journal: the intact ``"baseline"`` (``head`` None) or a ``"head"`` ablated,
    scored from its choices' log-likelihoods per prompt (predictions, accuracy and lm-eval's
    acc_norm). Every analysis that scores heads the sweep's way (``ganda extends``' controls too)
    writes this record."""
    scores = [ChoiceScores(ll, p.n_chars) for p, ll in zip(packed, logliks, strict=True)]
    preds, preds_norm = [s.pred for s in scores], [s.pred_norm for s in scores]
    n = len(packed)
    correct = sum(int(pr == p.gold) for pr, p in zip(preds, packed, strict=True))
    correct_norm = sum(int(pr == p.gold) for pr, p in zip(preds_norm, packed, strict=True))
    rec: dict[str, Any] = {"type": "baseline" if head is None else "head"}
    if head is not None:
        rec.update({"head": str(head), "layer": head.layer, "index": head.head, "kind": head.kind})
    rec.update(
        {
            "n": n,
            "correct": correct,
            "acc": correct / n if n else 0.0,
            "acc_norm": correct_norm / n if n else 0.0,
            "pred": preds,
            "pred_norm": preds_norm,
            "gold": [p.gold for p in packed],
            "loglik": logliks,
        }
    )
    return rec


def _require_finite(adapter: ModelAdapter, packed: list[Prepared], rec: dict[str, Any],
                    means: dict[tuple[int, str], torch.Tensor] | None = None) -> None:
    """Refuse a record with a non-finite log-likelihood before it is written: its prompt is run again
    (under the record's ablation) to name the module where the non-finite values first appear."""
    bad = next((i for i, ll in enumerate(rec["loglik"]) if not all(math.isfinite(v) for v in ll)), None)
    if bad is None:
        return
    head = rec.get("head")
    how = "mean" if means is not None else "zero"
    with apply(adapter, [AblateHeads([head], how=how, means=means)] if head else []):
        check_scores(rec["loglik"][bad], f"prompt {bad} with {head} ablated" if head else f"prompt {bad}",
                     adapter, packed[bad].rows[0][: packed[bad].ctx_lens[0]])


def _well_formed(rec: dict[str, Any]) -> bool:
    lists = [rec.get(k) for k in ("pred", "pred_norm", "gold", "loglik")]
    return (isinstance(rec.get("n"), int) and all(isinstance(x, list) and len(x) == rec["n"] for x in lists)
            and all(isinstance(ll, list) and all(isinstance(v, int | float) and math.isfinite(v) for v in ll)
                    for ll in rec["loglik"]))


SWEEP_METRICS = ("acc", "acc_norm", "margin")  # what a sweep ranks heads by (ganda.effects)
#: results.csv's interval columns, after the drops (:meth:`SweepResult.intervals`)
CI_COLUMNS = tuple(f"{d}_ci_{end}" for d in ("drop", "drop_norm", "margin_drop") for end in ("low", "high"))


def has_per_prompt_lists(rec: dict[str, Any]) -> bool:
    """Whether a record keeps its prompts' predictions, golds and log-likelihoods (an older or
    trimmed file may not): what per-prompt rows and paired intervals are made of."""
    return all(isinstance(rec.get(k), list) for k in ("pred", "pred_norm", "gold", "loglik"))


@dataclass
class SweepResult:
    """A sweep's numbers. A head's effect is the drop of a metric when it is ablated, intact minus
    ablated (:mod:`ganda.effects`): ``"acc"``, ``"acc_norm"`` or ``"margin"`` (the mean margin);
    ``metric`` is the one heads are ranked by."""

    config: dict[str, Any]
    baseline: dict[str, Any]
    records: list[dict[str, Any]]  # one per head, in head order
    seconds: float = 0.0
    out_dir: Path | None = None
    metric: str = "acc"
    seed: int | None = None  # the intervals' bootstrap seed where it is not the config's (a ranking's verification)
    _intervals: dict[str, dict[str, float]] | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def value(rec: dict[str, Any], metric: str = "acc") -> float:
        """A record's ``metric``: its accuracy, normalised accuracy or mean margin (NaN where a prompt
        has a single choice)."""
        if metric == "margin":
            return mean_margin_or_nan(rec["loglik"], rec["gold"])
        return rec[metric]

    def drop(self, rec: dict[str, Any], metric: str = "acc") -> float:
        """The head's effect on ``metric``: intact minus ablated (positive: the head helps)."""
        return effect(self.value(self.baseline, metric), self.value(rec, metric))

    @staticmethod
    def gold_loglik(rec: dict[str, Any]) -> float:
        """Mean log-likelihood of the gold choice over the prompts."""
        lls = [ll[g] for ll, g in zip(rec["loglik"], rec["gold"], strict=True)]
        return sum(lls) / max(1, len(lls))

    def ll_drop(self, rec: dict[str, Any]) -> float:
        """How much ablating the head lowers the gold choice's mean log-likelihood."""
        return self.gold_loglik(self.baseline) - self.gold_loglik(rec)

    def effects(self, metric: str | None = None) -> dict[str, float]:
        """Every head's effect on ``metric`` (default: the ranking metric), in head order."""
        return {r["head"]: self.drop(r, metric or self.metric) for r in self.records}

    def _ranked(self, metric: str | None) -> tuple[dict[str, float], dict[str, float]]:
        """What heads are ordered by: their effects on ``metric`` (default: the ranking metric), and
        for ties their effects on the other of accuracy and margin."""
        metric = metric or self.metric
        return self.effects(metric), self.effects("acc" if metric == "margin" else "margin")

    def _records(self, heads: Sequence[str]) -> list[dict[str, Any]]:
        by = {r["head"]: r for r in self.records}
        return [by[h] for h in heads]

    def top(self, k: int | None = 10, metric: str | None = None) -> list[dict[str, Any]]:
        """The first ``k`` heads by signed effect on ``metric`` (default: the ranking metric),
        largest first: heads whose ablation hurts most lead, those whose ablation helps come last
        (ties: the larger effect on the other of accuracy and margin first, then head order)."""
        return self._records(ordered(*self._ranked(metric))[:k])

    def matter(self, metric: str | None = None) -> list[dict[str, Any]]:
        """The heads whose ablation lowers ``metric`` (positive effect), largest effect first."""
        return self._records(split(*self._ranked(metric))[0])

    def helpful_when_ablated(self, metric: str | None = None) -> list[dict[str, Any]]:
        """The heads whose ablation raises ``metric`` (negative effect), most negative first."""
        return self._records(split(*self._ranked(metric))[1])

    @staticmethod
    def per_prompt(rec: dict[str, Any], metric: str = "acc") -> list[float]:
        """A record's ``metric`` per prompt: 1.0 or 0.0 for ``"acc"`` (``"acc_norm"``: by the
        normalised prediction), the margin for ``"margin"`` (what a paired bootstrap over prompts takes)."""
        if metric == "margin":
            return [margin(ll, g) for ll, g in zip(rec["loglik"], rec["gold"], strict=True)]
        preds = rec["pred_norm"] if metric == "acc_norm" else rec["pred"]
        return [float(p == g) for p, g in zip(preds, rec["gold"], strict=True)]

    def intervals(self) -> dict[str, dict[str, float]]:
        """Each head's paired 95% intervals of its drops (``drop``, ``drop_norm``, ``margin_drop``:
        ``<name>_ci_low``/``_ci_high``): a percentile bootstrap over the prompts, intact minus
        ablated prompt by prompt, 2000 resamples seeded by the run's seed and drawn once for every
        head (:func:`ganda.stats.paired_intervals`: the intervals :func:`ganda.stats.paired_difference`
        gives one head at a time). A drop on 40 prompts is read with its uncertainty; a record
        without its per-prompt lists, or a margin where a prompt has one choice, has none."""
        if self._intervals is None:
            self._intervals = {r["head"]: {} for r in self.records}
            base = self.baseline
            with_lists = [r for r in self.records if has_per_prompt_lists(r) and has_per_prompt_lists(base)
                          and len(r["gold"]) == len(base["gold"])]
            seed = self.seed if self.seed is not None else int(self.config.get("seed", 0) or 0)
            for metric, name in (("acc", "drop"), ("acc_norm", "drop_norm"), ("margin", "margin_drop")):
                if not with_lists or (metric == "margin" and any(len(ll) < 2 for ll in base["loglik"])):
                    continue
                ablated = {r["head"]: self.per_prompt(r, metric) for r in with_lists}
                for h, ci in paired_intervals(self.per_prompt(base, metric), ablated, name, seed).items():
                    self._intervals[h].update(ci)
        return self._intervals

    def row(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A head's record without its per-prompt lists, with each effect its record allows (the one
        place effects are computed from records): ``drop`` (accuracy), ``drop_norm`` (normalised
        accuracy), ``gold_loglik_drop`` and ``margin_drop`` (from the log-likelihoods)."""
        out = {k: v for k, v in rec.items() if k not in PER_PROMPT and k != "type"}
        if _numbers(rec, self.baseline, "acc"):
            out["drop"] = self.drop(rec)
        if _numbers(rec, self.baseline, "acc_norm"):
            out["drop_norm"] = self.drop(rec, "acc_norm")
        if all(isinstance(r.get("loglik"), list) and isinstance(r.get("gold"), list) for r in (rec, self.baseline)):
            out["gold_loglik_drop"] = self.ll_drop(rec)
            if not math.isnan(m := self.drop(rec, "margin")):
                out["margin_drop"] = m
        if "head" in rec:
            out.update(self.intervals().get(rec["head"], {}))
        return out

    def matrix(self, metric: str = "acc", kind: str | None = None) -> torch.Tensor:
        """``[layers, heads]`` effect on ``metric`` (NaN where a head was not swept)."""
        recs = [r for r in self.records if kind is None or r.get("kind") == kind]
        n_l = max((r["layer"] for r in recs), default=-1) + 1
        n_h = max((r["index"] for r in recs), default=-1) + 1
        m = torch.full((n_l, n_h), float("nan"))
        for r in recs:
            m[r["layer"], r["index"]] = self.drop(r, metric)
        return m

    def write(self, out_dir: Path) -> None:
        """``results.jsonl``, ``results.csv`` and ``heatmap.png``, each written atomically."""
        with runio.atomic_open(out_dir / "results.jsonl") as f:
            f.write(json.dumps({"type": "header", "config": self.config, "metric": self.metric,
                                **({"seed": self.seed} if self.seed is not None else {})}) + "\n")
            f.write(json.dumps(self.baseline) + "\n")
            for r in self.records:
                f.write(json.dumps(r) + "\n")
        with runio.atomic_open(out_dir / "results.csv", newline="") as f:
            w = csv.writer(f)
            w.writerow(["head", "layer", "index", "kind", "n", "correct", "acc", "acc_norm", "drop", "drop_norm",
                        "gold_loglik", "gold_loglik_drop", "margin", "margin_drop", *CI_COLUMNS])
            w.writerow(["none", "", "", "", self.baseline["n"], self.baseline["correct"], self.baseline["acc"],
                        self.baseline["acc_norm"], 0.0, 0.0, self.gold_loglik(self.baseline), 0.0,
                        self.value(self.baseline, "margin"), 0.0, *[""] * len(CI_COLUMNS)])
            cis = self.intervals()
            for r in self.records:
                w.writerow([r["head"], r["layer"], r["index"], r["kind"] or "", r["n"], r["correct"], r["acc"],
                            r["acc_norm"], self.drop(r), self.drop(r, "acc_norm"), self.gold_loglik(r),
                            self.ll_drop(r), self.value(r, "margin"), self.drop(r, "margin"),
                            *[cis[r["head"]].get(c, "") for c in CI_COLUMNS]])
        self.heatmap(out_dir / "heatmap.png")

    def heatmap(self, path: Path, metric: str | None = None) -> None:
        """Every head's effect on ``metric`` (default: the ranking metric) on a layers x heads grid."""
        metric = metric or self.metric
        plt = pyplot()
        kinds = sorted({r.get("kind") or "" for r in self.records}) or [""]
        fig, axes = plt.subplots(1, len(kinds), figsize=(4 + 3 * len(kinds), 6), squeeze=False)
        for ax, kind in zip(axes[0], kinds, strict=True):
            m = self.matrix(metric, kind or None).numpy()
            lim = max(1e-9, float(abs(m[~(m != m)]).max()) if m.size and (m == m).any() else 1.0)
            im = ax.imshow(m, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower", interpolation="nearest")
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(f"{kind + ' ' if kind else ''}{metric} drop when ablated")
            fig.colorbar(im, ax=ax, label=f"baseline {metric} {self.value(self.baseline, metric):.3f} minus ablated")
        model = self.config.get("model", "")
        task = self.config.get("task", {})
        fig.suptitle(f"{model}: {task.get('task', '?') if isinstance(task, dict) else task} (n={self.baseline['n']})")
        fig.tight_layout()
        save_figure(fig, path, dpi=120, tight=False)


def _batches(heads: Sequence[HeadId], batch_heads: int) -> list[list[HeadId]]:
    """Fixed batches: consecutive heads of the same mixer, at most ``batch_heads`` each."""
    out: list[list[HeadId]] = []
    for h in heads:
        if out and len(out[-1]) < batch_heads and out[-1][0].layer == h.layer and out[-1][0].kind == h.kind:
            out[-1].append(h)
        else:
            out.append([h])
    return out


ABLATION_HELP = ("what an ablated head's slice becomes: zero or mean (its mean over every token of the scored "
                 "prompts); resample needs a donor per scored row: eval runs it (docs/heads.md)")
HEADS_HELP = "only these heads (default: all), e.g. 'L16H*' or 'L*H0,L17H3'"


@dataclass
class SweepOptions(Options):
    """How :func:`run_sweep` (``ganda sweep``, a grid's ``sweep`` jobs) ablates and ranks the heads;
    ``top``, ``until_chance`` and ``max_heads`` are ``ganda sweep``'s own."""

    heads: str | None = option(None, HEADS_HELP)
    batch_heads: int = option(16, "heads of one layer ablated per forward", low=1)
    naive: bool = option(False, "the reference loop (AblateHeads + scoring per head), slow")
    metric: str = option("acc", "rank heads by the drop of acc (accuracy), acc_norm or margin (mean margin) when "
                         "each is ablated", choices=SWEEP_METRICS)
    ablation: str = option("zero", ABLATION_HELP)
    top: int = option(15, "rows in each printed table", low=1, journal=False)
    until_chance: bool = option(False, "then ablate the heads that matter cumulatively, most damaging first, until "
                                "accuracy is at chance: how many heads must go", journal=False)
    max_heads: int = option(24, "--until-chance: give up after this many heads", low=1, journal=False)

    def check(self) -> None:
        require_heads(self.flag("heads"), self.heads)
        check_batched_ablation(self.ablation, self.flag("ablation"), "the sweep engine")
        if self.ablation != "zero" and self.until_chance:
            raise GandaError(f"{self.flag('ablation')} {self.ablation} runs without {self.flag('until_chance')}; "
                             f"drop {self.flag('until_chance')}")
        self.needs("max_heads", "until_chance", "bounds")


def run_sweep(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    options: SweepOptions | None = None,
    *,
    heads: Sequence[HeadId] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    config: dict[str, Any] | None = None,
    on_head: Callable[[dict[str, Any]], None] | None = None,
    seed: int | None = None,
    **overrides: Any,
) -> SweepResult:
    """Ablate each head alone and score ``examples`` (see the module docstring).

    ``options`` (default :class:`SweepOptions`' defaults) may be given field by field as keywords
    instead, e.g. ``run_sweep(ad, exs, ablation="mean", naive=True)``. ``heads`` (default: the
    ``heads`` option's, else every head of the running layers; a head of a layer that a layer edit
    removes is refused) are the heads swept. ``config`` (task options, seed, ...) is recorded and
    must match on resume, as must the weights (their fingerprint) and the dtype. ``naive`` runs the
    reference loop (``AblateHeads`` + ``evaluate_examples`` per head) with the same output format.
    ``on_head`` is called with each finished head's record. ``seed`` (default: ``config``'s seed,
    else 0) seeds the bootstrap of the intervals; it changes no measured number, so it is not part
    of what a resume must match (a ranking gives its own to its verification). ``metric`` is the effect the result
    ranks heads by (:meth:`SweepResult.top`). ``ablation`` ``"mean"`` sets each head's slice to its
    mean over every token of ``examples`` (:mod:`ganda.ablation`: the numbers ``eval --ablation
    mean`` gives); resample needs each scored row's own donor, which batched heads do not have, and
    is refused.
    """
    o = SweepOptions.build({**(options.to_json() if options is not None else {}), **overrides})
    t0 = time.perf_counter()
    if heads is None and o.heads:
        heads = expand(o.heads, adapter)
    heads = running_heads(adapter, heads, "sweep")
    if not examples:
        raise GandaError("no examples to sweep")
    means = _mean_reference(adapter, examples, heads) if o.ablation == "mean" else None
    packed = prepare_all(adapter, examples)
    cfg = {
        "model": adapter.spec,
        "n": len(examples),
        "heads": [str(h) for h in heads],
        "prompts_sha": examples_digest(examples),
        **(config or {}),
        "ablation": o.ablation,
    }
    out = Path(out_dir) if out_dir is not None else None
    with runio.run_dir_lock(out) if out is not None else contextlib.nullcontext():
        if out is not None:
            cfg["weights"] = weights_fingerprint(adapter)
            cfg["dtype"] = str(next(adapter.model.parameters()).dtype).removeprefix("torch.")
        return _sweep(adapter, examples, packed, heads, cfg, out, resume, o.naive, o.batch_heads, progress, on_head,
                      t0, o.metric, means, seed)


def _mean_reference(adapter: ModelAdapter, examples: Sequence[Example], heads: list[HeadId]
                    ) -> dict[tuple[int, str], torch.Tensor]:
    """Mean ablation's values: each swept head's mixer averaged over every token of the prompts
    (:mod:`ganda.ablation`). Workers do not receive them, so a mean sweep runs in this process."""
    if _SCORERS:
        raise GandaError("--ablation mean runs in this process only, not on workers")
    return reference_means(adapter, examples, list({id(m): m for m in map(adapter.mixer_of, heads)}.values()))


_RESULT_FILES = ("result.json", "results.jsonl", "results.csv", "heatmap.png", "cumulative.json", "cumulative.csv", "cumulative.png")


_FIELDS = {"baseline": ("n", "acc", "acc_norm", "pred", "pred_norm", "gold", "loglik"),
           "head": ("head", "layer", "index", "n", "acc", "acc_norm", "pred", "pred_norm", "gold", "loglik")}


def _record_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a line of a sweep's journal (None: the baseline's or one head's record
    with all its fields and finite scores)."""
    kind = rec.get("type")
    if kind not in _FIELDS:
        return f"a record of type {kind!r}"
    if missing := [f for f in _FIELDS[kind] if f not in rec]:
        return f"a {kind} record without {', '.join(missing)}"
    return None if _well_formed(rec) else f"a {kind} record whose scores are malformed or not finite"


def _resumed(out: Path | None, cfg: dict[str, Any], resume: bool
             ) -> tuple[runio.Journal | None, dict[str, dict[str, Any]], dict[str, Any] | None]:
    """The sweep's journal (``out/progress.jsonl``, opened) and what an earlier run of the same
    sweep finished there: each head's record by name and the baseline. A new journal clears an
    earlier sweep's result files, which would otherwise sit beside this one's."""
    done: dict[str, dict[str, Any]] = {}
    baseline: dict[str, Any] | None = None
    if out is None:
        return None, done, baseline
    journal = runio.Journal(out / "progress.jsonl", cfg, "sweep", resume=resume, check=_record_problem)
    journal.open()
    for rec in journal.records:
        if rec["type"] == "baseline":
            baseline = rec
        else:
            done[rec["head"]] = rec
    if journal.fresh:  # a new sweep: results of an earlier one in this directory would sit beside it
        for name in _RESULT_FILES:
            (out / name).unlink(missing_ok=True)
    return journal, done, baseline


def _sweep(adapter, examples, packed, heads, cfg, out, resume, naive, batch_heads, progress, on_head, t0, metric, means=None,
           seed=None):
    journal, done, baseline = _resumed(out, cfg, resume)

    def note() -> None:
        if journal is not None:
            n = len(done)
            runio.set_interrupt_note(f"{n} head{'s' if n != 1 else ''} saved, rerun the same command to resume")

    note()
    todo = [h for h in heads if str(h) not in done]
    bar = tqdm(total=len(heads), initial=len(heads) - len(todo), desc="sweep", unit="head", disable=not progress)
    try:
        scored = (_naive(adapter, examples, heads, done, baseline is None, means) if naive else
                  _batched(adapter, examples, packed, heads, done, baseline is None, means, batch_heads))
        for head, logliks in scored:  # each record is journalled as its scores come back
            rec = sweep_record(head, packed, logliks)
            _require_finite(adapter, packed, rec, means)
            if journal is not None:
                journal.append(rec)
            if head is None:
                baseline = rec
                note()
                continue
            done[str(head)] = rec
            note()
            bar.update(1)
            if on_head:
                on_head(rec)
    finally:
        bar.close()
        if journal is not None:
            journal.close()
    assert baseline is not None
    result = SweepResult(cfg, baseline, [done[str(h)] for h in heads], time.perf_counter() - t0, out, metric, seed)
    if out is not None:
        try:
            result.write(out)
        except GandaError as exc:
            raise GandaError(f"{exc}; every head is kept in {out / 'progress.jsonl'}: rerun the same command to "
                             "write the results") from None
    runio.set_interrupt_note(None)
    return result


Scored = Iterator[tuple[HeadId | None, list[list[float]]]]  # (head or None: the intact model, its log-likelihoods)


def _batched(adapter: ModelAdapter, examples: Sequence[Example], packed: list[Prepared], heads: list[HeadId],
             done: dict[str, dict[str, Any]], baseline: bool, means: Any, batch_heads: int) -> Scored:
    """The batched engine's part of :func:`run_sweep`: the intact model (``baseline``: not yet
    scored) and every head not in ``done``, up to ``batch_heads`` of one layer per pass, scored here
    or by the installed executor, each as its batch comes back (a batch left partly done is scored whole)."""
    batches: list[list[HeadId | None]] = [[None]] if baseline else []
    batches += [b for b in _batches(heads, batch_heads) if not all(str(h) in done for h in b)]
    scores = _SCORERS[-1](adapter, examples, packed, batches) if _SCORERS else \
        local_scores(adapter, examples, packed, batches, means)
    return ((h, ll) for h, ll in _pairs(batches, scores) if h is None or str(h) not in done)


def _pairs(batches: list[list[HeadId | None]], scores: Iterator[list[list[list[float]]]]) -> Scored:
    """Each head of ``batches`` (None: the intact model) with its log-likelihoods, from each batch's scores."""
    for batch, batch_scores in zip(batches, scores, strict=True):
        yield from zip(batch, batch_scores, strict=True)


# where batches are scored: in this process, or by an executor installed with :func:`scored_by`
BatchScorer = Callable[[ModelAdapter, Sequence[Example], list[Prepared], list[list[HeadId | None]]],
                       Iterator[list[list[list[float]]]]]
_SCORERS: list[BatchScorer] = []


def local_scores(adapter: ModelAdapter, examples: Sequence[Example], packed: list[Prepared],
                 batches: list[list[HeadId | None]], means: dict[tuple[int, str], torch.Tensor] | None = None
                 ) -> Iterator[list[list[list[float]]]]:
    """Each batch's scores (per head, per example, per choice), in order, from this process's engine;
    a batch ``[None]`` is the intact baseline (``means``: mean ablation, :mod:`ganda.ablation`)."""
    engine = engine_for(adapter, packed, batching(packed, batches, adapter.device.type != "cpu"), means)
    for batch in batches:
        yield engine.score(None if batch[0] is None else batch[0].layer, batch)


def single_ablations(adapter: ModelAdapter, examples: Sequence[Example], heads: Sequence[HeadId]) -> SweepResult:
    """Each of ``heads`` ablated alone on ``examples``, scored by this process's engine: no files
    and no Ray pool, for a short screen inside a larger run (``ganda extends``' control heads)."""
    packed = prepare_all(adapter, list(examples))
    by_layer: dict[int, list[HeadId]] = {}
    for h in heads:
        by_layer.setdefault(h.layer, []).append(h)
    batches: list[list[HeadId | None]] = [[None], *by_layer.values()]
    recs = [sweep_record(h, packed, ll) for h, ll in _pairs(batches, local_scores(adapter, examples, packed, batches))]
    return SweepResult({}, recs[0], recs[1:])


def engine_for(adapter: ModelAdapter, packed: list[Prepared], shape: Batching = Batching(),
               means: dict[tuple[int, str], torch.Tensor] | None = None) -> Any:
    """The engine that scores ``packed``: layer skipping where the family allows it
    (:meth:`ModelAdapter.skips_layers`), its forwards shaped by ``shape``, else full forwards. Its
    ``score(layer, heads)`` for an example depends on the examples of its block (:func:`_groups`)
    only, and on those only through float rounding."""
    return _FastEngine(adapter, packed, shape, means) if adapter.skips_layers() else _FallbackEngine(adapter, packed, means)


@contextlib.contextmanager
def scored_by(scorer: BatchScorer) -> Iterator[None]:
    """Inside this block every sweep scores its batches with ``scorer`` (same arguments and order as
    :func:`local_scores`; :mod:`ganda.distributed` runs them on Ray). Progress files, resume and
    results stay this module's, so a run scored elsewhere writes exactly the files of a local one."""
    _SCORERS.append(scorer)
    try:
        yield
    finally:
        _SCORERS.remove(scorer)


def weights_fingerprint(adapter: ModelAdapter) -> str:
    """What a resumed run checks the weights against: :func:`ganda.fingerprint.fingerprint` of the
    files behind ``adapter.spec`` or, for a model built in memory, of its tensors on their device."""
    path = model_path(adapter.spec)
    return fingerprint(path.resolve() if path is not None else adapter.model)


def _naive(adapter: ModelAdapter, examples: Sequence[Example], heads: list[HeadId], done: dict[str, dict[str, Any]],
           baseline: bool, means: Any = None) -> Scored:
    """The reference loop: ``AblateHeads([head])`` around lm-eval-style scoring of every example
    (``score_example``, exactly as ``evaluate_examples`` runs it), for the intact model (``baseline``)
    and every head not in ``done``."""
    def logliks(ivs):
        with apply(adapter, ivs):
            return [score_example(adapter, ex).loglik for ex in examples]

    if baseline:
        yield None, logliks([])
    for h in heads:
        if str(h) not in done:
            yield h, logliks([AblateHeads([h], how="mean" if means is not None else "zero", means=means)])


PER_PROMPT = ("pred", "pred_norm", "gold", "loglik", "predictions")  # a record's lists of one value per prompt


def _numbers(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    return all(isinstance(x.get(key), int | float) and not isinstance(x.get(key), bool) for x in (a, b))


def load_result(out_dir: str | Path) -> SweepResult:
    """Read a finished sweep's ``results.jsonl``."""
    path = Path(out_dir) / "results.jsonl"
    if not path.exists():
        raise GandaError(f"no sweep results in {out_dir}")
    res = read_sweep(path)
    res.out_dir = Path(out_dir)
    return res


def read_sweep(path: Path, partial: bool = False) -> SweepResult:
    """A finished sweep's ``results.jsonl`` (header, baseline, one record per head), or with
    ``partial`` the journal (``progress.jsonl``) of one that has not finished, read as far as it
    goes and never changed (a last line without its newline, one a run may be writing, is left
    out). A file that is not one is one error naming what it lacks."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise GandaError(f"{path}: cannot read it ({exc})") from None
    if partial and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    lines = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise GandaError(f"{path}, line {i}: not a JSON object; the file is damaged or not ganda's")
        lines.append(rec)
    header = next((x for x in lines if x.get("type") == "header"), None)
    base = next((x for x in lines if x.get("type") == "baseline"), None)
    recs = [x for x in lines if x.get("type") not in ("header", "baseline")]
    if header is None or not isinstance(header.get("config"), dict) or base is None or not _numbers(base, base, "acc"):
        what = "a sweep's journal with its baseline" if partial else "a finished sweep"
        raise GandaError(f"{path} is not {what} (no header with its config, or no baseline with its accuracy)")
    if any(not isinstance(r.get("head"), str) or not _numbers(r, r, "acc") for r in recs):
        raise GandaError(f"{path} holds a head record without its head or accuracy; the file is damaged")
    seed = header.get("seed")
    return SweepResult(header["config"], base, recs, metric=header.get("metric", "acc"),
                       seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None)


__all__ = ["SWEEP_METRICS", "BatchScorer", "Batching", "SweepResult", "engine_for", "load_result", "local_scores", "read_sweep",
           "single_ablations", "run_sweep", "scored_by",
           "sweep_record", "weights_fingerprint"]
