"""The one interface every model family implements.

Everything above ``models/`` (interventions, tasks, scoring, discovery, experiments) talks to a
model only through :class:`ModelAdapter`: its decoder layers, the mixers in each layer (attention
or SSM) with their head layout and output projection, and ``attention_maps`` (softmax attention for
attention heads, the exact materialised mixer for SSM heads). Adding a family means one adapter
file plus a registry entry; nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import GandaError
from ..heads import HeadId

PreHook = Callable[[nn.Module, tuple[Any, ...]], Any]


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
    extra: dict[str, Any] = field(default_factory=dict)

    def head_slice(self, head: int) -> slice:
        return slice(head * self.head_dim, (head + 1) * self.head_dim)


class ModelAdapter(ABC):
    """A loaded model plus its tokenizer, seen through one family-independent layout."""

    family: ClassVar[str] = "?"

    def __init__(self, model: nn.Module, tokenizer: Any, spec: str = "") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self._mixers: list[Mixer] | None = None

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
        """Replace the decoder block list (used by reversible layer interventions)."""

    @abstractmethod
    def _build_mixers(self) -> list[Mixer]:
        """All mixers of the intact model, with their original layer indices."""

    def mixers(self) -> list[Mixer]:
        if self._mixers is None:
            self._mixers = self._build_mixers()
        return self._mixers

    @property
    def num_layers(self) -> int:
        return max(m.layer for m in self.mixers()) + 1 if self.mixers() else 0

    def layer_kinds(self, layer: int) -> list[str]:
        return [m.kind for m in self.mixers() if m.layer == layer]

    def mixer(self, layer: int, kind: str | None = None) -> Mixer:
        """The mixer of ``layer``; ``kind`` is required only where the layer has several."""
        found = [m for m in self.mixers() if m.layer == layer and (kind is None or m.kind == kind)]
        if not found:
            kinds = self.layer_kinds(layer)
            if not kinds:
                raise GandaError(f"layer {layer} out of range, the model has layers 0-{self.num_layers - 1}")
            raise GandaError(f"layer {layer} has no {kind} mixer (it has: {', '.join(kinds)})")
        if len(found) > 1:
            raise GandaError(
                f"layer {layer} has several mixers ({', '.join(m.kind for m in found)}): "
                f"name one, e.g. L{layer}.{found[0].kind}H0"
            )
        return found[0]

    def canonical(self, head: HeadId) -> HeadId:
        """Fill in or drop the kind so that equal heads compare equal."""
        mixer = self.mixer(head.layer, head.kind)
        if not 0 <= head.head < mixer.num_heads:
            raise GandaError(
                f"{head}: head {head.head} out of range, layer {head.layer} ({mixer.kind}) "
                f"has heads 0-{mixer.num_heads - 1}"
            )
        kind = mixer.kind if len(self.layer_kinds(head.layer)) > 1 else None
        return HeadId(head.layer, head.head, kind)

    def mixer_of(self, head: HeadId) -> Mixer:
        return self.mixer(head.layer, head.kind)

    def heads(self, kind: str | None = None) -> list[HeadId]:
        """Every head of the model (optionally only attention or only SSM heads)."""
        out = []
        for m in self.mixers():
            if kind is None or m.kind == kind:
                out.extend(self.canonical(HeadId(m.layer, h, m.kind)) for h in range(m.num_heads))
        return out

    # ---- hooks ----------------------------------------------------------------------------
    def register_out_proj_pre_hook(self, mixer: Mixer, fn: PreHook) -> Any:
        """Attach ``fn`` to the input of ``mixer.out_proj``; returns a removable handle.

        Families whose output projection is shared between invocations (Zamba2) override this
        to fire only for the invocation of ``mixer.layer``.
        """
        return mixer.out_proj.register_forward_pre_hook(fn)

    # ---- maps -----------------------------------------------------------------------------
    @abstractmethod
    def attention_maps(
        self, input_ids: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None = None
    ) -> dict[HeadId, torch.Tensor]:
        """Per head, the ``[len(rows) or T, T]`` fp32 CPU matrix that mixes values into outputs.

        Attention heads: softmax probabilities (eager attention). SSM heads: the exact implicit
        attention (signed, not normalised). ``input_ids`` is one sequence ``[1, T]``.
        """

    def map_kind(self, head: HeadId) -> str:
        return "softmax" if self.mixer_of(head).kind == "attn" else "implicit"

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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` with no cache (interventions may change the layer list)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (family, layers, mixers and head counts)."""
        return {
            "spec": self.spec,
            "family": self.family,
            "class": type(self.model).__name__,
            "num_layers": self.num_layers,
            "mixers": [
                {"layer": m.layer, "kind": m.kind, "num_heads": m.num_heads, "head_dim": m.head_dim}
                for m in self.mixers()
            ],
            "n_ctx": self.n_ctx,
        }
