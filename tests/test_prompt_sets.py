"""``--prompt-sets K`` on ``extends`` and ``roles``: each set drawn with seed ``seed + k``, recorded,
written to ``prompt_sets.csv`` with a pooled row, and the headline says on how many sets the finding
holds. One set leaves the outputs as they are without the option."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("lab_checkpoints")


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_extends_on_two_prompt_sets(tmp_path: Path, capsys) -> None:
    from ganda.cli import main

    argv = ["extends", "lab-llama", "--heads", "L0H0,L2H1", "--task", "lab-mmlu,lab-kv", "--limit", "8",
            "--seed", "5", "--quiet", "--out"]
    assert main([*argv, str(tmp_path / "one")]) == 0
    one = json.loads((tmp_path / "one" / "extends.json").read_text())
    assert not (tmp_path / "one" / "prompt_sets.csv").exists()
    assert not {"sets", "seeds", "pooled", "findings", "prompt_sets"} & one.keys()
    saved = json.loads((tmp_path / "one" / "result.json").read_text())  # what every run directory holds
    assert saved["kind"] == "extends" and saved["rows"] == one["results"] and saved["command"].startswith("ganda extends")
    assert saved["summary"]["lab-kv.ablated"] == one["results"][4]["accuracy"] and saved["summary"]["heads"] == "L0H0,L2H1"
    capsys.readouterr()

    assert main([*argv, str(tmp_path / "two"), "--prompt-sets", "2"]) == 0
    printed = capsys.readouterr().out
    two = json.loads((tmp_path / "two" / "extends.json").read_text())
    assert two["seeds"] == [5, 6] and [s["seed"] for s in two["sets"]] == [5, 6] and two["prompt_sets"] == 2
    assert two["results"] == [{**r, "seconds": two["results"][i]["seconds"]} for i, r in enumerate(one["results"])]
    assert all(s["disjoint"] == {"lab-mmlu": True, "lab-kv": True} for s in two["sets"])
    rows = _csv(tmp_path / "two" / "prompt_sets.csv")
    assert [(r["set"], r["task"], r["condition"]) for r in rows] == [
        (s, t, c) for s in ("1", "2", "pooled") for t in ("lab-mmlu", "lab-kv") for c in ("intact", "ablated", "control")]
    assert {r["seed"] for r in rows} == {"5", "6", "5,6"} and {r["n"] for r in rows} == {"8", "16"}
    pooled = [r for r in rows if r["set"] == "pooled" and r["condition"] == "ablated"]
    assert all(float(r["drop_ci_low"]) <= float(r["drop"]) <= float(r["drop_ci_high"]) for r in pooled)
    for task, f in two["findings"].items():
        assert f["k"] == 2 and f["holds_on"] == sum(f["holds"]) and f["against"] == "control"
        assert f"{task}: the G&A ablation costs more than the control on {f['holds_on']} of 2 prompt sets (seeds 5-6)" in printed
    assert "prompt_sets.csv" in printed
    assert (tmp_path / "two" / "predictions" / "set-2" / "lab-kv.ablated.jsonl").exists()


def test_roles_on_two_prompt_sets(tmp_path: Path, capsys) -> None:
    from ganda.cli import main

    out = tmp_path / "roles"
    assert main(["roles", "lab-llama-h1", "--task", "lab-mmlu", "--control", "none", "--top", "2", "--max-heads", "1",
                 "--limit", "12", "--seed", "3", "--prompt-sets", "2", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "result.json").read_text())
    assert saved["config"]["prompt_sets"] == 2 and saved["seeds"] == [3, 4] == saved["summary"]["seeds"]
    assert [(s["set"], s["seed"], s["n"], s["disjoint"]) for s in saved["sets"]] == [(1, 3, 12, True), (2, 4, 12, True)]
    roles = [r for r in ("gather", "aggregate") if saved["summary"].get(r)]
    assert roles and set(saved["findings"]) == set(roles)
    rows = _csv(out / "prompt_sets.csv")
    modes = ("all", "query", "context", "where")
    assert [(r["set"], r["role"], r["mode"]) for r in rows] == [
        (s, role, m) for s in ("1", "2", "pooled") for role in roles for m in modes]
    for role in roles:
        f = saved["findings"][role]
        assert f["holds_on"] == sum(f["holds"]) == saved["summary"]["holds_on"][role] and f["k"] == 2
        assert f"{role.capitalize()} head {f['head']}: holds on {f['holds_on']} of 2 prompt sets (seeds 3-4)" in printed
    # set 1 measures the roles on the prompts that found them: its drop is the summary's
    first = saved["sets"][0]["roles"][roles[0]]["all"]
    assert first["accuracy"] == pytest.approx(saved["summary"][f"{roles[0]}_ablated"])
