"""Adapter for decoder-only Transformers with the Llama layout.

Llama-3.x, SmolLM2, Qwen2/3, Mistral and Gemma 1-3 all expose ``model.model.layers[i].self_attn``
with ``q_proj/k_proj/v_proj/o_proj`` and a head-major ``o_proj`` input, so one adapter serves them.
GQA: heads are *query* heads (``num_attention_heads``); KV heads are shared and never ablated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from ..heads import HeadId
from .base import Mixer, ModelAdapter


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


class TransformerAdapter(ModelAdapter):
    family = "transformer"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or len(layers) == 0:
            return False
        attn = getattr(layers[0], "self_attn", None)
        return attn is not None and hasattr(attn, "o_proj") and hasattr(attn, "q_proj")

    def _backbone(self) -> nn.Module:
        return self.model.model

    def decoder_layers(self) -> nn.ModuleList:
        return self._backbone().layers

    def set_decoder_layers(self, layers: nn.ModuleList) -> None:
        self._backbone().layers = layers

    def _build_mixers(self) -> list[Mixer]:
        cfg = self.model.config
        n_heads = cfg.num_attention_heads
        out = []
        for i, layer in enumerate(self.original_layers()):
            attn = layer.self_attn
            head_dim = getattr(attn, "head_dim", None) or attn.o_proj.in_features // n_heads
            out.append(Mixer(layer=i, kind="attn", num_heads=n_heads, head_dim=head_dim, out_proj=attn.o_proj, module=attn))
        return out

    @torch.no_grad()
    def attention_maps(
        self, input_ids: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None = None
    ) -> dict[HeadId, torch.Tensor]:
        heads = [self.canonical(h) for h in heads]
        by_layer: dict[int, list[HeadId]] = {}
        for h in heads:
            by_layer.setdefault(h.layer, []).append(h)
        self.require_active(by_layer, f"attention maps of {', '.join(str(h) for h in heads)}")
        captured: dict[HeadId, torch.Tensor] = {}

        def make_hook(layer: int):
            def hook(_module, _args, output):
                weights = output[1]  # [B, H, T, T] softmax probabilities (eager)
                for h in by_layer[layer]:
                    w = weights[0, h.head]
                    if rows is not None:
                        w = w[list(rows)]
                    captured[h] = w.float().cpu()

            return hook

        handles = [self.mixer(layer).module.register_forward_hook(make_hook(layer)) for layer in by_layer]
        try:
            with eager_attention(self.model):
                self.forward(input_ids.to(self.device))
        finally:
            for hd in handles:
                hd.remove()
        missing = [str(h) for h in heads if h not in captured]
        if missing:
            raise RuntimeError(f"no attention captured for {missing} (layer removed by an intervention?)")
        return {h: captured[h] for h in heads}
