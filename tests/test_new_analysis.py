"""A new analysis in one file outside the package: the code block of docs/extending.md's "An
analysis", imported as a module of its own, becomes ``ganda one-head`` with its flags, help and
errors, ``ganda run one-head``, ``ganda plan -e one-head``, a grid job, a ``results.load`` row and a
``ganda report`` section, with no other file touched."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from ganda import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
LAB = "lab-llama-h1"  # its Gather head L2H0 is known by construction: ablating it costs accuracy


def _doc_block() -> str:
    text = DOC.read_text()
    section = text[text.index("## An analysis"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def one_head(tmp_path):
    """The documented file, imported from tmp_path; the registries are restored afterwards."""
    registry.load_plugins()
    registry.experiment_names()
    saved = dict(registry._EXPERIMENTS), dict(registry._RESULTS), dict(registry._SUMMARIES)
    path = tmp_path / "one_head.py"
    path.write_text(_doc_block())
    spec = importlib.util.spec_from_file_location("one_head", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["one_head"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("one_head", None)
    for box, old in zip((registry._EXPERIMENTS, registry._RESULTS, registry._SUMMARIES), saved, strict=True):
        box.clear()
        box.update(old)


def test_a_one_file_analysis_gets_a_command_plan_grid_results_and_report(one_head, tmp_path, capsys):
    from ganda.cli import main
    from ganda.grid import run_grid
    from ganda.results import load

    assert main(["--help"]) == 0
    assert re.search(r"one-head\s+Accuracy intact and with one head ablated", capsys.readouterr().out)
    assert main(["one-head", "--help"]) == 0
    usage = capsys.readouterr().out
    for flag in ("--head", "--ablation", "--task", "--limit", "--out", "--json", "--quiet"):
        assert flag in usage, flag
    assert "the head to ablate, e.g. L1H2" in usage

    # bad values: one line, exit 2, nothing written, before the model loads
    assert main(["one-head", LAB, "--task", "lab-mmlu", "--head", "banana", "-o", str(tmp_path / "bad")]) == 2
    assert "--head must be one head id such as L1H2, not 'banana'" in capsys.readouterr().err
    assert main(["one-head", LAB, "--task", "lab-mmlu", "--ablation", "half", "-o", str(tmp_path / "bad")]) == 2
    assert "--ablation must be zero or mean, not 'half'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()

    run = tmp_path / "run"
    assert main(["one-head", LAB, "--task", "lab-mmlu", "-n", "16", "--head", "L2H0", "-o", str(run), "-q"]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((run / "result.json").read_text())
    s = saved["summary"]
    assert saved["kind"] == "one_head" and saved["config"]["options"] == {"head": "L2H0", "ablation": "zero"}
    assert s["n"] == 16 and s["intact"] - s["ablated"] >= 0.25  # the lab model's Gather head
    assert printed.strip() == f"Ablating L2H0 takes accuracy from {s['intact']:.2f} to {s['ablated']:.2f}."

    # ganda run: the same run, the options as data
    again = tmp_path / "again"
    assert main(["run", "one-head", LAB, "--task", "lab-mmlu", "-n", "16", "--option", "head=L2H0", "-o", str(again),
                 "-q"]) == 0
    capsys.readouterr()
    assert json.loads((again / "result.json").read_text())["summary"] == s

    # ganda plan prices it from its phases, its options checked by its Options
    assert main(["plan", LAB, "-e", "one-head", "--task", "lab-mmlu", "--limit", "16", "--device", "cpu", "--json",
                 "--option", "head=L2H0"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert main(["plan", LAB, "-e", "eval", "--task", "lab-mmlu", "--limit", "16", "--device", "cpu", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert two["flops"] == pytest.approx(2 * one["flops"])
    assert main(["plan", LAB, "-e", "one-head", "--option", "head=L9"]) == 2
    assert "head must be one head id" in capsys.readouterr().err

    # a grid job
    spec = {"models": [LAB], "tasks": ["lab-mmlu"], "experiments": ["one-head"],
            "options": {"limit": 16, "one-head": {"head": "L2H0"}}, "out": str(tmp_path / "grid")}
    job = run_grid(spec)[0]
    assert job["status"] == "done" and job["result"]["ablated"] == pytest.approx(s["ablated"])

    # results.load and the report read it through the registered result kind
    res = load(run)
    assert list(res.runs["kind"]) == ["one_head"] and list(res.runs["ablated"]) == pytest.approx([s["ablated"]])
    page = tmp_path / "page.html"
    assert main(["report", str(run), "--out", str(page)]) == 0
    assert "Ablating L2H0 takes accuracy from" in page.read_text()
