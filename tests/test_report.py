"""The report: figures draw, the HTML page is self-contained, and it renders in headless chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ganda.report import attention_panels, bars, curves, heatmap, write_report
from ganda.report.html import records_table


def _run_dir(tmp: Path) -> Path:
    d = tmp / "run-prune"
    d.mkdir()
    tokens = ["A", ".", " x", "\n", "Answer", ":"]
    t = len(tokens)
    soft = torch.softmax(torch.randn(t, t).tril() + torch.triu(torch.full((t, t), -1e9), 1), -1)
    implicit = torch.randn(t, t).tril()
    attention_panels({"L1H0": soft, "L2H3": implicit}, tokens, {"L1H0": "softmax", "L2H3": "implicit"}, d / "maps.png")
    curves([1, 2, 3], {"mmlu": [0.3, 0.5, 0.6], "knowledge": [0.4, None, 0.5]}, d / "curve.png",
           bands={"mmlu": ([0.2, 0.4, 0.5], [0.4, 0.6, 0.7])}, vlines={"minimal": 2}, hlines={"chance": 0.25})
    heatmap(torch.rand(4, 3), d / "heat.png", center=0.5)
    bars(["a", "b"], {"x": [0.2, 0.7]}, d / "bars.png", errors={"x": ([0.1, 0.6], [0.3, 0.8])})
    (d / "result.json").write_text(json.dumps({
        "kind": "prune", "model": "tiny", "summary": {"minimal_layers": 2, "critical_layer": 2, "drop_from": 0.6, "drop_to": 0.3},
        "points": [{"layers": 1, "mmlu": 0.3}, {"layers": 2, "mmlu": 0.5, "extra": [1, 2]}],
        "config": {"limit": 3, "nested": {"a": 1}},
    }))
    (d / "points.csv").write_text("layers,mmlu\n1,0.3\n2,0.5\n")
    return d


def test_report_self_contained(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    other = tmp_path / "empty-run"
    other.mkdir()
    out = write_report([d, other], tmp_path / "r.html", title="T <x>")
    text = out.read_text()
    assert not re.search(r"https?://", text)
    assert "<link" not in text and "<script" not in text and 'src="http' not in text
    for p in d.glob("*.png"):
        assert base64.b64encode(p.read_bytes()).decode() in text
    assert re.findall(r'src="([^"]+)"', text) and all(s.startswith("data:image/png;base64,") for s in re.findall(r'src="([^"]+)"', text))
    assert "Minimal model" in text and "T &lt;x&gt;" in text and "no result.json" in text
    assert "<table>" in text


def test_records_table_escapes() -> None:
    html = records_table([{"a": "<b>", "b": 1.5}, {"c": None}])
    assert "&lt;b&gt;" in html and "<th>c</th>" in html


def test_report_cli(tmp_path: Path) -> None:
    from ganda.cli import main

    d = _run_dir(tmp_path)
    assert main(["report", str(d), "--out", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").exists()
    assert main(["report", str(tmp_path / "nope")]) == 2


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_chromium(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    out = write_report([d], tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
           f"--screenshot={shot}", out.resolve().as_uri()]
    subprocess.run(cmd, check=False, capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 5000


def test_report_sweep_and_fallback_figures(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    lines = [{"type": "header", "config": {"model": "tiny", "heads": ["L0H0", "L0H1"]}},
             {"type": "baseline", "acc": 0.8, "n": 5, "pred": [0, 1]},
             {"type": "head", "head": "L0H0", "layer": 0, "index": 0, "acc": 0.7, "pred": [0]},
             {"type": "head", "head": "L0H1", "layer": 0, "index": 1, "acc": 0.3, "loglik": [[1.0]]}]
    (sweep / "results.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "result.json").write_text(json.dumps({
        "kind": "ga_maps", "model": "tiny", "tokens": ["a", "b"],
        "maps": {"L0H0": [[1, 0], [0.5, 0.5]], "L1H0": [[0.2, 0], [-0.3, 0.1]]}, "map_kinds": {"L1H0": "implicit"}}))
    text = write_report([sweep, maps], tmp_path / "r.html").read_text()
    assert "Most critical head: <b>L0H1</b>" in text and "loglik" not in text.split("raw result.json")[0]
    assert text.count("data:image/png;base64,") == 1
