"""A head's activity (mean |AtP| per prompt) against a brute-force autograd reference, and
``rank --active`` on a tiny model."""

from __future__ import annotations

import csv
import json

import pytest
from test_attribution import EXAMPLES, brute_atp, llama

from ganda.attribution import attribute, rank_heads
from ganda.cli import main
from ganda.errors import GandaError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_activity_is_the_mean_of_each_prompts_absolute_atp():
    """Per prompt, plain autograd through the whole model gives each head's AtP; the activity is the
    mean of its absolute values. It is never below |AtP| (the mean of the signed values) and, where a
    head's per-prompt effects disagree in sign, above it: the case the activity exists for."""
    ad = llama(layers=3, seed=4)
    att = attribute(ad, EXAMPLES, method="atp", progress=False)
    per_prompt = [brute_atp(ad, [ex]) for ex in EXAMPLES]
    activity = att.activity()
    for h, value in activity.items():
        assert value == pytest.approx(sum(abs(p[h]) for p in per_prompt) / len(EXAMPLES), abs=1e-5)
    atp = dict(zip(map(str, att.heads), att.atp, strict=True))
    assert all(activity[h] >= abs(atp[h]) - 1e-7 for h in atp)
    cancelled = [h for h in atp if activity[h] > 2 * abs(atp[h]) + 1e-4]
    assert cancelled, "no head's per-prompt effects cancel on these examples: the check has no weight"


def test_rank_verifies_the_most_active_heads(tmp_path):
    """``active=K``: the K most active heads are verified whatever their estimate rank (here some
    that the estimate's top would not reach), with their activity in ranking.csv; K = 0 verifies by
    estimate only."""
    ad = llama(layers=3, seed=4)
    res = rank_heads(ad, EXAMPLES, method="atp", verify_top=2, audit=0, active=4, out_dir=tmp_path, progress=False)
    by_est = sorted(res.estimate, key=lambda h: (-abs(res.estimate[h]), h))
    by_act = sorted(res.activity, key=lambda h: (-res.activity[h], h))
    assert set(res.verified) == {*by_est[:2], *by_act[:4]}
    assert set(by_act[:4]) - set(by_est[:4]), "the activity's top equals the estimate's: the check has no weight"
    assert res.config["active"] == 4
    with open(tmp_path / "ranking.csv") as f:
        rows = {r["head"]: r for r in csv.DictReader(f)}
    assert float(rows[by_act[0]]["activity"]) == pytest.approx(res.activity[by_act[0]], rel=1e-6)
    plain = rank_heads(ad, EXAMPLES, method="atp", verify_top=2, active=0, audit=0, progress=False)
    assert set(plain.verified) == set(by_est[:2])


def test_active_refusals(capsys):
    ad = llama(layers=2, seed=0)
    with pytest.raises(GandaError, match="active must be at least 0"):
        rank_heads(ad, EXAMPLES, method="atp", active=-1, progress=False)
    assert main(["rank", "tiny-nonexistent", "--active", "-2"]) == 2
    assert "--active must be at least 0" in capsys.readouterr().err


def test_rank_defaults_to_the_activity_rule_without_an_audit(tiny_dir, tmp_path, capsys):
    """``ganda rank`` with no rule options: AtP, the top 10 and the 30 most active heads checked
    (every head of a 12-head model), no audit, and a line saying the bound needs one."""
    assert main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "2", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "bound: none without an audit" in out and "verified" in out
    doc = json.loads((tmp_path / "r" / "ranking.json").read_text())
    cfg = doc["config"]
    assert (doc["method"], cfg["verify_top"], cfg["active"], cfg["audit"]) == ("atp", 10, 30, 0)
    assert doc["verified"] == 12 and doc["audited"] == []
