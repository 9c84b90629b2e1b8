"""The lab world, tokenizer and tasks: determinism, round trips, and segment layout."""

from __future__ import annotations

import random

import pytest

from ganda.tasks import get_task
from ganda.tasks.base import token_spans
from ganda_lab.tokenizer import build_tokenizer
from ganda_lab.world import World, WorldConfig

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


# ---- the hard world: distractors, the option drill, multi-query dictionaries ---------------------

HARD = WorldConfig(distractors="hard", n_values=36)


def _words(opt: str) -> tuple[str, str]:
    a, n = opt.split()
    return a, n


def test_hard_distractors_leave_no_single_word_that_identifies_the_answer():
    w, rng = World(HARD), random.Random(0)
    for i in range(300):
        ex = w.mmlu_example(rng, w.facts[i % len(w.facts)]) if i % 2 else w.letters_example(rng)
        opts = [_words(o) for o in ex.meta["options"]]
        gold = opts[ex.gold]
        assert len(set(opts)) == 4 and ex.meta["value"] == " ".join(gold)
        # both the gold adjective and the gold noun appear in some distractor
        assert sum(o[0] == gold[0] for o in opts) >= 2 and sum(o[1] == gold[1] for o in opts) >= 2
    # the default world draws distractors at random: there, one word usually does identify it
    w0 = World()
    single = 0
    for i in range(300):
        ex = w0.mmlu_example(rng, w0.facts[i])
        opts = [_words(o) for o in ex.meta["options"]]
        g = opts[ex.gold]
        single += sum(o[0] == g[0] for o in opts) == 1 or sum(o[1] == g[1] for o in opts) == 1
    assert single > 200
    # knowledge questions keep random distractors in the hard world too
    ex = w.knowledge_example(random.Random(1), w.facts[0])
    assert ex.choices[ex.gold] == " " + w.facts[0].value


def test_hard_world_can_be_switched_off_per_example():
    w = World(HARD)
    a = w.mmlu_example(random.Random(5), w.facts[3], hard=False)
    b = World(WorldConfig(n_values=36)).mmlu_example(random.Random(5), w.facts[3])
    assert a.prompt == b.prompt


def test_option_drill_asks_several_letters_of_one_option_block():
    w = World(HARD)
    tok = build_tokenizer(w)
    pieces = w.drill_pieces(random.Random(2), n_options=4, n_queries=3)
    text = "".join(t for t, _ in pieces)
    assert text.startswith("Question: Which option is ") and text.count("Question:") == 3
    assert text.count("\nA. ") == 1 and text.count("Answer:") == 3
    answers = [t for t, is_answer in pieces if is_answer]
    assert len(answers) == 3 and len(set(answers)) == 3
    lines = dict(line.split(". ", 1) for line in text.split("\n") if line[:2] in ("A.", "B.", "C.", "D."))
    asked = [q.split("is ", 1)[1].rstrip("?") for q in text.split("\n") if q.startswith("Question:")]
    for content, ans in zip(asked, answers, strict=True):  # every answer is the letter of that option
        assert lines[ans.strip()] == content
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and tok.decode(ids) == text


def test_training_sequences_weight_only_the_answers(tmp_path):
    from ganda_lab.train import sample_sequence

    w = World(HARD)
    tok = build_tokenizer(w)
    for kind, kvq in (("drill", (1, 1)), ("kv", (3, 3))):
        ids, labels, weights = sample_sequence(w, tok, random.Random(4), kind, (5, 5), (4, 4), 5.0, None, kvq)
        heavy = [tok.convert_ids_to_tokens(i) for i, x in zip(ids, weights, strict=True) if x == 5.0]
        assert len(heavy) >= (2 if kind == "drill" else 3) and all(t.startswith(" ") for t in heavy)
        assert labels == ids  # all-token loss (answer_weight set)
        # without an answer weight only the answers carry a loss
        ids2, labels2, _ = sample_sequence(w, tok, random.Random(4), kind, (5, 5), (4, 4), None, None, kvq)
        assert ids2 == ids and sum(x != -100 for x in labels2) == len(heavy)


def test_multi_query_dictionary_answers_each_key_with_its_value():
    w = World(HARD)
    pieces = w.kv_pieces(random.Random(3), n_pairs=6, n_queries=4)
    text = "".join(t for t, _ in pieces)
    table = dict(line.split(":") for line in text.split("\n")[1:7])
    queries = [q.split("'")[1] for q in text.split("\n")[7:] if q.startswith("The value")]
    answers = [t.strip() for t, a in pieces if a]
    assert len(queries) == 4 and len(set(queries)) == 4
    assert [table[k] for k in queries] == answers


def test_repeat_drill_answers_each_repeated_key_with_its_value_in_both_layouts(world, tok):
    """The KV copy-step drill: a dictionary, then its lines again in another order; only the
    repeated values carry a loss, and each is its key's value. ``sep=" "`` puts the value right
    after its key (one token on, the textbook induction step) and the answer is then the very
    token of the dictionary line, as with ``:``."""
    from ganda_lab.train import sample_sequence

    for sep, kind in ((":", "kvrepeat"), (" ", "kvrepeat_adjacent")):
        pieces = world.kv_repeat_pieces(random.Random(5), 6, sep)
        text = "".join(t for t, _ in pieces)
        lines = text.split("\n")
        table = dict(line.split(sep) for line in lines[1:7])
        again = [line.split(sep) for line in lines[7:13]]
        assert sorted(k for k, _ in again) == sorted(table) and [k for k, _ in again] != list(table)
        answers = [t for t, a in pieces if a]
        assert [a.strip() for a in answers] == [table[k] for k, _ in again]
        dict_tokens = set(tok("\n".join(lines[1:7]))["input_ids"])
        assert all(len(tok(a)["input_ids"]) == 1 and tok(a)["input_ids"][0] in dict_tokens for a in answers)
        ids, labels, _ = sample_sequence(world, tok, random.Random(5), kind, (6, 6))
        assert sum(x != -100 for x in labels) == 6
    assert ":" not in "".join(t for t, _ in world.kv_repeat_pieces(random.Random(5), 6, " ")).split("\n", 1)[1]
    with pytest.raises(ValueError, match="separator"):
        world.kv_repeat_pieces(random.Random(5), 6, "=")


def test_phrase_keys_are_two_words_of_the_world():
    w = World(WorldConfig(kv_keys="phrases"))
    ex = w.kv_example(random.Random(0), 8)
    keys = [line.split(":")[0] for line in ex.prompt.split("\n")[1:9]]
    assert all(len(k.split()) == 2 for k in keys) and len(set(keys)) == 8
    with pytest.raises(ValueError):
        World(WorldConfig(kv_keys="nope")).kv_example(random.Random(0), 2)


# ---- the phrase world: variable-length values, edit distractors --------------------------------

PHRASES = WorldConfig(distractors="hard", values="phrases", max_words=2)


def test_phrase_values_are_every_short_sequence_of_distinct_pool_words():
    from ganda_lab.world import phrase_pool

    w = World(PHRASES)
    pool = phrase_pool("home", 6)
    assert len(pool) == 6 and len(set(pool)) == 6
    assert len(w.values["home"]) == 6 + 6 * 5  # singles and ordered pairs of distinct words
    assert "hill red" in w.values["home"] and "red red" not in w.values["home"]
    lengths = [len(f.value.split()) for f in w.facts]
    assert set(lengths) == {1, 2} and 0.35 < lengths.count(1) / len(lengths) < 0.65
    assert World(WorldConfig(values="phrases")).values["home"].__len__() == 6 + 30 + 120


def test_edit_distractors_defeat_word_counting_and_last_word_summaries():
    """In every four-option question some distractor holds every gold word (a swap or an
    extension: counting matched words cannot pick the gold), and some distractor agrees with the
    gold up to the gold's last word (a prefix or an extension: only the line's end tells them apart)."""
    for cfg in (PHRASES, WorldConfig(distractors="hard", values="phrases")):
        w, rng = World(cfg), random.Random(0)
        for i in range(300):
            ex = w.mmlu_example(rng, w.facts[i % len(w.facts)]) if i % 2 else w.letters_example(rng)
            opts, gold = ex.meta["options"], ex.meta["value"]
            assert len(set(opts)) == 4 and opts[ex.gold] == gold
            gw = gold.split()
            others = [o.split() for o in opts if o != gold]
            assert any(set(gw) <= set(o) for o in others)
            assert any(o[: len(gw)] == gw or gw[: len(o)] == o for o in others)
            assert all(o in w.values[ex.meta["relation"]] for o in opts)  # every option is a possible value


def test_phrase_knowledge_choices_end_where_the_value_ends():
    w = World(PHRASES)
    ex = w.knowledge_example(random.Random(0), w.facts[0])
    assert ex.choices[ex.gold] == f" {w.facts[0].value}." and all(c.endswith(".") for c in ex.choices)
    tok = build_tokenizer(w)
    for c in ex.choices:
        ids = tok(ex.prompt + c, add_special_tokens=False).input_ids
        assert tok.unk_token_id not in ids and tok.decode(ids) == ex.prompt + c


def test_world_records_without_values_mean_pairs():
    old = {"seed": 0, "n_entities": 200, "n_novel": 200, "relations": ["home", "job"], "n_values": 36,
           "holdout_frac": 0.2, "n_kv_values": 100, "distractors": "hard"}
    assert WorldConfig.from_json(old).values == "pairs"
    assert WorldConfig.from_json(PHRASES.to_json()) == PHRASES
    with pytest.raises(ValueError):
        _ = World(WorldConfig(values="sentences")).facts


def test_copy_drill_repeats_a_run_of_dictionary_tokens_with_loss_on_the_copy(world, tok):
    """The copy drill behind finding 3's KV pair: BOS, a run of distinct KV keys/values, the same
    run again; every token of the second copy after its first is a target (an induction step)."""
    from ganda_lab.train import copy_sequence, make_batch, sample_sequence

    ids, labels, weights = copy_sequence(world, tok, random.Random(3), 7)
    run = ids[1:8]
    assert ids[0] == tok.bos_token_id and ids[8:] == run and len(set(run)) == 7
    assert labels[:9] == [-100] * 9 and labels[9:] == run[1:] and weights == [1.0] * 15
    vocab = {i: t for t, i in tok.get_vocab().items()}
    keys, values = set(world.kv_key_pool), {str(v) for v in range(world.config.n_kv_values)}
    assert all(vocab[i] in keys | values for i in run)
    rng = random.Random(3)
    rng.randint(7, 7)  # the length is drawn first
    assert sample_sequence(world, tok, random.Random(3), "copy", (2, 4), copy_len=(7, 7)) == \
        copy_sequence(world, tok, rng, 7)
    with pytest.raises(ValueError, match="copy drill length"):
        copy_sequence(world, tok, random.Random(3), 1)
    batch = make_batch(world, tok, {"mixture": {"copy": 1}, "kv_pairs": [2, 4], "copy_len": [3, 5], "batch_size": 6},
                       seed=0, step=0)
    n = batch["attention_mask"].sum(1)
    assert set(n.tolist()) <= {7, 9, 11}  # 1 + 2 x length


UNASKED = WorldConfig(distractors="hard", n_values=36, unasked_relations=("pet", "key"))


def test_unasked_relations_add_facts_and_leave_the_asked_world_as_it_was():
    base, grown = World(WorldConfig(distractors="hard", n_values=36)), World(UNASKED)
    # the asked facts, their held-out split and the vocabulary are those of the world without them,
    # so a model trained on that world keeps every token id and every question
    assert grown.facts[: len(base.facts)] == base.facts and grown.asked_facts == base.facts
    assert grown.heldout_facts == base.heldout_facts and grown.train_facts == base.train_facts
    assert grown.words == base.words and build_tokenizer(grown).get_vocab() == build_tokenizer(base).get_vocab()
    unasked = grown.fact_split("unasked")
    assert len(unasked) == 2 * len(grown.entities) and {f.relation for f in unasked} == {"pet", "key"}
    # crossed values: a home adjective with a job noun (pet), a job adjective with a home noun (key)
    f = next(f for f in unasked if f.relation == "pet")
    assert f.value.split()[0] in {"red", "cold", "dark", "old", "high", "wet"}
    assert f.value.split()[1] in {"smith", "guard", "cook", "miner", "baker", "farmer"}
    assert WorldConfig.from_json(UNASKED.to_json()) == UNASKED
    assert "unasked_relations" not in base.config.to_json()  # old records stay byte for byte


def test_unasked_facts_are_in_the_knowledge_task_and_never_asked_in_mmlu_format():
    grown = World(UNASKED)
    rec = UNASKED.to_json()
    know = get_task("lab-knowledge", world=rec).examples(limit=300)
    assert {ex.meta["relation"] for ex in know} == {"home", "job", "pet", "key"}
    for ex in know:
        assert ex.choices[ex.gold] == " " + grown.value(ex.meta["entity"], ex.meta["relation"])
    only = get_task("lab-knowledge", world=rec, split="unasked").examples(limit=50)
    assert {ex.meta["relation"] for ex in only} == {"pet", "key"}
    for task in ("lab-mmlu", "lab-letters"):
        assert {ex.meta["relation"] for ex in get_task(task, world=rec).examples(limit=300)} == {"home", "job"}
    assert {ex.meta["relation"] for ex in get_task("lab-mmlu", world=rec, split="asked").examples(limit=50)} <= {"home", "job"}
    with pytest.raises(ValueError, match="unasked"):
        get_task("lab-mmlu", world=rec, split="unasked")
    # statements (the training mixture) state them
    rng = random.Random(0)
    from ganda_lab.train import sample_sequence

    tok = build_tokenizer(grown)
    seen = {tok.decode(sample_sequence(grown, tok, rng, "statement", (2, 4))[0]).split()[1] for _ in range(200)}
    assert {"pet", "key"} <= seen


def test_unasked_relations_are_checked():
    with pytest.raises(ValueError, match="unasked relation 'home'"):
        _ = World(WorldConfig(unasked_relations=("home",))).facts
    with pytest.raises(ValueError, match="borrows words"):
        _ = World(WorldConfig(relations=("home",), unasked_relations=("pet",))).facts
    with pytest.raises(ValueError, match="pairs"):
        _ = World(WorldConfig(values="phrases", unasked_relations=("pet",))).facts
