"""ganda: find, measure, disable and transplant Gather-and-Aggregate heads.

Data flows one way: ``load_model`` -> choose heads (``heads``) -> intervene
(``interventions``) -> evaluate (``tasks`` + ``scoring``) -> report (``report``).
"""

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
