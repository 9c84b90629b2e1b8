"""The one interface every model family implements.

Everything above ``models/`` (interventions, tasks, scoring, patterns, experiments) talks to a
model only through :class:`ModelAdapter`: its decoder layers, the mixers in each layer (attention
or SSM) with their head layout and output projection, and ``attention_maps`` (softmax attention for
attention heads, the exact materialised mixer for SSM heads). Adding a family means one adapter
file plus a registry entry; nothing else changes.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..device import shape_free_attention
from ..errors import GandaError
from ..heads import HeadId

PreHook = Callable[[nn.Module, tuple[Any, ...]], Any]
PostHook = Callable[[nn.Module, tuple[Any, ...], Any], Any]


@dataclass
class Mixer:
    """One token mixer (an attention block or an SSM) inside a decoder layer.

    ``out_proj`` is the linear layer whose *input* is laid out head-major as
    ``[..., num_heads * head_dim]``; zeroing head h's slice there is the paper's ablation
    (equivalent to zeroing h's columns of the output projection's weight).
    """

    layer: int
    kind: str  # "attn" | "ssm"
    num_heads: int
    head_dim: int
    out_proj: nn.Linear
    module: nn.Module
    shared_key: str | None = None  # set when the same weights are invoked at several layers (Zamba2)

    @classmethod
    def attention(cls, layer: int, attn: nn.Module, num_heads: int, shared_key: str | None = None) -> Mixer:
        """A Llama-style attention module's query heads, written through its ``o_proj``."""
        head_dim = getattr(attn, "head_dim", None) or attn.o_proj.in_features // num_heads
        return cls(layer, "attn", num_heads, head_dim, attn.o_proj, attn, shared_key)

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (grouped-query attention; 1 where heads share nothing)."""
        return getattr(self.module, "num_key_value_groups", 1) or 1

    def head_slice(self, head: int) -> slice:
        return slice(head * self.head_dim, (head + 1) * self.head_dim)


class OutputHead:
    """The model's final norm and LM head as a function of final residual vectors
    ``[..., d_model]`` -> logits ``[..., V]``, differentiable, for any family.

    Found once per adapter by watching one short forward: the norm is the module outside the
    decoder layers that reads the last layer's output, the head is the model's output embedding
    (or the tied input embedding), with the logit multipliers, soft-capping and scaling its config
    declares. The pair is checked against the model's own logits on that forward; where it does
    not reproduce them (a family with other output arithmetic), every call runs the model's own
    forward on one layer whose output is replaced, which is exact by construction.
    """

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        self.norm: nn.Module | None = None
        self.dtype: torch.dtype | None = None
        self.exact_forward = False
        self._find()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.exact_forward:
            return self._through_forward(hidden)
        assert self.norm is not None
        return self._head(self.norm(hidden.to(self.dtype or hidden.dtype)))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        model = self.adapter.model
        lm = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if lm is None:
            lm = getattr(model, "lm_head", None)
        if lm is None:  # tied embeddings without an output module (Llamba)
            emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.backbone.embedding
            logits = F.linear(x.to(emb.weight.dtype), emb.weight)
        else:  # SSM families keep the residual in fp32 and cast it to the head's dtype
            logits = lm(x.to(lm.weight.dtype))
        cfg = getattr(model, "config", None)
        mult = float(getattr(getattr(model, "model", None), "lm_head_multiplier", 1.0) or 1.0)
        if mult != 1.0:
            logits = logits * mult
        scale = getattr(cfg, "logits_scaling", None)
        if scale:
            logits = logits / scale
        cap = getattr(cfg, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _find(self) -> None:
        ad = self.adapter
        model = ad.model
        layers = ad.decoder_layers()
        inside = {id(m) for layer in layers for m in layer.modules()}
        last: dict[str, torch.Tensor] = {}
        found: dict[str, Any] = {}

        def on_last(_m: Any, _a: Any, out: Any) -> None:
            last["h"] = hidden_of(out)

        def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
            if "norm" not in found and args and "h" in last and args[0] is last["h"]:
                found["norm"], found["dtype"] = mod, args[0].dtype

        handles = [layers[-1].register_forward_hook(on_last)]
        handles += [m.register_forward_pre_hook(pre) for m in model.modules()
                    if id(m) not in inside and m is not model and not list(m.children())]
        try:
            with torch.no_grad():
                logits = ad.forward(torch.zeros((1, 3), dtype=torch.long, device=ad.device))
        finally:
            for h in handles:
                h.remove()
        if "norm" in found:
            self.norm, self.dtype = found["norm"], found["dtype"]
            with torch.no_grad():
                mine = self._head(self.norm(last["h"]))
            tol = 1e-4 if logits.dtype == torch.float32 else 2e-2
            if mine.shape == logits.shape and torch.allclose(mine.float(), logits.float(), atol=tol, rtol=tol):
                return
        self.exact_forward = True

    def _through_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ad = self.adapter
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])

        def replace(_m: Any, _a: Any, out: Any) -> Any:
            h = flat[None].to(hidden_of(out).dtype)
            return (h, *out[1:]) if isinstance(out, tuple) else h

        # hooked inside the edit: the one running block (a family may wrap a moved block anew)
        with ad.layer_edit(ad.active_layers()[-1:], "final norm and LM head"):
            handle = ad.decoder_layers()[0].register_forward_hook(replace)
            try:
                logits = ad.forward(torch.zeros((1, flat.shape[0]), dtype=torch.long, device=flat.device))[0]
            finally:
                handle.remove()
        return logits.reshape(*shape[:-1], logits.shape[-1])


def hidden_of(out: Any) -> torch.Tensor:
    """The hidden states a layer or module returns: a bare tensor, or the first of a tuple (families differ)."""
    return out[0] if isinstance(out, tuple) else out


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Temporarily switch to eager attention, the only implementation that returns weights."""
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        yield
    finally:
        cfg._attn_implementation = before


class StopForward(Exception):
    """Raised inside a forward once the wanted values are in (:meth:`ModelAdapter._capture`,
    :class:`ganda.engine.Trace`): the rest of the network does not run."""


def _forward_params(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The keyword arguments of ``model.forward`` (what a family's forward accepts)."""
    return inspect.signature(model.forward).parameters


@dataclass(frozen=True)
class ReadPositions:
    """Where each row of one forward is read, as indices into that forward's input ``[B]``:
    ``query``, the last prompt token (it predicts the answer's first token), and ``last``, the
    last scored position (it predicts the answer's final token). A position outside the input
    (a cached prefix's forward, whose query lies in a later suffix) reads nothing there.
    Position-restricted head ablations act at these rows (:class:`ganda.AblateHeads`).

    The rows path of scoring also gives ``ids``, the forward's input ``[B, T]`` (a resample
    ablation finds each row's prompt, and so its donor, from it), and, where an intervention asks
    for them, ``classes``: per position class (``ends``, ``key``, ``final``, ``elsewhere``) a
    ``[B, T]`` mask of the positions of that class (:mod:`ganda.sites`)."""

    query: torch.Tensor
    last: torch.Tensor
    ids: torch.Tensor | None = None
    classes: dict[str, torch.Tensor] | None = None

    @classmethod
    def of_mask(cls, mask: torch.Tensor | None) -> ReadPositions | None:
        """Each row's last real position where a 2-D mask right-pads some row; None (each row's
        last position) for unpadded or left-padded input."""
        if mask is None or mask.ndim != 2 or bool(mask[:, -1].all()):
            return None
        last = mask.shape[1] - 1 - torch.flip(mask.bool(), [1]).int().argmax(1)
        return cls(last, last)


@dataclass(frozen=True)
class _LayerEdit:
    keep: frozenset[int]
    replace: dict[int, nn.Module]
    label: str


class ModelAdapter(ABC):
    """A loaded model plus its tokenizer, seen through one family-independent layout.

    What a new family writes, and what it gets:

    ===============================  ==========================================================
    must implement                   ``matches``, ``decoder_layers``, ``set_decoder_layers``,
                                     ``_build_mixers`` (each mixer's heads and output projection)
    may declare (a generic path      ``implicit_maps`` with ``_ssm_maps`` and ``analysis_path``
    otherwise)                       (SSM heads), ``packs_choices`` and
                                     ``skips_layers`` (the sweep's fast paths),
                                     ``supports_kv_cache_generation``, ``prefix_cache_kwarg`` with
                                     ``new_cache``/``expand_cache``/``_forward_cached`` (shared
                                     prefixes), ``_gated`` (a shared block's
                                     invocations), ``run_block``/``head_output`` (transplant donor)
    gets for free                    head ids and validation, reversible layer edits, the engine's
                                     named points and replay, ``attention_maps`` (eager softmax
                                     captured in one forward), ``unembed`` (found and checked on one
                                     forward), ablations, scoring, the sweep, attribution, pruning
    ===============================  ==========================================================
    """

    family: ClassVar[str] = "?"

    def __init__(self, model: nn.Module, tokenizer: Any, spec: str = "") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self._mixers: list[Mixer] | None = None
        # The blocks as loaded: layer indices and head ids always name these, whatever is edited.
        self._original_layers: nn.ModuleList = self.decoder_layers()
        self._edits: dict[int, _LayerEdit] = {}
        self._whole_sequence = 0  # active whole_sequence() contexts
        self._head_users: dict[int, tuple[str, frozenset[int]]] = {}
        self._live: nn.ModuleList = self._original_layers
        self._tokens = itertools.count()
        self._n_params: int | None = None
        self._output_head: OutputHead | None = None
        self.read_positions: ReadPositions | None = None  # set by the forward running now
        self.row_needs = 0  # active interventions that need each scored row's prompt (ganda.sites)
        first = next(model.parameters(), None)
        if first is not None:
            shape_free_attention(first.device)

    # ---- layout -------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """True when this adapter understands ``model``."""

    @abstractmethod
    def decoder_layers(self) -> nn.ModuleList:
        """The list of decoder blocks, in order (what truncation and removal edit)."""

    @abstractmethod
    def set_decoder_layers(self, layers: nn.ModuleList) -> None:
        """Replace the decoder block list (low level: layer interventions go through :meth:`push_layer_edit`)."""

    @abstractmethod
    def _build_mixers(self) -> list[Mixer]:
        """All mixers of the model as loaded (from :meth:`original_layers`), with their layer indices."""

    def mixers(self) -> list[Mixer]:
        if self._mixers is None:
            mixers = self._build_mixers()
            for m in mixers:  # a layout that does not tile out_proj's input would ablate the wrong slice
                if m.num_heads * m.head_dim != m.out_proj.in_features:
                    raise GandaError(
                        f"layer {m.layer} ({m.kind}): {m.num_heads} heads of {m.head_dim} do not tile the "
                        f"{m.out_proj.in_features} inputs of its output projection; ganda cannot locate its heads"
                    )
            # (layer, kind) and (layer, None) -> the mixer (None where the layer has several): head
            # lookups in O(1), which a Mamba-1 model needs (d_inner heads per layer: ~500k for Falcon-Mamba-7B)
            self._lookup: dict[tuple[int, str | None], Mixer | None] = {}
            for m in mixers:
                self._lookup[(m.layer, m.kind)] = m
                self._lookup[(m.layer, None)] = None if (m.layer, None) in self._lookup else m
            self._mixers = mixers
        return self._mixers

    # ---- layer edits ----------------------------------------------------------------------
    def original_layers(self) -> nn.ModuleList:
        """The decoder blocks as loaded; layer ``i`` of every head id and layer list is ``original_layers()[i]``."""
        return self._original_layers

    def active_layers(self) -> list[int]:
        """Original indices of the layers the model runs now (every layer when nothing is edited)."""
        keep = set(range(len(self._original_layers)))
        for edit in self._edits.values():
            keep &= edit.keep
        return sorted(keep)

    def is_active(self, layer: int) -> bool:
        return all(layer in e.keep for e in self._edits.values())

    def layer_position(self, layer: int) -> int | None:
        """Where original layer ``layer`` sits in the running layer list (None when removed)."""
        active = self.active_layers()
        return active.index(layer) if layer in active else None

    def push_layer_edit(self, keep: Iterable[int], label: str,
                        replace: Mapping[int, nn.Module] | None = None) -> int:
        """Run only the original layers ``keep`` (``replace``: stand-in blocks for some of them).

        Edits compose: the model runs the intersection of every active edit's kept layers, so they
        may be entered and exited in any order. Refused when the result would drop a layer that an
        active head intervention acts on, or would remove every layer. Returns the token for
        :meth:`pop_layer_edit`.
        """
        n = len(self._original_layers)
        keep = frozenset(keep)
        replace = dict(replace or {})
        bad = sorted(i for i in {*keep, *replace} if not 0 <= i < n)
        if bad:
            raise GandaError(f"{label}: layer {bad[0]} out of range, the model has layers 0-{n - 1}")
        if self.decoder_layers() is not self._live:
            raise GandaError(f"{label}: the layer list was replaced outside ganda's layer edits; "
                             "enter layer edits first")
        for other in self._edits.values():
            clash = sorted(set(replace) & set(other.replace))
            if clash:
                raise GandaError(f"{label}: layer {clash[0]} is already replaced by {other.label}")
        active = set(self.active_layers()) & keep
        if not active:
            raise GandaError(f"{label}: cannot remove every layer")
        for user, layers in self._head_users.values():
            gone = sorted(layers - active)
            if gone:
                raise GandaError(f"{label}: layer {gone[0]} would be removed while {user} acts on it "
                                 "(enter layer edits before head interventions)")
        token = next(self._tokens)
        self._edits[token] = _LayerEdit(keep, replace, label)
        self._apply_edits()
        return token

    def pop_layer_edit(self, token: int) -> None:
        """Undo one edit of :meth:`push_layer_edit` (the others stay in force)."""
        if self._edits.pop(token, None) is not None:
            self._apply_edits()

    @contextmanager
    def layer_edit(self, keep: Iterable[int], label: str, replace: Mapping[int, nn.Module] | None = None
                   ) -> Iterator[None]:
        """:meth:`push_layer_edit` for the block, undone however it ends."""
        token = self.push_layer_edit(keep, label, replace)
        try:
            yield
        finally:
            self.pop_layer_edit(token)

    def _apply_edits(self) -> None:
        if not self._edits:
            self.set_decoder_layers(self._original_layers)
        else:
            replace = {i: m for e in self._edits.values() for i, m in e.replace.items()}
            orig = self._original_layers
            self.set_decoder_layers(nn.ModuleList([replace.get(i, orig[i]) for i in self.active_layers()]))
        self._live = self.decoder_layers()

    def use_layers(self, layers: Iterable[int], user: str) -> int:
        """Record that a head intervention acts on ``layers``; refused where one is removed.

        A head of a removed layer is refused rather than ignored: its ablation would silently do
        nothing. Returns the token for :meth:`release_layers`.
        """
        layers = frozenset(layers)
        self.require_active(layers, user)
        token = next(self._tokens)
        self._head_users[token] = (user, layers)
        return token

    def release_layers(self, token: int) -> None:
        self._head_users.pop(token, None)

    def require_active(self, layers: Iterable[int], user: str) -> None:
        """Refuse (one line naming the edit) when one of ``layers`` is removed by a layer edit."""
        for layer in sorted(set(layers)):
            if not self.is_active(layer):
                by = ", ".join(e.label for e in self._edits.values() if layer not in e.keep)
                raise GandaError(f"{user}: layer {layer} is removed by {by}")

    @property
    def num_layers(self) -> int:
        return max(m.layer for m in self.mixers()) + 1 if self.mixers() else 0

    @property
    def d_model(self) -> int:
        """The residual stream's width: what every mixer's output projection writes (1 without mixers)."""
        return self.mixers()[0].out_proj.out_features if self.mixers() else 1

    def layer_kinds(self, layer: int) -> list[str]:
        return [m.kind for m in self.mixers() if m.layer == layer]

    def mixer(self, layer: int, kind: str | None = None) -> Mixer:
        """The mixer of ``layer``; ``kind`` is required only where the layer has several."""
        self.mixers()
        found = self._lookup.get((layer, kind))
        if found is not None:
            return found
        kinds = self.layer_kinds(layer)
        if not kinds:
            raise GandaError(f"layer {layer} out of range, the model has layers 0-{self.num_layers - 1}")
        if kind is None:
            raise GandaError(f"layer {layer} has several mixers ({', '.join(kinds)}): name one, e.g. L{layer}.{kinds[0]}H0")
        raise GandaError(f"layer {layer} has no {kind} mixer (it has: {', '.join(kinds)})")

    def canonical(self, head: HeadId) -> HeadId:
        """Fill in or drop the kind so that equal heads compare equal."""
        mixer = self.mixer(head.layer, head.kind)
        if not 0 <= head.head < mixer.num_heads:
            raise GandaError(
                f"{head}: head {head.head} out of range, layer {head.layer} ({mixer.kind}) "
                f"has heads 0-{mixer.num_heads - 1}"
            )
        single = self._lookup.get((head.layer, None)) is not None
        return HeadId(head.layer, head.head, None if single else mixer.kind)

    def mixer_of(self, head: HeadId) -> Mixer:
        return self.mixer(head.layer, head.kind)

    def heads(self, kind: str | None = None, *, running: bool = False) -> list[HeadId]:
        """Every head of the model (optionally only attention or only SSM heads; ``running``: only
        those of the layers a layer edit keeps, a submodel's own heads)."""
        out = []
        for m in self.mixers():
            if (kind is None or m.kind == kind) and (not running or self.is_active(m.layer)):
                k = None if self._lookup.get((m.layer, None)) is not None else m.kind
                out.extend(HeadId(m.layer, h, k) for h in range(m.num_heads))
        return out

    # ---- hooks ----------------------------------------------------------------------------
    def _gated(self, mixer: Mixer, module: nn.Module, register: Callable[[Callable[..., Any]], Any],
               fn: Callable[..., Any]) -> Any:
        """Register ``fn`` on ``module`` (``register``: one of its ``register_*`` methods) so that it
        fires only inside ``mixer.layer``'s invocation; returns a removable handle. Every module
        here belongs to one layer; families whose modules run at several layers (Zamba2's shared
        block) override this."""
        return register(fn)

    def register_out_proj_pre_hook(self, mixer: Mixer, fn: PreHook) -> Any:
        """Attach ``fn`` to the input of ``mixer.out_proj``; returns a removable handle. Fires for
        ``mixer.layer`` only, where the projection is shared between invocations (:meth:`_gated`)."""
        return self._gated(mixer, mixer.out_proj, mixer.out_proj.register_forward_pre_hook, fn)

    def register_out_proj_hook(self, mixer: Mixer, fn: PostHook) -> Any:
        """Attach ``fn`` to the output of ``mixer.out_proj`` (ahead of hooks already there, so they
        see what ``fn`` returns); fires for ``mixer.layer`` only, as :meth:`register_out_proj_pre_hook`."""
        out_proj = mixer.out_proj
        return self._gated(mixer, out_proj, lambda f: out_proj.register_forward_hook(f, prepend=True), fn)

    # ---- maps -----------------------------------------------------------------------------
    @torch.no_grad()
    def attention_maps(
        self, input_ids: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None = None
    ) -> dict[HeadId, torch.Tensor]:
        """Per head, the ``[len(rows) or T, T]`` fp32 CPU matrix that mixes values into outputs.

        Attention heads: softmax probabilities (eager attention). SSM heads: the exact implicit
        attention (signed, not normalised). ``input_ids`` is one sequence ``[1, T]``.
        """
        return self._maps(input_ids, heads, rows)

    def implicit_maps(self, input_ids: torch.Tensor, heads: Sequence[HeadId],
                      rows: Sequence[int] | None = None, include_d: bool = False) -> dict[HeadId, torch.Tensor]:
        """SSM heads only: the exact implicit attention ``M[rows, :]`` per head (``include_d`` adds
        ``D_h`` on the diagonal). Families without SSM heads refuse."""
        raise GandaError(f"{self.family} models have no SSM heads (implicit attention is for SSMs)")

    def _maps(self, input_ids: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None,
              include_d: bool = False) -> dict[HeadId, torch.Tensor]:
        """The maps of :meth:`attention_maps` from one forward: attention heads as captured, SSM
        heads built from their captured inputs (:meth:`_ssm_maps`, SSM families), a layer at a time."""
        heads = [self.canonical(h) for h in heads]
        of = {h: self.mixer_of(h) for h in set(heads)}
        ssm = list({m.layer: m for m in of.values() if m.kind == "ssm"}.values())
        raw, out = self._capture(input_ids, ssm, {h: m for h, m in of.items() if m.kind == "attn"}, rows)
        for mx in ssm:
            out.update(self._ssm_maps(mx, raw.pop(mx.layer), [h for h in of if of[h] is mx], rows, include_d))
        return {h: out[h] for h in heads}

    def analysis_path(self) -> AbstractContextManager[Any]:
        """What a forward that reads or edits the model's insides runs under (map captures, the
        gradient passes of attribution, edges and path ablation): nothing here; SSM families force
        their PyTorch reference path, on which every hooked module runs and autograd reaches every head."""
        return nullcontext()

    def _capture(self, input_ids: torch.Tensor, ssm: Sequence[Mixer], attn: Mapping[HeadId, Mixer],
                 rows: Sequence[int] | None = None, stop_early: bool = True
                 ) -> tuple[dict[int, torch.Tensor], dict[HeadId, torch.Tensor]]:
        """One forward of ``input_ids[0]`` under :meth:`analysis_path`: by layer, the raw tensor
        each SSM mixer's inputs are recomputed from (the output of its ``ssm_capture_module``), and
        the ``rows`` (None: all) of each attention head's eager softmax, fp32 on the CPU.

        ``stop_early`` abandons the forward once everything is captured (maps of early layers
        then cost a fraction of a forward); checks that watch later modules turn it off.
        """
        self.require_active([*(m.layer for m in ssm), *(h.layer for h in attn)], "map capture")
        raw: dict[int, torch.Tensor] = {}
        maps: dict[HeadId, torch.Tensor] = {}
        by_mixer: dict[int, tuple[Mixer, list[HeadId]]] = {}
        for h, mx in attn.items():
            by_mixer.setdefault(id(mx), (mx, []))[1].append(h)

        def done() -> None:  # everything captured: skip the rest of the network
            if stop_early and len(raw) == len(ssm) and len(maps) == len(attn):
                raise StopForward

        def cap_ssm(layer: int) -> Callable[..., None]:
            def hook(_m: nn.Module, _a: Any, out: Any) -> None:
                raw[layer] = hidden_of(out)[0].detach()
                done()

            return hook

        def cap_attn(layer: int, hs: list[HeadId]) -> Callable[..., None]:
            def hook(_m: nn.Module, _a: Any, out: Any) -> None:
                if not isinstance(out, tuple) or len(out) < 2 or out[1] is None:
                    raise GandaError(f"layer {layer}: the attention module returned no weights (eager needed)")
                for h in hs:
                    w = out[1][0, h.head].detach()
                    maps[h] = (w if rows is None else w[list(rows)]).float().cpu()
                done()

            return hook

        hooks = [(mx, self.ssm_capture_module(mx), cap_ssm(mx.layer)) for mx in ssm]  # type: ignore[attr-defined]
        hooks += [(mx, mx.module, cap_attn(mx.layer, hs)) for mx, hs in by_mixer.values()]
        self._forward_hooked(input_ids, hooks, eager=bool(attn))
        missing = sorted({m.layer for m in ssm if m.layer not in raw} | {h.layer for h in attn if h not in maps})
        if missing:
            raise GandaError(f"nothing captured for layers {missing} (removed by an intervention?)")
        return raw, maps

    def _forward_hooked(self, input_ids: torch.Tensor, hooks: Sequence[tuple[Mixer, nn.Module, Callable[..., Any]]],
                        eager: bool) -> None:
        """One forward of ``input_ids[0]`` under :meth:`analysis_path` (and eager attention where
        ``eager``), each hook on its module's output for its mixer's layer only (:meth:`_gated`); a
        hook that raises :class:`StopForward` ends the forward there. The hooks are removed after."""
        handles = []
        try:
            for mx, mod, fn in hooks:
                handles.append(self._gated(mx, mod, mod.register_forward_hook, fn))
            with ExitStack() as stack:
                stack.enter_context(self.analysis_path())
                if eager:
                    stack.enter_context(eager_attention(self.model))
                try:
                    self.forward(input_ids[:1].to(self.device))
                except StopForward:
                    pass
        finally:
            for handle in handles:
                handle.remove()

    def map_kind(self, head: HeadId) -> str:
        return "softmax" if self.mixer_of(head).kind == "attn" else "implicit"

    def shared_blocks(self) -> dict[str, list[int]]:
        """``{"block0": [layers invoking it], ...}`` for mixers whose weights run at several layers
        (Zamba2's shared attention); empty for families without shared blocks."""
        out: dict[str, list[int]] = {}
        for m in self.mixers():
            if m.shared_key:
                out.setdefault(m.shared_key, []).append(m.layer)
        return out

    # ---- running --------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def n_ctx(self) -> int | None:
        """Longest prompt the model was trained for (None where no limit is stated, as for SSMs)."""
        cfg = getattr(self.model, "config", None)
        return getattr(cfg, "max_position_embeddings", None) if cfg is not None else None

    def check_length(self, n_tokens: int) -> None:
        if self.n_ctx is not None and n_tokens > self.n_ctx:
            raise GandaError(
                f"prompt is {n_tokens} tokens, longer than the model's context of {self.n_ctx} tokens"
            )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, read: ReadPositions | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` with no cache (interventions may change the layer list).
        ``attention_mask``: 2-D, or an additive ``[B, 1, T, T]`` block mask with ``position_ids``
        where the family packs choices (:meth:`packs_choices`). ``read``: where each row is read
        (default: each row's last real position)."""
        kw = {} if position_ids is None else {"position_ids": position_ids}
        with self.reading(read if read is not None else ReadPositions.of_mask(attention_mask)):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
        return out.logits

    @contextmanager
    def reading(self, read: ReadPositions | None) -> Iterator[None]:
        """``read_positions`` for the forwards inside: what a scoring path passes with its rows."""
        before, self.read_positions = self.read_positions, read
        try:
            yield
        finally:
            self.read_positions = before

    def unembed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` of final residual vectors ``[..., d_model]``: the model's final norm
        and LM head (:class:`OutputHead`), differentiable. Every analysis that reads the output
        from a residual stream of its own goes through here."""
        if self._output_head is None:
            self._output_head = OutputHead(self)
        return self._output_head(hidden)

    def n_params(self) -> int:
        """Number of parameters (counted once; scoring batches small models differently)."""
        if self._n_params is None:
            self._n_params = sum(p.numel() for p in self.model.parameters())
        return self._n_params

    # ---- optional capabilities (a family declares them or gets the generic path) -------------
    def packs_choices(self, width: int) -> bool:
        """True when an example's choices may share one sequence of ``width`` tokens under a block
        mask with continued position ids (:mod:`ganda.prepared`'s packed layout) and score as their
        own rows would: attention families without a sliding window shorter than ``width``. False
        (the default): one row per choice."""
        return False

    def skips_layers(self) -> bool:
        """True when the sweep may run only the layers from an ablated head's on (replaying the
        layer calls of one intact pass, :class:`ganda.engine.LayerCalls`); False (the default):
        every ablation runs whole forwards, which every family supports."""
        return False

    def supports_kv_cache_generation(self) -> bool:
        """True when greedy generation may keep a KV cache across steps (the model runs its layers
        as loaded); False (the default) re-runs the whole sequence for every new token."""
        return False

    # ---- shared-prefix reuse (scoring and generation run a common prefix once) ------------------
    # the forward keyword that takes the cache of :meth:`new_cache` (None: the family cannot
    # continue a multi-token input from a cached state exactly, and always runs whole rows)
    prefix_cache_kwarg: ClassVar[str | None] = None
    # True where left pads between a prefix and a suffix are masked out exactly (attention only;
    # a recurrent state would carry them): generation then batches suffixes of different lengths
    prefix_left_padding: ClassVar[bool] = False

    def supports_prefix_cache(self) -> bool:
        """True when a forward may continue from a cached prefix state: the family continues a
        multi-token input from its cache, and the layer list is as loaded (a cache is indexed by the
        loaded layers, which a removed or swapped layer would desynchronise)."""
        return (self.prefix_cache_kwarg is not None and not self._edits and not self._whole_sequence
                and self.decoder_layers() is self._original_layers)

    @contextmanager
    def whole_sequence(self) -> Iterator[None]:
        """While active, every forward sees the whole sequence (no prefix cache): for interventions
        that recompute something from the current input alone, such as a donor head's attention."""
        self._whole_sequence += 1
        try:
            yield
        finally:
            self._whole_sequence -= 1

    def new_cache(self) -> Any:
        """An empty cache for :meth:`forward_cached` (attention KV, SSM conv and recurrent states)."""
        from transformers import DynamicCache  # heavy: loaded with the first model

        return DynamicCache(config=self.model.config)

    def expand_cache(self, cache: Any, rows: int) -> Any:
        """An independent copy of a one-row cache for ``rows`` rows; ``cache`` itself is unchanged,
        so one prefix serves any number of suffix batches."""
        out = copy.deepcopy(cache)
        if rows != 1:
            out.reorder_cache(torch.zeros(rows, dtype=torch.long, device=self.device))
        return out

    def forward_cached(self, input_ids: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None,
                       keep: torch.Tensor | None = None, read: ReadPositions | None = None) -> torch.Tensor:
        """Logits of ``input_ids`` ``[B, T]`` continuing the sequence held in ``cache`` (updated in
        place). ``position_ids`` ``[B, T]`` continue the cached positions; ``attention_mask`` covers
        cache + input (None: every position is real, or pads only at the right end); ``keep``: the
        only input positions whose logits are wanted (``[B, len(keep), V]`` is returned); ``read``:
        where each row is read, relative to ``input_ids`` (default: each row's last position)."""
        with self.reading(read):
            return self._forward_cached(input_ids, cache, position_ids, attention_mask, keep)

    def _forward_cached(self, input_ids: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor:
        params = _forward_params(self.model)
        kw: dict[str, Any] = {self.prefix_cache_kwarg or "past_key_values": cache, "use_cache": True}
        if "position_ids" in params:
            kw["position_ids"] = position_ids
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        if keep is not None and "logits_to_keep" in params:
            kw["logits_to_keep"] = keep
            keep = None
        logits = self.model(input_ids=input_ids, **kw).logits
        return logits if keep is None else logits[:, keep]

    def run_block(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        """Decoder block ``layer`` run on its own, outside this model's layer loop: ``hidden``
        ``[B, T, d_model]``, ``positions`` ``[B or 1, T]``, ``mask`` additive ``[B or 1, 1, T, T]``
        -> hidden states ``[B, T, d_model]``. What a donor in a layer transplant provides."""
        raise GandaError(f"{self.spec or self.family}: {self.family} blocks cannot run outside their model "
                         "(transplant donors must be Llama-layout Transformers)")

    def head_output(self, layer: int, head: int, hidden: torch.Tensor, positions: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
        """One attention head's contribution ``W_o[:, h] @ o_h`` to the residual stream ``[B, T, d_model]``
        when block ``layer`` reads ``hidden`` (arguments as :meth:`run_block`). What a donor in a
        head transplant provides."""
        raise GandaError(f"{self.spec or self.family}: {self.family} heads cannot run outside their model "
                         "(transplant donors must be Llama-layout Transformers)")

    def require_tokenizer(self) -> Any:
        """The tokenizer; a model loaded without one (no tokenizer files beside its weights) is refused
        in one line wherever text has to become tokens."""
        if self.tokenizer is None:
            raise GandaError(f"{self.spec or self.family} has no tokenizer (no tokenizer.json, tokenizer.model or "
                             "tokenizer_config.json beside its weights); copy the tokenizer files into the model "
                             "directory")
        return self.tokenizer
