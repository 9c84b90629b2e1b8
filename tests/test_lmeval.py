"""The lm-eval bridge: local task configs (no hub), interventions active inside lm-eval, and the
cross-check that lm-eval and ganda's MMLU scorer make the same per-question predictions."""

from __future__ import annotations

import csv

import pytest

from ganda import AblateHeads
from ganda.tasks.mmlu import DATA_DIR, MMLUTask, read_split

pytestmark = pytest.mark.usefixtures("lm_eval")

ROWS = [
    ["Which key holds 7?", "apple", "river", "stone", "cloud", "B"],
    ["Pick the first letter.", "A", "B", "C", "D", "A"],
    ["Which one, with a comma, is last?", "one, two", "three", "four", "five", "D"],
    ["Memorize: apple:42. The value of apple is", "7", "42", "3", "0", "B"],
]


def _ganda_preds(adapter, task, subject, rows, interventions, data_dir):
    from ganda.scoring import evaluate_examples

    examples = [task.build(subject, q, ch, g) for q, ch, g in rows]
    return evaluate_examples(adapter, examples, interventions, progress=False)


def _csv_dir(tmp_path):
    for split in ("test", "dev"):
        (tmp_path / split).mkdir()
        with open(tmp_path / split / f"astronomy_{split}.csv", "w", newline="") as f:
            csv.writer(f).writerows(ROWS)
    return tmp_path


def test_mmlu_config_matches_lm_eval_template():
    from ganda.lmeval import arc_easy_task, mmlu_task, mmlu_tasks

    cfg = mmlu_task("abstract_algebra")
    assert cfg["dataset_path"] == "csv" and cfg["doc_to_choice"] == ["A", "B", "C", "D"]
    assert cfg["doc_to_text"] == "{{question.strip()}}\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\nAnswer:"
    assert cfg["description"] == "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
    assert mmlu_task("anatomy", shots=5)["fewshot_config"] == {"sampler": "first_n"}
    assert len(mmlu_tasks()) == 57
    arc = arc_easy_task()
    assert arc["dataset_path"] == "json" and arc["dataset_kwargs"]["data_files"]["test"].endswith(
        "ganda/data/arc/ARC-Easy-Test.jsonl.gz")


def test_arc_config_matches_lm_eval_yaml():
    """The local ARC-Easy config uses lm-eval's own arc_easy.yaml strings and metrics."""
    from pathlib import Path

    import lm_eval
    import yaml

    from ganda.lmeval import arc_easy_task

    ref = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "arc" / "arc_easy.yaml").read_text())
    cfg = arc_easy_task()
    for key in ("output_type", "doc_to_text", "doc_to_target", "doc_to_choice", "metric_list"):
        assert cfg[key] == ref[key], key
    assert cfg.get("target_delimiter", " ") == ref.get("target_delimiter", " ") == " "


@pytest.mark.integration
@pytest.mark.parametrize("shots", [0, 2])
def test_bridge_matches_ganda_under_ablation(tiny, tmp_path, shots):
    """lm-eval (HFLM on the hooked model) and ganda's scorer: same log-likelihoods, same predictions."""
    from ganda.lmeval import mmlu_task, sample_predictions, simple_evaluate

    d = _csv_dir(tmp_path)
    ivs = [AblateHeads("L1H0,L2H3")]
    res = simple_evaluate(tiny, [mmlu_task("astronomy", data_dir=d, shots=shots)], ivs, log_samples=True)
    lm = sample_predictions(res, "ganda_mmlu_astronomy")
    task = MMLUTask(shots=shots, subjects=["astronomy"], data_dir=str(d))
    ga = _ganda_preds(tiny, task, "astronomy", read_split(str(d), "test", "astronomy"), ivs, d)
    assert [p["pred"] for p in lm] == [p["pred"] for p in ga.predictions]
    assert [p["gold"] for p in lm] == [1, 0, 3, 1]
    for a, b in zip(lm, ga.predictions, strict=True):
        assert a["loglik"] == pytest.approx(b["loglik"], abs=1e-4)
    assert res["results"]["ganda_mmlu_astronomy"]["acc,none"] == pytest.approx(ga.accuracy)
    assert res["ganda"]["interventions"] == [{"type": "ablate_heads", "heads": "L1H0,L2H3", "ablation": "zero"}]
    # the ablation really acted inside lm-eval, and was removed afterwards
    intact = simple_evaluate(tiny, [mmlu_task("astronomy", data_dir=d, shots=shots)], None, log_samples=True)
    ll_intact = [p["loglik"] for p in sample_predictions(intact, "ganda_mmlu_astronomy")]
    assert ll_intact != [p["loglik"] for p in lm]
    assert tiny.model.model.layers[1].self_attn.o_proj._forward_pre_hooks == {}


def _assert_arc_agree(r, n):
    assert r["n"] == n and r["same_requests"] == n and r["same_gold"]
    assert r["same_pred"] == n and r["same_pred_norm"] == n
    assert r["max_abs_loglik_diff"] < 1e-4 and r["max_abs_norm_diff"] < 1e-5
    assert r["lm_eval_acc_norm_consistent"]
    assert r["lm_eval_correct"] == r["ganda_correct"] and r["lm_eval_correct_norm"] == r["ganda_correct_norm"]
    assert r["lm_eval_acc"] == pytest.approx(r["ganda_acc"]) == r["ganda_correct"] / n
    assert r["lm_eval_acc_norm"] == pytest.approx(r["ganda_acc_norm"]) == r["ganda_correct_norm"] / n


@pytest.mark.integration
def test_arc_easy_bridge_matches_ganda_per_question(tiny, monkeypatch):
    """ARC-Easy through lm-eval (vendored data) and ganda's arc_easy task, intact and under an
    ablation: the same requests, log-likelihoods, acc and acc_norm predictions per question."""
    import ganda.scoring
    from ganda.lmeval import arc_easy_cross_check, arc_easy_task, compare_arc, simple_evaluate
    from ganda.scoring import evaluate_examples
    from ganda.tasks import get_task

    n, ivs = 5, [AblateHeads("L1H0,L2H3")]
    intact = arc_easy_cross_check(tiny, n, None, batch_size=4)
    _assert_arc_agree(intact, n)
    res = simple_evaluate(tiny, [arc_easy_task()], ivs, limit=n, log_samples=True, batch_size=4)
    ex = get_task("arc_easy").examples(limit=n)
    ga = evaluate_examples(tiny, ex, ivs, progress=False)
    _assert_arc_agree(compare_arc(res, ex, ga), n)
    # the ablation acted inside lm-eval (its log-likelihoods differ from ganda's intact ones)
    assert compare_arc(res, ex, evaluate_examples(tiny, ex, None, progress=False))["max_abs_loglik_diff"] > 1e-3
    assert tiny.model.model.layers[1].self_attn.o_proj._forward_pre_hooks == {}
    # the check can fail: acc_norm over the length *with* the leading space is not lm-eval's
    monkeypatch.setattr(ganda.scoring, "choice_chars", lambda chs: [len(c) for c in chs])
    with pytest.raises(AssertionError):
        _assert_arc_agree(compare_arc(res, ex, ga), n)


@pytest.mark.slow
def test_smollm2_mmlu_cross_check(smollm2):
    """Real model, real MMLU questions: identical per-question predictions and accuracy."""
    from ganda.lmeval import mmlu_task, sample_predictions, simple_evaluate

    subject, n = "high_school_geography", 12
    res = simple_evaluate(smollm2, [mmlu_task(subject)], None, limit=n, log_samples=True, batch_size=4)
    lm = sample_predictions(res, f"ganda_mmlu_{subject}")
    task = MMLUTask(subjects=[subject])
    ga = _ganda_preds(smollm2, task, subject, read_split(str(DATA_DIR), "test", subject)[:n], None, DATA_DIR)
    assert [p["pred"] for p in lm] == [p["pred"] for p in ga.predictions]
    assert sum(p["pred"] == p["gold"] for p in lm) == ga.correct
    for a, b in zip(lm, ga.predictions, strict=True):
        assert a["loglik"] == pytest.approx(b["loglik"], abs=2e-3)
