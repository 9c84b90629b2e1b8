"""Jamba (``JambaForCausalLM``): interleaved Mamba-1 and attention layers, MoE feed-forwards.

Mamba layers follow the Mamba-1 convention (every inner channel is a head, ``L3H100``);
attention layers have query heads (``L4H2``). One mixer per layer, so ids need no kind.
Quirks handled: the Mamba mixer RMS-normalises Δ-rank, B and C with *learned* weights
(``dt_layernorm``, ``b_layernorm``, ``c_layernorm``) before discretising, so the implicit
attention uses the normalised B and C. The model picks each layer's mask by position from
``config.layer_types`` (a read-only property derived from ``attn_layer_period/offset``), so
while layers are removed the config's class is swapped for a subclass whose ``layer_types`` /
``layers_block_type`` follow the kept layers, and swapped back afterwards.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .common import HybridAdapterBase
from .mamba1 import Mamba1Mixers


class JambaAdapter(Mamba1Mixers, HybridAdapterBase):
    family = "jamba"
    model_types = {"jamba": "Jamba (hybrid)"}

    def __init__(self, model: nn.Module, tokenizer: Any, spec: str = "") -> None:
        super().__init__(model, tokenizer, spec)
        self._config_class = type(model.config)

    def _on_layers_changed(self, kept: list[int] | None, layers: list[nn.Module]) -> None:
        cfg = self.model.config
        if kept is None:
            cfg.__class__ = self._config_class
            return
        # each layer's type from the module itself (a swapped-in layer has no original index)
        attn = [hasattr(m, "self_attn") for m in layers]
        types = tuple("full_attention" if a else "linear_attention" for a in attn)
        blocks = tuple("attention" if a else "mamba" for a in attn)
        patched = type(f"Ganda{self._config_class.__name__}", (self._config_class,), {
            "layer_types": property(lambda _self: list(types)),
            "layers_block_type": property(lambda _self: list(blocks)),
        })
        cfg.__class__ = patched
