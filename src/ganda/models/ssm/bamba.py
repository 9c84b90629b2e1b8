"""Bamba (``BambaForCausalLM``): interleaved Mamba-2 and attention layers.

Each layer has one mixer, so ids are plain ``L{layer}H{head}`` (SSD heads on Mamba layers,
query heads on attention layers). Quirk handled: the model picks each layer's mask by *position*
(``config.layers_block_type[i]``, derived from ``attn_layer_indices``), so after a layer is
removed an attention layer would get the recurrent mask (None: no causal masking) and a Mamba
layer the 4-D causal mask. Truncation and removal therefore re-point ``attn_layer_indices`` at
the attention layers' new positions and restore it afterwards.
"""

from __future__ import annotations

from torch import nn

from .common import HybridAdapterBase


class BambaAdapter(HybridAdapterBase):
    family = "bamba"
    model_types = {"bamba": "Bamba (hybrid)"}

    def __init__(self, model: nn.Module, tokenizer, spec: str = "") -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, tokenizer, spec)
        self._attn_indices = list(model.config.attn_layer_indices or [])

    def supports_prefix_cache(self) -> bool:
        """transformers' Bamba builds its attention mask from the cache's attention layers, so a
        Bamba with no attention layer (a pure-SSM student) cannot continue from a cache."""
        return bool(self._attn_indices) and super().supports_prefix_cache()

    def _on_layers_changed(self, kept: list[int] | None, layers: list[nn.Module]) -> None:
        cfg = self.model.config
        if kept is None:
            cfg.attn_layer_indices = list(self._attn_indices)
        else:  # read each layer's type from the module itself (a swapped-in layer has no index)
            cfg.attn_layer_indices = [pos for pos, m in enumerate(layers) if hasattr(m, "self_attn")]
