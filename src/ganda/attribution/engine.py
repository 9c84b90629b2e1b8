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

Transformers (Llama layout) run in the sweep's packed layout (an example's choices share one
sequence through a block mask), so estimate and exact sweep see the same tokens; other families
run one right-padded row per choice on the pure-PyTorch SSM path, so autograd reaches every head.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import GandaError
from ..heads import HeadId
from ..models.base import Mixer, ModelAdapter
from ..models.ssm.common import SSMAdapterBase, torch_path
from ..progress import tqdm
from ..sweep import _Packed, prepare, weights_fingerprint
from ..tasks.base import Example

METHODS = ("atp", "atp*")
ABLATIONS = ("zero", "mean")
MARGINS = ("mean", "max")


GRADDROP_BLOCKS = 6  # GradDrop's default blocks of layers: L·6/2 layer VJPs, not L²/2 (docs/attribution.md)


def margin_of(ll: torch.Tensor, gold: int, margin: str = "mean") -> torch.Tensor:
    """Gold log-likelihood minus the mean (or the best) of the other choices' (differentiable)."""
    others = torch.cat([ll[:gold], ll[gold + 1:]])
    if others.numel() == 0:
        raise GandaError("a margin needs at least two choices")
    return ll[gold] - (others.mean() if margin == "mean" else others.max())


def metric_value(logliks: Sequence[Sequence[float]], golds: Sequence[int], margin: str = "mean") -> float:
    """The metric (mean margin over prompts) from per-prompt choice log-likelihoods."""
    vals = [float(margin_of(torch.tensor(ll, dtype=torch.float64), g, margin)) for ll, g in zip(logliks, golds, strict=True)]
    return sum(vals) / max(1, len(vals))


# ---------------------------------------------------------------------------------------------
# batches


@dataclass
class _Item:
    index: int
    gold: int
    rows: list[list[int]]  # token rows (packed: one)
    positions: list[list[int]] | None  # packed only
    parents: list[list[int]] | None  # packed only: -1 prefix, else choice index
    reads: list[tuple[int, list[int], list[int]]]  # per choice: (row within item, positions, target ids)


@dataclass
class _Batch:
    items: list[_Item]
    ids: torch.Tensor
    mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    row_example: torch.Tensor  # [rows] index into items
    valid: torch.Tensor  # [rows, W] bool: real (non-pad) positions
    packed: bool

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])


def _item(p: _Packed, index: int, packed: bool) -> _Item:
    if packed:
        reads = [(0, list(r), list(c)) for r, c in zip(p.read, p.conts, strict=True)]
        return _Item(index, p.gold, [list(p.tokens)], [list(p.positions)], [list(p.parent)], reads)
    if p.single:
        ctx = p.rows[0][: p.ctx_lens[0]]
        reads = [(0, [len(ctx) - 1], list(c)) for c in p.conts]
        return _Item(index, p.gold, [ctx], None, None, reads)
    reads = []
    for i, (n, c) in enumerate(zip(p.ctx_lens, p.conts, strict=True)):
        reads.append((i, list(range(n - 1, n + len(c) - 1)), list(c)))
    return _Item(index, p.gold, [r[:-1] for r in p.rows], None, None, reads)


def _pad_id(adapter: ModelAdapter) -> int:
    tok = adapter.tokenizer
    return int(getattr(tok, "pad_token_id", None) or 0) if tok is not None else 0


def _make_batch(adapter: ModelAdapter, items: list[_Item], packed: bool, dtype: torch.dtype) -> _Batch:
    dev = adapter.device
    rows = [r for it in items for r in it.rows]
    row_example = torch.tensor([j for j, it in enumerate(items) for _ in it.rows], device=dev)
    w = max(len(r) for r in rows)
    ids = torch.full((len(rows), w), _pad_id(adapter), dtype=torch.long)
    valid = torch.zeros((len(rows), w), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        valid[i, : len(r)] = True
    if not packed:
        return _Batch(items, ids.to(dev), valid.long().to(dev), None, row_example, valid.to(dev), False)
    pos = torch.zeros((len(rows), w), dtype=torch.long)
    mask = torch.full((len(rows), 1, w, w), torch.finfo(dtype).min, dtype=dtype)
    idx = torch.arange(w)
    for i, it in enumerate(items):
        assert it.positions is not None and it.parents is not None
        n = len(it.rows[0])
        pos[i, :n] = torch.tensor(it.positions[0])
        parent = torch.tensor(it.parents[0])
        causal = idx[None, :n] <= idx[:n, None]
        same = (parent[None, :] == -1) | (parent[None, :] == parent[:, None])
        mask[i, 0, :n, :n].masked_fill_(causal & same, 0.0)
        mask[i, 0, idx[n:], idx[n:]] = 0.0  # a pad position sees only itself (no all-masked row)
    return _Batch(items, ids.to(dev), mask.to(dev), pos.to(dev), row_example, valid.to(dev), True)


def _plan(adapter: ModelAdapter, examples: Sequence[Example], batch_tokens: int) -> tuple[list[list[_Item]], bool]:
    """Items grouped into batches of at most ``batch_tokens`` padded tokens (fixed by the inputs)."""
    runner = adapter.sweep_runner()
    prepared = [prepare(adapter, ex) for ex in examples]
    for p in prepared:
        adapter.check_length(p.width)
    packed = runner is not None and all(runner.can_pack(len(p.tokens)) for p in prepared)
    items = [_item(p, i, packed) for i, p in enumerate(prepared)]
    batches: list[list[_Item]] = []
    cur: list[_Item] = []
    for it in items:
        trial = cur + [it]
        n_rows = sum(len(x.rows) for x in trial)
        width = max(len(r) for x in trial for r in x.rows)
        if cur and n_rows * width > batch_tokens:
            batches.append(cur)
            trial = [it]
        cur = trial
    if cur:
        batches.append(cur)
    return batches, packed


# ---------------------------------------------------------------------------------------------
# running layers by hand


class _Stop(Exception):
    """Raised after the last decoder layer: the capture pass needs nothing beyond it."""


@dataclass
class _Trace:
    inputs: list[torch.Tensor]  # residual entering each decoder layer
    calls: list[tuple[tuple[Any, ...], dict[str, Any], bool]]  # (other args, kwargs, hidden passed by keyword)
    last: torch.Tensor  # residual leaving the last layer


def _ssm_context(adapter: ModelAdapter) -> contextlib.AbstractContextManager[Any]:
    return torch_path(adapter.model) if isinstance(adapter, SSMAdapterBase) else contextlib.nullcontext()


def _capture(adapter: ModelAdapter, run: Callable[[], Any]) -> _Trace:
    """One no-grad pass that records every decoder layer's input and call arguments."""
    layers = adapter.decoder_layers()
    calls: list[tuple[tuple[Any, ...], dict[str, Any], bool]] = []
    inputs: list[torch.Tensor] = []
    box: dict[str, torch.Tensor] = {}

    def pre(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        kw = dict(kwargs)
        by_kw = not args
        h = kw.pop("hidden_states") if by_kw else args[0]
        for key in ("past_key_values", "past_key_value", "cache_params"):
            if key in kw:
                kw[key] = None
        if "use_cache" in kw:
            kw["use_cache"] = False
        inputs.append(h)
        calls.append((tuple(args[1:]), kw, by_kw))

    def post(_m: Any, _args: Any, _kwargs: Any, out: Any) -> None:
        box["h"] = out[0] if isinstance(out, tuple) else out
        raise _Stop

    handles = [layer.register_forward_pre_hook(pre, with_kwargs=True) for layer in layers]
    handles.append(layers[-1].register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if len(inputs) != len(layers) or "h" not in box:
        raise GandaError("could not capture every decoder layer's input (a layer removed by an intervention?)")
    return _Trace(inputs, calls, box["h"])


def _call_layer(adapter: ModelAdapter, i: int, h: torch.Tensor, trace: _Trace) -> torch.Tensor:
    args, kw, by_kw = trace.calls[i]
    layer = adapter.decoder_layers()[i]
    out = layer(**kw, hidden_states=h) if by_kw else layer(h, *args, **kw)
    return out[0] if isinstance(out, tuple) else out


class _Tail:
    """Final norm + LM head + log-softmax at the read positions only (``[K, d]`` -> ``[K, V]`` fp32)."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        self.runner = adapter.sweep_runner()
        self.norm: Any = None
        self.head: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.checked = self.runner is not None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.runner is not None:
            return self.runner.logprobs(hidden)
        assert self.norm is not None and self.head is not None
        return torch.log_softmax(self.head(self.norm(hidden)).float(), -1)

    def find(self, batch: _Batch, trace: _Trace) -> None:
        """Find the final norm (the module that reads the last layer's output) and check the tail
        reproduces the model's own log-probabilities."""
        model = self.adapter.model
        inside = {id(m) for layer in self.adapter.decoder_layers() for m in layer.modules()}
        box: dict[str, Any] = {}
        last_out: dict[str, torch.Tensor] = {}

        def on_last(_m: Any, _a: Any, out: Any) -> None:
            last_out["h"] = out[0] if isinstance(out, tuple) else out

        def pre(mod: Any, args: tuple[Any, ...]) -> None:
            if "norm" not in box and args and "h" in last_out and args[0] is last_out["h"]:
                box["norm"] = mod

        handles = [self.adapter.decoder_layers()[-1].register_forward_hook(on_last)]
        handles += [m.register_forward_pre_hook(pre) for m in model.modules()
                    if id(m) not in inside and m is not model and not list(m.children())]
        try:
            with torch.no_grad(), _ssm_context(self.adapter):
                logits = self.adapter.forward(batch.ids, attention_mask=batch.mask)
        finally:
            for h in handles:
                h.remove()
        if "norm" not in box:
            raise GandaError(f"attribution cannot find {type(model).__name__}'s final norm")
        self.norm = box["norm"]
        lm = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "lm_head", None)
        if lm is None:  # tied embeddings without an output module (Llamba)
            emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.backbone.embedding
            w = emb.weight
            self.head = lambda x: torch.nn.functional.linear(x, w)
        else:
            mult = float(getattr(getattr(model, "model", None), "lm_head_multiplier", 1.0) or 1.0)
            self.head = (lambda x: lm(x) * mult) if mult != 1.0 else lm
        r, pos = 0, batch.items[0].reads[0][1]
        with torch.no_grad():
            mine = self(trace.last[r, pos])
            ref = torch.log_softmax(logits[r, pos].float(), -1)
        if not torch.allclose(mine, ref, atol=1e-3, rtol=1e-3):
            raise GandaError(f"attribution cannot reproduce {type(model).__name__}'s output layer "
                             f"(max |Δ log p| {float((mine - ref).abs().max()):.2e})")
        self.checked = True


# ---------------------------------------------------------------------------------------------
# the result


@dataclass
class Attribution:
    """Per-head first-order effect estimates (drop of the margin metric when the head is ablated)."""

    heads: list[HeadId]
    atp: list[float]  # plain AtP, signed
    estimate: list[float]  # the ranking score: AtP, or AtP* magnitude with AtP's sign
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

    def order(self) -> list[int]:
        """Head indices by |estimate|, largest first (ties: head order)."""
        return sorted(range(len(self.heads)), key=lambda i: (-abs(self.estimate[i]), i))

    def by_head(self) -> dict[str, float]:
        return {str(h): e for h, e in zip(self.heads, self.estimate, strict=True)}


# ---------------------------------------------------------------------------------------------
# the engine


class _Engine:
    def __init__(self, adapter: ModelAdapter, heads: list[HeadId], ablation: str, margin: str, graddrop: bool,
                 blocks: int | None = None) -> None:
        self.adapter = adapter
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
        self.means: dict[int, torch.Tensor] = {}  # id(mixer) -> [H*D]
        self.mixer_key = {id(m): (m.layer, m.kind) for m in adapter.mixers()}
        self.tail = _Tail(adapter)
        self.dtype = next(adapter.model.parameters()).dtype

    def trace(self, batch: _Batch) -> _Trace:
        if batch.packed:
            backbone = self.adapter.model.model

            def run() -> Any:
                return backbone(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.position_ids,
                                use_cache=False)
        else:
            def run() -> Any:
                return self.adapter.forward(batch.ids, attention_mask=batch.mask)
        with _ssm_context(self.adapter):
            tr = _capture(self.adapter, run)
        if not self.tail.checked:
            self.tail.find(batch, tr)
        return tr

    def reference_means(self, batches: Sequence[_Batch]) -> None:
        """``μ_h``: each mixer's output-projection input averaged over every real position."""
        sums: dict[int, torch.Tensor] = {}
        count = 0
        for batch in batches:
            handles = []
            for mixers in self.by_layer.values():
                for m, _ in mixers:
                    def hook(_mod: Any, args: tuple[Any, ...], key: int = id(m), valid: torch.Tensor = batch.valid) -> None:
                        x = args[0].float()
                        s = (x * valid[..., None]).sum((0, 1))
                        sums[key] = sums[key] + s if key in sums else s
                    handles.append(self.adapter.register_out_proj_pre_hook(m, hook))
            try:
                with torch.no_grad(), _ssm_context(self.adapter):
                    if batch.packed:
                        self.adapter.model.model(input_ids=batch.ids, attention_mask=batch.mask,
                                                 position_ids=batch.position_ids, use_cache=False)
                    else:
                        self.adapter.forward(batch.ids, attention_mask=batch.mask)
            finally:
                for h in handles:
                    h.remove()
            count += int(batch.valid.sum())
        self.means = {k: v / max(1, count) for k, v in sums.items()}

    def _metric(self, batch: _Batch, h_last: torch.Tensor) -> tuple[torch.Tensor, list[list[float]]]:
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
        lp = self.tail(h_last[torch.tensor(rows, device=dev), torch.tensor(pos, device=dev)])
        picked = lp[torch.arange(len(tgt), device=dev), torch.tensor(tgt, device=dev)]
        lls: list[list[torch.Tensor]] = [[picked.new_zeros(()) for _ in it.reads] for it in batch.items]
        for k, (j, c) in enumerate(owner):
            lls[j][c] = lls[j][c] + picked[k]
        total = picked.new_zeros(())
        for it, ll in zip(batch.items, lls, strict=True):
            total = total + margin_of(torch.stack(ll), it.gold, self.margin)
        return total, [[float(v.detach()) for v in ll] for ll in lls]

    def _heads_of(self, zs: list[tuple[Mixer, list[int | None], torch.Tensor]], grads: Sequence[torch.Tensor | None],
                  batch: _Batch, n_items: int) -> list[tuple[list[int | None], torch.Tensor]]:
        """Per mixer: (head columns, ``[items, heads]`` first-order drops)."""
        out = []
        for (m, cols, z), g in zip(zs, grads, strict=True):
            rows, w = z.shape[0], z.shape[1]
            if g is None:
                vals = z.new_zeros((n_items, m.num_heads), dtype=torch.float32)
            else:
                zf = z.detach().float()
                if self.ablation == "mean":
                    zf = zf - self.means[id(m)].to(zf.device)
                prod = (zf * g.float()).reshape(rows, w, m.num_heads, m.head_dim).sum((1, 3))
                vals = prod.new_zeros((n_items, m.num_heads)).index_add_(0, batch.row_example, prod)
            out.append((cols, vals.cpu()))
        return out

    def run(self, batch: _Batch) -> tuple[torch.Tensor, torch.Tensor | None, list[list[float]]]:
        """``[items, heads]`` AtP, ``[blocks, heads]`` summed GradDrop terms (or None), clean log-likelihoods."""
        tr = self.trace(batch)
        n_items, n_heads, n_layers = len(batch.items), len(self.heads), self.n_layers
        atp = torch.zeros((n_items, n_heads))
        gd = torch.zeros((self.n_blocks, n_heads)) if self.graddrop else None
        with torch.enable_grad():
            top = tr.last.detach().requires_grad_(True)
            total, lls = self._metric(batch, top)
            (cot,) = torch.autograd.grad(total, [top])
        drops: dict[int, torch.Tensor] = {}  # block -> cotangent at the current layer's output, its branches dropped
        for k in reversed(range(n_layers)):
            own = self.block_of[k]
            if self.graddrop and k > 0 and own not in drops:
                drops[own] = cot  # entering the block from above: its layers pass this cotangent on unchanged
            zs: list[tuple[Mixer, list[int | None], torch.Tensor]] = []
            handles = []
            for m, cols in self.by_layer.get(k, []):
                def hook(_mod: Any, args: tuple[Any, ...], m: Mixer = m, cols: list[int | None] = cols,
                         zs: list[Any] = zs) -> None:
                    zs.append((m, cols, args[0]))
                handles.append(self.adapter.register_out_proj_pre_hook(m, hook))
            try:
                with torch.enable_grad(), _ssm_context(self.adapter):
                    x = tr.inputs[k].detach().requires_grad_(True)
                    out = _call_layer(self.adapter, k, x, tr)
            finally:
                for h in handles:
                    h.remove()
            want = (tr.last if k == n_layers - 1 else tr.inputs[k + 1]).float()
            err = float((out.detach().float() - want).abs().max()) / (1.0 + float(want.abs().max()))
            if err > (1e-4 if out.dtype == torch.float32 else 3e-2):
                raise GandaError(f"layer {k} replayed by hand differs from the model's own pass; "
                                 f"attribution does not support {type(self.adapter.model).__name__}")
            passes: list[int | None] = [None, *sorted(b for b in drops if b != own)]
            need_x = k > 0
            inputs = ([x] if need_x else []) + [z for _, _, z in zs]
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
                for cols, vals in self._heads_of(zs, gz, batch, n_items):
                    for hcol, col in enumerate(cols):
                        if col is None:
                            continue
                        if ell is None:
                            atp[:, col] = vals[:, hcol]
                        else:
                            assert gd is not None
                            gd[ell, col] += float(vals[:, hcol].sum())
                del grads, gx, gz, c
            del out, x
            if need_x:
                cot = new_cot
        return atp, gd, lls


def _prompts_digest(examples: Sequence[Example]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.prompt, ex.choices, ex.gold, ex.meta.get("contexts"), ex.meta.get("continuation")],
                            default=str).encode())
    return h.hexdigest()[:16]


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines; a torn last line (a killed write, no newline) is cut off, and any other
    line that is not a JSON object is one error naming it."""
    if not path.exists():
        return []
    out, good = [], 0
    data = path.read_bytes()
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            rec = None
        if not isinstance(rec, dict):  # a whole line that is not a record: damage, never cut silently
            raise GandaError(f"{path}, line {len(out) + 1}: not a record; the file is damaged: use --no-resume "
                             "to start over, or another --out")
        out.append(rec)
        good += len(line)
    if good != len(data):
        with path.open("r+b") as f:
            f.truncate(good)
    return out


@contextlib.contextmanager
def _cpu_clock() -> Iterator[dict[str, float]]:
    box: dict[str, float] = {}
    t, c = time.perf_counter(), time.process_time()
    try:
        yield box
    finally:
        box["wall"] = time.perf_counter() - t
        box["cpu"] = time.process_time() - c


def attribute(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    *,
    method: str = "atp*",
    ablation: str = "zero",
    margin: str = "mean",
    heads: Sequence[HeadId] | None = None,
    reference: Sequence[Example] | None = None,
    batch_tokens: int = 4096,
    graddrop_blocks: int | None = GRADDROP_BLOCKS,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
) -> Attribution:
    """Estimate every head's ablation effect on the margin metric (see the module docstring).

    ``method``: ``"atp"`` (one backward) or ``"atp*"`` (adds GradDrop). ``ablation``: ``"zero"``
    or ``"mean"`` (``reference``: the prompts the mean is taken over; default ``examples``).
    ``graddrop_blocks``: GradDrop over that many contiguous blocks of layers, ``L·G/2`` layer VJPs
    instead of ``L²/2`` (default 6; ``None``: one block per layer, the paper's form).
    ``batch_tokens`` bounds a batch's padded size. With ``out_dir``, ``attribution.jsonl`` gets one
    line per finished batch and a stopped run resumes from it.
    """
    if method not in METHODS:
        raise GandaError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if ablation not in ABLATIONS:
        raise GandaError(f"ablation must be 'zero' or 'mean', not {ablation!r}")
    if margin not in MARGINS:
        raise GandaError(f"margin must be 'mean' or 'max', not {margin!r}")
    if not examples:
        raise GandaError("no examples to attribute")
    if batch_tokens < 1:
        raise GandaError("batch_tokens must be at least 1")
    with _cpu_clock() as clock:
        head_list = sorted(adapter.canonical(h) for h in (heads if heads is not None else adapter.heads()))
        if graddrop_blocks is not None and graddrop_blocks < 1:
            raise GandaError("graddrop_blocks must be at least 1")
        eng = _Engine(adapter, head_list, ablation, margin, graddrop=method == "atp*", blocks=graddrop_blocks)
        plan, packed = _plan(adapter, examples, batch_tokens)
        dtype = eng.dtype
        cfg = {"model": adapter.spec, "n": len(examples), "prompts_sha": _prompts_digest(examples), "method": method,
               "ablation": ablation, "margin": margin, "heads": [str(h) for h in head_list],
               "graddrop_blocks": eng.n_blocks if method == "atp*" else None,
               "batches": [[it.index for it in b] for b in plan],
               "reference_sha": _prompts_digest(reference) if reference is not None else None,
               "weights": weights_fingerprint(adapter) if out_dir is not None else None, "dtype": str(next(adapter.model.parameters()).dtype).removeprefix("torch.")}
        done: dict[int, dict[str, Any]] = {}
        path = Path(out_dir) / "attribution.jsonl" if out_dir is not None else None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not resume and path.exists():
                path.unlink()
            lines = _read_lines(path)
            if lines:
                if lines[0].get("config") != cfg:
                    raise GandaError(f"{path} holds a different attribution (model, weights, prompts, method or heads "
                                     "differ); "
                                     "use --no-resume to start over or another --out")
                done = {rec["batch"]: rec for rec in lines[1:]}
            else:
                path.write_text(json.dumps({"type": "header", "config": cfg}) + "\n")
        if ablation == "mean":
            ref_plan, ref_packed = (plan, packed) if reference is None else _plan(adapter, reference, batch_tokens)
            eng.reference_means([_make_batch(adapter, b, ref_packed, dtype) for b in ref_plan])
        n = len(examples)
        atp = torch.zeros((n, len(head_list)))
        gd = torch.zeros((eng.n_blocks, len(head_list))) if method == "atp*" else None
        lls: list[list[float]] = [[] for _ in range(n)]
        bar = tqdm(total=n, initial=sum(len(plan[b]) for b in done if b < len(plan)), desc=f"attribute ({method})",
                   unit="prompt", disable=not progress)
        fh = path.open("a") if path is not None else None
        try:
            for b, items in enumerate(plan):
                if b in done:
                    rec = done[b]
                    a_b = torch.tensor(rec["atp"])
                    g_b = torch.tensor(rec["graddrop"]) if rec.get("graddrop") is not None else None
                    ll_b = rec["loglik"]
                else:
                    a_b, g_b, ll_b = eng.run(_make_batch(adapter, items, packed, dtype))
                    if fh is not None:
                        fh.write(json.dumps({"batch": b, "atp": a_b.tolist(),
                                             "graddrop": g_b.tolist() if g_b is not None else None,
                                             "loglik": ll_b}) + "\n")
                        fh.flush()
                    bar.update(len(items))
                for j, it in enumerate(items):
                    atp[it.index] = a_b[j]
                    lls[it.index] = ll_b[j]
                if gd is not None and g_b is not None:
                    gd += g_b
        finally:
            bar.close()
            if fh is not None:
                fh.close()
        mean_atp = atp.mean(0)
        golds = [ex.gold for ex in examples]
        est = mean_atp.tolist()
        gd_mag: list[float] | None = None
        if gd is not None:
            gd_mag = graddrop_scores(gd / n, mean_atp, [h.layer for h in head_list], eng.n_layers, eng.n_blocks)
            est = [(1.0 if a >= 0 else -1.0) * s for a, s in zip(mean_atp.tolist(), gd_mag, strict=True)]
    means = {eng.mixer_key[k]: v for k, v in eng.means.items()}
    return Attribution(head_list, mean_atp.tolist(), est, method, ablation, margin, metric_value(lls, golds, margin),
                       lls, golds, atp, gd_mag, clock["wall"], clock["cpu"], cfg, means)


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
