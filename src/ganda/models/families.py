"""The built-in families: the Llama-layout Transformer (generic, tried last) and the SSM and hybrid
families, which register themselves in :mod:`.ssm`."""

from __future__ import annotations

from ..registry import register_family
from . import ssm as _ssm  # noqa: F401  (registers the SSM and hybrid families)
from .transformer import TransformerAdapter

register_family(TransformerAdapter, {
    "llama": "Llama / SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
}, generic=True)
