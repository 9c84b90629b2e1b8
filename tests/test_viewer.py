"""The report's interactive attention view: maps saved beside the PNG by ``draw_attention``, the
compact embedded data (sampling, quantisation, size budget), and the page driven in headless
chromium over the DevTools protocol: a real mouse event on a token, the highlighted row and
column read back from the DOM and compared with the saved map."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CHROMIUM, needs

from ganda.attention import ATTENTION_FORMAT, attention_record, draw_attention, save_attention_json
from ganda.report import viewer as gv
from ganda.report import write_report
from ganda.tasks import get_task


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


# ---- the saved maps ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with a transformer's and an SSM's maps on one lab-mmlu prompt, as
    ``draw_attention`` saves them (PNG + JSON), and a minimal ``result.json``."""
    from ganda.models import load_model

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("attn")
    ex = get_task("lab-mmlu").examples(limit=1)[0]
    draw_attention(load_model("lab-llama-h1"), ex, ["L2H0", "L1H0"], d / "ga_heads.png",
                   roles={"L1H0": "gather", "L2H0": "aggregate"})
    draw_attention(load_model("lab-mamba2-9k"), ex, ["L1H0", "L2H1"], d / "ssm_heads.png")
    (d / "result.json").write_text(json.dumps({"kind": "attn", "model": "lab-llama-h1"}))
    return d


def test_draw_attention_saves_maps_segments_and_gold(lab_run: Path) -> None:
    doc = json.loads((lab_run / "ga_heads.json").read_text())
    assert doc["format"] == ATTENTION_FORMAT == gv.ATTENTION_FORMAT and doc["model"] == "lab-llama-h1"
    p = doc["prompts"][0]
    t = len(p["tokens"])
    # four option lines, each ending with its newline (the summary token), the third one gold
    assert len(p["segments"]) == 4 and p["gold_segment"] == 2
    assert all(gv.display_token(p["tokens"][b]) == "\n" for _, b in p["segments"])
    assert [gv.display_token(p["tokens"][a]).strip() for a, _ in p["segments"]] == ["A", "B", "C", "D"]
    assert list(p["heads"]) == ["L2H0", "L1H0"]  # the caller's order, not the sorted one
    assert p["heads"]["L1H0"]["role"] == "gather" and p["heads"]["L2H0"]["kind"] == "softmax"
    m = torch.tensor(p["heads"]["L2H0"]["map"])
    assert m.shape == (t, t) and torch.allclose(m.sum(-1), torch.ones(t), atol=1e-3)
    assert float(m.triu(1).abs().max()) == 0.0  # causal
    ssm = json.loads((lab_run / "ssm_heads.json").read_text())["prompts"][0]["heads"]["L1H0"]
    s = torch.tensor(ssm["map"])
    assert ssm["kind"] == "implicit" and float(s.min()) < 0 < float(s.max())  # signed, not a softmax


# ---- the embedded data ---------------------------------------------------------------------------

def test_sampling_keeps_first_summaries_whole_segments_and_a_contiguous_end() -> None:
    segments = [[100 + 20 * k, 112 + 20 * k] for k in range(4)]
    keep = gv.sample_positions(400, segments, max_tokens=120, tail=32)
    assert len(keep) == 120 and keep == sorted(set(keep))
    assert 0 in keep and all(p in keep for a, b in segments for p in range(a, b + 1))  # whole segments
    rest = 120 - 1 - 4 * 13
    assert keep[-rest:] == list(range(400 - rest, 400))  # then the end, contiguous
    # sixty one-line segments: every summary token stays, whole segments from the last one back
    many = [[5 * k + 1, 5 * k + 5] for k in range(60)]
    keep = gv.sample_positions(310, many, max_tokens=120, tail=32)
    assert all(b in keep for _, b in many) and len(keep) == 120
    assert all(p in keep for p in range(many[-10][0], 310)) and many[0][0] not in keep
    assert gv.sample_positions(50, segments, max_tokens=120) == list(range(50))


def test_payload_samples_long_prompts_and_quantises_within_a_step() -> None:
    t = 300
    g = torch.Generator().manual_seed(0)
    soft = torch.softmax(torch.randn(t, t, generator=g) + torch.triu(torch.full((t, t), -1e9), 1), -1)
    implicit = torch.randn(t, t, generator=g).tril() * 1e-3
    rec = attention_record([f"t{i}" for i in range(t)], {"A": soft, "B": implicit}, {"B": "implicit"},
                           segments=[[10, 20], [21, 40]], gold_segment=1)
    p = gv.prompt_payload(rec, roles={"A": "aggregate"}, max_tokens=160)
    keep = p["pos"]
    assert p["T"] == t and len(keep) == len(p["tokens"]) <= 160 and p["tokens"][0] == "t0"
    assert p["segments"] == [[keep.index(10), keep.index(20)], [keep.index(21), keep.index(40)]] and p["gold"] == 1
    for h in p["heads"]:
        back = torch.tensor(gv.dequantise(h))
        want = torch.tensor(rec["heads"][h["name"]]["map"])[keep][:, keep]
        assert back.shape == (len(keep), len(keep))
        # quantised to 1/1000 of the largest |entry|: within half a step of the saved value
        assert float((back - want).abs().max()) <= h["scale"] / gv.LEVELS / 2 + 1e-6
        assert h["scale"] == pytest.approx(float(want.abs().max()), rel=1e-6)
    assert p["heads"][0]["role"] == "aggregate" and p["heads"][1]["kind"] == "implicit"


def test_payload_budget_leaves_heads_out_and_page_stays_small(tmp_path: Path) -> None:
    t = 160
    maps = {f"L{i}H0": torch.softmax(torch.randn(t, t), -1) for i in range(24)}
    rec = attention_record([f"t{i}" for i in range(t)], maps, {})
    payload = gv.viewer_payload([("a", {"prompts": [rec]})], budget=300_000)
    kept = len(payload["prompts"][0]["heads"])
    assert 0 < kept < 24 and payload["omitted"] == 24 - kept
    assert len(gv.payload_json(payload)) < 300_000 + 20_000
    d = tmp_path / "run"
    d.mkdir()
    (d / "result.json").write_text(json.dumps({"kind": "attn", "model": "m"}))
    save_attention_json(d / "attention.json", "m", [rec])
    page = write_report([d], tmp_path / "r.html").read_text()
    assert len(page.encode()) < 1_500_000 and "left out of the page" in page
    assert "</script" not in gv.payload_json({"x": "</script><b>"})


def test_report_embeds_one_viewer_per_run_with_maps(lab_run: Path, tmp_path: Path) -> None:
    page = write_report([lab_run], tmp_path / "r.html").read_text()
    assert page.count('<div class="gv"') == 1 and page.count("<script>") == 1
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    data = json.loads(page.split('<script type="application/json" id="gv0-data">')[1].split("</script>")[0])
    assert [p["label"] for p in data["prompts"]] == ["ga_heads: prompt 0", "ssm_heads: prompt 0"]
    assert [h["name"] for h in data["prompts"][0]["heads"]] == ["L2H0", "L1H0"]
    # headline first, then the interactive view, then the figures
    assert page.index('<div class="gv"') < page.index("<figure>")


# ---- the page in a browser -----------------------------------------------------------------------

class Browser:
    """Headless chromium driven over the DevTools protocol (one page)."""

    def __init__(self, profile: Path) -> None:
        import websocket  # websocket-client (the ``dev`` extra)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--remote-allow-origins=*", "--remote-debugging-port=0", "--window-size=1300,1000",
                 f"--user-data-dir={profile}"]
        self.proc = subprocess.Popen([_chromium(), *flags, "about:blank"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.is_file() and port_file.read_text().strip()) and time.time() < deadline:
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.n = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                assert "error" not in msg, msg["error"]
                return msg.get("result", {})

    def js(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.time() + 60
        while not self.js("document.readyState === 'complete' && !!document.querySelector('.gv .gv-tok')"):
            assert time.time() < deadline, "the viewer did not build"
            time.sleep(0.1)

    def mouse(self, selector: str, kind: str = "mouseMoved") -> None:
        """A real mouse event at the centre of the element ``selector`` (scrolled into view)."""
        box = self.js(f"(function(){{var e=document.querySelector({json.dumps(selector)});e.scrollIntoView({{block:'center'}});"
                      "var r=e.getBoundingClientRect();return [r.left+r.width/2,r.top+r.height/2];})()")
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
        if kind == "click":
            for t in ("mousePressed", "mouseReleased"):
                self.call("Input.dispatchMouseEvent", type=t, x=box[0], y=box[1], button="left", clickCount=1)

    def strip(self, which: str) -> list[float | None]:
        vals = self.js(f"Array.from(document.querySelectorAll('.gv [data-strip={which}] .gv-tok'))"
                       ".map(function(t){return t.getAttribute('data-v');})")
        return [None if v is None else float(v) for v in vals]

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _close(got: list[float | None], want: list[float], tol: float) -> None:
    assert len(got) == len(want)
    bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=True)) if g is None or abs(g - w) > tol]
    assert not bad, bad[:5]


@pytest.mark.integration
def test_hovering_a_token_shows_its_row_and_column_from_the_saved_map(lab_run: Path, tmp_path: Path) -> None:
    if _chromium() is None:
        needs(CHROMIUM)
    out = write_report([lab_run], tmp_path / "r.html")
    saved = json.loads((lab_run / "ga_heads.json").read_text())["prompts"][0]
    b = Browser(tmp_path / "profile")
    try:
        b.open(out.resolve().as_uri())
        t = len(saved["tokens"])
        agg = saved["heads"]["L2H0"]["map"]
        # before any hover the view shows the final token's row: what the Aggregate head picks
        assert b.js("document.querySelector('.gv [data-strip=row]').getAttribute('data-sel')") == str(t - 1)
        _close(b.strip("row"), agg[t - 1], 2e-3)
        # hover the gold option's newline: its row (what it reads) and its column (who reads it)
        gold_nl = saved["segments"][saved["gold_segment"]][1]
        b.mouse(f".gv [data-strip=row] .gv-tok[data-i='{gold_nl}']")
        assert b.js("document.querySelector('.gv [data-strip=row]').getAttribute('data-sel')") == str(gold_nl)
        _close(b.strip("row"), agg[gold_nl], 2e-3)
        _close(b.strip("col"), [agg[i][gold_nl] for i in range(t)], 2e-3)
        assert b.js(f"document.querySelector('.gv .gv-tok[data-i=\"{gold_nl}\"]').className").count("gold") == 1
        # switch to the Gather head by clicking its button, hover a token of the first option line
        b.mouse(".gv .gv-btn[data-i='1']", "click")
        assert b.js("document.querySelector('.gv').getAttribute('data-head')") == "L1H0"
        first_nl = saved["segments"][0][1]
        b.mouse(f".gv [data-strip=col] .gv-tok[data-i='{first_nl}']")
        _close(b.strip("row"), saved["heads"]["L1H0"]["map"][first_nl], 2e-3)
        # a click locks the choice: moving to another token no longer changes the rows shown
        b.mouse(f".gv [data-strip=row] .gv-tok[data-i='{first_nl}']", "click")
        b.mouse(".gv [data-strip=row] .gv-tok[data-i='3']")
        _close(b.strip("row"), saved["heads"]["L1H0"]["map"][first_nl], 2e-3)
        # the SSM prompt: exact implicit maps, signed values shown as they are
        b.mouse(".gv .gv-group:nth-child(2) .gv-btn[data-i='1']", "click")
        assert b.js("document.querySelector('.gv').getAttribute('data-prompt')") == "1"
        b.mouse(".gv .gv-group:nth-child(1) .gv-btn[data-i='0']", "click")
        assert b.js("document.querySelector('.gv').getAttribute('data-head')") == "L1H0"
        ssm = json.loads((lab_run / "ssm_heads.json").read_text())["prompts"][0]["heads"]["L1H0"]["map"]
        b.mouse(f".gv [data-strip=row] .gv-tok[data-i='{gold_nl}']")
        row = b.strip("row")
        scale = max(abs(v) for r in ssm for v in r)
        _close(row, ssm[gold_nl], scale / 1000 + 0.01 * max(abs(v) for v in ssm[gold_nl]))
        assert min(v for v in row if v is not None) < 0
    finally:
        b.close()
