"""The lab's four tasks, registered as ``lab-knowledge``, ``lab-mmlu``, ``lab-letters``, ``lab-kv``.

All are multiple-choice and deterministic for a seed. Evaluation streams are seeded apart from
the training stream, so prompts are held out (new distractors, option orders, novel names);
``lab-mmlu --split held`` restricts to facts whose MMLU-format questions were never trained on
(their statements were), which tests knowledge *extraction* rather than memorised prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ganda.errors import GandaError
from ganda.tasks.base import Example, OptionError, Task, keyword_types

from . import shipped_path
from .analysis import model_world
from .world import DEFAULT_WORLD, World, WorldConfig, checked_world, eval_rng

_WORLDS: dict[WorldConfig, World] = {}


def get_world(cfg: WorldConfig | None = None) -> World:
    cfg = cfg or DEFAULT_WORLD
    if cfg not in _WORLDS:
        _WORLDS[cfg] = World(cfg)
    return _WORLDS[cfg]


def world_record(spec: str) -> dict[str, Any]:
    """The world named on the command line (``--option world=...``): ``default``, a lab model
    directory or shipped checkpoint name (its ``lab.json``), or a ``lab.json`` file."""

    if spec == "default":
        return DEFAULT_WORLD.to_json()
    path = Path(spec).expanduser()
    if not path.exists():
        path = shipped_path(spec) or path
    f = path / "lab.json" if path.is_dir() else path
    if not f.is_file():
        raise GandaError(f"world {spec!r}: expected 'default', a lab model directory or its lab.json")
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GandaError(f"world {spec!r}: cannot read {f}: {exc}") from None
    return checked_world(meta, f"world {spec!r}: {f}")


class _LabTask(Task):
    kind = "mc"
    default_n = 400
    bounds = {"n": (1, None)}
    model_options = ("world", "world_seed")

    def __init__(self, n: int | None = None, world_seed: int | None = None,
                 world: dict[str, Any] | str | None = None, **kw: Any) -> None:
        self.n = int(n) if n is not None else self.default_n
        if world is not None and world_seed is not None:
            raise OptionError(f"{self.name}: give world or world_seed, not both")
        if isinstance(world, str):
            world = world_record(world)
        cfg = WorldConfig.from_json(world) if world is not None else DEFAULT_WORLD if world_seed is None else WorldConfig.from_json({**DEFAULT_WORLD.to_json(), "seed": int(world_seed)})
        self.world = get_world(cfg)
        self._init(**kw)

    @classmethod
    def option_types(cls) -> dict[str, Any]:
        return {**keyword_types(_LabTask.__init__), **keyword_types(cls._init)}

    @classmethod
    def for_model(cls, adapter: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The world ``adapter`` was trained on (its ``lab.json``); nothing when ``options`` name
        a world. A model with no ``lab.json`` is refused (:func:`~ganda_lab.analysis.model_world`)."""
        if options and ("world" in options or "world_seed" in options):
            return {}
        return {"world": model_world(adapter, task=cls.name)}

    def _init(self) -> None:
        pass

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        n = self.n if limit is None else int(limit)
        return self._make(n, seed)

    def _make(self, n: int, seed: int) -> list[Example]:  # pragma: no cover - interface
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "size": self.n, "world": self.world.config.to_json(), **self._extra()}

    def _extra(self) -> dict[str, Any]:
        return {}


class _FactTask(_LabTask):
    asked = False  # only facts MMLU-format questions may be about

    def _init(self, split: str = "all") -> None:
        self.split = split
        self.world.fact_split(split, self.asked)  # validates

    def _facts(self, n: int, seed: int, kind: str):
        rng = eval_rng(kind, seed)
        facts = list(self.world.fact_split(self.split, self.asked))
        rng.shuffle(facts)
        return rng, [facts[i % len(facts)] for i in range(n)]

    def _extra(self) -> dict[str, Any]:
        return {"split": self.split}


class LabKnowledgeTask(_FactTask):
    """``The home of bako is`` -> the value, among four (no letters; only stored knowledge helps)."""

    name = "lab-knowledge"

    def _make(self, n: int, seed: int) -> list[Example]:
        rng, facts = self._facts(n, seed, "knowledge")
        return [self.world.knowledge_example(rng, f) for f in facts]


class LabMMLUTask(_FactTask):
    """MMLU format about a stored fact: needs the fact *and* Gather-and-Aggregate."""

    name = "lab-mmlu"
    asked = True

    def _make(self, n: int, seed: int) -> list[Example]:
        rng, facts = self._facts(n, seed, "mmlu")
        return [self.world.mmlu_example(rng, f) for f in facts]


class LabLettersTask(_LabTask):
    """MMLU format about a novel entity whose value is stated in context (pure letter retrieval)."""

    name = "lab-letters"

    def _make(self, n: int, seed: int) -> list[Example]:
        rng = eval_rng("letters", seed)
        return [self.world.letters_example(rng) for _ in range(n)]


class LabKVTask(_LabTask):
    """The paper's dictionary prompt in the lab's token world; choices are the dictionary's values."""

    name = "lab-kv"

    bounds = {"n": (1, None), "n_pairs": (2, None), "pairs": (2, None)}

    def _init(self, n_pairs: int = 8, pairs: int | None = None) -> None:
        self.n_pairs = int(pairs if pairs is not None else n_pairs)  # ``pairs`` as for ``kv``
        most = min(len(self.world.kv_key_pool), self.world.config.n_kv_values)
        if not 2 <= self.n_pairs <= most:
            raise OptionError(f"task 'lab-kv': pairs must be between 2 and {most} (the world's distinct "
                              f"dictionary keys and values), got {self.n_pairs}")

    def _make(self, n: int, seed: int) -> list[Example]:
        rng = eval_rng("kv", seed)
        return [self.world.kv_example(rng, self.n_pairs) for _ in range(n)]

    def _extra(self) -> dict[str, Any]:
        return {"n_pairs": self.n_pairs}

