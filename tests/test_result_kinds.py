"""One result type: ``ganda.results.load`` and ``ganda report`` read every run directory through
the registered result class of its kind (:func:`ganda.experiments.read_run`), and hold no code of
their own for any kind. A kind registered from outside the package is read and rendered like a
built-in one; every built-in kind reads back what its writer wrote."""

from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from ganda import experiments, registry, runio
from ganda.errors import GandaError
from ganda.experiments import ExperimentResult, read_run
from ganda.report import write_report
from ganda.results import load


@dataclass
class TallyResult(ExperimentResult):
    """A plugin's result kind: ``result.json`` as every kind writes it, or an older ``tally.txt``
    (one count per head, whitespace-separated) that the class still reads."""

    kind: str = "toy_tally"
    title = "Tallies counted by a plugin"
    files = ("tally.txt",)

    @classmethod
    def read(cls, run_dir: Path) -> TallyResult:
        if (run_dir / "result.json").is_file():
            return super().read(run_dir)  # type: ignore[return-value]
        counts = [int(x) for x in (run_dir / "tally.txt").read_text().split()]
        return cls(model="toy-old", summary={"total": sum(counts)},
                   rows=[{"head": f"L0H{i}", "count": c} for i, c in enumerate(counts)])

    def headline(self) -> str:
        return f"The heads counted **{self.summary['total']}** in all."


@pytest.fixture
def registered():
    """Register ``toy_tally`` from outside the package (the registry is restored afterwards)."""
    registry.result_kinds()  # the plugins' kinds belong to the state restored afterwards
    saved = dict(registry._RESULTS)
    registry.register_result("toy_tally", TallyResult)
    yield
    registry._RESULTS.clear()
    registry._RESULTS.update(saved)


def test_a_kind_registered_outside_the_package_is_loaded_and_reported(tmp_path):
    """No file of ganda names ``toy_tally``: its registration alone makes results.load read both of
    its formats and ganda report render both runs with its title, headline and table."""
    new, old = tmp_path / "runs" / "new", tmp_path / "runs" / "old"
    TallyResult(model="toy", summary={"total": 7}, rows=[{"head": "L0H0", "count": 3},
                                                         {"head": "L1H2", "count": 4}]).save(new)
    old.mkdir(parents=True)
    (old / "tally.txt").write_text("5 1 2\n")
    with pytest.raises(GandaError, match="not a ganda run directory"):  # unregistered: tally.txt is nobody's
        load(old)

    registry.register_result("toy_tally", TallyResult)
    try:
        r = load(tmp_path / "runs")
        assert list(r.runs["kind"]) == ["toy_tally", "toy_tally"]
        assert list(r.runs["model"]) == ["toy", "toy-old"] and list(r.runs["total"]) == [7, 8]
        assert list(r.heads["head"]) == ["L0H0", "L1H2", "L0H0", "L0H1", "L0H2"]  # rows that name a head
        assert list(r.heads["count"]) == [3, 4, 5, 1, 2] and list(r.rows["count"]) == [3, 4, 5, 1, 2]
        assert "tally.txt" in experiments.run_files()

        page = write_report([new, old], tmp_path / "page.html").read_text()
        assert page.count("<h2>Tallies counted by a plugin") == 2
        assert "The heads counted <b>7</b> in all." in page and "The heads counted <b>8</b> in all." in page
        assert "<td>L1H2</td>" in page and "<td>L0H2</td>" in page
    finally:
        registry._RESULTS.pop("toy_tally", None)


def test_a_registered_class_with_only_the_report_protocol_still_reads(tmp_path, registered):
    """A class that is no ExperimentResult (``from_json``, ``headline``, ``draw`` only) reads as an
    ExperimentResult of its kind and headlines as itself."""

    class Bare:
        title = "A bare kind"

        def __init__(self, d):
            self.d = d

        @classmethod
        def from_json(cls, d):
            return cls(d)

        def headline(self):
            return f"bare **{self.d['summary']['x']}**"

        def draw(self, out_dir):
            return []

    registry.register_result("toy_bare", Bare)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text(json.dumps({"kind": "toy_bare", "model": "m", "summary": {"x": 2.5}}))
    res = read_run(tmp_path / "run")
    assert isinstance(res, ExperimentResult) and res.kind == "toy_bare" and res.headline() == "bare **2.5**"
    assert res.title == "A bare kind" and load(tmp_path / "run").runs.loc[0, "x"] == 2.5


# ---- every built-in kind, written by its own writer and read back through the registry ----------

def _sweep(d: Path) -> dict:
    from ganda.sweep import SweepResult

    def rec(kind, head, acc, ll):
        out = {"type": kind, "n": 2, "correct": round(2 * acc), "acc": acc, "acc_norm": acc, "gold": [0, 1],
               "pred": [0, 1] if acc == 1 else [0, 0], "pred_norm": [0, 0], "loglik": ll}
        if head:
            out.update({"head": head, "layer": int(head[1]), "index": int(head[3]), "kind": None})
        return out

    base = rec("baseline", None, 1.0, [[0.0, -2.0], [-1.0, 0.0]])
    heads = [rec("head", "L0H0", 0.5, [[0.0, -1.0], [0.0, -0.5]]), rec("head", "L1H1", 1.0, [[0.0, -3.0], [-2.0, 0.0]])]
    d.mkdir()
    SweepResult({"model": "m", "task": {"task": "kv"}, "seed": 3}, base, heads).write(d)
    return {"acc": 1.0, "drops": {"L0H0": 0.5, "L1H1": 0.0}, "margin_drops": {"L0H0": 1.25, "L1H1": -1.0}}


def _rank(d: Path) -> dict:
    from ganda.attribution.ranking import RankResult

    est = {"L0H0": 0.5, "L0H1": 0.1, "L1H0": -0.2, "L1H1": 0.05}
    rank = RankResult(method="atp", ablation="zero", margin="mean", heads=list(est), estimate=est,
                      exact={"L0H0": 0.45, "L0H1": -0.12}, verified=["L0H0", "L0H1"], audited=[], clean=1.0, bound=None,
                      config={"model": "m", "task": "kv", "n": 4})
    rank.write(d)
    return {r["head"]: r for r in rank.rows()}


def _extends(d: Path) -> dict:
    from ganda.experiments.extends import write_results

    rows = [{"task": "kv", "condition": c, "n": 2, "correct": k, "accuracy": k / 2, "ci_low": 0.0, "ci_high": 1.0,
             "seconds": 0.1} for c, k in (("intact", 2), ("ablated", 0), ("control", 1))]
    d.mkdir()
    write_results({"model": "m", "heads": "L0H0", "control_heads": "L1H1", "limit": 2, "seed": 0, "results": rows}, d)
    (d / "predictions").mkdir()
    for r in rows:
        lines = [{"id": {"task": "kv", "subject": None, "doc_id": i}, "gold": 0, "pred": 0 if i < r["correct"] else 1,
                  "correct": i < r["correct"]} for i in range(2)]
        (d / "predictions" / f"kv.{r['condition']}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {r["condition"]: r["accuracy"] for r in rows}


def test_every_built_in_kind_round_trips_through_the_registry(tmp_path):
    """Each registered kind's run directory, as its writer writes it, is read by its registered class:
    the same summary, rows and numbers come back, in results.load's tables and on the report page."""
    root = tmp_path / "runs"
    root.mkdir()
    written = {}
    for kind in registry.result_kinds():
        cls = experiments.result_class(kind)
        if kind in ("sweep", "rank", "extends"):
            written[kind] = {"sweep": _sweep, "rank": _rank, "extends": _extends}[kind](root / kind)
            continue
        res = ExperimentResult.from_json({"kind": kind, "model": "m", "summary": {"x": 0.25}, "config": {"n": 4},
                                          "rows": [{"head": "L2H1", "acc": 0.5, "acc_ci_low": 0.25, "acc_ci_high": 0.75}]})
        runio.write_json(root / kind / "result.json", res.to_json())
        written[kind] = res
    assert {"sweep", "rank", "extends", "prune", "heads", "sharpness", "roles", "demo", "circuit_edges"} <= set(written)

    for kind, want in written.items():
        got = read_run(root / kind)
        cls = experiments.result_class(kind)
        assert type(got) is cls and got.kind == kind, kind
        if isinstance(want, ExperimentResult):
            assert (got.model, got.summary) == ("m", want.summary), kind
            assert got.tables("r")["rows" if cls.table == "rows" else "runs"], kind

    r = load(root)
    runs = r.runs.set_index("kind")
    assert set(runs.index) == set(written) and len(r.runs) == len(written)
    # the sweep: its baseline and each head's effects, as SweepResult computes them
    assert runs.loc["sweep", "accuracy"] == 1.0 and runs.loc["sweep", "seed"] == 3 and runs.loc["sweep", "task"] == "kv"
    sweep = r.heads[r.heads["run"] == str(root / "sweep")].set_index("head")
    for head, drop in written["sweep"]["drops"].items():
        assert sweep.loc[head, "drop"] == drop and sweep.loc[head, "margin_drop"] == written["sweep"]["margin_drops"][head]
    p = r.predictions[r.predictions["run"] == str(root / "sweep")]
    assert p.groupby("condition")["correct"].mean().to_dict() == {"intact": 1.0, "L0H0": 0.5, "L1H1": 1.0}
    # the ranking: every head with the ranks ganda rank wrote
    rank = r.heads[r.heads["run"] == str(root / "rank")].set_index("head")
    for head, row in written["rank"].items():
        assert rank.loc[head, "rank_estimate"] == row["rank_estimate"]
        assert (rank.loc[head, "exact"] == row["exact"]) or row["exact"] is None
    # extends: one row per condition, and each condition's predictions give its accuracy back
    ext = r.rows[r.rows["run"] == str(root / "extends")].set_index("condition")
    assert ext["accuracy"].to_dict() == written["extends"]
    ep = r.predictions[r.predictions["run"] == str(root / "extends")]
    assert ep.groupby("condition")["correct"].mean().to_dict() == written["extends"]
    # a result.json kind: its summary in the run row, its rows (intervals as two numbers), its heads
    for kind in ("prune", "roles", "demo", "heads"):
        assert runs.loc[kind, "x"] == 0.25 and runs.loc[kind, "n"] == 4
        row = r.rows[r.rows["run"] == str(root / kind)].iloc[0]
        assert (row["acc"], row["acc_ci_low"], row["acc_ci_high"]) == (0.5, 0.25, 0.75)
        assert list(r.heads[r.heads["run"] == str(root / kind)]["head"]) == ["L2H1"]

    page = write_report([root / k for k in written], tmp_path / "page.html").read_text()
    for kind in written:
        assert f"<h2>{html.escape(experiments.result_class(kind).title or kind).replace('&#x27;', '&#39;')}" in page, kind
    assert "Most critical head: <b>L0H0</b>" in page and "Largest exact effect: <b>L0H0</b>" in page
    assert "kv: intact <b>100.0%</b>, <b>L0H0</b> ablated <b>0.0%</b>, control L1H1 ablated <b>50.0%</b>." in page


def test_report_orders_a_sweep_as_ganda_sweep_does(tmp_path):
    """Two heads cost the same accuracy; the one that also costs more margin is the most critical
    head in the report, as in ``ganda sweep``'s tables (SweepResult.top), and the heads whose
    ablation helps come in the same order."""
    from ganda.experiments.head_effects import HeadSweepResult
    from ganda.sweep import read_sweep

    def rec(head, i, pred, loglik):
        acc = sum(p == 0 for p in pred) / 2
        return {"type": "head", "head": head, "layer": 0, "index": i, "kind": None, "n": 2, "acc": acc,
                "acc_norm": acc, "pred": pred, "pred_norm": pred, "gold": [0, 0], "loglik": loglik}

    lines = [{"type": "header", "config": {"model": "m", "task": "t", "heads": ["L0H0", "L0H1", "L0H2", "L0H3"]},
              "metric": "acc"},
             {**rec("", 0, [0, 1], [[-0.1, -2.0], [-1.0, -0.5]]), "type": "baseline"},
             rec("L0H0", 0, [1, 1], [[-0.9, -0.8], [-1.0, -0.5]]),  # acc 0.5 -> 0, small margin loss
             rec("L0H1", 1, [1, 1], [[-3.0, -0.1], [-1.0, -0.5]]),  # acc 0.5 -> 0, large margin loss
             rec("L0H2", 2, [0, 0], [[-0.1, -2.0], [-0.6, -0.7]]),  # acc 0.5 -> 1, margin up a little
             rec("L0H3", 3, [0, 0], [[-0.1, -3.0], [-0.2, -0.9]])]  # acc 0.5 -> 1, margin up more
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    sw = read_sweep(tmp_path / "results.jsonl")
    got = HeadSweepResult.read(tmp_path)
    assert [r["head"] for r in sw.top(None)] == [r["head"] for r in got.rows] == [
        "L0H1", "L0H0", "L0H2", "L0H3"]
    assert got.summary["top_head"] == "L0H1" and got.summary["top_drop"] == 0.5
    assert got.summary["helpful_when_ablated"] == [r["head"] for r in sw.helpful_when_ablated()] == ["L0H2", "L0H3"]


def test_a_sharpness_run_is_an_experiment_result_and_its_older_layout_still_loads(tmp_path):
    """``sharpness`` saves the layout every kind saves (settings in ``config``, the first
    comparison's differences with their intervals in ``summary``); a result.json that keeps its
    settings at the top level reads back to the same result."""
    from ganda.experiments.sharpness import SharpnessResult

    metrics = {"aggregate": {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6, "scale": "mean"}}
    res = {"kind": "sharpness", "task": "lab-mmlu", "n": 12, "seed": 0, "k": 3,
           "models": {"T": {"aggregate_heads": ["L3H0"], "gather_heads": ["L2H0"], "metrics": metrics},
                      "S": {"aggregate_heads": ["L1H7"], "gather_heads": ["L0H2"], "metrics": metrics}},
           "differences": [{"a": "T", "b": "S", "metric": "aggregate", "value": 0.21, "ci_low": 0.12, "ci_high": 0.3,
                            "scale": "difference T - S", "sharper": "T"}]}
    assert isinstance(SharpnessResult.of(res), ExperimentResult)
    SharpnessResult.of(res).save(tmp_path / "new")
    rows = list(csv.DictReader(open(tmp_path / "new" / "sharpness.csv")))
    assert [r["heads"] for r in rows] == ["L3H0", "L1H7", "T"]
    new = json.loads((tmp_path / "new" / "result.json").read_text())
    assert new["config"] == {"task": "lab-mmlu", "n": 12, "seed": 0, "k": 3} and new["model"] == "T,S"
    assert new["summary"] == {"n": 12, "compared": "T vs S", "aggregate": 0.21, "aggregate_ci_low": 0.12,
                              "aggregate_ci_high": 0.3, "aggregate_sharper": "T"}
    (tmp_path / "old").mkdir()
    runio.write_json(tmp_path / "old" / "result.json", res)  # the settings at the top level
    old, saved = read_run(tmp_path / "old"), read_run(tmp_path / "new")
    assert type(old) is type(saved) is SharpnessResult
    assert (old.config, old.summary, old.rows, old.extra) == (saved.config, saved.summary, saved.rows, saved.extra)
    assert old.headline() == saved.headline() == "aggregate: **T** sharper; difference T - S 0.21 (95% CI 0.12 to 0.3, n=12)."
    table = load(tmp_path)
    assert list(table.runs["aggregate_ci_low"]) == [0.12, 0.12] and list(table.rows["metric"]) == ["aggregate"] * 2
