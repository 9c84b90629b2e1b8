"""One effect, one sign: a head's effect is the drop of a stated metric when it is ablated (intact
minus ablated, positive: the head helps). Every command that ranks heads orders them by that signed
number, lists as mattering only heads whose ablation hurts, and lists the heads whose ablation helps
apart; ``ganda sweep`` and ``ganda rank`` agree on the sign and order of the heads both measure."""

from __future__ import annotations

import json
import math
import re

import pytest
from test_attribution import EXAMPLES, LETTERS, llama

from ganda.attribution import rank_heads
from ganda.cli import main
from ganda.effects import (
    accuracy,
    effect,
    helpful_when_ablated,
    margin,
    matters,
    mean_margin,
    mean_margin_or_nan,
    ordered,
    split,
)
from ganda.errors import GandaError
from ganda.sweep import SweepResult, load_result, run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


def test_effect_is_intact_minus_ablated_and_its_sign_says_whether_the_head_matters():
    assert effect(0.75, 0.5) == 0.25 and effect(0.5, 0.75) == -0.25
    assert margin([0.0, -1.0, -3.0], 0) == 2.0 and margin([0.0, -1.0, -3.0], 0, "max") == 1.0
    assert mean_margin([[0.0, -1.0, -3.0], [-2.0, 0.0]], [0, 0]) == 0.0
    assert accuracy([[0.0, -1.0], [-1.0, -1.0], [-1.0, 0.0]], [0, 1, 0]) == pytest.approx(1 / 3)  # a tie: the first
    with pytest.raises(GandaError, match="two choices"):
        margin([0.0], 0)
    assert math.isnan(mean_margin_or_nan([[0.0, -1.0], [0.0]], [0, 0]))  # a sweep of one-choice prompts has no margin
    assert matters(0.1) and not matters(0.0) and not matters(-0.1) and not matters(None)
    assert not matters(0.1, ci_low=-0.02) and matters(0.1, ci_low=0.01)  # beyond its interval
    assert helpful_when_ablated(-0.1) and not helpful_when_ablated(0.0) and not helpful_when_ablated(-0.1, ci_high=0.0)
    effects = {"a": 0.2, "b": -0.3, "c": 0.0, "d": 0.5, "e": -0.1, "f": 0.2}
    assert ordered(effects) == ["d", "a", "f", "c", "e", "b"]  # signed, not by magnitude: b is last
    assert ordered(effects, tie={"f": 1.0}) == ["d", "f", "a", "c", "e", "b"]
    assert split(effects) == (["d", "a", "f"], ["b", "e"])
    assert split(effects, lows={"a": -0.1}, highs={"b": 0.1}) == (["d", "f"], ["e"])


def _rec(head: str, acc: float, logliks: list[list[float]]) -> dict:
    layer, index = (int(x) for x in head[1:].split("H"))
    return {"type": "head", "head": head, "layer": layer, "index": index, "kind": None, "n": 2, "acc": acc,
            "acc_norm": acc, "gold": [0, 0], "loglik": logliks, "pred": [0, 0], "pred_norm": [0, 0], "correct": 0}


def fabricated() -> SweepResult:
    """Intact accuracy 0.5: L0H0 costs 0.5, L0H1 raises it by 0.5, L1H0 and L1H1 leave it, one lowering the
    margin and one raising it; L1H2 raises the margin by the most while costing no accuracy either."""
    base = {**_rec("L9H9", 0.5, [[0.0, -1.0], [-1.0, 0.0]]), "type": "baseline"}  # margins +1, -1: mean 0
    recs = [_rec("L0H0", 0.0, [[-1.0, 0.0], [-2.0, 0.0]]), _rec("L0H1", 1.0, [[0.0, -1.0], [0.0, -1.0]]),
            _rec("L1H0", 0.5, [[0.0, -0.5], [-1.0, 0.0]]), _rec("L1H1", 0.5, [[0.0, -2.0], [-1.0, 0.0]]),
            _rec("L1H2", 0.5, [[0.0, -5.0], [-1.0, 0.0]])]
    return SweepResult({"model": "fabricated"}, base, recs)


def test_a_sweep_orders_heads_by_signed_effect_and_lists_the_helpful_ones_apart():
    res = fabricated()
    assert res.drop(res.records[1]) == -0.5 and res.drop(res.records[0], "margin") == 1.5
    assert [r["head"] for r in res.top(None)] == ["L0H0", "L1H0", "L1H1", "L1H2", "L0H1"]  # ties: the margin drop
    assert [r["head"] for r in res.matter()] == ["L0H0"]
    assert [r["head"] for r in res.helpful_when_ablated()] == ["L0H1"]
    assert [r["head"] for r in res.matter("margin")] == ["L0H0", "L1H0"]
    assert [r["head"] for r in res.helpful_when_ablated("margin")] == ["L1H2", "L0H1", "L1H1"]
    by_margin = SweepResult(res.config, res.baseline, res.records, metric="margin")
    assert [r["head"] for r in by_margin.top(2)] == ["L0H0", "L1H0"]


def test_sweep_files_state_the_metric_and_both_drops(tmp_path):
    res = SweepResult(fabricated().config, fabricated().baseline, fabricated().records, metric="margin")
    res.write(tmp_path)
    assert json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])["metric"] == "margin"
    back = load_result(tmp_path)
    assert back.metric == "margin" and [r["head"] for r in back.top(None)] == [r["head"] for r in res.top(None)]
    header, *rows = (line.split(",") for line in (tmp_path / "results.csv").read_text().splitlines())
    col = {c: i for i, c in enumerate(header)}
    assert {"drop", "margin_drop"} <= set(col)
    assert {r[0]: float(r[col["margin_drop"]]) for r in rows[1:]}["L1H2"] == pytest.approx(-2.0)


@pytest.fixture(scope="module")
def swept():
    """A tiny random Llama on 9 prompts: heads whose ablation raises the margin or the accuracy exist
    (L0H1 raises the margin and costs accuracy; L0H0 the reverse)."""
    ad = llama(layers=3, seed=0)
    exs = EXAMPLES + LETTERS
    return ad, exs, run_sweep(ad, exs, progress=False, metric="margin")


def test_a_real_sweep_lists_as_mattering_only_heads_whose_ablation_hurts(swept):
    _, _, res = swept
    for metric in ("margin", "acc"):
        matter, helpful = res.matter(metric), res.helpful_when_ablated(metric)
        assert matter and helpful, metric  # both kinds exist on this model: the test can fail
        assert all(res.drop(r, metric) > 0 for r in matter) and all(res.drop(r, metric) < 0 for r in helpful)
        drops = [res.drop(r, metric) for r in res.top(None, metric)]
        assert drops == sorted(drops, reverse=True)
    assert "L0H1" in {r["head"] for r in res.helpful_when_ablated("margin")}
    assert "L0H1" in {r["head"] for r in res.matter("acc")}  # the metric is stated because the two can differ


def test_sweep_and_rank_agree_on_sign_and_order(swept):
    ad, exs, sw = swept
    margins = sw.effects("margin")
    exact = rank_heads(ad, exs, method="exact", progress=False)
    assert exact.metric == "margin" and exact.order() == [r["head"] for r in sw.top(None)]
    assert exact.matter() == [r["head"] for r in sw.matter()]
    assert exact.helpful_when_ablated() == [r["head"] for r in sw.helpful_when_ablated()]
    for h, v in exact.exact.items():
        assert v == pytest.approx(margins[h], abs=1e-6)
        assert exact.exact_acc[h] == pytest.approx(sw.drop(next(r for r in sw.records if r["head"] == h)))
    atp = rank_heads(ad, exs, method="atp", verify_top=6, active=0, audit=0, progress=False)
    verified = [h for h in atp.order() if h in atp.exact]
    assert verified == [r["head"] for r in sw.top(None) if r["head"] in atp.exact]
    assert all(atp.exact[h] > 0 for h in atp.matter()) and all(atp.exact[h] < 0 for h in atp.helpful_when_ablated())
    ranking = atp.to_json()
    assert ranking["metric"] == "margin" and ranking["matter"] == atp.matter()
    assert ranking["helpful_when_ablated"] == atp.helpful_when_ablated()


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_sweep_cli_prints_heads_that_matter_and_helpful_heads_apart(tiny_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "4", "--metric", "margin",
                 "--out", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    res = load_result(out)
    assert res.metric == "margin"
    matter_part, _, helpful_part = text.partition("helpful when ablated")
    head = re.compile(r"L\d+H\d+")
    shown_matter = [r for r in _table_rows(matter_part) if head.fullmatch(r[1])]
    shown_helpful = [r for r in _table_rows(helpful_part) if head.fullmatch(r[1])]
    assert [r[1] for r in shown_matter] == [r["head"] for r in res.matter()][:15]
    assert [r[1] for r in shown_helpful] == [r["head"] for r in res.helpful_when_ablated()][:15]
    # the margin drop's sign as printed (a tiny drop prints as -0.0000, still with its sign)
    assert all(r[4].startswith("+") for r in shown_matter) and all(r[4].startswith("-") for r in shown_helpful)
    assert shown_matter or shown_helpful
    assert main(["sweep", str(tiny_dir), "--metric", "loss", "--out", str(tmp_path / "x")]) == 2
    assert "--metric" in capsys.readouterr().err
    # ganda rank on the same prompts: the same heads matter, in the same order, with the same margin drops
    assert main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "4", "--method", "exact",
                 "--out", str(tmp_path / "rank"), "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    assert ranking["metric"] == "margin"
    assert ranking["matter"] == [r["head"] for r in res.matter()]
    assert ranking["helpful_when_ablated"] == [r["head"] for r in res.helpful_when_ablated()]
    assert [r["head"] for r in ranking["ranking"]] == [r["head"] for r in res.top(None)]
    drops = {r["head"]: (res.drop(r, "margin"), res.drop(r)) for r in res.records}
    for r in ranking["ranking"]:
        assert (r["exact"], r["acc_drop"]) == pytest.approx(drops[r["head"]], abs=1e-5)
