"""ganda: find, measure, disable and transplant Gather-and-Aggregate heads.

Data flows one way: ``load_model`` -> choose heads (``heads``) -> intervene
(``interventions``) -> evaluate (``tasks`` + ``scoring``) -> report (``report``).

Importing ``ganda`` registers the built-in model families, tasks and result kinds
(:mod:`ganda.registry`); plugins add theirs on the first lookup that misses.
"""

from . import experiments as _experiments  # noqa: F401  (registers the built-in result kinds)
from . import tasks as _tasks  # noqa: F401  (registers the built-in tasks)
from .errors import GandaError
from .heads import HeadId
from .interventions import AblateHeads, KeepHeads, KeepLayers, RemoveLayers, mask_last_row, truncate
from .models import ModelAdapter, from_model, load_model

__version__ = "0.1.0"

__all__ = [
    "AblateHeads",
    "GandaError",
    "HeadId",
    "KeepHeads",
    "KeepLayers",
    "ModelAdapter",
    "RemoveLayers",
    "from_model",
    "load_model",
    "mask_last_row",
    "truncate",
    "__version__",
]
