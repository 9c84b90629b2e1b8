"""GSM8K, BBH and DREAM: prompts match the reference formats, answer extraction and scoring."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import require_module

from ganda.errors import GandaError
from ganda.tasks import get_task
from ganda.tasks.bbh import BBHTask, extract_answer, flexible_match, read_cot_prompt, subtasks
from ganda.tasks.dream import find_data_dir
from ganda.tasks.gsm8k import COT_EXEMPLARS, GSM8KTask, exact_match, extract_flexible, extract_strict

JANET = ("Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
         "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per "
         "fresh duck egg. How much in dollars does she make every day at the farmers' market?")


def _lm_eval_tasks_dir() -> Path | None:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    return d if d.is_dir() else None


def _render_lm_eval(cfg: dict, doc: dict) -> str:
    """lm-eval's few-shot context: description + (text + delimiter + target + "\\n\\n") * k + text."""
    import jinja2

    env = jinja2.Environment(keep_trailing_newline=True)  # as lm_eval.utils does
    text = env.from_string(cfg["doc_to_text"])
    target = env.from_string(cfg.get("doc_to_target", "{{target}}"))
    delim = cfg.get("target_delimiter", " ")
    out = cfg.get("description", "")
    for s in cfg["fewshot_config"]["samples"]:
        out += text.render(**s) + delim + target.render(**s) + "\n\n"
    return out + text.render(**doc)


# ---- GSM8K -------------------------------------------------------------------------------

def test_gsm8k_prompts():
    ex = GSM8KTask().examples(limit=None)[0]
    assert ex.prompt == f"Q: {JANET}\nA:"
    assert ex.target == "18" and ex.stop == ["Q:", "</s>", "<|im_end|>"]
    zs = GSM8KTask(cot=True).examples()[0]
    assert zs.prompt == f"Q: {JANET}\nA: Let's think step by step."  # lm-eval gsm8k_cot_zeroshot
    cot = get_task("gsm8k-cot").examples()[0]
    assert cot.prompt.startswith(
        "Q: There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
        "done, there will be 21 trees. How many trees did the grove workers plant today?\nA: There are 15 trees "
        "originally. Then there were 21 trees after some more were planted. So there must have been 21 - 15 = 6. "
        "The answer is 6.\n\nQ: If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are "
        "in the parking lot?\nA: There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.\n\n")
    assert cot.prompt.endswith(
        "Q: Olivia has $23. She bought five bagels for $3 each. How much money does she have left?\nA: Olivia had "
        "23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars left. "
        f"23 - 15 is 8. The answer is 8.\n\nQ: {JANET}\nA:")
    assert cot.prompt.count("\n\nQ: ") == 8
    assert len(GSM8KTask().examples(limit=7, seed=1)) == 7
    with pytest.raises(GandaError):
        GSM8KTask(shots=9)


def test_gsm8k_matches_lm_eval_yaml():
    require_module("lm_eval")
    d = _lm_eval_tasks_dir()
    import yaml

    cfg = yaml.safe_load((d / "gsm8k" / "gsm8k-cot.yaml").read_text())
    assert [(s["question"], s["target"]) for s in cfg["fewshot_config"]["samples"]] == COT_EXEMPLARS
    assert cfg["generation_kwargs"]["until"] == ["Q:", "</s>", "<|im_end|>"]
    cfg["doc_to_target"] = "{{target}}"
    ex = get_task("gsm8k-cot").examples()[0]
    assert ex.prompt == _render_lm_eval(cfg, {"question": JANET})


# Real SmolLM2-135M-Instruct generations: `ganda extends smollm2-135m --tasks gsm8k-cot --limit 8`
# (8-shot CoT, greedy, max 160 new tokens), cut at the stop sequences, copied from the predictions files.
SMOL_GSM8K = [
    # intact, well-formed, wrong (test index 181)
    (" Sandra had 40 red roses. 5 pm is 10 pm. 40 - 5 = 25. The answer is 25.\n\n", "160", "25", "25."),
    # intact, well-formed, right
    (" 1000 x 1/5 = 500. 50 patients are admitted into the hospital each day. 50 x 2 = 100. The answer is "
     "100.\n\n", "100", "100", "100."),
    # G&A placeholder heads ablated: several answers, never stops, cut by the token cap
    (" 240 - 80 = 120. 120 is 180. 180 is 18 * 2 = 24. The answer is 24.\n\n"
     + "A: The answer is 2.\n\n" * 11 + "A", "6", "24", "2."),
    # ablated: a loop with no "The answer is", cut mid-expression by the token cap
    (" 15 x 2 = 20. 20 x 4 = 80. 20 x 4 = 80. 20 x 4 = 80. 30 x 4 = 120. 40 x 4 = 160. 50 x 4 = 200. 60 x 4 = "
     "240. 70 x 4 = 240. 80 x 4 = 240. 90 x 4 = 320. 100 x 4 = 400. 110 x 4 = 440. 120 x ", "135", "[invalid]",
     "120"),
    # real, 0-shot `gsm8k` (no exemplars, cap 48): the model lists options instead of answering
    (" 100%\nB: 100%\nC: 100%\nD: 100%\nE: 100%\nF: 100%\nG:", "21", "[invalid]", "100"),
    (" 10\nB: 12\nC: 14\nD: 16\nE: 18\nF: 20\nG: 22\nH: 24\nI:", "5", "[invalid]", "24"),
    # constructed: no number at all
    (" Let me think about this problem carefully.", "5", "[invalid]", "[invalid]"),
]


@pytest.mark.parametrize("text,target,strict,flexible", SMOL_GSM8K)
def test_gsm8k_extraction(text, target, strict, flexible):
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible
    t = GSM8KTask()
    ex = t.examples(limit=1)[0]
    ex.target = target
    m = t.metrics(ex, text)
    assert m["strict"] == exact_match(strict, target)
    assert m["flexible"] == exact_match(flexible, target)


def test_gsm8k_normalisation():
    assert exact_match("$1,000.", "1000")
    assert exact_match("18", "18") and not exact_match("18.5", "18")
    assert exact_match("The total is 7\n#### 42", "42")


# ---- BBH ---------------------------------------------------------------------------------

BOOL_COT = (
    "Evaluate the result of a random Boolean expression.\n\n"
    "Q: not ( ( not not True ) ) is\nA: Let's think step by step.\n"
    "Remember that (i) expressions inside brackets are always evaluated first and that (ii) the order of "
    "operations from highest priority to lowest priority is \"not\", \"and\", \"or\", respectively.\n"
    "We first simplify this expression \"Z\" as follows: \"Z = not ( ( not not True ) ) = not ( ( A ) )\" "
    "where \"A = not not True\".\n"
    "Let's evaluate A: A = not not True = not (not True) = not False = True.\n"
    "Plugging in A, we get: Z = not ( ( A ) ) = not ( ( True ) ) = not True = False. So the answer is False.\n\n"
)


def test_bbh_prompts():
    cot = BBHTask(subtask="boolean_expressions").examples()[0]
    assert cot.prompt.startswith(BOOL_COT)
    assert cot.prompt.endswith("So the answer is True.\n\nQ: not ( True ) and ( True ) is\nA: Let's think step by step.\n")
    assert cot.target == "False" and cot.stop == ["</s>", "Q", "\n\n"]
    plain = BBHTask(subtask="boolean_expressions", cot=False).examples()[0]
    assert plain.prompt == (
        "Evaluate the result of a random Boolean expression.\n\n"
        "Q: not ( ( not not True ) ) is\nA: False\n\n"
        "Q: True and False and not True and True is\nA: False\n\n"
        "Q: not not ( not ( False ) ) is\nA: True\n\n"
        "Q: not ( True ) and ( True ) is\nA:")
    assert len(subtasks()) == 27
    ex = BBHTask().examples(limit=54)
    assert len(ex) == 54 and {e.meta["subtask"] for e in ex} == set(subtasks())
    with pytest.raises(GandaError):
        BBHTask(subtask="nope")


def test_bbh_matches_lm_eval_yaml():
    require_module("lm_eval")
    d = _lm_eval_tasks_dir()
    import yaml

    for s in subtasks():
        doc = {"input": "QUESTION?"}
        for cot, sub in ((True, "cot_fewshot"), (False, "fewshot")):
            cfg = yaml.safe_load((d / "bbh" / sub / f"{s}.yaml").read_text())
            tmpl = yaml.safe_load((d / "bbh" / sub / cfg["include"]).read_text())
            cfg = {**tmpl, **cfg}
            task = BBHTask(subtask=s, cot=cot)
            from ganda.tasks.bbh import build_prompt

            mine = build_prompt(str(task.data_dir), s, doc["input"], cot)
            assert mine == _render_lm_eval(cfg, doc), (s, cot)
            assert cfg["generation_kwargs"]["until"] == ["</s>", "Q", "\n\n"]


def test_bbh_cot_prompt_files_parse():
    for s in subtasks():
        desc, shots = read_cot_prompt(str(BBHTask().data_dir), s)
        assert desc and len(shots) == 3


# BBH generations. "real": SmolLM2-135M-Instruct, greedy, cut at the stops (3-shot without CoT from
# `ganda extends ... --tasks bbh --option bbh.cot=false`, CoT from `generate(..., max_new_tokens=96)`);
# "constructed": written by hand in the model's style.
SMOL_BBH = [
    (False, " (B)", "(B)", "(B)", True, True),  # real, disambiguation_qa
    (False, " } ] >", "> ]", "} ] >", False, False),  # real, dyck_languages
    (False, " invalid", "valid", "invalid", False, False),  # real, formal_fallacies
    (False, " (G)\nB: The blue book is the third from the right\n", "(F)", "(G)", False, False),  # real, ablated
    (False, "\nA:\nA:\nA:\nA:\nA:\n", "(A)", "A:", False, False),  # real, ablated snarks: a format echo
    (False, " Valid.", "valid", "Valid.", False, True),  # constructed
    # real 3-shot CoT (cap 96): cut by the cap before any "the answer is"
    (True, "Remember that (i) expressions inside brackets are always evaluated first and that (ii) the order of "
     "operations from highest priority to lowest priority is \"not\", \"and\", \"or\", respectively.\nWe first "
     "simplify this expression \"Z\" as follows: \"Z = not not ( not ( False ) ) = not not ( A )\" where \"A = "
     "False\" and \"B = True\" = True.\nLet's evaluate A: A = False = False =", "True", "[invalid]", False, False),
    # real 3-shot CoT, date_understanding: well-formed, right
    (True, "If today is today, then tomorrow is tomorrow. Tomorrow is 10/07/2008. So the answer is (E).", "(E)",
     "(E)", True, True),
    # real 3-shot CoT, date_understanding: capitalised "The answer is": lm-eval's regex misses it
    (True, "If today is Apr 10, 1985, then tomorrow is 24 hours later. So tomorrow is 24 hours later. The answer "
     "is (D).", "(D)", "[invalid]", False, True),
    # constructed: option letter followed by its text
    (True, "The date 10 days ago is 12/14/1937. So the answer is (D) 12/14/1937.", "(D)", "(D) 12/14/1937",
     False, True),
]


@pytest.mark.parametrize("cot,text,target,extracted,strict,flexible", SMOL_BBH)
def test_bbh_extraction(cot, text, target, extracted, strict, flexible):
    assert extract_answer(text, cot) == extracted
    t = BBHTask(subtask="boolean_expressions", cot=cot)
    ex = t.examples(limit=1)[0]
    ex.target = target
    assert t.metrics(ex, text) == {"strict": strict, "flexible": flexible}


def test_bbh_flexible_letters():
    assert flexible_match("B", "(B)") and flexible_match("(B) 11/11/2018", "(B)") and flexible_match("B)", "(B)")
    assert not flexible_match("(C)", "(B)") and not flexible_match("[invalid]", "(B)")


def test_bbh_aggregate_macro():
    t = BBHTask()
    recs = [{"correct": True, "meta": {"subtask": "a"}}, {"correct": False, "meta": {"subtask": "a"}},
            {"correct": True, "meta": {"subtask": "b"}}]
    agg = t.aggregate(recs)
    assert agg["macro_accuracy"] == pytest.approx(0.75)
    assert agg["per_subtask"]["a"] == {"correct": 1, "n": 2, "accuracy": 0.5}


# ---- DREAM -------------------------------------------------------------------------------

def _dream_available() -> bool:
    try:
        find_data_dir()
        return True
    except GandaError:
        return False


needs_dream = pytest.mark.skipif(not _dream_available(), reason="DREAM data (non-commercial) not available")


@needs_dream
def test_dream_prompts():
    turns = ("Dialogue:\nW: The movie next Tuesday has been cancelled due to lack of interest.\n"
             "M: What do you mean?\nW: Well, by last night only a few tickets has been sold.\n\n"
             "Question: What can we conclude about the movie?\n")
    ex = get_task("dream").examples()[0]
    assert ex.prompt == turns + "Answer:"
    assert ex.choices == [" They want to buy the tickets for the movie.", " The tickets for the movie were sold.",
                          " The movie will not be shown."]
    assert ex.gold == 2 and len(ex.segments) == 3
    let = get_task("dream-letters").examples()[0]
    assert let.prompt == turns + ("A. They want to buy the tickets for the movie.\nB. The tickets for the movie "
                                  "were sold.\nC. The movie will not be shown.\nAnswer:")
    assert let.choices == [" A", " B", " C"] and let.gold == 2 and let.gold_segment == 2
    a, b = let.segments[2]
    assert let.prompt[a:b] == "C. The movie will not be shown.\n"
    assert len(get_task("dream").examples(limit=5, seed=3)) == 5
    shot = get_task("dream-letters", shots=1).examples()[0]
    assert shot.prompt.endswith(let.prompt) and shot.prompt.count("Answer:") == 2


def test_dream_missing_data(tmp_path, monkeypatch):
    monkeypatch.setenv("GANDA_DREAM_DIR", str(tmp_path))
    with pytest.raises(GandaError, match="non-commercial"):
        get_task("dream", data_dir=str(tmp_path))


@needs_dream
def test_dream_env_dir(tmp_path, monkeypatch):
    src = find_data_dir()
    (tmp_path / "test.json").write_text((src / "test.json").read_text())
    monkeypatch.setenv("GANDA_DREAM_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path
    assert os.path.samefile(get_task("dream").dir, tmp_path)


# ---- ganda extends -----------------------------------------------------------------------

def test_control_heads(tiny):
    from ganda.experiments.extends import control_heads
    from ganda.heads import HeadId, expand

    ga = expand("L1H0,L1H2,L2H3", tiny)
    ctrl = control_heads(tiny, ga, seed=0)
    assert len(ctrl) == 3 and not set(ctrl) & set(ga)
    assert sorted(h.layer for h in ctrl) == [1, 1, 2]
    assert ctrl == control_heads(tiny, ga, seed=0)
    # a head named with its mixer's kind is the same head: the same draw, never itself a control
    named = [HeadId(h.layer, h.head, tiny.mixer_of(h).kind) for h in ga]
    assert named != ga and control_heads(tiny, named, seed=0) == ctrl
    with pytest.raises(GandaError):
        control_heads(tiny, expand("L1H*", tiny))


def test_run_extends_writes_json_and_csv(tiny, tmp_path):
    import csv as _csv
    import json

    from ganda.commands.options import parse_options
    from ganda.experiments.extends import run_extends

    opts = parse_options(["gsm8k.max_new_tokens=3", "bbh.cot=false", "bbh.max_new_tokens=3",
                          "bbh.subtask=navigate"], per_task=True)
    assert opts["bbh"] == {"cot": "false", "max_new_tokens": "3", "subtask": "navigate"}
    # the control heads are screened on the run's multiple-choice prompts: one such task is always in
    tasks = ["gsm8k", "bbh", "dream-letters" if _dream_available() else "mmlu"]
    res = run_extends(tiny, "L1H0,L2H1", tasks, limit=2, out=tmp_path, options=opts, progress=False)
    assert [r["condition"] for r in res["results"]] == ["intact", "ablated", "control"] * len(tasks)
    assert all(r["n"] == 2 for r in res["results"])
    saved = json.loads((tmp_path / "extends.json").read_text())
    assert saved["heads"] == "L1H0,L2H1" and saved["control_heads"]
    rows = list(_csv.DictReader(open(tmp_path / "extends.csv")))
    assert len(rows) == 3 * len(tasks) and rows[1]["heads"] == "L1H0,L2H1"
    assert (tmp_path / "predictions" / "gsm8k.ablated.jsonl").is_file()


def test_run_extends_knowledge(tiny, monkeypatch):
    import ganda.experiments.extends as kn
    from ganda.experiments.extends import run_extends

    seen = []

    def fake(adapter, interventions=None, limit=None, *, seed=0, progress=True):
        seen.append((len(interventions or []), limit))
        return {"tasks": {"arc_easy": {"n": 3, "acc": 0.5, "ci_low": 0.1, "ci_high": 0.9}}, "mean": 0.5, "seconds": 0.1}

    monkeypatch.setattr(kn, "evaluate_knowledge", fake)
    res = run_extends(tiny, "L1H0", ["knowledge"], limit=3, progress=False)
    assert [r["accuracy"] for r in res["results"]] == [0.5, 0.5, 0.5] and seen == [(0, 3), (1, 3), (1, 3)]
    assert res["results"][0]["config"]["per_task"]["arc_easy"]["n"] == 3
