"""ganda's CPU lab: tiny Llama / Mamba-2 / hybrid models trained on a synthetic world where
knowledge (facts in weights) and retrieval (Gather-and-Aggregate) are exactly separable, and the
programme that replays the paper's six findings on them.

The lab is a client of ganda: it reaches the core only through its public modules and registries.
Its plugin (:mod:`ganda_lab.plugin`, entry point ``ganda.plugins: lab``) registers the shipped
checkpoints as model names (``lab-llama-h1``, ...), the tasks ``lab-knowledge``, ``lab-mmlu``,
``lab-letters`` and ``lab-kv``, the result kind ``lab_findings`` and the commands ``train``,
``distill``, ``grow`` and ``lab``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ganda.errors import GandaError

#: The checkpoints installed with the lab: the models of the six findings.
CHECKPOINTS = Path(__file__).parent / "checkpoints"
#: The other recipes' checkpoints live in the repository, not in the installed package (each one
#: rebuilds bit for bit: docs/lab.md, "The shipped models"); a source checkout finds them here,
#: and ``GANDA_LAB_CHECKPOINTS`` (directories separated by ``os.pathsep``) names more places.
REPO_CHECKPOINTS = Path(__file__).resolve().parents[2] / "lab-checkpoints"


def checkpoint_dirs() -> list[Path]:
    """Where lab checkpoints are looked up by name, first match wins."""
    extra = [Path(p).expanduser() for p in os.environ.get("GANDA_LAB_CHECKPOINTS", "").split(os.pathsep) if p]
    return [d for d in (CHECKPOINTS, *extra, REPO_CHECKPOINTS) if d.is_dir()]

# the programme's roles and the models each finding reads (``--only`` evaluates just these)
ROLES = ("transformer", "ssm", "hybrid", "distilled", "kv_transformer", "kv_ssm", "deep")
NEEDS = {1: {"transformer"}, 2: {"transformer", "deep"}, 3: {"transformer", "ssm", "kv_transformer", "kv_ssm"},
         4: {"transformer", "ssm"},
         5: {"hybrid"}, 6: {"transformer", "distilled"}}
# the shipped model of each role (docs/lab.md says why each one):
# - transformer: the Llama with one head per layer (weight decay 0.3): its last layer's only head must
#   serve every answer letter, so one Aggregate head and one Gather head each take lab-mmlu to chance
# - distilled: its 1600-step student, which responds to a transplant of the teacher's Aggregate layer
# - hybrid: attention last, as in the paper's hybrids (lab-hybrid, attention at layer 2 of 4, keeps
#   its Aggregate step in the SSM layer after it)
# - kv_transformer, kv_ssm: finding 3's KV curve is measured on a pair trained for KV (the models
#   above never learned it on their mixture); with those roles empty it falls back to the
#   transformer and the ssm
# - deep: finding 2 prunes lab-llama-h1 grown by two blocks on top that store facts MMLU never asks
#   (every lab model keeps its Aggregate step in its last layer, so pruning any of them from the end
#   costs retrieval at once)
DEFAULT_MODELS = {"transformer": "lab-llama-h1", "ssm": "lab-mamba2-9k", "hybrid": "lab-hybrid-late-7k5",
                  "distilled": "lab-distilled-h1", "kv_transformer": "lab-kv-llama", "kv_ssm": "lab-kv-mamba2",
                  "deep": "lab-llama-deep"}


def shipped() -> list[str]:
    """Names of the lab checkpoints that load by name."""
    return sorted({p.name for d in checkpoint_dirs() for p in d.iterdir() if (p / "config.json").exists()})


def shipped_path(name: str) -> Path | None:
    """The directory of lab checkpoint ``name``, or None (the lab's model resolver)."""
    if not name or Path(name).name != name:
        return None
    for d in checkpoint_dirs():
        if (d / name / "config.json").exists():
            return d / name
    return None


def checkpoint(name: str) -> Path:
    """The directory of a shipped checkpoint (``lab-llama-h1``, ``lab-mamba2-9k``, ...)."""
    path = shipped_path(name)
    if path is None:
        raise GandaError(f"no shipped lab checkpoint {name!r}; shipped: {', '.join(shipped()) or 'none'}")
    return path


def lab_model(spec: str) -> Path:
    """A model directory, or the shipped lab checkpoint of that name."""
    if Path(spec).exists():
        return Path(spec)
    path = shipped_path(spec)
    if path is None:
        raise GandaError(f"{spec!r} is neither a model directory nor a shipped lab checkpoint")
    return path


__all__ = ["CHECKPOINTS", "DEFAULT_MODELS", "NEEDS", "REPO_CHECKPOINTS", "ROLES", "checkpoint", "checkpoint_dirs",
           "lab_model", "shipped", "shipped_path"]
