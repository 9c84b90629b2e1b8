"""Adapter for decoder-only Transformers with the Llama layout.

Llama-3.x, SmolLM2, Qwen2/3, Mistral and Gemma 1-3 all expose ``model.model.layers[i].self_attn``
with ``q_proj/k_proj/v_proj/o_proj`` and a head-major ``o_proj`` input, so one adapter serves them.
GQA: heads are *query* heads (``num_attention_heads``); KV heads are shared and never ablated.

The family's fast paths live here too: packed choices under a block mask, layer skipping in
the sweep, KV-cached generation, and a block or one attention head run outside
the model (what a transplant donor provides).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GandaError
from .base import Mixer, ModelAdapter, hidden_of


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class TransformerAdapter(ModelAdapter):
    family = "transformer"
    prefix_cache_kwarg = "past_key_values"
    prefix_left_padding = True

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
        n_heads = self.model.config.num_attention_heads
        return [Mixer.attention(i, layer.self_attn, n_heads) for i, layer in enumerate(self.original_layers())]

    # ---- fast paths ---------------------------------------------------------------------------
    def packs_choices(self, width: int) -> bool:
        cfg = self.model.config
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        return not window or width <= window

    def skips_layers(self) -> bool:
        return True

    def supports_kv_cache_generation(self) -> bool:
        """Only with the layer list as loaded: a cache indexes its entries by ``self_attn.layer_idx``,
        which a removed or swapped layer would desynchronise."""
        layers = self.decoder_layers()
        n_cfg = getattr(self.model.config, "num_hidden_layers", None)
        if n_cfg is not None and len(layers) != n_cfg:
            return False
        return all(getattr(getattr(layer, "self_attn", None), "layer_idx", i) == i
                   for i, layer in enumerate(layers))

    def _rotary(self) -> nn.Module:
        rot = getattr(self._backbone(), "rotary_emb", None)
        if rot is None:
            raise GandaError(f"{self.spec} has no rotary_emb: its blocks cannot run outside the model")
        return rot

    def _rope(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's own rotary cos/sin: models with per-layer-type RoPE (Gemma-3: local and
        global bases) key their ``rotary_emb`` by the block's ``layer_type``."""
        rot = self._rotary()
        if "layer_type" not in inspect.signature(rot.forward).parameters:
            return rot(x, positions)
        attn = self.original_layers()[layer].self_attn
        layer_type = getattr(attn, "layer_type", None) or self.model.config.layer_types[attn.layer_idx]
        return rot(x, positions, layer_type=layer_type)

    def _window(self, layer: int, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` narrowed to the block's sliding window where it has one (a key ``w`` or more
        positions back is masked), as the model's own sliding-window mask does for that block."""
        attn = self.original_layers()[layer].self_attn
        window = getattr(attn, "sliding_window", getattr(self.model.config, "sliding_window", None))
        t = mask.shape[-1]
        if not window or t <= window:
            return mask
        idx = torch.arange(t, device=mask.device)
        far = idx[None, :] <= idx[:, None] - window  # [q, k]
        return mask.masked_fill(far, torch.finfo(mask.dtype).min)

    def run_block(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        cos, sin = self._rope(layer, hidden, positions)
        out = self.original_layers()[layer](hidden, attention_mask=self._window(layer, mask), position_ids=positions,
                                            position_embeddings=(cos, sin), use_cache=False)
        return hidden_of(out)

    def head_output(self, layer: int, head: int, hidden: torch.Tensor, positions: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
        """Query head ``head`` of block ``layer`` on ``input_layernorm(hidden)``: its query, key and
        value rows (GQA: the KV head it shares), the block's q/k norms where it has them, RoPE, a
        softmax under ``mask``, and its columns of ``o_proj`` (no bias: that belongs to the layer)."""
        block = self.original_layers()[layer]
        attn = block.self_attn
        hd = attn.head_dim
        kv = head // self.mixer(layer).kv_group
        x = block.input_layernorm(hidden)

        def proj(lin: nn.Linear, idx: int) -> torch.Tensor:
            sl = slice(idx * hd, (idx + 1) * hd)
            b = lin.bias[sl] if lin.bias is not None else None
            return F.linear(x, lin.weight[sl], b)[:, None]  # [B, 1, T, hd]

        q, k, v = proj(attn.q_proj, head), proj(attn.k_proj, kv), proj(attn.v_proj, kv)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self._rope(layer, x, positions)
        cos, sin = cos[:, None], sin[:, None]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        scores = (q @ k.transpose(-1, -2)) * getattr(attn, "scaling", hd**-0.5)
        cap = getattr(attn, "attn_logit_softcapping", None)
        if cap:  # Gemma-2: logits soft-capped before the mask, as its eager attention does
            scores = torch.tanh(scores / cap) * cap
        scores = scores + self._window(layer, mask)
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        o = (probs @ v)[:, 0]  # [B, T, hd]
        return F.linear(o, attn.o_proj.weight[:, head * hd : (head + 1) * hd])
