"""``ganda.results.load``: real run directories (small commands on the shipped lab models, run in
process) as pandas DataFrames, and ``ganda eval --predictions`` rows that join with lm-eval's
``log_samples`` question by question."""

from __future__ import annotations

import csv
import json
import re

import pytest

from ganda import registry, runio
from ganda.cli import main
from ganda.errors import GandaError
from ganda.results import PREDICTION_COLUMNS, load

pytestmark = pytest.mark.usefixtures("one_thread")

N = 8
COMMANDS = {
    "sweep": ["sweep", "lab-llama-h1", "--task", "lab-mmlu", "-n", str(N)],
    "rank": ["rank", "lab-llama-h1", "--task", "lab-mmlu", "-n", str(N), "--method", "atp", "--verify-top", "2", "--active", "0",
             "--audit", "1"],
    "heads": ["heads", "lab-llama-h1", "--task", "lab-mmlu", "-n", "2", "--verify-n", "4", "--top", "1"],
    "prune": ["prune", "lab-llama-h1", "--tasks", "lab-mmlu", "-n", str(N)],
    "retain": ["retain", "lab-llama-h1", "--gather", "L2H0", "--aggregate", "L3H0", "--tasks", "lab-mmlu", "-n", str(N)],
    "kv_curve": ["kv-curve", "lab-kv-llama", "--task", "lab-kv", "--pairs", "2,4", "-n", str(N), "--heads", "L1H0"],
    "mask_last_row": ["mask-last-row", "lab-hybrid-late-7k5", "--tasks", "lab-mmlu", "-n", str(N), "--heads", "L3H*"],
    "roles": ["roles", "lab-llama-h1", "-n", str(N), "--top", "2"],
    "sharpness": ["sharpness", "lab-llama-h1", "lab-mamba2-9k", "--task", "lab-mmlu", "-n", "4"],
    "transplant": ["transplant", "lab-distilled-h1", "--donor", "lab-llama-h1", "--layers", "3", "--tasks",
                   "lab-mmlu", "-n", str(N)],
    "extends": ["extends", "lab-llama-wd", "--heads", "L2H0", "--tasks", "lab-mmlu", "-n", str(N)],
    "path": ["path", "lab-llama-h1", "--task", "lab-mmlu", "-n", str(N), "--from", "L2H0", "--to", "L3H0"],
    "edges": ["edges", "lab-llama-h1", "--task", "lab-mmlu", "-n", str(N), "--verify-top", "1", "--audit", "0", "--active", "0",
              "--no-roles"],
}
#: kinds whose command takes minutes even at its smallest (the lab programme, remove-and-restore on
#: every layer): saved through their registered class from a result of that class's shape
SAVED = {
    "remove_restore": {"rows": [{"layer": 2, "removed": 0.25, "restored": 0.875}], "summary": {"n_layers": 4}},
    "lab_findings": {"rows": [{"finding": "1", "verdict": "reproduced"}], "summary": {"reproduced": ["1"]}},
    "lab_models": {"rows": [{"role": "transformer", "model": "lab-llama-h1", "lab-mmlu": 0.875}], "config": {"n": 8}},
    "demo": {"rows": [{"condition": "intact", "heads": "", "accuracy": 0.5}],
             "summary": {"baseline_accuracy": 0.5, "baseline_ci_low": 0.3, "baseline_ci_high": 0.7, "chance": 0.2}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, lab_checkpoints):  # extends runs on lab-llama-wd
    root = tmp_path_factory.mktemp("runs")
    for name, argv in COMMANDS.items():
        assert main([*argv, "--out", str(root / name)]) == 0, name
    assert main(["eval", "lab-llama-h1", "--task", "lab-mmlu", "-n", str(N), "--json",
                 "--predictions", str(root / "eval.jsonl")]) == 0
    for kind, fields in SAVED.items():
        registry.result_class(kind)(kind=kind, model="lab-llama-h1", **fields).save(root / kind)
    return root


def _floats(obj):
    if isinstance(obj, float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _floats(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v)


def test_result_files_hold_floats_to_the_stated_digits(runs):
    """Every JSON result of every kind writes its floats to runio.RESULT_DIGITS significant digits
    (an accuracy of 11/50 is 0.22, never 0.21999999999999997). The JSON-lines records a run resumes
    from and every example's log-likelihoods are kept exact."""
    files = list(runs.rglob("*.json"))
    assert {f.parent.name for f in files} >= set(COMMANDS) - {"sweep"}, files
    floats = 0
    for f in files:
        for x in _floats(json.loads(f.read_text())):
            floats += 1
            assert float(f"{x:.{runio.RESULT_DIGITS}g}") == x, (f, x)
    assert floats > 1000


def test_write_json_rounds_to_the_stated_digits_and_reads_back_the_same_numbers(tmp_path):
    numbers = {"acc": 1 - 0.78, "drop": 0.525 - 0.445, "ci": (1 / 3, 2 / 3), "tiny": 2e-9 / 3,
               "big": 123456789.123, "n": 11, "ok": True, "name": "L2H0"}
    assert numbers["acc"] == 0.21999999999999997
    text = runio.write_json(tmp_path / "r.json", numbers).read_text()
    assert "0.21999999999999997" not in text and '"acc": 0.22' in text
    back = json.loads(text)
    assert back["n"] == 11 and back["ok"] is True and back["name"] == "L2H0" and back["big"] == 123457000.0
    for key in ("acc", "drop", "tiny"):
        assert back[key] == pytest.approx(numbers[key], rel=10 ** -runio.RESULT_DIGITS), key
        assert back[key] != numbers[key] and float(f"{back[key]:.{runio.RESULT_DIGITS}g}") == back[key], key
    assert back["ci"] == pytest.approx(list(numbers["ci"]), rel=10 ** -runio.RESULT_DIGITS)


def test_every_result_kind_loads(runs):
    """Every registered result kind, a sweep, a ranking and a predictions file, all in one load: one
    runs row each, and the experiment's table (its CSV) as ``rows``."""
    r = load(runs, runs / "eval.jsonl")
    kinds = set(r.runs["kind"])
    assert set(registry.result_kinds()) <= kinds
    assert {"sweep", "rank", "heads", "predictions", "extends", "circuit_path", "circuit_edges"} <= kinds
    assert len(r.runs) == len(COMMANDS) + len(SAVED) + 1
    prune = r.rows[r.rows["run"] == str(runs / "prune")]
    with open(runs / "prune" / "prune.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert list(prune["layers"]) == [int(x["layers"]) for x in csv_rows]
    assert list(prune["lab-mmlu"]) == pytest.approx([float(x["lab-mmlu"]) for x in csv_rows])
    roles = r.heads[r.heads["run"] == str(runs / "roles")]
    with open(runs / "roles" / "roles.csv", newline="") as f:
        assert list(roles["role"]) == [x["role"] for x in csv.DictReader(f)] and len(roles) == 2


def test_sweep_tables_match_its_files(runs):
    """A sweep: the heads table equals results.csv, and the predictions (intact + every head, one
    row per example) give back each head's accuracy."""
    r = load(runs / "sweep")
    (run,) = r.runs.itertuples()
    assert run.kind == "sweep" and run.model == "lab-llama-h1" and run.task == "lab-mmlu" and run.n == N
    with open(runs / "sweep" / "results.csv", newline="") as f:
        csv_rows = {x["head"]: x for x in csv.DictReader(f)}
    assert len(r.heads) == 4  # lab-llama-h1: 4 layers x 1 head
    for h in r.heads.itertuples():
        assert h.acc == pytest.approx(float(csv_rows[h.head]["acc"]))
        assert h.drop == pytest.approx(float(csv_rows[h.head]["drop"]))
    p = r.predictions
    assert list(p.columns[: len(PREDICTION_COLUMNS)]) == PREDICTION_COLUMNS
    assert len(p) == 5 * N
    acc = p.groupby("condition")["correct"].mean()
    assert acc["intact"] == pytest.approx(run.accuracy)
    for h in r.heads.itertuples():
        assert acc[h.head] == pytest.approx(h.acc)


def test_eval_predictions_join_the_sweep(runs):
    """``eval --predictions`` on the same task, limit and seed as the sweep: the same examples, so the
    two tables join on the example and agree on every log-likelihood and prediction."""
    ev = load(runs / "eval.jsonl").predictions
    assert ev["doc_id"].tolist() == list(range(N)) and set(ev["task"]) == {"lab-mmlu"}
    sw = load(runs / "sweep").predictions
    joined = ev.merge(sw[sw["condition"] == "intact"], on="example", suffixes=("_eval", "_sweep"))
    assert len(joined) == N
    assert (joined["pred_eval"] == joined["pred_sweep"]).all()
    assert (joined["pred_norm_eval"] == joined["pred_norm_sweep"]).all()
    for a, b in zip(joined["loglik_eval"], joined["loglik_sweep"], strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_extends_conditions_and_their_predictions(runs):
    """``ganda extends``: one row per task and condition, and each condition's predictions file gives
    back that row's accuracy."""
    r = load(runs / "extends")
    assert list(r.rows["condition"]) == ["intact", "ablated", "control"]
    acc = r.predictions.groupby("condition")["correct"].mean()
    for row in r.rows.itertuples():
        assert acc[row.condition] == pytest.approx(row.accuracy)
    assert len(r.predictions) == 3 * N and set(r.predictions["doc_id"]) == set(range(N))


def test_rank_and_heads_tables(runs):
    r = load(runs / "rank", runs / "heads")
    rank = r.heads[r.heads["run"] == str(runs / "rank")]
    assert len(rank) == 4 and sorted(rank["rank_estimate"]) == [1, 2, 3, 4] and list(rank["rank"]) == [1, 2, 3, 4]
    with open(runs / "rank" / "ranking.csv", newline="") as f:  # the ranks ganda rank wrote
        by_head = {x["head"]: x for x in csv.DictReader(f)}
    for h in rank.itertuples():
        assert str(int(h.rank_estimate)) == by_head[h.head]["rank_estimate"]
        assert ("" if h.rank_exact != h.rank_exact else str(int(h.rank_exact))) == by_head[h.head]["rank_exact"]
    ranking = json.loads((runs / "rank" / "ranking.json").read_text())
    assert rank["exact"].notna().sum() == sum(x.get("exact") is not None for x in ranking["ranking"]) >= 2
    assert "verify" not in " ".join(r.runs["run"])  # a ranking's exact sweep is part of the ranking
    verified = [x["head"] for x in ranking["ranking"] if x.get("exact") is not None]
    p = r.predictions[r.predictions["run"] == str(runs / "rank")]
    assert set(p["condition"]) == {"intact", *verified}
    assert len(p) == (1 + len(verified)) * N and set(p["task"]) == {"lab-mmlu"}
    sw = load(runs / "sweep").predictions  # the same examples, so the same verdicts as the full sweep
    for head in ["intact", *verified]:
        mine = p[p["condition"] == head]["correct"].tolist()
        assert mine == sw[sw["condition"] == head]["correct"].tolist(), head
    heads = r.heads[r.heads["run"] == str(runs / "heads")]
    assert len(heads) == 4 and {"aggregate", "gather"} <= set(heads.columns)
    base = r.runs.set_index("kind").loc["heads", "accuracy"]
    assert 0.0 <= base <= 1.0 and base * 4 == round(base * 4)  # an accuracy over the 4 verify prompts


def test_the_runs_table_holds_the_intact_baseline_of_every_run_that_has_one(runs):
    """``runs.accuracy`` is the intact accuracy a run measured on its one task: the sweep's, the
    ranking's (its clean accuracy), roles', heads' and transplant's, each as its own files hold it."""
    r = load(*(runs / k for k in ("sweep", "rank", "roles", "heads", "transplant"))).runs.set_index("kind")
    sweep = json.loads((runs / "sweep" / "results.jsonl").read_text().splitlines()[1])
    rank = json.loads((runs / "rank" / "ranking.json").read_text())
    roles = json.loads((runs / "roles" / "result.json").read_text())["summary"]
    assert r.loc["sweep", "accuracy"] == sweep["acc"] == r.loc["rank", "accuracy"] == rank["clean_acc"]
    assert r.loc["roles", "accuracy"] == roles["baseline"]
    assert r["accuracy"].between(0, 1).all()


@pytest.mark.slow  # a whole demo run (the slow tier holds the demo's runs)
def test_demo_run_and_its_ranking(byte_tok, tmp_path):
    """``ganda demo`` (on a tiny random Llama, the smallest settings): its run row and heads table,
    and its ``ranking/`` as a rank run; the heads table equals the demo's heads.csv."""
    from conftest import make_tiny_llama

    model = tmp_path / "tiny"
    make_tiny_llama(len(byte_tok), ctx=1024).save_pretrained(model, safe_serialization=True)
    byte_tok.save_pretrained(model)
    assert main(["demo", str(model), "-n", "2", "--verify-n", "4", "--top", "1", "--out", str(tmp_path / "demo")]) == 0
    r = load(tmp_path / "demo")
    assert list(r.runs["kind"]) == ["demo", "rank"]
    demo = r.runs.iloc[0]
    summary = json.loads((tmp_path / "demo" / "result.json").read_text())["summary"]
    assert demo["n"] == 4 and demo["accuracy"] == summary["baseline_accuracy"]
    # the heads that matter are verified heads whose ablation lowers the margin; the others are listed apart
    ranking = json.loads((tmp_path / "demo" / "ranking" / "ranking.json").read_text())
    assert all(h["exact"] > 0 for h in summary["top_heads"]) and all(h["exact"] < 0 for h in summary["helpful_when_ablated"])
    assert [h["head"] for h in summary["top_heads"]] == ranking["matter"][:1]
    assert [h["head"] for h in summary["helpful_when_ablated"]] == ranking["helpful_when_ablated"]
    heads = r.heads[r.heads["run"] == str(tmp_path / "demo")]
    with open(tmp_path / "demo" / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(heads["head"]) == [x["head"] for x in rows] and len(rows) == 12  # 3 layers x 4 heads
    assert list(heads["exact"]) == pytest.approx([float(x["exact"]) for x in rows])
    assert not _file_problems(tmp_path / "demo")  # its intervals too: see the test of every run kind
    assert {"baseline_ci_low", "baseline_ci_high"} <= set(r.runs.columns)


def test_example_keys_name_the_source_file_row():
    """``doc_id`` is the row of the source file (what lm-eval calls ``doc_id``), also in a seeded
    sample; a generated task's is its position, the same for every limit of one seed."""
    from ganda.tasks import get_task

    arc = get_task("arc_easy")
    sample = arc.examples(limit=3, seed=4)
    every = arc.all_examples()
    for ex in sample:
        key = ex.key("arc_easy", 0)
        assert every[key["doc_id"]] is ex and key == {"task": "arc_easy", "subject": None, "doc_id": key["doc_id"]}
    assert [ex.key("arc_easy", i)["doc_id"] for i, ex in enumerate(arc.examples(limit=3))] == [0, 1, 2]
    mmlu = get_task("mmlu", subjects="anatomy,astronomy", sample=True).examples(limit=6, seed=1)
    for i, ex in enumerate(mmlu):
        key = ex.key("mmlu", i)
        assert key["subject"] in ("anatomy", "astronomy") and ex.meta["index"] == key["doc_id"]
        assert get_task("mmlu", subjects=key["subject"]).examples()[key["doc_id"]].prompt == ex.prompt
    kv = get_task("kv", pairs=5)
    assert [ex.key("kv", i)["doc_id"] for i, ex in enumerate(kv.examples(limit=3))] == [0, 1, 2]
    assert kv.examples(limit=5)[2].prompt == kv.examples(limit=3)[2].prompt


def test_not_a_run_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(GandaError, match="not a ganda run directory"):
        load(tmp_path / "empty")
    with pytest.raises(GandaError, match="no such run directory"):
        load(tmp_path / "missing")
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(GandaError, match="not a ganda prediction"):
        load(tmp_path / "x.jsonl")


def test_empty_tables_keep_their_columns(runs):
    r = load(runs / "prune")
    assert r.predictions.empty and list(r.predictions.columns) == PREDICTION_COLUMNS
    assert r.heads.empty and len(r.rows) > 0


@pytest.mark.integration
@pytest.mark.usefixtures("lm_eval")
def test_predictions_join_lm_eval_log_samples(byte_tok, tmp_path):
    """``ganda eval --predictions`` on a seeded sample of MMLU astronomy questions (scattered doc ids)
    and lm-eval's ``log_samples`` for exactly those doc ids: joined on (subject, doc_id), every
    choice's log-likelihood and the acc and acc_norm verdicts agree."""
    from conftest import make_tiny_llama

    from ganda import load_model
    from ganda.lmeval import mmlu_task, simple_evaluate

    tiny_dir = tmp_path / "tiny"  # a tiny random Llama as a local model directory, with room for MMLU prompts
    make_tiny_llama(len(byte_tok), ctx=1024).save_pretrained(tiny_dir, safe_serialization=True)
    byte_tok.save_pretrained(tiny_dir)
    out = tmp_path / "p.jsonl"
    assert main(["eval", str(tiny_dir), "--task", "mmlu", "--subjects", "astronomy", "-n", "4", "--sample", "--json",
                 "--predictions", str(out)]) == 0
    ga = load(out).predictions
    ids = sorted(ga["doc_id"])
    assert ids != list(range(4)) and set(ga["subject"]) == {"astronomy"} and set(ga["task"]) == {"mmlu"}
    res = simple_evaluate(load_model(str(tiny_dir)), [mmlu_task("astronomy")], log_samples=True,
                          samples={"ganda_mmlu_astronomy": ids})
    import pandas as pd

    lm = pd.DataFrame([{"doc_id": s["doc_id"], "ll": [float(x[0]) for x in s["filtered_resps"]],
                        "acc": s["acc"], "acc_norm": s["acc_norm"]} for s in res["samples"]["ganda_mmlu_astronomy"]])
    joined = ga.merge(lm, on="doc_id")
    assert len(joined) == 4
    for a, b in zip(joined["loglik"], joined["ll"], strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert (joined["correct"].astype(float) == joined["acc"]).all()
    assert (joined["correct_norm"].astype(float) == joined["acc_norm"]).all()


OLD_INTERVAL = re.compile(r"(^|_)(lo|hi|ci95)$|ci95")
TEXT_INTERVAL = re.compile(r"^\s*\[\s*-?[\d.eE+-]+\s*,\s*-?[\d.eE+-]+\s*\]\s*$")


def _interval_problems(where, record):
    """What in one record (a dict of a file or a table row) breaks the interval schema."""
    out = [f"{where}: {k}" for k in record if OLD_INTERVAL.search(str(k))]
    out += [f"{where}: {k} = {v!r}" for k, v in record.items() if isinstance(v, str) and TEXT_INTERVAL.match(v)]
    for k in record:
        if str(k).endswith("ci_low"):
            high = str(k)[: -len("low")] + "high"
            lo, hi = record[k], record.get(high, "missing")
            if hi == "missing":
                out.append(f"{where}: {k} without {high}")
            elif isinstance(lo, int | float) and isinstance(hi, int | float) and lo == lo and hi == hi and not lo <= hi:
                out.append(f"{where}: {k} {lo} > {high} {hi}")
    return out


def _records(obj, where):
    """Every dict inside a JSON document, with where it sits."""
    if isinstance(obj, dict):
        yield where, obj
        for k, v in obj.items():
            yield from _records(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _records(v, f"{where}[{i}]")


def _file_problems(root):
    """What in the JSON and CSV files under ``root`` breaks the interval schema."""
    problems = []
    for f in sorted(root.rglob("*.json")):
        for where, rec in _records(json.loads(f.read_text()), f.relative_to(root).as_posix()):
            problems += _interval_problems(where, rec)
    for f in sorted(root.rglob("*.csv")):
        with open(f, newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                row = {k: (float(v) if re.fullmatch(r"-?[\d.]+(e-?\d+)?", v or "") else v) for k, v in row.items()}
                problems += _interval_problems(f"{f.relative_to(root).as_posix()}:{i + 2}", row)
    return problems


def test_every_run_kind_writes_one_interval_schema(runs):
    """Every interval of every run kind, in its JSON files, its CSV tables and the tables of
    ``results.load``, is two numbers ``<name>_ci_low`` <= ``<name>_ci_high`` (``ci_low``/``ci_high``
    in a row of one value): never a string, never ``_lo``/``_hi`` or ``ci95``."""
    problems = _file_problems(runs)
    r = load(runs, runs / "eval.jsonl")
    for name in ("runs", "heads", "rows", "predictions"):
        for i, row in enumerate(getattr(r, name).to_dict("records")):
            problems += _interval_problems(f"load().{name}[{i}]", row)
    assert not problems, "\n".join(dict.fromkeys(problems))
    lows = [c for name in ("runs", "heads", "rows") for c in getattr(r, name).columns if c.endswith("ci_low")]
    assert lows, "no interval in any run"


def test_intervals_in_other_forms_read_back_as_two_numbers(tmp_path):
    """A result that holds an interval as a ``[low, high]`` list or as ``_lo``/``_hi`` columns is
    read (by its result class and by ``results.load``) with ``_ci_low``/``_ci_high`` in their place."""
    from ganda.intervals import split_all

    d = {"kind": "roles", "summary": {"baseline": 0.7, "baseline_ci95": [0.5, 0.8], "gather_ablated_ci95": None},
         "rows": [{"head": "L2H0", "all": 0.4, "all_lo": 0.3, "all_hi": 0.5, "ci95": [0.1, 0.2]},
                  {"head": "L3H0", "value": 1.5, "lo": 1, "hi": 2}]}
    assert split_all(d)["summary"] == {"baseline": 0.7, "baseline_ci_low": 0.5, "baseline_ci_high": 0.8,
                                       "gather_ablated_ci_low": None, "gather_ablated_ci_high": None}
    rows = split_all(d)["rows"]
    assert list(rows[0]) == ["head", "all", "all_ci_low", "all_ci_high", "ci_low", "ci_high"]
    assert rows[1] == {"head": "L3H0", "value": 1.5, "ci_low": 1, "ci_high": 2}
    assert registry.result_class("roles").from_json(d).rows[0]["all_ci_high"] == 0.5
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text(json.dumps(d))
    r = load(tmp_path / "run")
    assert r.runs.loc[0, "baseline_ci_low"] == 0.5 and r.rows.loc[0, "ci_high"] == 0.2
    assert not [c for c in (*r.runs.columns, *r.rows.columns) if "ci95" in c or c.endswith(("_lo", "_hi"))]


def test_objects_in_memory_name_intervals_as_the_files_do():
    """EvalResult, HeadScore and the paired bootstrap hold ``<name>_ci_low`` / ``<name>_ci_high``
    (no ``ci95`` pair, no ``_lo``/``_hi``), the names of every result file."""
    import dataclasses

    from ganda.patterns import METRICS, HeadScore
    from ganda.scoring import EvalResult
    from ganda.stats import bootstrap_paired

    for cls, names in ((EvalResult, [""]), (HeadScore, list(METRICS))):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert not [f for f in fields if OLD_INTERVAL.search(f)], cls
        assert {f"{n}_ci_{end}".lstrip("_") for n in names for end in ("low", "high")} <= fields, cls
    boot = bootstrap_paired([0.1, 0.5, 0.9], [0.0, 0.2, 0.4], resamples=50)
    assert not [k for k in boot if OLD_INTERVAL.search(k)]
    assert all(boot[f"{n}_ci_low"] <= boot[n] <= boot[f"{n}_ci_high"] for n in ("a", "b", "diff"))
