"""SSM and hybrid families: Mamba-2, Llamba (Discrete Mamba-2), Mamba-1/Falcon-Mamba, Zamba2, Bamba,
Falcon-H1, Jamba.

Importing this package registers the adapters (``families.py`` imports it) and the Llamba loader;
see docs/ssm.md for head ids, formulas and the forced PyTorch path. The implicit-attention
entry point is ``ganda.models.ssm.materialize.materialize(adapter, input_ids, heads, rows)``.
"""

from __future__ import annotations

from ..loading import CUSTOM_LOADERS
from ..registry import register
from .bamba import BambaAdapter
from .falcon_h1 import FalconH1Adapter
from .jamba import JambaAdapter
from .llamba import LlambaAdapter, LlambaForCausalLM, load_llamba, load_unlabelled
from .mamba1 import Mamba1Adapter
from .mamba2 import Mamba2Adapter
from .zamba2 import Zamba2Adapter

register(Mamba2Adapter, {"mamba2": "Mamba-2"})
register(Mamba1Adapter, {"mamba": "Mamba-1", "falcon_mamba": "Falcon-Mamba"})
register(LlambaAdapter, {"llamba": "Llamba (Discrete Mamba-2)"})
register(Zamba2Adapter, {"zamba2": "Zamba2 (hybrid)"})
register(BambaAdapter, {"bamba": "Bamba (hybrid)"})
register(FalconH1Adapter, {"falcon_h1": "Falcon-H1 (parallel hybrid)"})
register(JambaAdapter, {"jamba": "Jamba (hybrid)"})
CUSTOM_LOADERS["llamba"] = load_llamba
# Llamba's published config.json may carry no model_type; anything else without one is refused.
CUSTOM_LOADERS.setdefault(None, load_unlabelled)

__all__ = [
    "BambaAdapter",
    "FalconH1Adapter",
    "JambaAdapter",
    "LlambaAdapter", "LlambaForCausalLM", "Mamba1Adapter", "Mamba2Adapter", "load_llamba",
    "Zamba2Adapter",
]
