"""The lab's four tasks, registered as ``lab-knowledge``, ``lab-mmlu``, ``lab-letters``, ``lab-kv``.

All are multiple-choice and deterministic for a seed. Evaluation streams are seeded apart from
the training stream, so prompts are held out (new distractors, option orders, novel names);
``lab-mmlu --split held`` restricts to facts whose MMLU-format questions were never trained on
(their statements were), which tests knowledge *extraction* rather than memorised prompts.
"""

from __future__ import annotations

from typing import Any

from ..tasks.base import Example, Task
from .world import DEFAULT_WORLD, World, WorldConfig, eval_rng

_WORLDS: dict[WorldConfig, World] = {}


def get_world(cfg: WorldConfig | None = None) -> World:
    cfg = cfg or DEFAULT_WORLD
    if cfg not in _WORLDS:
        _WORLDS[cfg] = World(cfg)
    return _WORLDS[cfg]


class _LabTask(Task):
    kind = "mc"
    default_n = 400

    def __init__(self, n: int | None = None, world_seed: int | None = None, world: dict[str, Any] | None = None,
                 **kw: Any) -> None:
        self.n = int(n) if n is not None else self.default_n
        cfg = WorldConfig.from_json(world) if world is not None else DEFAULT_WORLD if world_seed is None else WorldConfig.from_json({**DEFAULT_WORLD.to_json(), "seed": int(world_seed)})
        self.world = get_world(cfg)
        self._init(**kw)

    @classmethod
    def for_model(cls, adapter: Any) -> dict[str, Any]:
        """The world ``adapter`` was trained on (its ``lab.json``), if it records one."""
        from .analysis import model_world

        world = model_world(adapter)
        return {"world": world} if world is not None else {}

    def _init(self) -> None:
        pass

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        n = self.n if limit is None else int(limit)
        return self._make(n, seed)

    def _make(self, n: int, seed: int) -> list[Example]:  # pragma: no cover - interface
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "n": self.n, "world": self.world.config.to_json(), **self._extra()}

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

    def _init(self, n_pairs: int = 8, pairs: int | None = None) -> None:
        self.n_pairs = int(pairs if pairs is not None else n_pairs)  # ``pairs`` as for ``kv``
        if not 2 <= self.n_pairs <= len(self.world.kv_key_pool):
            raise ValueError(f"n_pairs must be between 2 and {len(self.world.kv_key_pool)}")

    def _make(self, n: int, seed: int) -> list[Example]:
        rng = eval_rng("kv", seed)
        return [self.world.kv_example(rng, self.n_pairs) for _ in range(n)]

    def _extra(self) -> dict[str, Any]:
        return {"n_pairs": self.n_pairs}


LAB_TASKS = {
    "lab-knowledge": "ganda.lab.tasks:LabKnowledgeTask",
    "lab-mmlu": "ganda.lab.tasks:LabMMLUTask",
    "lab-letters": "ganda.lab.tasks:LabLettersTask",
    "lab-kv": "ganda.lab.tasks:LabKVTask",
}
