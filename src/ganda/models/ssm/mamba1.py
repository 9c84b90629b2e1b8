"""Mamba-1 and Falcon-Mamba (``MambaForCausalLM``, ``FalconMambaForCausalLM``).

Heads follow the paper's convention: every inner channel is a head (``num_heads = d_inner``,
``head_dim = 1``), so ``L3H100`` is channel 100 of layer 3 and ablating it zeroes one column of
``out_proj``. Channel maps are noisy to read; :meth:`Mamba1Adapter.grouped_maps` averages the maps
of blocks of consecutive channels for display (an aggregate, not an exact head).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...heads import HeadId
from ..base import Mixer
from .common import SSMAdapterBase, causal_conv
from .materialize import SelectiveParams, SSMParams, group_channels
from .selective_scan import MAMBA1_MODULES, present, selective_scan, starting_from


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


class _Start:
    """The recurrent state the next selective scan starts from (None: zero)."""

    state: torch.Tensor | None = None


def recurrent_state(cache: Any, layer_idx: int) -> torch.Tensor | None:
    """The cached recurrent state of a Mamba-1 layer (None before any token): ``get_recurrent_state``
    where the cache has it, else (transformers 5.17) the layer's first state once it holds one."""
    get = getattr(cache, "get_recurrent_state", None)
    if get is not None:
        return get(layer_idx)
    if not cache.has_previous_state(layer_idx, 0):
        return None
    return cache.layers[layer_idx].recurrent_states[0]


@contextmanager
def scans_continue(cache: Any, mixers: Sequence[nn.Module]) -> Iterator[None]:
    """For the duration, every Mamba-1 mixer in ``mixers`` scans a multi-token input from its
    recurrent state in ``cache`` rather than from zero.

    transformers' Mamba-1 mixers (Mamba, Falcon-Mamba, Jamba) continue the conv from a cache but
    start every multi-token scan at a zero state (only one-token inputs use the cached state).
    Here the module-level scan is swapped for ganda's chunked scan
    (:func:`.selective_scan.selective_scan`) with an initial state, which a pre-hook on each mixer
    reads from ``cache`` before the mixer runs; a multi-token suffix then runs in one forward,
    exactly as if the cached tokens preceded it, in about 2·√T steps of the suffix's T tokens.
    Reuse pays off behind the long prefixes (``PREFIX_MIN`` tokens or more, a few-shot header)
    that :func:`ganda.scoring.prefix_groups` caches.
    """
    start = _Start()
    scan = starting_from(selective_scan, start)

    def read_state(module: nn.Module, _args: Any) -> None:
        start.state = recurrent_state(cache, module.layer_idx)

    swapped = []
    for mod in present(MAMBA1_MODULES):
        if hasattr(mod, "mamba_selective_scan"):
            swapped.append((mod, mod.mamba_selective_scan))
            mod.mamba_selective_scan = scan
    hooks = [m.register_forward_pre_hook(read_state) for m in mixers]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for mod, fn in swapped:
            mod.mamba_selective_scan = fn
        start.state = None


def channel_mixer(layer: int, m: nn.Module) -> Mixer:
    """Every inner channel of a Mamba-1 mixer is a head (the paper's convention)."""
    return Mixer(layer=layer, kind="ssm", num_heads=m.intermediate_size, head_dim=1, out_proj=m.out_proj, module=m)


class Mamba1Mixers:
    """What adapters with Mamba-1 mixers share: every inner channel is a head (:func:`channel_mixer`),
    Δ, B, C from :func:`mamba1_params`, and shared-prefix reuse: :meth:`forward_cached` runs under
    :func:`scans_continue`, so a suffix continues from the cached conv and recurrent states."""

    ssm_mixer = staticmethod(channel_mixer)

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        return mamba1_params(mixer.module, captured)

    def _forward_cached(self, input_ids: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor:
        mixers = [m.module for m in self.mixers() if m.kind == "ssm"]  # type: ignore[attr-defined]
        with scans_continue(cache, mixers):
            return super()._forward_cached(input_ids, cache, position_ids, attention_mask, keep)  # type: ignore[misc]


class Mamba1Adapter(Mamba1Mixers, SSMAdapterBase):
    family = "mamba1"
    model_types = {"mamba": "Mamba-1", "falcon_mamba": "Falcon-Mamba"}

    @torch.no_grad()
    def grouped_maps(self, input_ids: torch.Tensor, layer: int, block: int, blocks: Sequence[int] | None = None,
                     rows: Sequence[int] | None = None, reduce: str = "mean") -> dict[int, torch.Tensor]:
        """Maps of channel blocks ``[k·block, (k+1)·block)`` of one layer (mean or |·| mean).

        Each channel is materialised exactly (:meth:`implicit_maps`), then averaged: a readable
        summary for plots.
        """
        E = self.mixer(layer).num_heads
        ks = list(blocks) if blocks is not None else list(range((E + block - 1) // block))
        maps = self.implicit_maps(input_ids, [h for k in ks for h in self.channel_heads(layer, block, k)], rows)
        return group_channels({h.head: m for h, m in maps.items()}, block, reduce)

    def channel_heads(self, layer: int, block: int, k: int) -> list[HeadId]:
        """The head ids of channel block ``k`` (e.g. to ablate a whole block)."""
        E = self.mixer(layer).num_heads
        return [HeadId(layer, c) for c in range(k * block, min(E, (k + 1) * block))]
