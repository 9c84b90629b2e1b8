"""SSM and hybrid families: Mamba-2, Llamba (Discrete Mamba-2), Mamba-1/Falcon-Mamba, Zamba2, Bamba,
Falcon-H1, Jamba.

Importing this package registers the adapters (``families.py`` imports it) and the Llamba loader;
see docs/ssm.md for head ids, formulas and the forced PyTorch path. The implicit-attention
entry point is ``ganda.models.ssm.materialize.materialize(adapter, input_ids, heads, rows)``.
"""

from __future__ import annotations

from ...registry import LOADERS, register_family
from .bamba import BambaAdapter
from .falcon_h1 import FalconH1Adapter
from .jamba import JambaAdapter
from .llamba import LlambaAdapter, LlambaForCausalLM, load_llamba, load_unlabelled
from .mamba1 import Mamba1Adapter
from .mamba2 import Mamba2Adapter
from .zamba2 import Zamba2Adapter

# registered in this order (later ones are tried first), each for its own ``model_types``
for _family in (Mamba2Adapter, Mamba1Adapter, LlambaAdapter, Zamba2Adapter, BambaAdapter, FalconH1Adapter,
                JambaAdapter):
    register_family(_family, _family.model_types)
LOADERS["llamba"] = load_llamba
# Llamba's published config.json may carry no model_type; anything else without one is refused.
LOADERS.setdefault(None, load_unlabelled)

__all__ = [
    "BambaAdapter",
    "FalconH1Adapter",
    "JambaAdapter",
    "LlambaAdapter", "LlambaForCausalLM", "Mamba1Adapter", "Mamba2Adapter", "load_llamba",
    "Zamba2Adapter",
]
