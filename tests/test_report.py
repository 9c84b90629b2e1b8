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
from conftest import CHROMIUM, needs

from ganda.figures import attention_panels, bars, curves, heatmap
from ganda.report import write_report
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
    assert "<link" not in text and "<script src" not in text and 'src="http' not in text
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


@pytest.mark.integration
def test_report_renders_in_chromium(tmp_path: Path) -> None:
    if _chromium() is None:
        needs(CHROMIUM)
    d = _run_dir(tmp_path)
    out = write_report([d], tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
           f"--screenshot={shot}", out.resolve().as_uri()]
    subprocess.run(cmd, check=False, capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 5000


def test_report_sweep_without_figures(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    lines = [{"type": "header", "config": {"model": "tiny", "heads": ["L0H0", "L0H1"]}},
             {"type": "baseline", "acc": 0.8, "n": 5, "pred": [0, 1]},
             {"type": "head", "head": "L0H0", "layer": 0, "index": 0, "acc": 0.7, "pred": [0]},
             {"type": "head", "head": "L0H1", "layer": 0, "index": 1, "acc": 0.3, "loglik": [[1.0]]}]
    (sweep / "results.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    text = write_report([sweep], tmp_path / "r.html").read_text()
    assert "Most critical head: <b>L0H1</b>" in text and "loglik" not in text.split("raw result.json")[0]
    assert "data:image/png;base64," not in text  # a sweep's result class draws nothing of its own


# ---- the page as a reader sees it -----------------------------------------------------------------

def _outline(text: str) -> list[dict]:
    """Per run section: its h3/h4 headings, table rows (cell texts) and headline text."""
    from html.parser import HTMLParser

    class Outline(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.sections: list[dict] = []
            self.stack: list[str] = []
            self.buf: list[str] = []
            self.row: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.sections.append({"headings": [], "rows": [], "headline": ""})
            if not self.sections:
                return
            if tag in ("h3", "h4", "th", "td") or (tag == "div" and dict(attrs).get("class") == "headline"):
                self.stack.append(tag if tag != "div" else "headline")
                self.buf = []
            if tag == "tr":
                self.row = []
            if tag in ("pre", "script", "style", "summary"):
                self.stack.append("skip")

        def handle_endtag(self, tag):
            if not self.sections:
                return
            if tag in ("pre", "script", "style", "summary") and "skip" in self.stack:
                self.stack.remove("skip")
                return
            text = " ".join("".join(self.buf).split())
            if tag in ("h3", "h4", "th", "td") and self.stack and self.stack[-1] == tag:
                self.stack.pop()
                if tag in ("h3", "h4"):
                    self.sections[-1]["headings"].append(text)
                elif self.row is not None:
                    self.row.append(text)
            if tag == "div" and self.stack and self.stack[-1] == "headline":
                self.stack.pop()
                self.sections[-1]["headline"] = text
            if tag == "tr" and self.row is not None:
                self.sections[-1]["rows"].append(self.row)
                self.row = None

        def handle_data(self, data):
            if self.stack and self.stack[-1] != "skip":
                self.buf.append(data)

    p = Outline()
    p.feed(text)
    return p.sections


def test_jinja_page_has_the_sections_and_tables_of_the_fstring_page(tmp_path: Path) -> None:
    """tests/data/report_fstring_reference.json is the outline of the page the f-string renderer
    wrote for these two runs; the jinja2 page has the same headings and the same table rows, plus
    only the sweep's prompt count."""
    torch.manual_seed(0)
    d = _run_dir(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"type": "header", "config": {"model": "tiny", "heads": ["L0H0", "L0H1"]}},
        {"type": "baseline", "acc": 0.8, "n": 5, "pred": [0, 1]},
        {"type": "head", "head": "L0H0", "layer": 0, "index": 0, "acc": 0.7, "pred": [0]},
        {"type": "head", "head": "L0H1", "layer": 0, "index": 1, "acc": 0.3, "loglik": [[1.0]]}]))
    new = _outline(write_report([d, sweep], tmp_path / "r.html").read_text())
    ref = json.loads((Path(__file__).parent / "data" / "report_fstring_reference.json").read_text())
    assert [s["headings"] for s in new] == [s["headings"] for s in ref]
    assert new[0]["rows"] == ref[0]["rows"] and new[0]["headline"] == ref[0]["headline"]
    extra = [r for r in new[1]["rows"] if r not in ref[1]["rows"]]
    added = [["n", "5"], ["metric", "acc"]]  # the sweep's prompt count and the metric it ranks heads by
    assert extra == added and [r for r in new[1]["rows"] if r not in added] == ref[1]["rows"]


def test_sections_are_titled_in_words_fold_wide_tables_and_omit_empty_values(tmp_path: Path) -> None:
    d = tmp_path / "heads"
    d.mkdir()
    wide = [{f"col{i}": i * 0.5 for i in range(20)} | {"head": f"L{k}H0"} for k in range(3)]
    (d / "result.json").write_text(json.dumps({
        "kind": "heads", "model": "tiny", "summary": {"baseline_accuracy": 0.725, "n_pattern": 8, "n_verify": 40,
                                                      "top_aggregate": ["L1H0"], "top_gather": ["L2H0"]},
        "rows": [{"head": "L1H0", "aggregate": 0.41, "gather": 0.1, "drop": 0.15, "ablated_accuracy": 0.575},
                 {"head": "L2H0", "aggregate": 0.02, "gather": 0.9, "drop": 0.5, "ablated_accuracy": 0.225}],
        "all_heads": wide, "interventions": [], "notes": [], "config": {"task": "kv", "extra": {}}}))
    text = write_report([d], tmp_path / "r.html").read_text()
    assert "<h2>Heads ranked by Gather and Aggregate pattern scores" in text and "heads — heads" not in text
    # the 20-column table is folded and scrolls inside the page
    fold = text.index("<h3>all_heads</h3>")
    assert text[fold:].startswith('<h3>all_heads</h3><details class="fold"><summary>3 rows × 21 columns')
    assert '<div class="tw"><table>' in text[fold:fold + 200]
    assert "<h3>interventions</h3>" not in text and "<h3>notes</h3>" not in text and "<h4>extra</h4>" not in text
    # the headline: the weak Aggregate result says so, the strong Gather one does not
    head = _outline(text)[0]["headline"]
    assert "Aggregate head L1H0 (aggregate score 0.41, best of 1 verified): ablating it alone takes accuracy " \
           "from 72.5% to 57.5% on 40 prompts (weak: the 95% intervals overlap at n=40" in head
    assert "Gather head L2H0 (gather score 0.9, best of 1 verified): ablating it alone takes accuracy from " \
           "72.5% to 22.5% on 40 prompts." in head


def test_every_registered_result_kind_has_a_headline() -> None:
    from ganda import registry
    from ganda.experiments import ExperimentResult

    kinds = registry.result_kinds()
    assert {"heads", "sharpness", "lab_models", "lab_findings", "prune", "transplant"} <= set(kinds)
    for kind in kinds:
        cls = registry.result_class(kind)
        assert cls.headline is not ExperimentResult.headline, kind


def test_sharpness_and_lab_models_headlines() -> None:
    from ganda import registry

    sharp = registry.result_class("sharpness").from_json({"kind": "sharpness", "n": 200, "differences": [
        {"a": "T", "b": "S", "metric": "aggregate", "value": 0.21, "ci_low": 0.12, "ci_high": 0.3, "scale": "difference T - S",
         "sharper": "T"},
        {"a": "T", "b": "S", "metric": "gather", "value": -0.01, "ci_low": -0.05, "ci_high": 0.03, "scale": "difference T - S",
         "sharper": "undecided (CI covers no difference)"}]})
    assert sharp.headline().splitlines() == [
        "aggregate: **T** sharper; difference T - S 0.21 (95% CI 0.12 to 0.3, n=200).",
        "gather: **undecided** (the 95% interval covers no difference); difference T - S -0.01 (95% CI -0.05 to 0.03, n=200)."]
    models = registry.result_class("lab_models").from_json({"kind": "lab_models", "config": {"n": 200}, "rows": [
        {"role": "transformer", "model": "lab-llama-h1", "params": 9000, "lab-mmlu": 0.975, "lab-knowledge": 0.5}]})
    assert models.headline().splitlines() == [
        "transformer: lab-llama-h1 (9k parameters): lab-mmlu **97.5%**, lab-knowledge **50.0%**.",
        "Each accuracy on 200 prompts (95% intervals in the table)."]


def test_attention_panels_name_roles_keep_labels_readable_and_scale_past_the_sink(tmp_path, monkeypatch) -> None:
    from ganda import figures

    seen = {}

    def keep(fig, path):
        seen["axes"] = [(ax.get_title(), [t.get_fontsize() for t in ax.get_xticklabels()], len(ax.get_xticks()),
                         ax.images[0].get_clim() if ax.images else None) for ax in fig.axes if ax.get_title()]
        figures.pyplot().close(fig)
        return Path(path)

    monkeypatch.setattr(figures, "save_figure", keep)
    t = 150
    sink = torch.full((t, t), 0.001).tril()
    sink[:, 0] = 0.9  # a first-token attention sink
    sink[100, 40] = 0.3
    tokens = [f"w{i}" for i in range(t)]
    figures.attention_panels({"L3H1": sink, "L1H0": sink}, tokens, {}, tmp_path / "x.png",
                             roles={"L3H1": "gather", "L1H0": "aggregate"})
    (t1, fs, nticks, clim), (t2, *_rest) = seen["axes"]
    assert (t1, t2) == ("Gather: L3H1 (softmax)", "Aggregate: L1H0 (softmax)")  # the order given, roles named
    assert min(fs) >= 7 and nticks <= figures.MAX_TICK_LABELS + 1  # labels sampled, not shrunk to 4 pt
    assert clim == pytest.approx((0.0, 0.3))  # the scale tops out at the largest entry past the sink column
    assert figures.colour_limit(sink.numpy() * -1, "implicit") == pytest.approx(0.3)


def test_lab_panel_3_names_the_kv_models_its_kv_bars_come_from() -> None:
    from ganda.experiments import ExperimentResult
    from ganda_lab.programme import findings_panels

    roles_t = ExperimentResult(kind="roles", summary={"baseline": 0.95}, rows=[{"all": 0.3}, {"all": 0.6}])
    roles_s = ExperimentResult(kind="roles", summary={"baseline": 0.9}, rows=[{"all": 0.7}])
    kv = ExperimentResult(kind="kv_curve", model="lab-kv-llama",
                          summary={"pairs": [2, 8], "at_max_pairs": {"lab-kv-llama": 0.9, "lab-kv-mamba2": 0.4}})
    st = {"models": {"transformer": {"model": "lab-llama-h1"}, "ssm": {"model": "lab-mamba2-9k"}},
          "roles_transformer": roles_t, "roles_ssm": roles_s, "kv": kv}
    (p3,) = [p for p in findings_panels(st, []) if p["title"].startswith("3.")]
    assert p3["groups"] == ["intact", "best head ablated", "KV 8 pairs"]
    assert p3["series"] == {"lab-llama-h1 (KV: lab-kv-llama)": [0.95, 0.3, 0.9],
                            "lab-mamba2-9k (KV: lab-kv-mamba2)": [0.9, 0.7, 0.4]}


def test_weak_results_say_so_and_clear_ones_do_not() -> None:
    from ganda import registry
    from ganda.experiments.head_effects import HeadSweepResult

    def roles(ablated_ci):
        return registry.result_class("roles").from_json({"kind": "roles", "summary": {
            "baseline": 0.725, "baseline_ci_low": 0.57, "baseline_ci_high": 0.84, "gather": "L16H2",
            "gather_ablated": 0.575, "gather_ablated_ci_low": ablated_ci[0], "gather_ablated_ci_high": ablated_ci[1],
            "gather_heads": ["L16H2"]}}).headline()

    assert "*weak*: its 95% interval overlaps the intact one" in roles([0.42, 0.71])
    assert "weak" not in roles([0.1, 0.35])

    def transplant(best_lo):
        return registry.result_class("transplant").from_json({"kind": "transplant", "summary": {
            "task": "mmlu", "best": "L3", "best_layer": 3, "best_accuracy": 0.5, "baseline_accuracy": 0.3},
            "rows": [{"condition": "student", "mmlu": 0.3, "mmlu_ci_low": 0.2, "mmlu_ci_high": 0.41},
                     {"condition": "L3", "mmlu": 0.5, "mmlu_ci_low": best_lo, "mmlu_ci_high": 0.6}]}).headline()

    assert transplant(0.38).endswith("vs baseline 30.0% (weak: its 95% interval overlaps the baseline's).")
    assert transplant(0.42).endswith("vs baseline 30.0%.")
    # a sweep's top head: 72.5% -> 57.5% is weak at n=40, 72.5% -> 22.5% is not
    weak = HeadSweepResult(summary={"top_head": "L1H0", "top_drop": 0.15, "baseline_acc": 0.725, "n": 40}).headline()
    clear = HeadSweepResult(summary={"top_head": "L1H0", "top_drop": 0.5, "baseline_acc": 0.725, "n": 40}).headline()
    assert "on 40 prompts (weak: the 95% intervals overlap at n=40" in weak and "weak" not in clear


def test_report_of_a_ranking_directory(tmp_path: Path, capsys) -> None:
    """``ganda rank`` writes ``ranking.json`` (no result.json): its directory is a run the report shows."""
    from ganda.cli import main

    run = tmp_path / "rank"
    assert main(["rank", "lab-llama-h1", "--task", "lab-kv", "--limit", "2", "--verify-top", "4", "--active", "0", "--audit", "0",
                 "--out", str(run)]) == 0
    ranking = json.loads((run / "ranking.json").read_text())
    best = next(r for r in ranking["ranking"] if r["exact"] is not None and r["exact"] > 0)  # its ablation hurts most
    helped = sorted((r for r in ranking["ranking"] if r["exact"] is not None and r["exact"] < 0), key=lambda r: r["exact"])
    assert helped and ranking["helpful_when_ablated"] == [r["head"] for r in helped]
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "page.html")]) == 0
    page = (tmp_path / "page.html").read_text()
    assert "Heads ranked by attribution, the top verified exactly" in page
    assert f"Largest exact effect: <b>{best['head']}</b>" in page
    assert f"Helpful when ablated: ablating {' or '.join(r['head'] for r in helped)} alone raises the mean margin" in page
    for name in ("scatter.png", "verify_heatmap.png"):  # estimate vs exact, exact by layer and head: inlined
        assert f"<figcaption>{name}</figcaption>" in page
        assert base64.b64encode((run / name).read_bytes()).decode() in page
    for name in ("scatter.png", "verify_heatmap.png"):  # a ranking saved without them: drawn from ranking.json
        (run / name).unlink()
        assert main(["report", str(run), "--out", str(tmp_path / "page.html")]) == 0
        page = (tmp_path / "page.html").read_text()
        assert page.count("<figcaption>scatter.png</figcaption>") == page.count(
            "<figcaption>verify_heatmap.png</figcaption>") == 1


def test_report_shows_a_sweep_that_has_not_finished_as_partial(tmp_path, capfd):
    """A sweep killed (or still running) has only its journal: the page shows the heads measured so
    far, marked partial, and the journal is read, never cut, whatever its last line holds."""
    from ganda.cli import main

    run = tmp_path / "sweep"
    assert main(["-q", "sweep", "lab-llama-h1", "--task", "lab-mmlu", "-n", "4", "--out", str(run)]) == 0
    lines = (run / "progress.jsonl").read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["header", "baseline", "head", "head", "head", "head"]
    for name in ("results.jsonl", "results.csv", "heatmap.png"):
        (run / name).unlink()
    journal = "\n".join(lines[:4]) + "\n" + lines[4][:20]  # two heads done, the third cut mid-line
    (run / "progress.jsonl").write_text(journal)
    assert main(["report", str(run), "-o", str(tmp_path / "page.html")]) == 0
    page = (tmp_path / "page.html").read_text()
    assert "Every head ablated alone (partial: not finished)" in page
    assert "<b>Partial sweep</b>: 2 of 4 heads measured so far" in page
    assert (run / "progress.jsonl").read_text() == journal
    (run / "progress.jsonl").write_text("\n".join(lines[:1]) + "\n")  # the header alone: nothing measured yet
    assert main(["report", str(run), "-o", str(tmp_path / "page.html")]) == 2
    assert "is not a sweep's journal with its baseline" in capfd.readouterr().err


def test_what_a_run_cost_closes_the_page_after_every_science_table(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    result = json.loads((d / "result.json").read_text())
    result["summary"].update({"seconds": 12.5, "cpu_seconds": 20.1, "cpu_seconds_by_phase": {"rank": 9.5, "ablate": 6.0}})
    (d / "result.json").write_text(json.dumps(result))
    text = write_report([d], tmp_path / "r.html").read_text()
    run, cost = _outline(text)
    assert not any("seconds" in cell for row in run["rows"] for cell in row)
    assert not any("seconds" in h for h in run["headings"])
    assert cost["headings"] == ["Layer pruning curve · run-prune", "cpu_seconds_by_phase"]
    assert cost["rows"] == [["seconds", "12.5"], ["cpu_seconds", "20.1"], ["rank", "9.5"], ["ablate", "6"]]
    head = text.index("<h2>Cost</h2>")
    assert text.index("<h4>cpu_seconds_by_phase</h4>") > head > text.rindex("<table>", 0, head)
    assert head > text.index('id="run0"') and "<table>" not in text[text.index("</section>", head):]
