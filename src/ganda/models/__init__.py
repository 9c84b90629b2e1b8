"""Model loading and the per-family adapters (see ``base.ModelAdapter``)."""

from ..registry import adapter_for
from . import families as _families  # noqa: F401  (registers the built-in families)
from .base import Mixer, ModelAdapter
from .loading import DEFAULT_MODEL, from_model, load_model

__all__ = ["DEFAULT_MODEL", "Mixer", "ModelAdapter", "adapter_for", "from_model", "load_model"]
