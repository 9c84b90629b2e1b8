"""The CPU lab: tiny Llama / Mamba-2 / hybrid models trained on a synthetic world where
knowledge (facts in weights) and retrieval (Gather-and-Aggregate) are exactly separable.

Importing this package registers the tasks ``lab-knowledge``, ``lab-mmlu``, ``lab-letters`` and
``lab-kv``. Shipped checkpoints live in ``ganda/lab/checkpoints/<name>/`` (see :func:`checkpoint`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GandaError
from ..tasks import register_task
from .tasks import LAB_TASKS

for _name, _target in LAB_TASKS.items():
    register_task(_name, _target)

CHECKPOINTS = Path(__file__).parent / "checkpoints"


def shipped() -> list[str]:
    """Names of the checkpoints shipped with ganda."""
    if not CHECKPOINTS.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").exists())


def checkpoint(name: str) -> Path:
    """The directory of a shipped checkpoint (``lab-llama``, ``lab-mamba2``, ...)."""
    path = CHECKPOINTS / name
    if not (path / "config.json").exists():
        raise GandaError(f"no shipped lab checkpoint {name!r}; shipped: {', '.join(shipped()) or 'none'}")
    return path


__all__ = ["CHECKPOINTS", "checkpoint", "shipped"]
