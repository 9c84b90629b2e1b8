"""The lab world, tokenizer and tasks: determinism, round trips, and segment layout."""

from __future__ import annotations

import random

import pytest

from ganda.lab.tokenizer import build_tokenizer
from ganda.lab.world import World, WorldConfig
from ganda.tasks import get_task
from ganda.tasks.base import token_spans

LAB_TASKS = ["lab-knowledge", "lab-mmlu", "lab-letters", "lab-kv"]


@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.fixture(scope="module")
def tok(world):
    return build_tokenizer(world)


def test_world_is_deterministic():
    a, b = World(WorldConfig(seed=3)), World(WorldConfig(seed=3))
    assert a.facts == b.facts and a.novel == b.novel
    assert World(WorldConfig(seed=4)).facts != a.facts
    assert len(a.facts) == a.config.n_entities * len(a.config.relations)
    assert not set(a.entities) & set(a.novel)
    held, train = set(a.heldout_facts), set(a.train_facts)
    assert held and not held & train and held | train == set(a.facts)


def test_examples_are_deterministic():
    for name in LAB_TASKS:
        t = get_task(name)
        e1, e2 = t.examples(limit=5, seed=1), t.examples(limit=5, seed=1)
        assert [e.prompt for e in e1] == [e.prompt for e in e2]
        assert [e.prompt for e in t.examples(limit=5, seed=2)] != [e.prompt for e in e1]


def test_tokenizer_round_trip_and_no_unknowns(world, tok):
    rng = random.Random(0)
    exs = [world.knowledge_example(rng, world.facts[0]), world.mmlu_example(rng, world.facts[1]),
           world.letters_example(rng), world.kv_example(rng, 6)]
    for ex in exs:
        for c in ex.choices:
            ids = tok(ex.prompt + c, add_special_tokens=False).input_ids
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == ex.prompt + c


def test_tokenizer_splits_answer_and_newlines(tok):
    toks = tok.convert_ids_to_tokens(tok("D. red hill\nAnswer: A", add_special_tokens=False).input_ids)
    assert toks == ["D", ".", " red", " hill", "\n", "Answer", ":", " A"]
    # the continuation " A" is one token after "Answer:" (how ganda.scoring splits pairs)
    ctx = tok("Answer:", add_special_tokens=False).input_ids
    whole = tok("Answer: A", add_special_tokens=False).input_ids
    assert whole[: len(ctx)] == ctx and len(whole) == len(ctx) + 1


def test_tokenizer_saves_and_loads(tmp_path, tok):
    from transformers import AutoTokenizer

    tok.save_pretrained(str(tmp_path))
    t2 = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Question: What is the home of bako?\nA. red hill\nAnswer: A"
    assert t2(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("name", ["lab-mmlu", "lab-letters", "lab-kv"])
def test_segments_end_on_newline_tokens(name, tok):
    for ex in get_task(name).examples(limit=10):
        enc = tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
        spans = token_spans(enc.offset_mapping, ex.segments)
        toks = tok.convert_ids_to_tokens(enc.input_ids)
        assert len(spans) == len(ex.choices)
        for s, e in spans:
            assert toks[e] == "\n" and "\n" not in toks[s:e]
        assert ex.gold_segment == ex.gold
        gold_line = ex.prompt[ex.segments[ex.gold][0] : ex.segments[ex.gold][1]]
        if name == "lab-kv":
            assert gold_line.endswith(f":{ex.meta['value']}\n")
            assert ex.choices[ex.gold] == f" {ex.meta['value']}"
        else:
            assert gold_line == f"{ex.choices[ex.gold].strip()}. {ex.meta['value']}\n"
            assert ex.prompt.endswith("Answer:")


def test_knowledge_choices_are_values(world):
    for ex in get_task("lab-knowledge").examples(limit=10):
        assert ex.choices[ex.gold] == " " + world.value(ex.meta["entity"], ex.meta["relation"])
        assert len(set(ex.choices)) == 4 and not ex.segments


def test_held_split_only_holds_heldout_facts(world):
    held = {(f.entity, f.relation) for f in world.heldout_facts}
    for ex in get_task("lab-mmlu", split="held").examples(limit=20):
        assert (ex.meta["entity"], ex.meta["relation"]) in held


def test_letters_entities_have_no_stored_facts(world):
    stored = set(world.entities)
    for ex in get_task("lab-letters").examples(limit=20):
        assert ex.meta["entity"] not in stored
        assert f"Context: The {ex.meta['relation']} of {ex.meta['entity']} is {ex.meta['value']}." in ex.prompt
