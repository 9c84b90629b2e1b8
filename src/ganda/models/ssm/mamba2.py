"""Mamba-2 (transformers ``Mamba2ForCausalLM``): heads are the SSD heads of each layer's mixer."""

from __future__ import annotations

from .common import SSMAdapterBase


class Mamba2Adapter(SSMAdapterBase):
    family = "mamba2"
    model_types = {"mamba2": "Mamba-2"}
