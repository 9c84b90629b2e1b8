"""Falcon-H1 (``FalconH1ForCausalLM``): a *parallel* hybrid, every layer runs attention and a
Mamba-2 mixer side by side on the same input and sums them.

Every layer therefore has two mixers and ids always name the kind: ``L3.attnH2``,
``L3.ssmH5``. Quirks handled: the mixer scales its ``in_proj`` output by a per-segment µP vector
(``mup_vector`` for z/x/B/C/dt), so Δ, B, C and x are recomputed *after* that multiplier (the
``in_proj`` output alone is wrong); ``ssm_in_multiplier`` acts before ``in_proj`` and is already
in the captured tensor; ``ssm_out_multiplier``/``attention_out_multiplier`` act after
``out_proj``/``o_proj`` and do not change which head contributes what. With
``mamba_rms_norm=False`` the gate is applied without a norm; the head layout is the same.
"""

from __future__ import annotations

import torch

from ..base import Mixer
from .common import HybridAdapterBase, mamba2_params
from .materialize import SSMParams


class FalconH1Adapter(HybridAdapterBase):
    family = "falcon_h1"
    model_types = {"falcon_h1": "Falcon-H1 (parallel hybrid)"}

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        mup = getattr(mixer.module, "mup_vector", None)
        proj = captured.float() * (mup.float().reshape(-1) if mup is not None else 1.0)
        return mamba2_params(mixer.module, proj)[0]
