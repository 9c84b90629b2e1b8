"""Knowledge tasks: prompts equal lm-eval's formats character for character, gold indices right.

Expected strings are written from lm-eval's task definitions (lm_eval/tasks/...):
arc_easy/arc_challenge ``doc_to_text: "Question: {{question}}\\nAnswer:"``, ``doc_to_choice:
"{{choices.text}}"``, ``doc_to_target: "{{choices.label.index(answerKey)}}"``; openbookqa
``doc_to_text: question_stem``, target ``choices.label.index(answerKey.lstrip())``; piqa
``"Question: {{goal}}\\nAnswer:"`` with ``[sol1, sol2]`` and ``label``; hellaswag
``preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`` with preprocessed
endings; winogrande ``doc_to_choice`` = ``sentence[:idx] + option`` (the contexts) and
``doc_to_target`` = ``sentence[idx+1:].strip()``; target_delimiter is " " throughout.
"""

from __future__ import annotations

import pytest

from ganda.knowledge import evaluate_knowledge
from ganda.scoring import example_pairs, norm_chars
from ganda.tasks import get_task
from ganda.tasks.knowledge import KNOWLEDGE_TASKS, capitalize_last_fragment, hellaswag_preprocess


def test_registered():
    for name in KNOWLEDGE_TASKS:
        assert get_task(name).name == name


def test_arc_easy_format():
    exs = get_task("arc_easy").all_examples()
    assert len(exs) == 2376
    ex = exs[0]
    assert ex.prompt == (
        "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:"
    )
    assert ex.choices == [
        " Sunlight is the source of energy for nearly all ecosystems.",
        " Most ecosystems are found on land instead of in water.",
        " Carbon dioxide is more available than other gases.",
        " The producers in all ecosystems are plants.",
    ]
    assert ex.gold == 0
    # numeric labels ("1".."4"): the gold index is the label's position
    ex = exs[14]
    assert ex.prompt == "Question: All living and nonliving material is composed of\nAnswer:"
    assert ex.choices == [" air", " elements", " water", " soil"] and ex.gold == 1
    # five choices
    ex = exs[500]
    assert ex.choices[-1] == " water vapor" and ex.gold == 1


def test_arc_challenge_format():
    exs = get_task("arc_challenge").all_examples()
    assert len(exs) == 1172
    ex = exs[0]
    assert ex.prompt == (
        "Question: An astronomer observes that a planet rotates faster after a meteorite impact. "
        "Which is the most likely effect of this increase in rotation?\nAnswer:"
    )
    assert ex.choices[2] == " Planetary days will become shorter." and ex.gold == 2


def test_openbookqa_format():
    exs = get_task("openbookqa").all_examples()
    assert len(exs) == 500
    ex = exs[0]
    assert ex.prompt == (
        "A person wants to start saving money so that they can afford a nice vacation at the end of the year. "
        "After looking over their budget and expenses, they decide the best way to save money is to"
    )
    assert ex.choices == [" make more phone calls", " quit eating lunch out", " buy less with monopoly money",
                          " have lunch with friends"]
    assert ex.gold == 1


def test_piqa_format():
    exs = get_task("piqa").all_examples()
    assert len(exs) == 1838
    assert exs[0].prompt == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert exs[0].gold == 0
    # upstream whitespace is kept, as lm-eval renders it
    assert exs[1].prompt == "Question: dresser\nAnswer:"
    assert exs[1].choices == [" replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "]
    assert exs[1].gold == 1


def test_hellaswag_format():
    exs = get_task("hellaswag").all_examples()
    assert len(exs) == 10042
    ex = exs[0]
    # lm-eval: "Roof shingle removal: " + ctx_a + " " + "he".capitalize()
    assert ex.prompt == "Roof shingle removal: A man is sitting on a roof. He"
    assert ex.choices == [" is using wrap to wrap a pair of skis.", " is ripping level tiles off.",
                          " is holding a rubik's cube.", " starts pulling up roofing on a roof."]
    assert ex.gold == 3
    assert exs[1].prompt == "Clean and jerk: A lady walks to a barbell. She bends down and grabs the pole. The lady"
    raw = get_task("hellaswag", capitalize_ctx_b=False).all_examples()[0]
    assert raw.prompt == "Roof shingle removal: A man is sitting on a roof. he"


def test_hellaswag_preprocess_matches_lm_eval():
    assert hellaswag_preprocess(" How to x [title] Do y [step] z  w ") == "How to x. Do y z w"
    assert capitalize_last_fragment("A man sits. the Man") == "A man sits. The man"
    assert capitalize_last_fragment("A man sits. He") == "A man sits. He"
    assert capitalize_last_fragment("no boundary here") == "no boundary here"


def test_winogrande_partial_scoring_shape():
    exs = get_task("winogrande").all_examples()
    assert len(exs) == 1267
    ex = exs[0]
    assert example_pairs(ex) == [
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."),
    ]
    assert ex.gold == 1 and exs[1].gold == 0
    assert get_task("winogrande").metrics == ("acc",)
    assert norm_chars(ex) == [len("always got the easier cases.")] * 2


def test_norm_chars_exclude_delimiter():
    ex = get_task("arc_easy").all_examples()[0]
    assert norm_chars(ex) == [len(c) - 1 for c in ex.choices]


def test_limit_and_seed():
    t = get_task("piqa")
    assert [e.meta["index"] for e in t.examples(limit=3)] == [0, 1, 2]
    a = [e.meta["index"] for e in t.examples(limit=5, seed=1)]
    assert a == [e.meta["index"] for e in t.examples(limit=5, seed=1)] and a != [0, 1, 2, 3, 4]


def test_evaluate_knowledge_tiny():
    from test_sweep import tiny_adapter

    from ganda.scoring import evaluate_examples

    tiny = tiny_adapter()
    res = evaluate_knowledge(tiny, None, limit=2, tasks=("piqa", "winogrande"), progress=False)
    assert set(res["tasks"]) == {"piqa", "winogrande"}
    assert "acc_norm" in res["tasks"]["piqa"] and "acc_norm" not in res["tasks"]["winogrande"]
    assert res["mean"] == pytest.approx((res["tasks"]["piqa"]["acc"] + res["tasks"]["winogrande"]["acc"]) / 2)
    # the same accuracy as ``ganda eval`` gets on the same examples
    for t in ("piqa", "winogrande"):
        exs = get_task(t).examples(limit=2)
        assert res["tasks"][t]["acc"] == evaluate_examples(tiny, exs, progress=False).accuracy, t


@pytest.mark.slow
def test_smollm2_knowledge_runs(smollm2):
    res = evaluate_knowledge(smollm2, None, limit=5, progress=False)
    # SmolLM2-135M (fp32, CPU) on the first five items of each task: acc (acc_norm)
    acc = {"arc_easy": 0.6, "arc_challenge": 0.0, "openbookqa": 0.0, "piqa": 0.6, "hellaswag": 0.4, "winogrande": 0.4}
    acc_norm = {"arc_easy": 0.8, "arc_challenge": 0.2, "openbookqa": 0.2, "piqa": 0.4, "hellaswag": 0.2}
    assert {t: r["acc"] for t, r in res["tasks"].items()} == pytest.approx(acc)
    assert {t: r["acc_norm"] for t, r in res["tasks"].items() if "acc_norm" in r} == pytest.approx(acc_norm)
    assert all(r["n"] == 5 for r in res["tasks"].values())
    assert res["mean"] == pytest.approx(2 / 6)


def test_winogrande_scores_the_same_through_evaluate_examples(tiny):
    """``evaluate_examples`` (what ``ganda eval`` runs) uses the per-option contexts, so its
    log-likelihoods equal ``score_example``'s, and acc_norm divides by the length without the space."""
    from ganda.scoring import evaluate_examples, norm_chars, score_choices
    from ganda.scoring import score_example as score_full

    exs = get_task("winogrande").examples(limit=3)
    res = evaluate_examples(tiny, exs, progress=False)
    for ex, p in zip(exs, res.predictions, strict=True):
        assert p["loglik"] == pytest.approx(score_full(tiny, ex).loglik, abs=1e-5)
        assert p["loglik"] != pytest.approx(score_choices(tiny, ex.prompt, ex.choices).loglik, abs=1e-3)
        assert score_full(tiny, ex).n_chars == norm_chars(ex) == [len(ex.meta["continuation"]) - 1] * 2
    assert get_task("arc_easy").name == "arc_easy" and get_task("lab-mmlu").name == "lab-mmlu"
