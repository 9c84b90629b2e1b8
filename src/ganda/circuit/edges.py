"""Edge attribution: every sender -> receiver head pair scored from one forward and one backward pass
per batch of prompts, then the top edges verified exactly and the rest bounded.

**The estimate** (EAP form, Syed et al. 2023) of the edge S -> R is the first-order drop of the
margin metric when S's write ``w_S = c·W_O[:, S] z_S`` is removed from R's input alone (the direct
path of :mod:`.paths`):

    e(S, R) = Σ_positions ∂m/∂x^(R) · w_S

where ``x^(R)`` is the residual stream entering R's layer *as R reads it*: R's mixer run on its
own copy of the layer input, only R's slice of its output kept. Senders are every head in an
earlier layer whose mixer writes linearly into the stream; positive: the edge supports the gold
answer. It is averaged over prompts, like AtP.

**One backward for every pair.** The backward runs layer by layer from the top, as attribution's
(:mod:`ganda.attribution.engine`): each layer is recomputed from its recorded input and its VJP
gives ``∂m/∂z`` of its heads and the cotangent below. Then the layer's mixer is run once more on
``C`` copies of its input stacked along the batch, one per receiver head (stopped at the mixer's
output projection), and one VJP with copy c's cotangent ``∂m/∂z`` on receiver c's slice only gives
every receiver's ``∂m/∂x^(R)`` at once. Each is dotted with every earlier sender's write (kept
from the forward: ``senders × tokens × d_model`` floats, which bounds the batch,
:func:`ganda.circuit.costs.edges_batch_tokens`) by one batched matrix product per layer. Cost:
the plain AtP backward plus, per layer, the copies' forward and VJP up to the mixer (``C`` times
the layer's attention or SSM part) and the products (docs/circuit.md has the measured ratio).

**Verification and the bound** mirror :mod:`ganda.attribution.ranking`: the top ``verify_top`` edges
by |estimate|, the ``active`` edges of largest activity (each prompt's |score|, averaged: it finds
edges whose prompts' scores cancel in the mean) and a seeded uniform audit of the others are
ablated exactly (:class:`.paths.PathBatch`,
direct paths); an edge's exact effect is the drop of the mean margin, with a paired bootstrap
interval over prompts; :func:`ganda.attribution.ranking.false_negative_bound` bounds how many
unverified edges could reach the verified top's smallest effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import runio
from ..ablation import check_batched_ablation, reference_means
from ..attribution.engine import (
    ACTIVE_EDGES,
    BATCH_TOKENS,
    AttributionEngine,
    margin_of,
    output_cotangent,
    replay_layer,
)
from ..attribution.ranking import (
    MARGIN_HELP,
    Bound,
    bound_at_top,
    choose_verified,
    most_active,
    spearman_verified,
    top_by_magnitude,
    widen_until_stable,
)
from ..effects import mean_margin
from ..engine import LayerCalls, Trace
from ..errors import GandaError
from ..heads import HeadId, expand, require_heads, running_heads
from ..intervals import bounds, ci
from ..interventions import z_point
from ..models.base import ModelAdapter
from ..models.components import residual_write_scale
from ..options import Options, option
from ..prepared import Batch, make_batch, plan_batches
from ..progress import cpu_clock, tqdm
from ..scoring import encode_pairs, example_pairs, examples_digest, pad_rows
from ..stats import bootstrap_paired
from ..sweep import weights_fingerprint
from ..tasks.base import Example
from .ablation import per_prompt
from .costs import edges_batch_tokens
from .paths import PathBatch, Variant, check_paths, run_layer, sender_write


def edge_name(sender: HeadId | str, receiver: HeadId | str) -> str:
    return f"{sender}>{receiver}"


def parse_edge(name: str) -> tuple[HeadId, HeadId]:
    s, _, r = name.partition(">")
    return HeadId.parse(s), HeadId.parse(r)


@dataclass
class EdgeScores:
    """First-order scores of every sender -> receiver pair (``scores[i, j]``; NaN where sender i is
    not in an earlier layer than receiver j)."""

    senders: list[HeadId]
    receivers: list[HeadId]
    scores: torch.Tensor  # [senders, receivers], mean over prompts
    activity: torch.Tensor  # [senders, receivers], mean over prompts of the prompt's |score|
    atp: dict[str, float]  # each head's plain AtP (zero-ablation), from the same backward
    margin: str
    clean: float
    clean_logliks: list[list[float]]
    golds: list[int]
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def by_edge(self, table: torch.Tensor | None = None) -> dict[str, float]:
        """``{"L2H0>L3H0": score}`` over every valid pair (``table``: another ``[senders, receivers]``
        table, e.g. :attr:`activity`)."""
        t = (self.scores if table is None else table).tolist()
        out = {}
        for i, s in enumerate(self.senders):
            for j, r in enumerate(self.receivers):
                if s.layer < r.layer:
                    out[edge_name(s, r)] = t[i][j]
        return out


class _EdgeEngine:
    def __init__(self, adapter: ModelAdapter, senders: list[HeadId], receivers: list[HeadId], margin: str,
                 means: dict[tuple[int, str], torch.Tensor] | None = None) -> None:
        self.adapter, self.margin, self.means = adapter, margin, means
        self.senders, self.receivers = senders, receivers
        self.layers = list(adapter.active_layers())
        self.nodes = AttributionEngine(adapter, adapter.heads(running=True), "zero", margin,
                                       graddrop=False)  # every running head's plain AtP
        self.heads = self.nodes.heads
        self.recv_col = {h: j for j, h in enumerate(receivers)}
        self._recv_index: dict[int, torch.Tensor] = {}  # built once per receiver layer

    def _writes(self, zs: dict[str, torch.Tensor], rows: int, width: int, d: int) -> torch.Tensor:
        """Every sender's write ``[rows, senders, width·d]`` (fp32), senders in list order."""
        out = torch.empty((rows, len(self.senders), width * d), dtype=torch.float32, device=self.adapter.device)
        for i, s in enumerate(self.senders):
            out[:, i] = sender_write(self.adapter, s, zs[z_point(self.adapter.mixer_of(s))], self.means).reshape(rows, -1)
        return out

    def _receiver_grads(self, calls: LayerCalls, pos: int, dz: dict[str, torch.Tensor], fired: list[str],
                        recv: list[HeadId]) -> torch.Tensor:
        """``∂m/∂x^(R)`` of every receiver in ``recv`` (one layer) ``[C, rows, W, d]``: the mixer run on
        one copy of the layer input per receiver, one VJP with each copy's cotangent on its receiver."""
        C, B = len(recv), calls.batch
        mixers = [self.adapter.mixer_of(r) for r in recv]
        points = list(dict.fromkeys(z_point(m) for m in mixers))
        stop = max(points, key=fired.index)
        x = calls.inputs[pos].detach()  # type: ignore[index]
        with torch.enable_grad(), self.adapter.analysis_path(), Trace(self.adapter, points, detach=False,
                                                                     stop=stop) as tr:
            xr = x.repeat(C, *([1] * (x.ndim - 1))).requires_grad_(True)
            run_layer(calls, pos, xr)
        cots = {p: torch.zeros_like(tr[p]) for p in points}
        for c, (r, m) in enumerate(zip(recv, mixers, strict=True)):
            sl = m.head_slice(r.head)
            cots[z_point(m)][c * B:(c + 1) * B, ..., sl] = dz[z_point(m)][..., sl].to(cots[z_point(m)].dtype)
        (g,) = torch.autograd.grad([tr[p] for p in points], [xr], [cots[p] for p in points])
        return g.float().reshape(C, *x.shape)

    @torch.no_grad()
    def run(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[float]]]:
        """``[senders, receivers]`` scores and |scores| summed over the batch's prompts, ``[items,
        heads]`` AtP, the items' clean log-likelihoods."""
        s_points = list(dict.fromkeys(z_point(self.adapter.mixer_of(s)) for s in self.senders))
        with torch.no_grad(), self.adapter.analysis_path(), Trace(self.adapter, s_points) as tr:
            calls = LayerCalls(self.adapter, batch.ids, batch.mask, batch.position_ids, inputs=True)
        rows, width = batch.ids.shape
        writes = self._writes({p: tr[p] for p in s_points}, rows, width, calls.h0.shape[-1]) if self.senders else None
        n_items, dev = len(batch.items), self.adapter.device
        # both accumulate on the device and reach the host once per batch (a sync per layer idles a GPU)
        scores = torch.zeros((len(self.senders), len(self.receivers)), device=dev)
        activity = torch.zeros_like(scores)
        atp = torch.zeros((n_items, len(self.heads)), device=dev)
        cot, lls = output_cotangent(self.adapter, batch, calls, self.margin)
        s_layers = torch.tensor([s.layer for s in self.senders], dtype=torch.long)
        for pos in reversed(range(len(self.layers))):
            layer = self.layers[pos]
            mixers = self.nodes.by_layer.get(layer, [])
            x, out, tr = replay_layer(self.adapter, calls, pos, [z_point(m) for m, _ in mixers])
            zs, fired = [(m, cols, tr[z_point(m)]) for m, cols in mixers], list(tr.values)
            grads = torch.autograd.grad(out, [x] + [z for *_, z in zs], grad_outputs=cot.to(out.dtype),
                                        allow_unused=True)
            dz = {z_point(m): (g if g is not None else torch.zeros_like(z)) for (m, _, z), g in zip(zs, grads[1:], strict=True)}
            for (_, vals), (hsel, csel) in zip(self.nodes._heads_of(zs, grads[1:], batch, n_items),
                                               self.nodes._layer_index(layer, dev), strict=True):
                atp[:, csel] = vals[:, hsel]
            recv = [r for r in self.receivers if r.layer == layer]
            below = int((s_layers < layer).sum())  # senders are sorted by layer: the first ``below``
            if recv and below and writes is not None:
                G = self._receiver_grads(calls, pos, dz, fired, recv)  # [C, rows, W, d]
                G = G.reshape(len(recv), rows, -1).permute(1, 2, 0)  # [rows, W·d, C]
                per_row = torch.bmm(writes[:, :below], G)  # [rows, below, C]
                per_item = per_row.new_zeros((n_items, *per_row.shape[1:])).index_add_(0, batch.row_example, per_row)
                cols = self._recv_cols(layer, recv)
                scores[:below, cols] += per_item.sum(0).to(scores.dtype)
                activity[:below, cols] += per_item.abs().sum(0).to(scores.dtype)
            cot = grads[0] if grads[0] is not None else torch.zeros_like(cot)
            del x, out, zs, grads
        return scores.cpu(), activity.cpu(), atp.cpu(), lls

    def _recv_cols(self, layer: int, recv: list[HeadId]) -> torch.Tensor:
        if layer not in self._recv_index:
            self._recv_index[layer] = torch.tensor([self.recv_col[r] for r in recv], device=self.adapter.device)
        return self._recv_index[layer]


def _layer_span(layers: list[int]) -> str:
    if not layers:
        return "no layer"
    lo, hi = min(layers), max(layers)
    return f"layer {lo}" if lo == hi else f"layers {lo}-{hi}"


def default_senders(adapter: ModelAdapter) -> list[HeadId]:
    """Every running head whose mixer writes linearly into the residual stream (all but Zamba2's shared
    attention)."""
    return [h for h in adapter.heads(running=True) if residual_write_scale(adapter, adapter.mixer_of(h)) is not None]


def edge_heads(adapter: ModelAdapter, senders: Sequence[HeadId] | None, receivers: Sequence[HeadId] | None
               ) -> tuple[list[HeadId], list[HeadId]]:
    """The senders and receivers an edge pass joins (default: every head that can be one), canonical
    and in order, refused in one line where a sender has no direct write or no pair makes an edge:
    what :func:`edge_attribution` runs on and ``ganda plan -e edges`` costs."""
    s_list = running_heads(adapter, senders if senders is not None else default_senders(adapter), "edges")
    r_list = running_heads(adapter, receivers, "edges")
    check_paths(adapter, "direct", s_list)
    if not any(s.layer < r.layer for s in s_list for r in r_list):
        span = lambda hs: _layer_span([h.layer for h in hs])  # noqa: E731
        raise GandaError(f"no edge to score: no sender is in an earlier layer than a receiver (senders in {span(s_list)}, "
                         f"receivers in {span(r_list)})")
    return s_list, r_list


def edge_attribution(adapter: ModelAdapter, examples: Sequence[Example], *, senders: Sequence[HeadId] | None = None,
                     receivers: Sequence[HeadId] | None = None, margin: str = "mean", batch_tokens: int | None = None,
                     progress: bool = True, means: dict[tuple[int, str], torch.Tensor] | None = None) -> EdgeScores:
    """Every sender -> receiver edge's first-order score (module docstring), one forward and one
    backward per batch. ``senders``/``receivers``: only these heads (default: every head that can be one);
    ``means``: mean ablation, a sender's write taken as ``c·W_O (z - μ)`` (:mod:`ganda.ablation`)."""
    if not examples:
        raise GandaError("no examples to attribute edges on")
    if any(len(ex.choices) < 2 for ex in examples):
        raise GandaError("edge attribution needs multiple-choice examples with at least two choices")
    s_list, r_list = edge_heads(adapter, senders, receivers)
    d_model = adapter.d_model
    with cpu_clock() as clock:
        eng = _EdgeEngine(adapter, s_list, r_list, margin, means)
        plan, packed = plan_batches(adapter, examples, batch_tokens or edges_batch_tokens(len(s_list), d_model))
        scores = torch.zeros((len(s_list), len(r_list)))
        activity = torch.zeros_like(scores)
        atp = torch.zeros((len(examples), len(eng.heads)))
        lls: list[list[float]] = [[] for _ in examples]
        for items in tqdm(plan, desc="edges", unit="batch", disable=not progress):
            sc, act, a, ll = eng.run(make_batch(adapter, items, packed))
            scores += sc
            activity += act
            for j, it in enumerate(items):
                atp[it.index], lls[it.index] = a[j], ll[j]
    scores /= len(examples)
    activity /= len(examples)
    valid = torch.tensor([[s.layer < r.layer for r in r_list] for s in s_list], dtype=torch.bool)
    scores[~valid] = float("nan")
    activity[~valid] = float("nan")
    golds = [ex.gold for ex in examples]
    mean_atp = atp.mean(0).tolist()
    cfg = {"model": adapter.spec, "n": len(examples), "prompts_sha": examples_digest(examples), "margin": margin,
           "senders": len(s_list), "receivers": len(r_list), "batches": len(plan),
           "layout": "packed" if packed else "rows", "ablation": "mean" if means is not None else "zero"}
    return EdgeScores(s_list, r_list, scores, activity, {str(h): v for h, v in zip(eng.heads, mean_atp, strict=True)}, margin,
                      mean_margin(lls, golds, margin), lls, golds, clock["wall"], clock["cpu"], cfg)


# ---------------------------------------------------------------------------------------------
# exact effects


def _edge_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a line of the edge checks' journal (None: an edge's record)."""
    missing = [k for k, t in (("edge", str), ("loglik", list)) if not isinstance(rec.get(k), t)]
    return f"an edge record without {', '.join(missing)}" if missing else None


def exact_edges(adapter: ModelAdapter, examples: Sequence[Example], edges: Sequence[tuple[HeadId, HeadId]], *,
                paths: str = "direct", margin: str = "mean", batch_tokens: int | None = None,
                out_dir: str | Path | None = None, resume: bool = True, progress: bool = True,
                means: dict[tuple[int, str], torch.Tensor] | None = None
                ) -> tuple[list[list[float]], dict[str, list[list[float]]]]:
    """Each edge's per-prompt log-likelihoods under the exact path ablation (``paths``), and the
    intact ones. The edges of one sender share its batches' recordings; with ``out_dir``,
    ``edges_exact.jsonl`` keeps one line per finished sender and a stopped run resumes from it
    (any run on the same model, prompts, paths and margin: the edge list may grow)."""
    check_paths(adapter, paths, [s for s, _ in edges])
    plan, packed = plan_batches(adapter, examples, batch_tokens or BATCH_TOKENS)  # the CPU's measured batch, as attribution's
    journal = None
    if out_dir is not None:
        cfg = {"model": adapter.spec, "prompts_sha": examples_digest(examples), "paths": paths, "margin": margin,
               "weights": weights_fingerprint(adapter), "ablation": "mean" if means is not None else "zero"}
        journal = runio.Journal(Path(out_dir) / "edges_exact.jsonl", cfg, "exact edge check", resume=resume,
                                check=_edge_problem).open()
    done = {r["edge"]: r["loglik"] for r in journal.records} if journal is not None else {}
    todo: dict[HeadId, list[HeadId]] = {}
    for s, r in edges:
        if edge_name(s, r) not in done:
            todo.setdefault(s, []).append(r)
    batches = [PathBatch(adapter, make_batch(adapter, items, packed), margin, means) for items in plan]
    clean: list[list[float]] = [[] for _ in examples]
    for pb, items in zip(batches, plan, strict=True):
        for it, ll in zip(items, pb.clean[0], strict=True):
            clean[it.index] = ll
    bar = tqdm(total=sum(len(v) for v in todo.values()), desc=f"exact edges ({paths})", unit="edge",
               disable=not progress)
    try:
        for s, recv in todo.items():
            got: dict[str, list[list[float]]] = {edge_name(s, r): [[] for _ in examples] for r in recv}
            for pb, items in zip(batches, plan, strict=True):
                for r, lls in zip(recv, pb.ablate(s, [Variant(r) for r in recv], paths), strict=True):
                    for it, ll in zip(items, lls, strict=True):
                        got[edge_name(s, r)][it.index] = ll
            for name, lls in got.items():
                done[name] = lls
                if journal is not None:
                    journal.append({"edge": name, "loglik": lls})
            bar.update(len(recv))
    finally:
        bar.close()
        if journal is not None:
            journal.close()
    return clean, {edge_name(s, r): done[edge_name(s, r)] for s, r in edges}


@dataclass
class EdgeRanking:
    """Every edge's estimate, the verified and audited edges' exact effects, and the bound."""

    scores: EdgeScores
    paths: str
    exact: dict[str, float]  # drop of the mean margin when the edge is ablated exactly
    exact_ci: dict[str, list[float]]  # paired bootstrap 95% interval over prompts
    accuracy_drop: dict[str, float]
    verified: list[str]
    audited: list[str]
    clean: float
    bound: Bound | None
    seconds: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def estimate(self) -> dict[str, float]:
        return self.scores.by_edge()

    def order(self) -> list[str]:
        """Verified and audited edges by |exact|, then the rest by |estimate|."""
        known = top_by_magnitude(self.exact, len(self.exact))
        seen = set(known)
        return known + [e for e in top_by_magnitude(self.estimate, len(self.estimate)) if e not in seen]

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        est = self.estimate
        rank = {e: i + 1 for i, e in enumerate(top_by_magnitude(est, len(est)))}
        out = []
        for e in self.order()[:limit]:
            s, r = parse_edge(e)
            out.append({"edge": e, "sender": str(s), "receiver": str(r), "estimate": est.get(e),
                        "rank_estimate": rank.get(e), "exact": self.exact.get(e), **ci(self.exact_ci.get(e), "exact"),
                        "accuracy_drop": self.accuracy_drop.get(e),
                        "verified": e in self.verified, "audited": e in self.audited})
        return out

    def to_json(self, limit: int = 100) -> dict[str, Any]:
        return {"model": self.config.get("model"), "task": self.config.get("task"), "n": self.config.get("n"),
                "paths": self.paths, "margin": self.scores.margin, "clean": self.clean,
                "edges": len(self.estimate), "verified": self.verified, "audited": self.audited,
                "spearman_verified": spearman_verified(self.estimate, self.exact),
                "bound": self.bound.to_json() if self.bound else None, "seconds": self.seconds, "atp": self.scores.atp, "ranking": self.rows(limit)}

    def write(self, out_dir: str | Path) -> None:
        """``edges.json`` (the top 100 edges and every exactly known one), ``edges.csv`` (every edge)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        runio.write_json(out / "edges.json", {**self.to_json(), "config": self.config}, indent=1)
        runio.write_csv(out / "edges.csv", self.rows())


def bound_sentence(b: Bound) -> str:
    """The false-negative bound in words, for edges."""
    s = (f"With {100 * b.confidence:.0f}% confidence at most {b.max_missed} of the {b.pool - len(b.audited):,} "
         f"unaudited unverified edges have |effect| >= {b.threshold:.4g} (audit of {len(b.audited)}: "
         f"{len(b.audit_above)} above)")
    if b.ratio_max is not None:
        s += (f"; the audit's largest |exact|/|estimate|, {b.ratio_max:.3g}, puts {len(b.at_risk):,} edge(s) at risk"
              + (f" ({', '.join(b.at_risk[:5])}{', ...' if len(b.at_risk) > 5 else ''})" if b.at_risk else ""))
    return s + "."


@dataclass
class EdgesOptions(Options):
    """How :func:`rank_edges` (``ganda edges``, a grid's ``edges`` jobs) chooses the edges it
    verifies, and what ``ganda edges`` draws (``roles``, ``show``)."""

    verify_top: int = option(10, "verify this many top edges exactly (direct paths)", short="-k", low=0)
    audit: int = option(10, "also verify this many random other edges (the false-negative bound)", low=0)
    active: int = option(ACTIVE_EDGES, "also verify this many edges with the largest mean |estimate| per prompt "
                         "(their prompts' scores can cancel in the mean)", low=0)
    widen: int = option(0, "then verify this many more edges by estimate, round after round, until a round leaves "
                        "the top --top by |exact| unchanged (0: off)", low=0)
    top: int = option(10, "the bound's default threshold: the smallest exact effect in the verified top TOP; rows "
                      "printed", low=1)
    threshold: float | None = option(None, "effect size the bound speaks about")
    senders: str = option("", "only these senders (default: every head), e.g. 'L16H*'")
    receivers: str = option("", "only these receivers (default: every head), e.g. L19H1")
    margin: str = option("mean", MARGIN_HELP, choices=("mean", "max"))
    roles: bool = option(True, "leave the heads of the drawn and printed edges unlabelled (by default the labeller "
                         "every command shares labels them: three ablations per head)", flag="--no-roles",
                         journal=False)
    show: int = option(10, "verified edges drawn in circuit.png", low=1, journal=False)
    ablation: str = option("zero", "the senders' ablation: zero or mean (its mean over every token of the prompts); "
                           "resample needs a donor per scored row: eval runs it")

    def check(self) -> None:
        check_batched_ablation(self.ablation, self.flag("ablation"), "edge attribution")
        if self.threshold is not None and not (math.isfinite(self.threshold) and self.threshold > 0):
            raise GandaError(f"{self.flag('threshold')} must be a positive finite number, got {self.threshold}")
        for name in ("senders", "receivers"):
            require_heads(self.flag(name), getattr(self, name) or None)  # "": every head


def rank_edges(adapter: ModelAdapter, examples: Sequence[Example], options: EdgesOptions | None = None, *,
               senders: Sequence[HeadId] | None = None, receivers: Sequence[HeadId] | None = None, seed: int = 0,
               confidence: float = 0.95, batch_tokens: int | None = None, out_dir: str | Path | None = None,
               resume: bool = True, progress: bool = True, config: dict[str, Any] | None = None,
               **overrides: Any) -> EdgeRanking:
    """Score every edge (:func:`edge_attribution`), ablate the top ``verify_top``, the ``active``
    most active (largest mean |estimate| per prompt: an edge whose prompts' first-order scores
    cancel in the mean can still have a large exact effect) and ``audit`` random others exactly
    along their direct paths, and bound what the unverified edges could hide (``threshold``:
    default the smallest |exact| in the verified top ``top``). ``widen``: then the next ``widen``
    edges by |estimate|, round after round, until a round leaves the top ``top`` by |exact|
    unchanged (:func:`ganda.attribution.ranking.widen_until_stable`). ``ablation``: ``"zero"`` or
    ``"mean"`` (every sender's slice set to its mean over every token of ``examples``, estimate and
    exact checks alike, :mod:`ganda.ablation`).

    ``options`` (default :class:`EdgesOptions`' defaults) may be given field by field as keywords
    instead, e.g. ``rank_edges(ad, exs, verify_top=3, active=0)``; ``senders`` and ``receivers``
    (default: those options' heads, else every head) are the heads the edges join."""
    o = EdgesOptions.build({**(options.to_json() if options is not None else {}), **overrides})
    senders = senders if senders is not None or not o.senders else expand(o.senders, adapter)
    receivers = receivers if receivers is not None or not o.receivers else expand(o.receivers, adapter)
    means = None
    if o.ablation == "mean":
        s_all = senders if senders is not None else default_senders(adapter)
        means = reference_means(adapter, examples, list({id(m): m for m in map(adapter.mixer_of, s_all)}.values()))
    with cpu_clock() as c1:
        sc = edge_attribution(adapter, examples, senders=senders, receivers=receivers, margin=o.margin,
                              batch_tokens=batch_tokens, progress=progress, means=means)
    est = sc.by_edge()
    order = top_by_magnitude(est, len(est))
    chosen, audited = choose_verified(order, o.verify_top, o.audit, seed, most_active(sc.by_edge(sc.activity), o.active),
                                      by_estimate=False)
    checks = _EdgeChecks(adapter, examples, sc.clean_logliks, margin=o.margin, seed=seed, means=means, out_dir=out_dir,
                         resume=resume, progress=progress)
    with cpu_clock() as c2:
        if chosen or audited:
            checks.measure([*chosen, *audited])
        widened = widen_until_stable(order, checks.exact, o.widen, o.top, checks.measure, top_of=lambda ex, k: set(
            top_by_magnitude(ex, k))) if o.widen and chosen else []
        chosen += widened
    clean = mean_margin(checks.clean_ll, checks.golds, o.margin)
    bound = bound_at_top(est, checks.exact, chosen, audited, o.threshold, o.top, confidence)
    secs = {"attribution": c1["wall"], "attribution_cpu": c1["cpu"], "verification": c2["wall"],
            "verification_cpu": c2["cpu"]}
    cfg = {**sc.config, **(config or {}), "verify_top": o.verify_top, "active": o.active, "audit": o.audit, "seed": seed,
           "widen": o.widen, "widened": len(widened)}
    res = EdgeRanking(sc, "direct", checks.exact, checks.ci, checks.acc, chosen, audited, clean, bound, secs, cfg)
    if out_dir is not None:
        res.write(out_dir)
    return res


class _EdgeChecks:
    """The exact direct-path ablations of the verified edges, measured in rounds (the first choice,
    then each ``widen`` round; resumable in ``out_dir``): each edge's margin drop as a paired
    bootstrap over prompts against the intact run (``exact``, its interval ``ci``) and its accuracy
    drop (``acc``). Every round re-scores the intact model, whose log-likelihoods ``clean_ll`` keeps."""

    def __init__(self, adapter: ModelAdapter, examples: Sequence[Example], clean_ll: list[list[float]], *,
                 margin: str, seed: int, means: Any, out_dir: str | Path | None, resume: bool, progress: bool) -> None:
        self.adapter, self.examples, self.clean_ll = adapter, examples, clean_ll
        self.margin, self.seed, self.means = margin, seed, means
        self.out_dir, self.resume, self.progress = out_dir, resume, progress
        self.golds = [ex.gold for ex in examples]
        self.exact: dict[str, float] = {}
        self.ci: dict[str, list[float]] = {}
        self.acc: dict[str, float] = {}

    def measure(self, names: list[str], _round: int = 0) -> None:
        """Exact path ablations of ``names`` into ``exact``, ``ci`` and ``acc``."""
        edges = [(self.adapter.canonical(s), self.adapter.canonical(r)) for s, r in map(parse_edge, names)]
        self.clean_ll, lls = exact_edges(self.adapter, self.examples, edges, margin=self.margin, out_dir=self.out_dir,
                                         resume=self.resume, progress=self.progress, means=self.means)
        base_a, base_m = per_prompt(self.clean_ll, self.golds, self.margin)
        for name, ll in lls.items():
            a, m = per_prompt(ll, self.golds, self.margin)
            bs = bootstrap_paired(base_m, m, seed=self.seed)
            self.exact[name], self.ci[name] = bs["diff"], list(bounds(bs, "diff"))
            self.acc[name] = (sum(base_a) - sum(a)) / len(a)


def edge_positions(adapter: ModelAdapter, example: Example, sender: HeadId, receiver: HeadId,
                   margin: str = "mean") -> list[float]:
    """Per position of the example's rows (the scorer's: one per choice, right-padded), the edge's
    first-order drop of this example's margin from that position alone: ``Σ_rows ∂m/∂x^(R)[t] · w_S[t]``
    (they sum to the example's edge score). Computed by autograd through two of the model's own
    forwards: R's layer input edited to ``x − ε_t·w_S``, then R's slice spliced into the intact forward."""
    s, r = adapter.canonical(sender), adapter.canonical(receiver)
    sm, rm = adapter.mixer_of(s), adapter.mixer_of(r)
    check_paths(adapter, "direct", [s])
    pairs = encode_pairs(adapter, example_pairs(example))
    ids, mask = pad_rows(adapter, [c + t for c, t in pairs])
    sp, rp = z_point(sm), z_point(rm)
    with torch.no_grad(), adapter.analysis_path(), Trace(adapter, [sp]) as tr:
        adapter.forward(ids, attention_mask=mask)
    sl, rsl = sm.head_slice(s.head), rm.head_slice(r.head)
    w = float(residual_write_scale(adapter, sm) or 0.0) * torch.nn.functional.linear(tr[sp][..., sl], sm.out_proj.weight[:, sl])
    eps = torch.zeros(ids.shape[1], requires_grad=True)

    def splice(z_new: torch.Tensor) -> Any:
        def edit(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[..., rsl] = z_new[..., rsl].to(x.dtype)
            return x
        return edit

    with torch.enable_grad(), adapter.analysis_path():
        edit = {f"L{r.layer}.resid_in": lambda h: h - (eps[None, :, None] * w).to(h.dtype)}
        with Trace(adapter, [rp], edit=edit, stop=rp, detach=False) as tr2:
            adapter.forward(ids, attention_mask=mask)
        with Trace(adapter, edit={rp: splice(tr2[rp])}):
            logits = adapter.forward(ids, attention_mask=mask)
        lls = []
        for i, (c, t) in enumerate(pairs):
            lp = torch.log_softmax(logits[i, len(c) - 1:len(c) + len(t) - 1].float(), -1)
            lls.append(lp[torch.arange(len(t)), torch.tensor(t)].sum())
        (g,) = torch.autograd.grad(margin_of(torch.stack(lls), example.gold, margin), [eps])
    return (-g).tolist()
