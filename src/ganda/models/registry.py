"""Which adapter serves which model: a view onto the family registry in :mod:`ganda.registry`.

``adapter_for`` picks the first registered adapter whose ``matches`` accepts the model; families
registered later are tried first, so specific families come before the generic Transformer.
"""

from __future__ import annotations

from torch import nn

from .. import registry
from ..errors import GandaError
from .base import ModelAdapter


def supported_text() -> str:
    return ", ".join(f"{v} ({k})" for k, v in sorted(registry.MODEL_TYPES.items()))


def check_model_type(model_type: str | None) -> None:
    if model_type not in registry.MODEL_TYPES:
        raise GandaError(f"unsupported architecture {model_type!r}; ganda supports: {supported_text()}")


def adapter_for(model: nn.Module, tokenizer, spec: str) -> ModelAdapter:
    for cls in registry.families():
        if cls.matches(model):
            return cls(model, tokenizer, spec)
    mt = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise GandaError(f"unsupported architecture {mt!r}; ganda supports: {supported_text()}")
