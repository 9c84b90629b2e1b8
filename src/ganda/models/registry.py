"""Which adapter serves which model, and which architectures ganda can load.

Families register themselves here; ``adapter_for`` picks the first adapter whose ``matches``
accepts the model, so the order puts specific families before generic ones.
"""

from __future__ import annotations

from torch import nn

from ..errors import GandaError
from .base import ModelAdapter

_ADAPTERS: list[type[ModelAdapter]] = []

# model_type -> human name, for error messages; families add themselves.
SUPPORTED: dict[str, str] = {
    "llama": "Llama / SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
}


def register(adapter: type[ModelAdapter], model_types: dict[str, str] | None = None, first: bool = True) -> None:
    if adapter not in _ADAPTERS:
        if first:
            _ADAPTERS.insert(0, adapter)
        else:
            _ADAPTERS.append(adapter)
    SUPPORTED.update(model_types or {})


def supported_text() -> str:
    _ensure_builtin()
    return ", ".join(f"{v} ({k})" for k, v in sorted(SUPPORTED.items()))


def check_model_type(model_type: str | None) -> None:
    _ensure_builtin()
    if model_type not in SUPPORTED:
        raise GandaError(
            f"unsupported architecture {model_type!r}; ganda supports: {supported_text()}"
        )


def adapter_for(model: nn.Module, tokenizer, spec: str) -> ModelAdapter:
    _ensure_builtin()
    for cls in _ADAPTERS:
        if cls.matches(model):
            return cls(model, tokenizer, spec)
    mt = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise GandaError(f"unsupported architecture {mt!r}; ganda supports: {supported_text()}")


_LOADED = False


def _ensure_builtin() -> None:
    """Import the family modules once so that they register their adapters."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from . import families  # noqa: F401  (side effect: registration)
