"""The one head labeller (ganda.labels): constructed attention maps, then real lab models."""

from __future__ import annotations

import pytest
import torch

import ganda
from ganda.discovery import discover, pattern_scores
from ganda.labels import MIN_SCORE, label_head, label_model, map_scores
from ganda.tasks import get_task


def _scores(m: torch.Tensor, ids: list[int]) -> dict[str, float]:
    return {k: s / c for k, (s, c) in map_scores(m, ids).items() if c}


def _previous_token(t: int) -> torch.Tensor:
    m = torch.zeros(t, t)
    m[0, 0] = 1.0
    for i in range(1, t):
        m[i, i - 1] = 1.0
    return m


def test_previous_token_map():
    s = _scores(_previous_token(10), list(range(10)))
    assert s["previous_token"] == pytest.approx(1.0)
    assert s["sink"] == pytest.approx(1 / 9)  # only row 1's previous token is the first token
    assert "induction" not in s  # no token repeats: nothing to count
    assert label_head("L0H0", **s).label == "previous-token"


def test_induction_map_on_a_repeated_sequence():
    seq = [7, 3, 9, 4, 1, 8]
    ids = [0, *seq, *seq]  # <bos>, then the sequence twice
    t = len(ids)
    m = torch.zeros(t, t)
    m[:, 0] = 1.0  # rows without an earlier occurrence rest on <bos>
    for i in range(1 + len(seq), t):
        m[i] = 0.0
        m[i, i - len(seq) + 1] = 1.0  # the token after the earlier occurrence of ids[i]
    s = _scores(m, ids)
    assert s["induction"] == pytest.approx(1.0)
    assert s["previous_token"] < MIN_SCORE["previous_token"]
    lab = label_head("L1H0", **s)
    assert lab.label == "induction" and "induction score 1.000" in lab.reason


def test_sink_map():
    t = 12
    m = torch.zeros(t, t)
    m[:, 0] = 0.8
    for i in range(t):
        m[i, i] += 0.2
    s = _scores(m, list(range(t)))
    assert s["sink"] == pytest.approx(0.8)
    assert label_head("L0H1", **s).label == "sink"


def test_signed_implicit_maps_are_scored_by_their_magnitude():
    m = -_previous_token(8)  # an SSM head's implicit map may be negative
    assert _scores(m, list(range(8)))["previous_token"] == pytest.approx(1.0)


def test_gather_and_aggregate_need_their_minimum_score():
    assert label_head("L2H0", aggregate=0.000215, gather=0.2).label == "none"
    # a big ablation drop does not make a low pattern score Aggregate
    low = label_head("L2H0", aggregate=0.01, ablation={"drop_all": 0.6, "drop_query": 0.6, "drop_context": 0.0})
    assert low.label == "none"
    assert label_head("L3H0", aggregate=0.2, gather=0.1).label == "Aggregate"
    assert label_head("L1H0", aggregate=0.0, gather=0.7).label == "Gather"
    # G&A outranks the generic patterns
    assert label_head("L3H0", aggregate=0.2, sink=0.9).label == "Aggregate"


def test_where_the_ablation_hurts_decides_between_two_qualifying_patterns():
    both = {"aggregate": 0.06, "gather": 0.9}  # gather is the larger multiple of its minimum
    assert label_head("L1H0", **both).label == "Gather"
    hurt_at_query = {"drop_all": 0.3, "drop_query": 0.3, "drop_context": 0.0}
    assert label_head("L1H0", **both, ablation=hurt_at_query).label == "Aggregate"
    # an ablation that does not hurt says nothing
    harmless = {"drop_all": 0.01, "drop_query": 0.01, "drop_context": 0.0}
    assert label_head("L1H0", **both, ablation=harmless).label == "Gather"
    # one qualifying pattern keeps its label; the reason says where the ablation hurts instead
    lab = label_head("L1H0", aggregate=0.2, ablation={"drop_all": 0.3, "drop_query": 0.0, "drop_context": 0.3})
    assert lab.label == "Aggregate" and "before the final position" in lab.reason


@pytest.mark.usefixtures("lab_checkpoints")
def test_labels_of_a_real_lab_model():
    a = ganda.load_model("lab-llama-h1", device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=a).examples(limit=6, seed=0)
    labels = label_model(a, exs, pattern_scores(a, exs, progress=False))
    assert sorted(labels) == sorted(str(h) for h in a.heads())
    for lab in labels.values():
        if lab.label in ("Gather", "Aggregate"):
            assert lab.scores[lab.label.lower()] >= MIN_SCORE[lab.label.lower()]
        for k in ("sink", "previous_token", "induction"):
            assert 0.0 <= lab.scores[k] <= 1.0 + 1e-6
    # discover labels every head it scores with the same labeller
    d = discover(a, exs, exs[:4], top=2, progress=False)
    assert {s.head: s.label for s in d.scores} == {h: lab.label for h, lab in labels.items()}


@pytest.mark.usefixtures("lab_checkpoints")
def test_heads_and_roles_give_every_head_they_both_report_the_same_label(tmp_path):
    """``ganda heads`` ranks by pattern and ``ganda roles`` by ablation; on the same prompts both
    label a head alike, and neither calls a head Gather or Aggregate below the minimum score."""
    import json

    from ganda.cli import main

    common = ["lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--seed", "0"]
    assert main(["-q", "heads", *common, "--verify-n", "4", "--top", "2", "--out", str(tmp_path / "h")]) == 0
    assert main(["-q", "roles", *common, "--top", "4", "--control", "none", "--max-heads", "1",
                 "--out", str(tmp_path / "r")]) == 0
    saved = json.loads((tmp_path / "h" / "result.json").read_text())
    heads = saved["all_heads"]
    assert saved["summary"]["labels"] == {h["head"]: h["label"] for h in heads if h["label"] != "none"}
    roles = json.loads((tmp_path / "r" / "result.json").read_text())["rows"]
    by_heads = {r["head"]: r["label"] for r in heads}
    by_roles = {r["head"]: r["label"] for r in roles}
    assert len(by_heads) == 4 and len(by_roles) == 4  # lab-llama-h1: 4 layers x 1 head
    assert by_roles == {h: by_heads[h] for h in by_roles}
    for r in heads + [{**r, "aggregate": r["aggregate_score"], "gather": r["gather_score"]} for r in roles]:
        for role in ("Aggregate", "Gather"):
            if r["label"] == role:
                assert r[role.lower()] >= MIN_SCORE[role.lower()], r
    # lab-llama-h1's heads carry the task (roles: ablating L3H0 costs most at the final position)
    # without the G&A attention pattern: no head reaches either minimum
    assert set(by_heads.values()) == {"none"}
    assert {r["role"] for r in roles} <= {"gather", "aggregate", "-", "knowledge"}


@pytest.mark.usefixtures("lab_checkpoints")
def test_ssm_heads_are_labelled_from_their_implicit_maps():
    """lab-mamba2-9k's SSM heads show the pattern (n=8 lab-mmlu prompts: L3H6 aggregate 0.105,
    L0H5 gather 0.86): labelled from the implicit attention every SSM head has."""
    a = ganda.load_model("lab-mamba2-9k", device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=a).examples(limit=8, seed=0)
    labels = label_model(a, exs, pattern_scores(a, exs, progress=False))
    assert labels["L3H6"].label == "Aggregate" and labels["L0H5"].label == "Gather"
    for lab in labels.values():
        role = lab.label.lower()
        if role in ("gather", "aggregate"):
            assert lab.scores[role] >= MIN_SCORE[role]
    assert sum(lab.label == "none" for lab in labels.values()) >= len(labels) // 2


def test_generic_scores_are_the_same_whatever_the_map_budget(tiny, monkeypatch):
    """Long prompts are scored a few heads at a time; the scores do not depend on how many."""
    import ganda.labels as labels

    exs = get_task("kv", pairs=3).examples(limit=2, seed=0)
    seqs = labels.probe_ids(tiny, exs)
    rep, n = seqs[-1], len(seqs[-1]) // 2
    assert len(seqs) == 3 and rep[-n:] == rep[-2 * n : -n] and n == 16  # two prompts, then 16 tokens twice
    whole = labels.generic_scores(tiny, seqs)
    monkeypatch.setattr(labels, "MAP_BUDGET", 1)  # one head per pass
    one = labels.generic_scores(tiny, seqs)
    assert one.keys() == whole.keys() and len(one) == len(tiny.heads())
    for h in whole:
        for k in ("induction", "previous_token", "sink"):
            assert one[h][k] == pytest.approx(whole[h][k], abs=1e-6)


@pytest.mark.slow
def test_smollm2_heads_take_every_kind_of_label(smollm2):
    """SmolLM2-135M on 4 KV prompts (ganda heads, same prompts): L16H2 Gather (gather 0.84),
    L17H5 induction (0.64), L1H0 previous-token (0.55), late-layer heads on <bos> (sink); no
    head reaches the Aggregate minimum (its largest aggregate score on KV is about 0.04)."""
    exs = get_task("kv").examples(limit=4, seed=0)
    labels = label_model(smollm2, exs, pattern_scores(smollm2, exs, progress=False))
    got = {h: lab.label for h, lab in labels.items()}
    assert got["L16H2"] == "Gather" and got["L17H5"] == "induction" and got["L1H0"] == "previous-token"
    assert sum(v == "sink" for v in got.values()) >= 50 and "Aggregate" not in got.values()
    assert all(labels[h].scores["gather"] >= MIN_SCORE["gather"] for h, v in got.items() if v == "Gather")
