"""One self-contained HTML page for one or more run directories.

A run directory holds ``result.json`` (at least ``{"kind": ..., "model": ...}``) plus any ``*.png``
and ``*.csv`` files. The page has no external references at all: CSS is inline, PNGs are inlined
as base64 ``data:`` URIs, and nothing is fetched from a CDN, so it can be mailed or archived
as one file and opened offline.

Each run is rendered through the result class registered for its kind
(:func:`ganda.registry.register_result`): its ``headline()`` opens the section (the numbers the
paper reports: the minimal model of a pruning run, the best transplant layer, ...) and, when the
run directory holds no PNG, its ``draw()`` makes the figures on the fly. The rest is generic:
scalars as a key/value table, lists of dicts as tables, nested dicts as nested sections. Kinds
are registered by whoever defines them (``ganda.experiments``, plugins), never here.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
import json
import logging
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import registry, runio
from ..errors import GandaError
from ..figures import attention_panels

log = logging.getLogger(__name__)

MAX_ROWS = 200  # longest table rendered in full; longer ones are cut with a note
MAX_CSV_ROWS = 60

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:14px 28px}
header h1{margin:0;font-size:22px} header .sub{opacity:.75;font-size:13px}
main{padding:10px 28px 40px}
nav{margin:10px 0 0;font-size:13px} nav a{margin-right:14px;color:#9cc3ff}
section.run{background:#fff;border:1px solid #dde1e7;border-radius:8px;margin:18px 0;padding:14px 20px}
section.run h2{margin:0 0 6px;font-size:19px}
.meta{color:#5b6577;font-size:13px;margin-bottom:8px}
.headline{background:#eef5ff;border-left:4px solid #3a7be0;padding:8px 14px;margin:10px 0;font-size:14px}
.headline b{font-size:15px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:12.5px}
th,td{border:1px solid #d6dae1;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4} tr:nth-child(even) td{background:#fafbfc}
td.num{text-align:right;font-variant-numeric:tabular-nums}
h3{font-size:15px;margin:16px 0 4px} h4{font-size:13px;margin:10px 0 4px;color:#394150}
figure{margin:10px 0 18px;display:inline-block;max-width:100%}
figure img{max-width:100%;border:1px solid #e3e6eb;background:#fff}
figcaption{font-size:12px;color:#5b6577}
details{margin:6px 0} summary{cursor:pointer;color:#394150;font-size:13px}
pre{background:#f3f4f6;padding:8px;overflow:auto;font-size:11.5px;max-height:420px}
.note{color:#8a5a00;font-size:12px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return _e(v)
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    if isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(a, int | float) for a in v):
        return f"[{_fmt(v[0])}, {_fmt(v[1])}]"
    if isinstance(v, dict | list):
        text = json.dumps(v, default=str)
        if len(text) > 160:
            return f"<details><summary>{_e(text[:80])}…</summary><pre>{_e(json.dumps(v, indent=1, default=str))}</pre></details>"
        return _e(text)
    return _e(v)


def _cell(v: Any) -> str:
    cls = ' class="num"' if isinstance(v, int | float) and not isinstance(v, bool) else ""
    return f"<td{cls}>{_fmt(v)}</td>"


def is_records(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(r, dict) for r in v)


def records_table(rows: Sequence[dict[str, Any]], max_rows: int = MAX_ROWS) -> str:
    """A list of dicts as an HTML table (columns in first-seen order)."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    out = ["<table><thead><tr>", *(f"<th>{_e(c)}</th>" for c in cols), "</tr></thead><tbody>"]
    for r in rows[:max_rows]:
        out.append("<tr>" + "".join(_cell(r.get(c, "")) for c in cols) + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > max_rows:
        out.append(f'<div class="note">{len(rows) - max_rows} more rows not shown (see the JSON/CSV).</div>')
    return "".join(out)


def kv_table(d: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th>{_cell(v)}</tr>" for k, v in d.items())
    return f"<table><tbody>{rows}</tbody></table>"


def render_value(name: str, v: Any, depth: int = 0) -> str:
    """Render one JSON value: scalars inline, lists of dicts as tables, dicts as sub-sections."""
    tag = "h3" if depth == 0 else "h4"
    if is_records(v):
        return f"<{tag}>{_e(name)}</{tag}>" + records_table(v)
    if isinstance(v, dict):
        scalars = {k: x for k, x in v.items() if not (is_records(x) or isinstance(x, dict))}
        parts = [f"<{tag}>{_e(name)}</{tag}>"]
        if scalars:
            parts.append(kv_table(scalars))
        for k, x in v.items():
            if k not in scalars:
                parts.append(render_value(f"{name}.{k}" if depth else k, x, depth + 1))
        return "".join(parts)
    return f"<{tag}>{_e(name)}</{tag}><div>{_fmt(v)}</div>"


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, int | float) else str(x)


def headline_html(text: str) -> str:
    """A result's ``headline()`` as the page's headline box: escaped, ``**x**`` in bold, ``*x*``
    in italics, one line per fact (empty text: no box)."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    marked = [re.sub(r"\*(.+?)\*", r"<i>\1</i>", re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", _e(ln))) for ln in lines]
    return '<div class="headline">' + "<br>".join(marked) + "</div>"


def _result_object(result: dict[str, Any]) -> Any:
    """The registered result class's object for ``result`` (None: unregistered kind or unreadable)."""
    try:
        cls = registry.result_class(str(result.get("kind", "")))
        return None if cls is None else cls.from_json(result)
    except Exception as exc:  # noqa: BLE001 - a result that cannot be rebuilt still renders generically
        log.warning("cannot rebuild the %s result: %s", result.get("kind"), exc)
        return None


class SweepRun:
    """A head sweep's ``results.jsonl`` as summarised by :func:`sweep_result`."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.summary = d.get("summary") or {}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SweepRun:
        return cls(d)

    def headline(self) -> str:
        s = self.summary
        if not s.get("top_head"):
            return ""
        return (f"Most critical head: **{s['top_head']}** (ablating it costs {_pct(s.get('top_drop'))} "
                f"of {_pct(s.get('baseline_acc'))}).")

    def draw(self, out_dir: Path) -> list[Path]:
        return []


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _csv_table(path: Path) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return ""
    body = records_table(rows, MAX_CSV_ROWS)
    return f"<details><summary>{_e(path.name)} ({len(rows)} rows)</summary>{body}</details>"


def _fallback_figures(result: dict[str, Any], obj: Any, tmp: Path) -> list[Path]:
    """Draw figures for a run dir that has none, when its kind knows how.

    Any result with ``tokens`` and ``maps`` (head -> matrix, optional ``map_kinds``) gets G&A
    attention panels; registered kinds redraw themselves from their JSON.
    """
    if isinstance(result.get("maps"), dict) and isinstance(result.get("tokens"), list) and result["maps"]:
        try:
            return [attention_panels(result["maps"], result["tokens"], result.get("map_kinds") or {},
                                     tmp / "attention.png", rows=result.get("rows") if isinstance(
                                         result.get("rows"), list) and all(isinstance(r, int) for r in result["rows"]) else None)]
        except Exception:  # noqa: BLE001
            return []
    if obj is None:
        return []
    try:
        return list(obj.draw(tmp))
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not cost the page
        log.warning("cannot draw the %s result: %s", result.get("kind"), exc)
        return []


SKIP_KEYS = {"kind", "model", "summary", "panels"}  # panels: figure specs, drawn as PNG
HEAVY = ("pred", "pred_norm", "gold", "loglik", "predictions")


def sweep_result(path: Path, top: int = 20) -> dict[str, Any]:
    """A head sweep's ``results.jsonl`` (header, baseline, one record per head) as a result dict:
    the heads whose ablation costs the most accuracy first, per-prompt lists left out."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    header = next((x for x in lines if x.get("type") == "header"), {})
    base = next((x for x in lines if x.get("type") == "baseline"), None)
    recs = [x for x in lines if x.get("type") not in ("header", "baseline")]
    b = base.get("acc") if base else None
    slim = []
    for r in recs:
        row = {k: v for k, v in r.items() if k not in HEAVY and k != "type"}
        if b is not None and isinstance(r.get("acc"), int | float):
            row["drop"] = b - r["acc"]
        slim.append(row)
    slim.sort(key=lambda r: -r.get("drop", 0.0))
    cfg = header.get("config", {})
    out = {
        "kind": "sweep",
        "model": cfg.get("model", "?"),
        "summary": {"baseline_acc": b, "heads": len(recs), "top_head": slim[0].get("head") if slim else None,
                    "top_drop": slim[0].get("drop") if slim else None},
        "top_heads": slim[:top],
        "config": {k: v for k, v in cfg.items() if k != "heads"},
    }
    cum = path.parent / "cumulative.json"
    if cum.is_file():  # ``ganda sweep --until-chance``
        c = json.loads(cum.read_text())
        out["summary"]["heads_to_chance"] = c.get("heads_to_chance")
        out["cumulative_ablation"] = c.get("curve", [])
    return out


def has_results(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's results (``result.json``, or a sweep's ``results.jsonl``)."""
    return (Path(run_dir) / "result.json").is_file() or (Path(run_dir) / "results.jsonl").is_file()


def render_run(run_dir: Path, index: int) -> str:
    run_dir = Path(run_dir)
    rfile = run_dir / "result.json"
    obj: Any = None
    if not rfile.exists() and (run_dir / "results.jsonl").exists():
        result = sweep_result(run_dir / "results.jsonl")
        obj = SweepRun.from_json(result)
    elif rfile.exists():
        try:
            result = json.loads(rfile.read_text())
        except json.JSONDecodeError as exc:
            result = {"kind": "?", "error": f"result.json is not valid JSON: {exc}"}
    else:
        result = {"kind": "?", "error": "no result.json in this directory"}
    if not isinstance(result, dict):
        result = {"kind": "?", "value": result}
    if obj is None and rfile.exists():
        obj = _result_object(result)
    kind = result.get("kind", "?")
    parts = [f'<section class="run" id="run{index}"><h2>{_e(kind)} — {_e(run_dir.name)}</h2>']
    meta = {k: result[k] for k in ("model", "command", "seed", "ganda_version", "created") if k in result}
    parts.append('<div class="meta">' + " · ".join(f"{_e(k)}: <code>{_e(v)}</code>" for k, v in meta.items()) + "</div>")
    parts.append(headline_html(obj.headline() if obj is not None else ""))
    pngs = sorted(run_dir.glob("*.png"))
    with tempfile.TemporaryDirectory() as td:
        if not pngs and rfile.exists():
            pngs = _fallback_figures(result, obj, Path(td))
        for p in pngs:
            parts.append(
                f'<figure><img alt="{_e(p.name)}" src="{_png_data_uri(p)}"><figcaption>{_e(p.name)}</figcaption></figure>'
            )
    summary = result.get("summary")
    if isinstance(summary, dict) and summary:
        parts.append(render_value("summary", summary))
    scalars = {k: v for k, v in result.items() if k not in SKIP_KEYS and k not in meta and not isinstance(v, dict | list)}
    if scalars:
        parts.append(kv_table(scalars))
    for k, v in result.items():
        if k in SKIP_KEYS or k in meta or k in scalars:
            continue
        parts.append(render_value(k, v))
    for c in sorted(run_dir.glob("*.csv")):
        parts.append(_csv_table(c))
    parts.append(
        f"<details><summary>raw result.json</summary><pre>{_e(json.dumps(result, indent=1, default=str))}</pre></details>"
    )
    parts.append("</section>")
    return "".join(parts)


def write_report(run_dirs: list[Path], out: Path, title: str = "ganda report") -> Path:
    """Write one self-contained HTML page covering every run directory; returns ``out``."""
    out = Path(out)
    runs = [Path(d) for d in run_dirs]
    if not any(has_results(d) for d in runs):
        names = ", ".join(str(d) for d in runs) or "none given"
        raise GandaError(f"nothing to report: no result.json or results.jsonl in {names}")
    sections = [render_run(d, i) for i, d in enumerate(runs)]
    nav = "".join(f'<a href="#run{i}">{_e(d.name)}</a>' for i, d in enumerate(runs))
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>{_e(title)}</h1><div class="sub">{len(runs)} run(s) · generated {stamp}</div>'
        f"<nav>{nav}</nav></header><main>{''.join(sections)}</main></body></html>"
    )
    runio.write_text(out, page)
    return out
