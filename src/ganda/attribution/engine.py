"""Every head's first-order ablation effect from one forward and one backward pass per batch.

The node is a head's slice ``z_h`` of its mixer's output-projection input (what ``AblateHeads``
zeroes). The metric is the multiple-choice margin the sweep's log-likelihoods give: per prompt the
gold choice's summed log-likelihood minus the mean (``margin="mean"``) or the best
(``margin="max"``) of the other choices', averaged over prompts. An *effect* is the drop of that
metric when the head is ablated (positive: the head supports the gold answer), estimated as

* zero-ablation: ``Σ_pos ∂m/∂z_h · z_h``
* mean-ablation: ``Σ_pos ∂m/∂z_h · (z_h − μ_h)``, ``μ_h`` the mean of ``z_h`` over a reference set.

**Checkpointed by layer.** One no-grad pass keeps only each decoder layer's input (the residual
stream); the backward then runs layer by layer from the top, recomputing one layer with autograd,
taking the vector-Jacobian product with the cotangent from above and reading ``∂m/∂z_h`` off that
layer's heads, so at most one layer's graph exists at a time (docs/attribution.md has the memory
formula).

**GradDrop** (AtP*, Kramár et al. 2024) repeats the backward with the gradient through one layer's
residual branch dropped: for layer ℓ the cotangent at ℓ's input is the one at its output (skip
connection only). Because backprop is linear, every ℓ's pass shares the layers above ℓ with the
plain one, so all of them run in the same top-down sweep: at layer k the plain cotangent and the
dropped passes of every ℓ > k each take one vector-Jacobian product of the same recomputed graph
(``L(L+1)/2`` layer VJPs in all instead of ``L`` full backward passes). The head's score is
``1/(L−1) Σ_ℓ |AtP_{−ℓ}(h)|`` (``AtP_{−ℓ}`` is AtP itself for ℓ below the head's layer and 0 for
its own layer), with the sign of plain AtP. By default the branches are dropped a block of
contiguous layers at a time (``graddrop_blocks=6``: ``1/(G−1) Σ_b``, about ``L(G+1)/2`` VJPs), which
costs a third of the per-layer form on a 30-layer model and ranks heads as well there.

**Integrated gradients** (``method="ig"``, the path form EAP-IG uses). AtP is one tangent at the
clean point, and ablating a head is a large step: the estimate can miss the effect by an order of
magnitude or get its sign wrong. IG follows the straight path from every ranked head ablated to
the clean model. Step α runs the model with each ranked head's ``z_h`` replaced, at every layer at
once, by ``ẑ_h = b_h + α·(z_h − b_h)`` (``b_h`` = 0 for zero-ablation, ``μ_h`` for mean-ablation;
``z_h`` is what the head computes in that α-pass, so later layers see the scaled earlier ones), and
a head's score is

    IG(h) = mean_α Σ_pos ∂m/∂ẑ_h · (z_h − b_h)      α ∈ {(i + ½)/k : i < k}  (midpoint rule, k steps)

with the gradient taken at ``ẑ_h`` through everything downstream (later heads' scaled outputs
included). Since ``dm/dα = Σ_h ∂m/∂ẑ_h · (z_h − b_h)`` exactly (α enters the pass only through the
edits), the scores are complete: ``Σ_h IG(h)`` is the midpoint-rule integral of ``dm/dα``, i.e.
``m(clean) − m(every ranked head ablated)`` up to ``O(1/k²)``. Ranking one head makes IG that head's
exact ablation effect in the limit; with ``α = 1`` as the only step it is AtP (both tested).
Multiplying by the clean ``z_h`` instead of the α-pass's would break completeness. The ``k`` steps
and one clean copy (α = 1: the log-likelihoods and plain AtP) run as ``k + 1`` copies of the batch's
rows in one checkpointed pass, so a batch holds ``1/(k+1)`` of the prompts.

Transformers (Llama layout) run in the sweep's packed layout (an example's choices share one
sequence through a block mask), so estimate and exact sweep see the same tokens; other families
run one right-padded row per choice on the pure-PyTorch SSM path, so autograd reaches every head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import runio
from ..ablation import reference_means
from ..effects import mean_margin
from ..engine import Edit, LayerCalls, Trace, logprobs
from ..errors import GandaError
from ..heads import HeadId, running_heads
from ..interventions import z_point
from ..models.base import Mixer, ModelAdapter
from ..prepared import Batch, BatchItem, make_batch, plan_batches
from ..progress import cpu_clock, tqdm
from ..scoring import examples_digest
from ..sweep import weights_fingerprint
from ..tasks.base import Example

METHODS = ("atp", "atp*", "ig")
ABLATIONS = ("zero", "mean")
MARGINS = ("mean", "max")


GRADDROP_BLOCKS = 6  # GradDrop's default blocks of layers: L·6/2 layer VJPs, not L²/2 (docs/attribution.md)
IG_STEPS = 5  # integrated gradients' midpoint steps (k + 1 copies of every batch: docs/attribution.md)
# ``rank``'s default rule: AtP, then exact verification of the top 10 by estimate and of the 30 most
# active heads (Attribution.activity). On SmolLM2 KV it holds the exhaustive top 10 on more prompt
# sets than the AtP* top 30 with an audit of 10, at about the same cost (docs/attribution.md); the
# audit, the false-negative bound's sample, is opt-in.
RANK_METHOD, VERIFY_TOP, ACTIVE, AUDIT = "atp", 10, 30, 0
ACTIVE_EDGES = 100  # ``ganda edges``' most active edges verified (its --verify-top and --audit: 10 and 10)


def ig_alphas(steps: int) -> list[float]:
    """The midpoint rule's ``k`` points of ``(0, 1)``: ``(i + ½)/k``."""
    return [(i + 0.5) / steps for i in range(steps)]


def margin_of(ll: torch.Tensor, gold: int, margin: str = "mean") -> torch.Tensor:
    """Gold log-likelihood minus the mean (or the best) of the other choices' (differentiable)."""
    others = torch.cat([ll[:gold], ll[gold + 1:]])
    if others.numel() == 0:
        raise GandaError("a margin needs at least two choices")
    return ll[gold] - (others.mean() if margin == "mean" else others.max())


# ---------------------------------------------------------------------------------------------
# a batch's read-out (the batches themselves: ganda.prepared)


def batch_metric(adapter: ModelAdapter, batch: Batch, h_last: torch.Tensor, margin: str = "mean"
             ) -> tuple[torch.Tensor, list[list[float]]]:
    """The summed margin of a batch's items (differentiable) and each item's choice log-likelihoods,
    read from the last layer's output ``h_last`` ``[rows, W, d_model]``: the one read-out the
    attribution pass and the circuit's path ablations share."""
    rows, pos, tgt, owner = [], [], [], []
    r0 = 0
    for j, it in enumerate(batch.items):
        for c, (r, ps, ts) in enumerate(it.reads):
            rows += [r0 + r] * len(ps)
            pos += ps
            tgt += ts
            owner += [(j, c)] * len(ps)
        r0 += len(it.rows)
    dev = h_last.device
    lp = logprobs(adapter, h_last[torch.tensor(rows, device=dev), torch.tensor(pos, device=dev)])
    picked = lp[torch.arange(len(tgt), device=dev), torch.tensor(tgt, device=dev)]
    lls: list[list[torch.Tensor]] = [[picked.new_zeros(()) for _ in it.reads] for it in batch.items]
    for k, (j, c) in enumerate(owner):
        lls[j][c] = lls[j][c] + picked[k]
    total = picked.new_zeros(())
    for it, ll in zip(batch.items, lls, strict=True):
        total = total + margin_of(torch.stack(ll), it.gold, margin)
    return total, [[float(v.detach()) for v in ll] for ll in lls]


def output_cotangent(adapter: ModelAdapter, batch: Batch, calls: LayerCalls, margin: str = "mean"
                     ) -> tuple[torch.Tensor, list[list[float]]]:
    """Where the layer-by-layer backward starts: the gradient of the batch's summed margin with
    respect to the last layer's output, and the items' clean log-likelihoods."""
    with torch.enable_grad():
        assert calls.final is not None
        top = calls.final.detach().requires_grad_(True)
        total, lls = batch_metric(adapter, batch, top, margin)
        (cot,) = torch.autograd.grad(total, [top])
    return cot, lls


def replay_layer(adapter: ModelAdapter, calls: LayerCalls, pos: int, points: Sequence[str],
                 edit: dict[str, Edit] | None = None) -> tuple[torch.Tensor, torch.Tensor, Trace]:
    """The layer at ``pos`` recomputed with autograd from its recorded input (the backward's one
    layer graph at a time): that input, requiring grad; the layer's output; the trace of ``points``
    inside it, kept in the graph."""
    with torch.enable_grad(), adapter.analysis_path(), Trace(adapter, points, edit=edit, detach=False) as tr:
        x = calls.inputs[pos].detach().requires_grad_(True)  # type: ignore[index]
        out = calls.run(pos, x)
    return x, out, tr


# ---------------------------------------------------------------------------------------------
# the result


@dataclass
class Attribution:
    """Per-head first-order effect estimates (drop of the margin metric when the head is ablated)."""

    heads: list[HeadId]
    atp: list[float]  # plain AtP, signed
    estimate: list[float]  # the ranking score: AtP, AtP* magnitude with AtP's sign, or IG
    method: str
    ablation: str
    margin: str
    clean: float  # the metric on the intact model
    clean_logliks: list[list[float]]
    golds: list[int]
    per_example: torch.Tensor  # [prompts, heads] plain AtP per prompt
    graddrop: list[float] | None = None  # AtP* magnitude
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    means: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # mean-ablation μ per mixer
    ig: list[float] | None = None  # integrated gradients, signed (method "ig")
    per_example_ig: torch.Tensor | None = None  # [prompts, heads] IG per prompt

    def order(self) -> list[int]:
        """Head indices by |estimate|, largest first (ties: head order)."""
        return sorted(range(len(self.heads)), key=lambda i: (-abs(self.estimate[i]), i))

    def by_head(self) -> dict[str, float]:
        return {str(h): e for h, e in zip(self.heads, self.estimate, strict=True)}

    def activity(self) -> dict[str, float]:
        """Each head's mean over prompts of |plain AtP on that prompt|: how far the head moves each
        prompt's margin, whatever the direction. A head whose per-prompt effects cancel in the mean
        (or whose ablation acts through a saturating nonlinearity the mean's sign misreads) has a
        small estimate but a large activity (``rank_heads(active=K)``, docs/attribution.md)."""
        return dict(zip(map(str, self.heads), self.per_example.abs().mean(0).tolist(), strict=True))


# ---------------------------------------------------------------------------------------------
# the engine


def index_pairs(pairs: Sequence[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[(head, column), ...]`` as two long index tensors on ``device`` (a mixer's ranked heads and
    their columns in a result table)."""
    return (torch.tensor([h for h, _ in pairs], dtype=torch.long, device=device),
            torch.tensor([c for _, c in pairs], dtype=torch.long, device=device))


class AttributionEngine:
    """The per-head state of one AtP / AtP* / IG pass (the ranked heads' columns by layer, mean
    ablation's values, GradDrop's blocks); :mod:`ganda.circuit.edges` reuses it for every head's
    plain AtP."""

    def __init__(self, adapter: ModelAdapter, heads: list[HeadId], ablation: str, margin: str, graddrop: bool,
                 blocks: int | None = None, alphas: Sequence[float] | None = None) -> None:
        self.adapter = adapter
        self.alphas = list(alphas) if alphas is not None else None  # IG's steps (None: AtP / AtP*)
        self._raw: dict[str, torch.Tensor] = {}  # IG: each z point's value before its edit, latest pass
        self.ablation = ablation
        self.margin = margin
        self.graddrop = graddrop
        self.heads = heads
        self.index = {h: i for i, h in enumerate(heads)}
        self.n_layers = len(adapter.decoder_layers())
        self.block_of = graddrop_blocks(self.n_layers, blocks)
        self.n_blocks = max(self.block_of) + 1 if self.block_of else 0
        self.by_layer: dict[int, list[tuple[Mixer, list[int | None]]]] = {}
        for m in adapter.mixers():
            cols = [self.index.get(adapter.canonical(HeadId(m.layer, h, m.kind))) for h in range(m.num_heads)]
            self.by_layer.setdefault(m.layer, []).append((m, cols))
        self.means: dict[tuple[int, str], torch.Tensor] = {}  # (layer, kind) -> [H*D], as ganda.ablation keys them
        self.dtype = next(adapter.model.parameters()).dtype
        self._indices: dict[tuple[str, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}  # see _layer_index

    def take_means(self, reference: Sequence[Example]) -> None:
        """Mean ablation's values by the one mean rule (:mod:`ganda.ablation`): each mixer's slice
        averaged over every token of every reference prompt."""
        self.means = reference_means(self.adapter, reference, [m for ms in self.by_layer.values() for m, _ in ms])

    def trace(self, batch: Batch, edit: dict[str, Edit] | None = None) -> LayerCalls:
        """One no-grad pass that records every decoder layer's input and call (``edit``: IG's α edits)."""
        with torch.no_grad(), self.adapter.analysis_path(), Trace(self.adapter, edit=edit or {}):
            return LayerCalls(self.adapter, batch.ids, batch.mask, batch.position_ids, inputs=True)

    @property
    def reps(self) -> int:
        """Copies of a batch's rows one pass runs: IG's steps and the clean copy; 1 otherwise."""
        return 1 + len(self.alphas) if self.alphas is not None else 1

    def ig_edits(self, batch: Batch) -> dict[str, Edit]:
        """IG's edits of a batch repeated :attr:`reps` times: copy 0 is clean (α = 1), copy i + 1
        runs at ``alphas[i]``; every ranked head's slice becomes ``b + α·(z − b)`` and ``z`` (what
        the head computed in that pass) is kept in ``_raw`` for the product."""
        assert self.alphas is not None
        per_copy = batch.ids.shape[0] // self.reps
        alpha = torch.tensor([1.0, *self.alphas], device=batch.ids.device).repeat_interleave(per_copy)
        edits: dict[str, Edit] = {}
        for mixers in self.by_layer.values():
            for m, cols in mixers:
                ranked = torch.tensor([c is not None for c in cols], device=batch.ids.device)
                if not bool(ranked.any()):
                    continue
                point = z_point(m)
                cmask = ranked.repeat_interleave(m.head_dim)

                def edit(x: torch.Tensor, point: str = point, cmask: torch.Tensor = cmask,
                         key: tuple[int, str] = (m.layer, m.kind)) -> torch.Tensor:
                    self._raw[point] = x.detach()
                    a = alpha.to(x.dtype)[:, None, None]
                    if self.ablation == "mean":
                        mu = self.means[key].to(device=x.device, dtype=x.dtype)
                        scaled = mu + a * (x - mu)
                    else:
                        scaled = a * x
                    return torch.where(cmask, scaled, x)
                edits[point] = edit
        return edits

    def _heads_of(self, zs: list[tuple[Mixer, list[int | None], torch.Tensor]], grads: Sequence[torch.Tensor | None],
                  batch: Batch, n_items: int) -> list[tuple[list[int | None], torch.Tensor]]:
        """Per mixer: (head columns, ``[items, heads]`` first-order drops, on the model's device).
        IG: the gradient is taken at the edited ``ẑ`` and multiplied by the pass's own ``z``."""
        out = []
        for (m, cols, z), g in zip(zs, grads, strict=True):
            rows, w = z.shape[0], z.shape[1]
            if g is None:
                vals = z.new_zeros((n_items, m.num_heads), dtype=torch.float32)
            else:
                zf = (self._raw.get(z_point(m), z) if self.alphas is not None else z).detach().float()
                if self.ablation == "mean":
                    zf = zf - self.means[(m.layer, m.kind)].to(zf.device)
                prod = (zf * g.float()).reshape(rows, w, m.num_heads, m.head_dim).sum((1, 3))
                vals = prod.new_zeros((n_items, m.num_heads)).index_add_(0, batch.row_example, prod)
            out.append((cols, vals))
        return out

    def _layer_index(self, k: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per mixer of layer ``k`` (in :attr:`by_layer`'s order): its head indices that are ranked and
        their columns in the result, as index tensors on ``device``, built once per device and layer."""
        key = (str(device), k)
        if key not in self._indices:
            self._indices[key] = [index_pairs([(h, c) for h, c in enumerate(cols) if c is not None], device)
                                  for _, cols in self.by_layer.get(k, [])]
        return self._indices[key]

    def _replay(self, calls: LayerCalls, k: int, edit: dict[str, Edit] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, list[Any], torch.Tensor]:
        """Layer k recomputed with autograd from its recorded input: (input, output, the heads' ``z``
        with their mixers and head columns, the replay's relative difference from the model's own
        pass, a device scalar that :meth:`run` checks once per batch instead of a host sync per layer)."""
        mixers = self.by_layer.get(calls.layers[k], [])  # k: a position among the running layers
        points = [z_point(m) for m, _ in mixers]
        x, out, tr = replay_layer(self.adapter, calls, k, points, {p: e for p, e in (edit or {}).items() if p in points})
        want = calls.output(k).float()
        err = (out.detach().float() - want).abs().max() / (1.0 + want.abs().max())
        return x, out, [(m, cols, tr[p]) for (m, cols), p in zip(mixers, points, strict=True)], err

    def _check_replays(self, errs: dict[int, torch.Tensor], dtype: torch.dtype) -> None:
        """Refuse a model whose layers, replayed by hand, differ from its own pass."""
        if not errs:
            return
        layers = sorted(errs)
        values = torch.stack([errs[k] for k in layers]).cpu().tolist()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        bad = [k for k, v in zip(layers, values, strict=True) if v > tol]  # NaN: left to the finiteness checks
        if bad:
            raise GandaError(f"layer {bad[-1]} replayed by hand differs from the model's own pass; "
                             f"attribution does not support {type(self.adapter.model).__name__}")

    def run(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, list[list[float]]]:
        """``[items, heads]`` AtP; ``[blocks, heads]`` summed GradDrop terms (AtP*), ``[items, heads]``
        IG (IG: ``batch`` holds :attr:`reps` copies of the items, copy 0 the clean one) or None; clean
        log-likelihoods. The scores accumulate on the model's device and move to the host once per batch."""
        edit = self.ig_edits(batch) if self.alphas is not None else None
        calls = self.trace(batch, edit)
        n_items, n_heads, n_layers = len(batch.items), len(self.heads), self.n_layers
        dev = batch.ids.device
        atp = torch.zeros((n_items, n_heads), device=dev)
        gd = torch.zeros((self.n_blocks, n_heads), device=dev) if self.graddrop else None
        cot, lls = output_cotangent(self.adapter, batch, calls, self.margin)
        drops: dict[int, torch.Tensor] = {}  # block -> cotangent at the current layer's output, its branches dropped
        errs: dict[int, torch.Tensor] = {}
        for k in reversed(range(n_layers)):
            own = self.block_of[k]
            if self.graddrop and k > 0 and own not in drops:
                drops[own] = cot  # entering the block from above: its layers pass this cotangent on unchanged
            x, out, zs, errs[k] = self._replay(calls, k, edit)
            if k == n_layers - 1:
                self._check_replays(errs, out.dtype)  # the top layer at once: an unsupported model stops here
            passes: list[int | None] = [None, *sorted(b for b in drops if b != own)]
            need_x = k > 0
            inputs = ([x] if need_x else []) + [z for _, _, z in zs]
            index = self._layer_index(calls.layers[k], dev)
            new_cot = cot
            for j, ell in enumerate(passes):
                if not inputs:
                    break
                c = cot if ell is None else drops[ell]
                grads = torch.autograd.grad(out, inputs, grad_outputs=c.to(out.dtype), retain_graph=j < len(passes) - 1,
                                            allow_unused=True)
                gx, gz = (grads[0], grads[1:]) if need_x else (None, grads)
                if gx is not None:  # each pass's cotangent moves down a layer (the old one is freed)
                    if ell is None:
                        new_cot = gx
                    else:
                        drops[ell] = gx
                for (_, vals), (hsel, csel) in zip(self._heads_of(zs, gz, batch, n_items), index, strict=True):
                    if ell is None:
                        atp[:, csel] = vals[:, hsel]
                    else:
                        assert gd is not None
                        gd[ell, csel] += vals[:, hsel].sum(0)
                del grads, gx, gz, c
            del out, x
            if need_x:
                cot = new_cot
        self._check_replays(errs, calls.output(n_layers - 1).dtype)
        self._raw.clear()
        if self.alphas is not None:  # copy 0 is clean (AtP, log-likelihoods); the others are IG's steps
            per = n_items // self.reps
            steps = atp.reshape(self.reps, per, n_heads)
            return steps[0].cpu(), steps[1:].mean(0).cpu(), lls[:per]
        return atp.cpu(), (gd.cpu() if gd is not None else None), lls


BATCH_TOKENS = 4096  # padded tokens per batch on the CPU (the measured sweet spot: docs/attribution.md)
MAX_BATCH_TOKENS = 65536


def batch_tokens_for(n_layers: int, d_model: int, elem_bytes: int, blocks: int, free_bytes: float | None,
                     state: int = 0) -> int:
    """Padded tokens per batch on an accelerator with ``free_bytes`` free: what one batch holds per
    token (every layer's input in the model's dtype, the fp32 cotangents of the plain pass and each
    GradDrop block, and one layer's graph, about 16 hidden vectors, plus for a Mamba-1 layer of
    ``state`` = d_inner × N states ten float32 ``state`` tensors: its scan's graph and gradients)
    within half of the free memory, between the CPU's :data:`BATCH_TOKENS` and
    :data:`MAX_BATCH_TOKENS`. ``free_bytes`` None: the CPU's."""
    if free_bytes is None:
        return BATCH_TOKENS
    per_token = n_layers * d_model * elem_bytes + (blocks + 1) * d_model * 4 + 16 * d_model * elem_bytes \
        + 10 * state * 4
    return int(max(BATCH_TOKENS, min(MAX_BATCH_TOKENS, 0.5 * free_bytes // per_token)))


def default_batch_tokens(adapter: ModelAdapter, blocks: int = GRADDROP_BLOCKS) -> int:
    """:func:`batch_tokens_for` on the model's device (its free memory on CUDA; the CPU's fixed size)."""
    dev = adapter.device
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
    d_model = adapter.d_model
    elem = next(adapter.model.parameters()).element_size()
    state = max((m.num_heads * int(getattr(m.module, "ssm_state_size", 0) or 0) for m in adapter.mixers()
                 if m.kind == "ssm" and m.head_dim == 1), default=0)  # Mamba-1 channels
    return batch_tokens_for(len(adapter.decoder_layers()), d_model, elem, blocks, free, state)


def check_options(method: str = "atp*", ablation: str = "zero", margin: str = "mean", batch_tokens: int | None = None,
                  graddrop_blocks: int | None = GRADDROP_BLOCKS, name: Any = str, ig_steps: int = IG_STEPS) -> None:
    """Refuse (one line) an attribution option out of its range: the one place these are checked
    (``name(option)`` is how the caller names an option: ``--graddrop-blocks`` on the command line)."""
    if method not in METHODS:
        raise GandaError(f"{name('method')} must be one of {', '.join(METHODS)}, not {method!r}")
    if ablation == "resample":
        raise GandaError(f"{name('ablation')} resample is not estimated by attribution (it needs a donor per scored "
                         "row); use zero or mean, or eval --ablate HEAD --ablation resample")
    if ablation not in ABLATIONS:
        raise GandaError(f"{name('ablation')} must be one of {', '.join(ABLATIONS)}, not {ablation!r}")
    if margin not in MARGINS:
        raise GandaError(f"{name('margin')} must be one of {', '.join(MARGINS)}, not {margin!r}")
    if batch_tokens is not None and batch_tokens < 1:
        raise GandaError(f"{name('batch_tokens')} must be at least 1")
    if graddrop_blocks is not None and graddrop_blocks < 1:
        raise GandaError(f"{name('graddrop_blocks')} must be at least 1")
    if ig_steps < 1:
        raise GandaError(f"{name('ig_steps')} must be at least 1")


def _batch_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a line of attribution's journal (None: a batch's record)."""
    missing = [k for k, t in (("batch", int), ("atp", list), ("loglik", list)) if not isinstance(rec.get(k), t)]
    return f"a batch record without {', '.join(missing)}" if missing else None


def attribute(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    *,
    method: str = "atp*",
    ablation: str = "zero",
    margin: str = "mean",
    heads: Sequence[HeadId] | None = None,
    reference: Sequence[Example] | None = None,
    batch_tokens: int | None = None,
    graddrop_blocks: int | None = GRADDROP_BLOCKS,
    ig_steps: int = IG_STEPS,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
) -> Attribution:
    """Estimate every head's ablation effect on the margin metric (see the module docstring).

    ``method``: ``"atp"`` (one backward), ``"atp*"`` (adds GradDrop) or ``"ig"`` (integrated
    gradients over ``ig_steps`` midpoint steps, run as ``ig_steps + 1`` copies of each batch; the
    result's ``atp`` is plain AtP from the clean copy, ``estimate`` and ``ig`` IG). ``ablation``: ``"zero"``
    or ``"mean"`` (``reference``: the prompts the mean is taken over; default ``examples``).
    ``graddrop_blocks``: GradDrop over that many contiguous blocks of layers, ``L·G/2`` layer VJPs
    instead of ``L²/2`` (default 6; ``None``: one block per layer, the paper's form).
    ``batch_tokens`` bounds a batch's padded size (default :func:`default_batch_tokens`: 4,096 on
    the CPU, up to half the free memory on a GPU). With ``out_dir``, ``attribution.jsonl`` (a
    :class:`ganda.runio.Journal`) gets one line per finished batch and a stopped run resumes from it;
    only then are the weights fingerprinted.
    """
    check_options(method, ablation, margin, batch_tokens, graddrop_blocks, ig_steps=ig_steps)
    if not examples:
        raise GandaError("no examples to attribute")
    with cpu_clock() as clock:
        head_list = running_heads(adapter, heads, "attribution")
        eng = AttributionEngine(adapter, head_list, ablation, margin, graddrop=method == "atp*", blocks=graddrop_blocks,
                      alphas=ig_alphas(ig_steps) if method == "ig" else None)
        if batch_tokens is None:
            batch_tokens = default_batch_tokens(adapter, eng.n_blocks if method == "atp*" else 0)
        plan, packed = plan_batches(adapter, examples, max(1, batch_tokens // eng.reps))  # IG: reps copies share the budget
        cfg = _config(adapter, examples, eng, plan, method, ig_steps, reference)
        journal = _journal(adapter, out_dir, cfg, resume)
        if ablation == "mean":
            eng.take_means(reference if reference is not None else examples)
        try:
            atp, gd, lls = _run_batches(eng, plan, packed, len(examples), journal, progress, method)
        finally:
            if journal is not None:
                journal.close()
        mean_atp = atp.mean(0)
        est, gd_mag, ig = _estimates(eng, method, mean_atp, gd, len(examples))
    golds = [ex.gold for ex in examples]
    return Attribution(head_list, mean_atp.tolist(), est, method, ablation, margin, mean_margin(lls, golds, margin),
                       lls, golds, atp, gd_mag, clock["wall"], clock["cpu"], cfg, eng.means, ig,
                       gd if method == "ig" else None)


def _journal(adapter: ModelAdapter, out_dir: str | Path | None, cfg: dict[str, Any], resume: bool
             ) -> runio.Journal | None:
    """``out_dir/attribution.jsonl`` opened (resumed where it matches ``cfg``, into which the weights'
    fingerprint goes first), or None without ``out_dir``: the weights are fingerprinted only then."""
    if out_dir is None:
        return None
    cfg["weights"] = weights_fingerprint(adapter)
    return runio.Journal(Path(out_dir) / "attribution.jsonl", cfg, "attribution", resume=resume,
                         check=_batch_problem).open()


def _config(adapter: ModelAdapter, examples: Sequence[Example], eng: AttributionEngine, plan: list[list[BatchItem]],
            method: str, ig_steps: int, reference: Sequence[Example] | None) -> dict[str, Any]:
    """What attribution's journal records and a resumed run must match: the prompts, the options,
    the batches (fixed by the inputs) and the dtype."""
    return {"model": adapter.spec, "n": len(examples), "prompts_sha": examples_digest(examples), "method": method,
            "ablation": eng.ablation, "margin": eng.margin, "heads": [str(h) for h in eng.heads],
            "graddrop_blocks": eng.n_blocks if method == "atp*" else None,
            "ig_steps": ig_steps if method == "ig" else None,
            "batches": [[it.index for it in b] for b in plan],
            "reference_sha": examples_digest(reference) if reference is not None else None,
            "dtype": str(eng.dtype).removeprefix("torch.")}


def _estimates(eng: AttributionEngine, method: str, mean_atp: torch.Tensor, gd: torch.Tensor | None, n: int
               ) -> tuple[list[float], list[float] | None, list[float] | None]:
    """Each head's estimate, by method: AtP's mean; AtP*'s GradDrop magnitude under AtP's sign; IG's
    mean. Also AtP*'s magnitudes and IG's per-head means (None for the other methods)."""
    est, gd_mag, ig = mean_atp.tolist(), None, None
    if method == "ig":
        assert gd is not None
        ig = gd.mean(0).tolist()
        est = list(ig)
    elif gd is not None:
        positions = [eng.adapter.layer_position(h.layer) for h in eng.heads]  # GradDrop's blocks: of the running layers
        gd_mag = graddrop_scores(gd / n, mean_atp, positions, eng.n_layers, eng.n_blocks)
        est = [(1.0 if a >= 0 else -1.0) * s for a, s in zip(mean_atp.tolist(), gd_mag, strict=True)]
    return est, gd_mag, ig


def _run_batches(eng: AttributionEngine, plan: list[list[BatchItem]], packed: bool, n: int, journal: runio.Journal | None,
                 progress: bool, method: str) -> tuple[torch.Tensor, torch.Tensor | None, list[list[float]]]:
    """Every batch's AtP, GradDrop sums (AtP*) or per-prompt IG (IG) and clean log-likelihoods,
    from the journal where an earlier run finished the batch, else computed (and journalled)."""
    done = {rec["batch"]: rec for rec in journal.records} if journal is not None else {}
    n_heads = len(eng.heads)
    atp = torch.zeros((n, n_heads))
    ig = method == "ig"
    gd = torch.zeros((n, n_heads)) if ig else torch.zeros((eng.n_blocks, n_heads)) if method == "atp*" else None
    key = "ig" if ig else "graddrop"
    lls: list[list[float]] = [[] for _ in range(n)]
    bar = tqdm(total=n, initial=sum(len(plan[b]) for b in done if b < len(plan)), desc=f"attribute ({method})",
               unit="prompt", disable=not progress)
    try:
        for b, items in enumerate(plan):
            if b in done:
                rec = done[b]
                a_b = torch.tensor(rec["atp"])
                g_b = torch.tensor(rec[key]) if rec.get(key) is not None else None
                ll_b = rec["loglik"]
            else:
                a_b, g_b, ll_b = _run_fitting(eng, items, packed)
                if journal is not None:
                    journal.append({"batch": b, "atp": a_b.tolist(), key: g_b.tolist() if g_b is not None else None,
                                    "loglik": ll_b})
                bar.update(len(items))
            for j, it in enumerate(items):
                atp[it.index] = a_b[j]
                lls[it.index] = ll_b[j]
                if ig:
                    if g_b is None:
                        raise GandaError(f"attribution journal: batch {b} has no ig scores")
                    gd[it.index] = g_b[j]  # type: ignore[index]
            if gd is not None and g_b is not None and not ig:
                gd += g_b
    finally:
        bar.close()
    return atp, gd, lls


def _run_fitting(eng: AttributionEngine, items: list[BatchItem], packed: bool) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                          list[list[float]]]:
    """``eng.run`` on one batch; a batch that runs the device out of memory runs as two halves
    instead (AtP is per prompt and GradDrop a sum over prompts, so the halves give the same
    numbers). The batch sizes are estimates (:func:`batch_tokens_for`); an SSM's scan keeps far more
    per token than a Transformer's layers, and no estimate covers every kernel. IG runs the items
    :attr:`AttributionEngine.reps` times over (its per-prompt scores concatenate like AtP's)."""
    try:
        return eng.run(make_batch(eng.adapter, items * eng.reps, packed, eng.dtype))
    except torch.OutOfMemoryError:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(items) == 1:
            raise GandaError(f"attribution: one prompt ({max(map(len, items[0].rows))} tokens) does not fit in the "
                             f"memory of {eng.adapter.device} with its gradients; use shorter prompts, fewer "
                             "GradDrop blocks (--graddrop-blocks) or a larger device") from None
    half = len(items) // 2
    (a1, g1, l1), (a2, g2, l2) = _run_fitting(eng, items[:half], packed), _run_fitting(eng, items[half:], packed)
    if g1 is None or g2 is None:
        return torch.cat([a1, a2]), None, [*l1, *l2]
    return torch.cat([a1, a2]), torch.cat([g1, g2]) if eng.alphas is not None else g1 + g2, [*l1, *l2]


def graddrop_blocks(n_layers: int, blocks: int | None) -> list[int]:
    """Each layer's GradDrop block: ``blocks`` contiguous runs of layers as equal as possible
    (``None``: one block per layer, AtP*'s own form)."""
    g = n_layers if blocks is None else max(1, min(int(blocks), n_layers))
    return [k * g // n_layers for k in range(n_layers)]


def graddrop_scores(dropped: torch.Tensor, atp: torch.Tensor, layers: Sequence[int], n_layers: int,
                    blocks: int | None = None) -> list[float]:
    """AtP*'s ``1/(G−1) Σ_b |AtP_{−b}(h)|`` over the ``G`` GradDrop blocks, from the mean dropped
    estimates ``[G, heads]`` (rows b above the head's block) and plain AtP (every block below it);
    ``0`` for the head's own block (its only route to the output is dropped), ``|AtP|`` when there
    is one block. With one block per layer this is the paper's ``1/(L−1) Σ_ℓ``."""
    block_of = graddrop_blocks(n_layers, blocks)
    n_blocks = max(block_of) + 1 if block_of else 0
    out = []
    for i, layer in enumerate(layers):
        a = abs(float(atp[i]))
        if n_blocks < 2:
            out.append(a)
            continue
        b = block_of[layer]
        s = b * a + sum(abs(float(dropped[c, i])) for c in range(b + 1, n_blocks))
        out.append(s / (n_blocks - 1))
    return out
