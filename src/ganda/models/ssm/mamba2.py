"""Mamba-2 (transformers ``Mamba2ForCausalLM``): heads are the SSD heads of each layer's mixer."""

from __future__ import annotations

import torch

from ..base import Mixer
from .common import SSMAdapterBase, mamba2_params
from .materialize import SSMParams


class Mamba2Adapter(SSMAdapterBase):
    family = "mamba2"
    prefix_cache_kwarg = "cache_params"
    model_types = {"mamba2": "Mamba-2"}
    layers_in = "backbone"

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        return mamba2_params(mixer.module, captured)[0]
