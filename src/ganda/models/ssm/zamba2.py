"""Zamba2 (``Zamba2ForCausalLM``): Mamba-2 layers plus shared attention blocks.

A hybrid layer runs one invocation of a shared transformer block (attention + MLP, weights tied
across every ``num_mem_blocks``-th hybrid layer, with per-invocation LoRA adapters) and then its
own Mamba-2 mixer. Ids: ``L6.attnH3`` is head 3 of the attention *invocation at layer 6* and
``L6.ssmH3`` head 3 of that layer's Mamba mixer; plain Mamba layers take ``L5H3``. Hooks fire
for one invocation only (even if the block's modules are one Python object), so ablating
``L6.attnH3`` leaves the same weights' other invocations alone; :meth:`Zamba2Adapter.block_heads`
lists a head in every invocation of a block, to ablate them all.
"""

from __future__ import annotations

from torch import nn

from ...errors import GandaError
from ...heads import HeadId
from .common import HybridAdapterBase


class Zamba2Adapter(HybridAdapterBase):
    family = "zamba2"
    model_types = {"zamba2": "Zamba2 (hybrid)"}
    layer_index_arg = (2, "layer_idx")  # Zamba2Model calls layer(h, orig_h, layer_idx, ...)

    def layer_parts(self, layer: nn.Module) -> tuple[nn.Module | None, nn.Module | None, int | None]:
        if hasattr(layer, "shared_transformer"):  # a hybrid layer: one invocation of a shared block
            block = layer.shared_transformer
            return block.self_attn, layer.mamba_decoder.mamba, block.block_id
        return None, layer.mamba, None

    def block_heads(self, block: int | str, heads: list[int] | None = None) -> list[HeadId]:
        """Head ids of ``heads`` (default all) in *every* invocation of a shared block."""
        key = block if isinstance(block, str) else f"block{block}"
        layers = self.shared_blocks().get(key)
        if not layers:
            raise GandaError(f"no shared block {key!r}; the model has: {', '.join(self.shared_blocks())}")
        n = self.mixer(layers[0], "attn").num_heads
        return [HeadId(layer, h, "attn") for layer in layers for h in (heads if heads is not None else range(n))]
