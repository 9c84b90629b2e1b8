"""Hugging Face Hub ids (``org/name``, ``org/name@revision``) as model specs.

A spec is a hub id when it has exactly one ``/`` between two names of letters, digits, ``.``, ``_``
and ``-`` (optionally ``@revision``), does not end in ``.gguf`` or ``.json``, and is not an
existing local path (a directory ``org/name`` next to you wins). It resolves through
``huggingface_hub.snapshot_download`` into the standard cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), fetching only ``*.json``, ``*.safetensors``
and tokenizer files: never pickle weights, never code. ``HF_HUB_OFFLINE=1`` reads the cache
only; an id that is not there is refused in one line.

The resolved spec is ``org/name@<commit>``: loading it again gives the same weights, and it is
what every result records as its model. Environment variables are read at each call (not when
``huggingface_hub`` was imported), so a test or a command can set them late.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .. import registry
from ..errors import GandaError

# What a model needs from a repository: configs, safetensors weights and tokenizer files.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt"]
CONFIG_PATTERNS = ["config.json"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_ID = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]*))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubModel:
    """One resolved repository snapshot."""

    repo_id: str
    commit: str
    path: Path

    @property
    def spec(self) -> str:
        """``org/name@<commit>``: the spec that reloads exactly these files."""
        return f"{self.repo_id}@{self.commit}"


def is_hub_id(spec: str) -> bool:
    """True when ``spec`` names a hub repository rather than a local file, directory or alias."""
    spec = str(spec)
    if _HUB_ID.match(spec) is None or spec.endswith((".gguf", ".json")):
        return False
    return not Path(spec).expanduser().exists()


def split(spec: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; the revision is None when not given."""
    m = _HUB_ID.match(str(spec))
    if m is None:
        raise GandaError(f"not a hub id: {spec!r} (expected org/name or org/name@revision)")
    return m["repo"], m["rev"]


def cache_dir() -> Path:
    """The hub cache: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                            / "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(spec: str, *, config_only: bool = False) -> HubModel:
    """Snapshot ``spec`` (``org/name`` or ``org/name@rev``) into the cache.

    ``config_only`` fetches ``config.json`` alone (what ``ganda plan`` and ``ganda info --meta``
    need). Every failure is one :class:`GandaError` line naming the id.
    """
    repo_id, rev = split(spec)
    rev = rev or "main"
    where = cache_dir()
    patterns = CONFIG_PATTERNS if config_only else ALLOW_PATTERNS
    try:
        path = Path(snapshot_download(repo_id, revision=rev, cache_dir=str(where), local_files_only=offline(),
                                      allow_patterns=patterns))
    except LocalEntryNotFoundError:
        if offline():
            raise GandaError(f"{repo_id}@{rev} is not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE=1 "
                             "forbids downloading it; download it once online or unset HF_HUB_OFFLINE") from None
        raise GandaError(f"{repo_id}@{rev}: the Hub cannot be reached and the cache ({where}) does not hold it") from None
    except IncompleteSnapshotError:
        raise GandaError(f"{repo_id}@{rev}: the cached snapshot in {where} is incomplete; download it again online") from None
    except GatedRepoError:
        raise GandaError(f"{repo_id} is gated: accept its licence on huggingface.co and log in (hf auth login)") from None
    except RevisionNotFoundError:
        raise GandaError(f"{repo_id} has no revision {rev!r}") from None
    except RepositoryNotFoundError:
        raise GandaError(f"no such repository on the Hugging Face Hub: {repo_id} (or it is private)") from None
    except HFValidationError as exc:
        raise GandaError(f"{spec!r} is not a valid hub id: {str(exc).splitlines()[0]}") from None
    except OSError as exc:  # disk full, permissions, network errors raised as OSError
        raise GandaError(f"{repo_id}@{rev}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    commit = path.name
    if not _COMMIT.match(commit):  # a snapshot folder is always named by its commit
        raise GandaError(f"{repo_id}@{rev}: unexpected cache layout at {path}")
    if not (path / "config.json").is_file():
        raise GandaError(f"{repo_id}@{commit[:12]} has no config.json: not a transformers model repository")
    if not config_only and not any(path.glob("*.safetensors")):
        raise GandaError(f"{repo_id}@{commit[:12]} publishes no *.safetensors weights (ganda never downloads "
                         "pickle checkpoints)")
    return HubModel(repo_id, commit, path)


def pinned(spec: str, path: Path) -> str:
    """``org/name@<commit>`` for a hub spec resolved to ``path`` (a snapshot folder), else ``spec``."""
    if not is_hub_id(spec) or not _COMMIT.match(path.name):
        return spec
    return f"{split(spec)[0]}@{path.name}"


# Model specs that look like hub ids load through the cache (after aliases and existing paths): a
# registered resolver is only asked about the specs its predicate accepts.
registry.register_resolver(is_hub_id, lambda spec: resolve(spec).path, label="a Hugging Face Hub id (org/name)")
