"""Mamba-1 and Falcon-Mamba (``MambaForCausalLM``, ``FalconMambaForCausalLM``).

Heads follow the paper's convention: every inner channel is a head (``num_heads = d_inner``,
``head_dim = 1``), so ``L3H100`` is channel 100 of layer 3 and ablating it zeroes one column of
``out_proj``. Channel maps are noisy to read; :meth:`Mamba1Adapter.grouped_maps` averages the maps
of blocks of consecutive channels for display (an aggregate, not an exact head).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...heads import HeadId
from ..base import Mixer
from .common import SSMAdapterBase, causal_conv
from .materialize import SelectiveParams, SSMParams, group_channels, selective_channel_map


def mamba1_params(m: nn.Module, captured: torch.Tensor) -> SelectiveParams:
    """Selective-scan inputs of a Mamba-1 mixer (Mamba, Falcon-Mamba, Jamba) from its in_proj output."""
    x, z = captured.float().chunk(2, dim=-1)
    x = causal_conv(x, m.conv1d, getattr(m, "activation", "silu"))
    R, N = m.time_step_rank, m.ssm_state_size
    ts, B, C = F.linear(x, m.x_proj.weight.float()).split([R, N, N], dim=-1)
    # Falcon-Mamba (weightless) and Jamba (weighted) RMS-normalise Δ-rank, B and C first.
    if getattr(m, "dt_layernorm", None) is not None:
        ts = m.dt_layernorm(ts)
    if getattr(m, "b_layernorm", None) is not None:
        B = m.b_layernorm(B)
    if getattr(m, "c_layernorm", None) is not None:
        C = m.c_layernorm(C)
    bias = m.dt_proj.bias.float() if m.dt_proj.bias is not None else 0.0
    delta = F.softplus(ts.float() @ m.dt_proj.weight.float().T + bias)
    A = -torch.exp(m.A_log.float())
    return SelectiveParams(x=x, delta=delta, A=A, B=B.float(), C=C.float(), D=m.D.float(), z=z)


def channel_mixer(layer: int, m: nn.Module) -> Mixer:
    """Every inner channel of a Mamba-1 mixer is a head (the paper's convention)."""
    return Mixer(layer=layer, kind="ssm", num_heads=m.intermediate_size, head_dim=1, out_proj=m.out_proj, module=m)


class Mamba1Adapter(SSMAdapterBase):
    family = "mamba1"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        mt = getattr(getattr(model, "config", None), "model_type", None)
        return mt in ("mamba", "falcon_mamba") and hasattr(model, "backbone")

    def _layers_attr(self) -> tuple[nn.Module, str]:
        return self.model.backbone, "layers"

    def _build_mixers(self) -> list[Mixer]:
        return [channel_mixer(i, layer.mixer) for i, layer in enumerate(self._original_layers)]

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        return mamba1_params(mixer.module, captured)

    @torch.no_grad()
    def grouped_maps(self, input_ids: torch.Tensor, layer: int, block: int, blocks: Sequence[int] | None = None,
                     rows: Sequence[int] | None = None, reduce: str = "mean") -> dict[int, torch.Tensor]:
        """Maps of channel blocks ``[k·block, (k+1)·block)`` of one layer (mean or |·| mean).

        Each channel is materialised exactly, then averaged: a readable summary for plots.
        """
        p = self.capture_ssm(input_ids, [layer])[layer]
        E = p.num_heads
        ks = list(blocks) if blocks is not None else list(range((E + block - 1) // block))
        chans = [c for k in ks for c in range(k * block, min(E, (k + 1) * block))]
        maps = {c: selective_channel_map(p, c, rows) for c in chans}
        return {k: v.cpu() for k, v in group_channels(maps, block, reduce).items()}

    def channel_heads(self, layer: int, block: int, k: int) -> list[HeadId]:
        """The head ids of channel block ``k`` (e.g. to ablate a whole block)."""
        E = self.mixer(layer).num_heads
        return [HeadId(layer, c) for c in range(k * block, min(E, (k + 1) * block))]
