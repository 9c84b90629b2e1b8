"""A seeded synthetic world where knowledge and retrieval are exactly separable.

* **Entities** (a few hundred made-up names such as ``bako``) each have one fixed value per
  **relation** (``home``, ``job``, ...). Values are two words (``red hill``), so an option line
  has several content tokens that a Gather head must summarise into its newline.
* **Knowledge** (the ARC/PIQA analogue): ``The home of bako is`` + `` red hill``; four candidate
  values scored by log-likelihood. No letters, nothing to retrieve: only the stored fact helps.
* **MMLU format**: ``Question: What is the home of bako?`` + four options ``A. red hill`` ... +
  ``Answer:`` -> `` A``..`` D``. Needs the stored fact *and* the Gather-and-Aggregate step.
* **Letters**: the same format about a *novel* entity (a name with no stored facts) whose value
  is stated in a ``Context:`` line, so the answer's content is in the prompt.
* **KV**: the paper's dictionary prompt with novel names as keys and numbers 0-99 as values.

Everything is a pure function of :class:`WorldConfig` (and a seed for sampled examples), so
the tasks, the training mixture and the tokenizer's vocabulary always agree.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from ganda.errors import GandaError
from ganda.tasks.base import Example

LETTERS = "ABCD"
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"

# relation -> (word lists whose product gives the values)
RELATIONS: dict[str, tuple[list[str], list[str]]] = {
    "home": (["red", "cold", "dark", "old", "high", "wet"], ["hill", "lake", "town", "wood", "port", "cave"]),
    "job": (["sky", "sea", "iron", "salt", "glass", "stone"], ["smith", "guard", "cook", "miner", "baker", "farmer"]),
    "pet": (["small", "loud", "shy", "fat", "quick", "lazy"], ["cat", "dog", "goat", "crow", "frog", "horse"]),
}

# relations that are *stated* (fact statements, the knowledge task) but never *asked* in MMLU
# format: the knowledge the paper's other benchmarks test and MMLU does not need (a Llama cut to
# 18 of 32 layers keeps its MMLU score and loses most of its knowledge score). Their names are
# words of the templates and their values pairs of the asked relations' words crossed (a home
# adjective with a job noun, a job adjective with a home noun), so a world that adds them keeps
# its vocabulary: a model trained on the world without them keeps every token id.
UNASKED_RELATIONS: dict[str, tuple[list[str], list[str]]] = {
    "pet": (RELATIONS["home"][0], RELATIONS["job"][1]),
    "key": (RELATIONS["job"][0], RELATIONS["home"][1]),
}

KV_HEADER = "Memorize the following dictionary:\n"
TEMPLATE_WORDS = (
    "The home job pet of is What Question Answer Context Memorize the following dictionary "
    "value key"
).split()
PUNCT = [".", ":", "?", "'", "\n"]
# words of the training-only option drill; appended after every other word so that adding them
# left the ids of earlier vocabularies unchanged
DRILL_WORDS = ["Which", "option"]


# what a world record that predates these fields meant (lab.json files written before them)
LEGACY: dict[str, Any] = {"distractors": "random", "kv_keys": "names", "values": "pairs"}


@dataclass(frozen=True)
class WorldConfig:
    seed: int = 0
    n_entities: int = 200
    n_novel: int = 200  # names with no facts: letters-task subjects and KV keys
    relations: tuple[str, ...] = ("home", "job")
    n_values: int = 16  # values per relation (adjective x noun combinations)
    holdout_frac: float = 0.2  # facts whose MMLU-format questions never appear in training
    n_kv_values: int = 100
    # "random": MMLU-format/letters distractors drawn at random from the relation's values;
    # "hard": every distractor shares one word with the gold value (``red port`` vs ``red hill``,
    # ``cold port``), so no single option word identifies the answer: the option line must be
    # summarised as a whole (Gather) and matched as a whole (Aggregate). Knowledge questions keep
    # random distractors (the ARC/PIQA analogue has no such trap).
    distractors: str = "random"
    # "names": dictionary keys are novel names (one token each); "phrases": two-word phrases
    # made of the relations' words (``old hill:42``), so a key, like an option, spans tokens
    kv_keys: str = "names"
    # "pairs": every value is two words, adjective + noun (``dark hill``); "phrases": every value
    # is a sequence of 1 to ``max_words`` distinct words from the relation's ``phrase_words``
    # words (``hill``, ``dark hill``, ``dark hill lake``), and hard distractors are *edits* of the
    # gold value: the gold minus its last word, the gold plus one more word, one word swapped.
    # With fixed-length values a model can summarise an option at its last word and vote word by
    # word; with phrases only the option's ``\n`` knows the option is complete (``dark hill`` vs
    # ``dark hill lake``), and every gold word also appears in a distractor, so the line must be
    # gathered into its ``\n`` and matched as a whole: the paper's Gather-and-Aggregate.
    values: str = "pairs"
    phrase_words: int = 6
    max_words: int = 3
    # stated, never asked (``UNASKED_RELATIONS``): their facts are in the statements and the
    # knowledge task only; MMLU-format, letters and drill questions keep to ``relations``
    unasked_relations: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["relations"] = list(self.relations)
        d["unasked_relations"] = list(self.unasked_relations)
        if not self.unasked_relations:  # records of worlds without them stay as they were
            del d["unasked_relations"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> WorldConfig:
        """A world from its JSON record. A record written before a field existed gets the value
        that field then had (``LEGACY``), not today's default; an empty record is today's default."""
        d = dict(d or {})
        if d:
            d = {**LEGACY, **d}
        for k in ("relations", "unasked_relations"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


@dataclass(frozen=True)
class Fact:
    entity: str
    relation: str
    value: str


def _names(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    seen = set(taken)
    while len(out) < n:
        name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2))
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def phrase_pool(relation: str, n_words: int) -> list[str]:
    """The words a relation's phrases are made of: its first adjectives and nouns, alternately."""
    adjs, nouns = RELATIONS[relation]
    mixed = [w for pair in zip(adjs, nouns, strict=True) for w in pair]
    if not 2 <= n_words <= len(mixed):
        raise ValueError(f"phrase_words must be between 2 and {len(mixed)}")
    return mixed[:n_words]


def _phrases(pool: list[str], max_words: int) -> list[str]:
    """Every sequence of 1..max_words distinct pool words, as text, sorted."""
    out: list[list[str]] = [[w] for w in pool]
    level = list(out)
    for _ in range(max_words - 1):
        level = [p + [w] for p in level for w in pool if w not in p]
        out += level
    return sorted(" ".join(p) for p in out)


def edit_distractors(rng: random.Random, gold: str, pool: list[str], max_words: int, k: int) -> list[str]:
    """``k`` distinct phrases that differ from ``gold`` by one edit. *Traps* come first, in random
    order: the gold minus its last word or plus one word at the end (identical up to the gold's
    last word, so only the line's end tells them apart) and two neighbouring words swapped (the
    same words in another order, so no count of matching words tells them apart); then a word
    replaced or the first word dropped; then any phrase that shares a word (tiny pools only)."""
    words = gold.split()
    unused = [w for w in pool if w not in words]
    traps = []
    if len(words) >= 2:
        traps.append(" ".join(words[:-1]))
        i = rng.randrange(len(words) - 1)
        traps.append(" ".join(words[:i] + [words[i + 1], words[i]] + words[i + 2 :]))
    if len(words) < max_words and unused:
        traps.append(" ".join(words + [rng.choice(unused)]))
    edits = [" ".join(words[:i] + [w] + words[i + 1 :]) for i in range(len(words)) for w in unused]
    if len(words) >= 2:
        edits.append(" ".join(words[1:]))
    rng.shuffle(traps)
    rng.shuffle(edits)
    picks: list[str] = []
    for cand in traps + edits:
        if len(picks) < k and cand != gold and cand not in picks:
            picks.append(cand)
    if len(picks) < k:  # only for tiny pools
        rest = [p for p in _phrases(pool, max_words) if p != gold and p not in picks and set(p.split()) & set(words)]
        picks += rng.sample(rest, k - len(picks))
    return picks[:k]


@dataclass
class World:
    config: WorldConfig = field(default_factory=WorldConfig)

    # ---- the fixed world ----------------------------------------------------------------
    @cached_property
    def _built(self) -> tuple[list[str], list[str], dict[str, list[str]], dict[tuple[str, str], str]]:
        cfg = self.config
        rng = random.Random(f"ganda-lab-world-{cfg.seed}")
        reserved = {w.lower() for w in TEMPLATE_WORDS}
        for rel in RELATIONS.values():
            reserved |= set(rel[0]) | set(rel[1])
        names = _names(rng, cfg.n_entities + cfg.n_novel, reserved)
        entities, novel = names[: cfg.n_entities], names[cfg.n_entities :]
        values: dict[str, list[str]] = {}
        if cfg.values == "phrases":
            for r in cfg.relations:
                values[r] = _phrases(phrase_pool(r, cfg.phrase_words), cfg.max_words)
            # a fact's length is uniform over 1..max_words, then its phrase uniform among that length
            by_len = {r: [[v for v in values[r] if len(v.split()) == n] for n in range(1, cfg.max_words + 1)]
                      for r in cfg.relations}
            facts = {(e, r): rng.choice(rng.choice(by_len[r])) for e in entities for r in cfg.relations}
            if cfg.unasked_relations:
                raise ValueError("unasked_relations need values='pairs'")
            return entities, novel, values, facts
        if cfg.values != "pairs":
            raise ValueError(f"values must be 'pairs' or 'phrases', not {cfg.values!r}")
        for r in cfg.relations:
            adjs, nouns = RELATIONS[r]
            combos = [f"{a} {n}" for a in adjs for n in nouns]
            rng.shuffle(combos)
            if cfg.n_values > len(combos):
                raise ValueError(f"relation {r} has only {len(combos)} values")
            values[r] = sorted(combos[: cfg.n_values])
        facts = {(e, r): rng.choice(values[r]) for e in entities for r in cfg.relations}
        # from a stream of their own, after the asked facts: those stay exactly as without them
        urng = random.Random(f"ganda-lab-world-{cfg.seed}-unasked")
        have = {w for q in cfg.relations for w in RELATIONS[q][0] + RELATIONS[q][1]}
        for r in cfg.unasked_relations:
            if r not in UNASKED_RELATIONS or r in cfg.relations:
                raise ValueError(f"unasked relation {r!r}: choose from {sorted(set(UNASKED_RELATIONS) - set(cfg.relations))}")
            adjs, nouns = UNASKED_RELATIONS[r]
            if not set(adjs + nouns) <= have:
                raise ValueError(f"unasked relation {r!r} borrows words of relations the world lacks")
            combos = [f"{a} {n}" for a in adjs for n in nouns]
            urng.shuffle(combos)
            values[r] = sorted(combos[: cfg.n_values])
            facts |= {(e, r): urng.choice(values[r]) for e in entities}
        return entities, novel, values, facts

    @property
    def entities(self) -> list[str]:
        return self._built[0]

    @property
    def novel(self) -> list[str]:
        return self._built[1]

    @property
    def values(self) -> dict[str, list[str]]:
        return self._built[2]

    @cached_property
    def facts(self) -> list[Fact]:
        return [Fact(e, r, v) for (e, r), v in self._built[3].items()]

    def value(self, entity: str, relation: str) -> str:
        return self._built[3][(entity, relation)]

    @cached_property
    def asked_facts(self) -> list[Fact]:
        """The facts MMLU-format questions are about (all but the unasked relations')."""
        return [f for f in self.facts if f.relation in self.config.relations]

    @cached_property
    def heldout_facts(self) -> list[Fact]:
        """Facts whose MMLU-format questions are never trained on (knowledge statements are)."""
        rng = random.Random(f"ganda-lab-holdout-{self.config.seed}")
        facts = list(self.asked_facts)
        rng.shuffle(facts)
        return sorted(facts[: int(round(self.config.holdout_frac * len(facts)))], key=self.facts.index)

    @cached_property
    def train_facts(self) -> list[Fact]:
        held = set(self.heldout_facts)
        return [f for f in self.asked_facts if f not in held]

    def fact_split(self, split: str, asked: bool = False) -> list[Fact]:
        """The facts of a split: ``all``, ``train`` / ``held`` (of the asked facts' MMLU-format
        questions), ``asked``, ``unasked``. ``asked=True`` keeps only facts MMLU may ask about."""
        if split == "unasked":
            if asked:
                raise ValueError("split 'unasked' has no MMLU-format questions")
            return [f for f in self.facts if f.relation not in self.config.relations]
        if split == "asked" or (split == "all" and asked):
            return self.asked_facts
        if split == "all":
            return self.facts
        if split in ("held", "heldout"):
            return self.heldout_facts
        if split == "train":
            return self.train_facts
        raise ValueError(f"unknown fact split {split!r} (all, train, held, asked, unasked)")

    # ---- vocabulary ---------------------------------------------------------------------
    @cached_property
    def words(self) -> list[str]:
        """Every word that can appear in any prompt (the tokenizer adds " word" and "word")."""
        ws: list[str] = list(TEMPLATE_WORDS) + list(LETTERS)
        for r in self.config.relations:
            ws += RELATIONS[r][0] + RELATIONS[r][1]
        ws += self.entities + self.novel + [str(i) for i in range(self.config.n_kv_values)] + DRILL_WORDS
        seen: set[str] = set()
        return [w for w in ws if not (w in seen or seen.add(w))]

    # ---- text builders ------------------------------------------------------------------
    @staticmethod
    def statement(entity: str, relation: str, value: str) -> str:
        return f"The {relation} of {entity} is {value}."

    @staticmethod
    def knowledge_prompt(entity: str, relation: str) -> str:
        return f"The {relation} of {entity} is"

    @staticmethod
    def question(entity: str, relation: str) -> str:
        return f"Question: What is the {relation} of {entity}?\n"

    @cached_property
    def _values_by_word(self) -> dict[str, tuple[dict[str, list[str]], dict[str, list[str]]]]:
        """Per relation, its two-word values grouped by adjective and by noun, in value order:
        the hard distractors' pools, once (splitting every value per question was a tenth of
        building a training batch)."""
        out: dict[str, tuple[dict[str, list[str]], dict[str, list[str]]]] = {}
        for r, vals in self.values.items():
            by_adj: dict[str, list[str]] = {}
            by_noun: dict[str, list[str]] = {}
            for v in vals:
                words = v.split()
                by_adj.setdefault(words[0], []).append(v)
                by_noun.setdefault(words[-1], []).append(v)
            out[r] = (by_adj, by_noun)
        return out

    def _options(self, rng: random.Random, relation: str, gold_value: str, n: int = 4,
                 hard: bool = False) -> tuple[list[str], int]:
        others = [v for v in self.values[relation] if v != gold_value]
        if hard and self.config.values == "phrases":
            opts = edit_distractors(rng, gold_value, phrase_pool(relation, self.config.phrase_words),
                                    self.config.max_words, n - 1) + [gold_value]
        elif hard:  # one distractor shares the adjective, one the noun, the rest either
            adj, noun = gold_value.split()
            by_adj, by_noun = self._values_by_word[relation]
            same_adj = [v for v in by_adj[adj] if v != gold_value]
            same_noun = [v for v in by_noun[noun] if v != gold_value]
            picks = [rng.choice(pool) for pool in (same_adj, same_noun)[: n - 1] if pool]
            near = [v for v in same_adj + same_noun if v not in picks]
            picks += rng.sample(near, min(n - 1 - len(picks), len(near)))
            rest = [v for v in others if v not in picks]
            opts = picks + rng.sample(rest, n - 1 - len(picks)) + [gold_value]
        else:
            opts = rng.sample(others, n - 1) + [gold_value]
        rng.shuffle(opts)
        return opts, opts.index(gold_value)

    @staticmethod
    def _mc(head: str, options: list[str], gold: int, meta: dict[str, Any]) -> Example:
        prompt = head
        segments = []
        for letter, opt in zip(LETTERS, options, strict=False):
            line = f"{letter}. {opt}\n"
            segments.append((len(prompt), len(prompt) + len(line)))
            prompt += line
        prompt += "Answer:"
        return Example(
            prompt=prompt,
            choices=[f" {c}" for c in LETTERS[: len(options)]],
            gold=gold,
            segments=segments,
            gold_segment=gold,
            meta={**meta, "options": options},
        )

    # ---- examples -----------------------------------------------------------------------
    def knowledge_example(self, rng: random.Random, fact: Fact) -> Example:
        opts, gold = self._options(rng, fact.relation, fact.value)
        # phrases can be prefixes of each other (``dark`` / ``dark hill``): the choice includes
        # the statement's closing ``.`` so that its likelihood says where the value ends
        end = "." if self.config.values == "phrases" else ""
        return Example(
            prompt=self.knowledge_prompt(fact.entity, fact.relation),
            choices=[f" {o}{end}" for o in opts],
            gold=gold,
            meta={"entity": fact.entity, "relation": fact.relation, "value": fact.value},
        )

    @property
    def hard(self) -> bool:
        if self.config.distractors not in ("random", "hard"):
            raise ValueError(f"distractors must be 'random' or 'hard', not {self.config.distractors!r}")
        return self.config.distractors == "hard"

    def mmlu_example(self, rng: random.Random, fact: Fact, n_options: int = 4, hard: bool | None = None) -> Example:
        opts, gold = self._options(rng, fact.relation, fact.value, n_options, self.hard if hard is None else hard)
        meta = {"entity": fact.entity, "relation": fact.relation, "value": fact.value}
        return self._mc(self.question(fact.entity, fact.relation), opts, gold, meta)

    def letters_example(self, rng: random.Random, n_options: int = 4, hard: bool | None = None) -> Example:
        entity = rng.choice(self.novel)
        relation = rng.choice(self.config.relations)
        value = rng.choice(self.values[relation])
        opts, gold = self._options(rng, relation, value, n_options, self.hard if hard is None else hard)
        head = f"Context: {self.statement(entity, relation, value)}\n" + self.question(entity, relation)
        return self._mc(head, opts, gold, {"entity": entity, "relation": relation, "value": value})

    def drill_pieces(self, rng: random.Random, n_options: int = 4, n_queries: int = 3,
                     hard: bool | None = None) -> list[tuple[str, bool]]:
        """A training-only *option drill*: one block of option lines, then several questions
        about it, each answered by a letter::

            Question: Which option is old hill?
            A. wet hill
            B. dark hill
            C. old port
            D. old hill
            Answer: D
            Question: Which option is old port?
            Answer: C

        Every question is pure letter retrieval (Gather the option lines, Aggregate the one that
        matches), and one sequence supervises several of them: a dense signal for the circuit
        that ``lab-mmlu`` and ``lab-letters`` need, as repeated sequences are for induction heads.
        Returns ``(text, is_answer)`` pieces (answers are `` A``..`` D``).
        """
        relation = rng.choice(self.config.relations)
        value = rng.choice(self.values[relation])
        opts, gold = self._options(rng, relation, value, n_options, self.hard if hard is None else hard)
        asked = [gold] + rng.sample([i for i in range(n_options) if i != gold], min(n_queries, n_options) - 1)
        pieces: list[tuple[str, bool]] = [(f"Question: Which option is {opts[asked[0]]}?\n", False)]
        pieces += [("".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(opts)) + "Answer:", False)]
        pieces += [(f" {LETTERS[asked[0]]}", True)]
        for i in asked[1:]:
            pieces += [(f"\nQuestion: Which option is {opts[i]}?\nAnswer:", False), (f" {LETTERS[i]}", True)]
        return pieces

    def kv_pieces(self, rng: random.Random, n_pairs: int, n_queries: int) -> list[tuple[str, bool]]:
        """A training dictionary prompt asked ``n_queries`` different keys in turn (the first
        query is exactly :meth:`kv_example`'s prompt), as ``(text, is_answer)`` pieces."""
        ex = self.kv_example(rng, n_pairs)
        keys, vals = ex.meta["keys"], ex.meta["values"]
        asked = [ex.gold] + rng.sample([i for i in range(n_pairs) if i != ex.gold], min(n_queries, n_pairs) - 1)
        pieces: list[tuple[str, bool]] = [(ex.prompt, False), (ex.choices[ex.gold], True)]
        for i in asked[1:]:
            pieces += [(f".\nThe value of the key '{keys[i]}' is", False), (f" {vals[i]}", True)]
        return pieces

    @cached_property
    def kv_key_pool(self) -> list[str]:
        if self.config.kv_keys == "names":
            return self.novel
        if self.config.kv_keys == "phrases":
            return sorted({f"{a} {n}" for r in self.config.relations for a in RELATIONS[r][0] for n in RELATIONS[r][1]})
        raise ValueError(f"kv_keys must be 'names' or 'phrases', not {self.config.kv_keys!r}")

    @cached_property
    def kv_texts(self) -> tuple[str, ...]:
        """Every dictionary key and value as text: the copy drill's material."""
        return (*self.kv_key_pool, *(str(v) for v in range(self.config.n_kv_values)))

    def kv_repeat_pieces(self, rng: random.Random, n_pairs: int, sep: str = ":") -> list[tuple[str, bool]]:
        """A training-only *repeat drill*: a dictionary, then the same lines again in a new order.
        Each repeated key is unpredictable, but its value is fixed by the first copy: the dense
        copy signal that makes induction-style heads (find the key, read what follows) form,
        which the dictionary prompt's single query cannot give on its own.

        ``sep=" "`` writes ``key 97`` instead of ``key:97``: the value right after its key, the
        textbook induction step (a diagnostic of what the ``:`` costs)."""
        if sep not in (":", " "):
            raise ValueError(f"repeat drill separator must be ':' or ' ', not {sep!r}")
        ex = self.kv_example(rng, n_pairs)
        keys, vals = ex.meta["keys"], ex.meta["values"]
        order = list(range(n_pairs))
        rng.shuffle(order)
        head = ex.prompt[: ex.prompt.rindex("\n") + 1]
        if sep == " ":
            head = head[: ex.segments[0][0]] + "".join(f"{k} {v}\n" for k, v in zip(keys, vals, strict=True))
        pieces: list[tuple[str, bool]] = [(head, False)]
        for i in order:
            # the value piece is the very token of the dictionary line: "97" after ":", " 97" after a space
            key, value = (f"{keys[i]}:", f"{vals[i]}") if sep == ":" else (keys[i], f" {vals[i]}")
            pieces += [(key, False), (value, True), ("\n", False)]
        return pieces

    def kv_example(self, rng: random.Random, n_pairs: int = 8) -> Example:
        keys = rng.sample(self.kv_key_pool, n_pairs)
        vals = rng.sample(range(self.config.n_kv_values), n_pairs)
        q = rng.randrange(n_pairs)
        prompt = KV_HEADER
        segments = []
        for k, v in zip(keys, vals, strict=True):
            line = f"{k}:{v}\n"
            segments.append((len(prompt), len(prompt) + len(line)))
            prompt += line
        prompt += f"The value of the key '{keys[q]}' is"
        return Example(
            prompt=prompt,
            choices=[f" {v}" for v in vals],
            gold=q,
            segments=segments,
            gold_segment=q,
            meta={"key": keys[q], "value": vals[q], "n_pairs": n_pairs, "keys": keys, "values": vals},
        )


DEFAULT_WORLD = WorldConfig()


def eval_rng(kind: str, seed: int) -> random.Random:
    """Evaluation streams are seeded apart from training streams (``train_rng``)."""
    return random.Random(f"ganda-lab-eval-{kind}-{seed}")


def train_rng(seed: int, step: int) -> random.Random:
    return random.Random(f"ganda-lab-train-{seed}-{step}")


def checked_world(meta: Any, where: str) -> dict[str, Any]:
    """The ``world`` of a ``lab.json`` record, refused in one line unless it is a world record."""
    world = meta.get("world") if isinstance(meta, dict) else None
    if not isinstance(world, dict):
        what = "is not a lab.json record (a JSON object)" if not isinstance(meta, dict) else "names no world"
        raise GandaError(f"{where} {what}; a lab model's lab.json records the world it was trained on")
    for f in dataclasses.fields(WorldConfig):
        if f.name not in world:
            continue
        value, default = world[f.name], f.default
        ok = (all(isinstance(v, str) for v in value) if isinstance(value, list) else False) \
            if isinstance(default, tuple) else isinstance(value, int | float) and not isinstance(value, bool) \
            if isinstance(default, float) else type(value) is type(default)
        if not ok:
            raise GandaError(f"{where} holds a world ganda cannot read: {f.name} is {value!r}, not a "
                             f"{'list of names' if isinstance(default, tuple) else type(default).__name__}")
    try:
        hash(WorldConfig.from_json(world))
    except Exception as exc:  # noqa: BLE001 - any malformed world record is one line
        raise GandaError(f"{where} holds a world ganda cannot read ({type(exc).__name__}: {exc})") from None
    return world
