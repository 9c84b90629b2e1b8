"""One self-contained HTML page for one or more run directories.

A run directory holds ``result.json`` (at least ``{"kind": ..., "model": ...}``) plus any ``*.png``
and ``*.csv`` files. The page has no external references at all: CSS is inline, PNGs are inlined
as base64 ``data:`` URIs, and nothing is fetched from a CDN, so it can be mailed or archived
as one file and opened offline.

Rendering is generic (scalars as a key/value table, lists of dicts as tables, nested dicts as
nested sections) with a few kinds given a headline box first (the numbers the paper reports:
the minimal model of a pruning run, the best transplant layer, ...). When a run directory has no
PNG but its kind knows how to draw itself (``ganda.experiments``), figures are drawn on the fly.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import runio
from ..errors import GandaError

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
    return f"{100 * x:.1f}%" if isinstance(x, int | float) else _e(x)


def headline(result: dict[str, Any]) -> str:
    """Kind-specific one-liners with the numbers that matter (empty where there are none)."""
    kind = result.get("kind", "")
    s = result.get("summary") or {}
    lines: list[str] = []
    drop_task = (result.get("config") or {}).get("drop_task", "MMLU")
    if kind == "prune":
        if "minimal_layers" in s:
            lines.append(
                f"Minimal model: <b>{_e(s['minimal_layers'])} layers</b> (0-{_e(s['minimal_layers'] - 1)}); "
                f"the largest one-step {_e(drop_task)} drop is when layer <b>{_e(s.get('critical_layer'))}</b> is removed "
                f"({_pct(s.get('drop_from'))} → {_pct(s.get('drop_to'))})"
                + ("." if s.get("significant", True) else
                   " — <i>not significant</i> (the Wilson intervals overlap: the curve may be flat noise).")
            )
    elif kind == "remove_restore":
        if s.get("critical_layers") is not None:
            lines.append(f"Layers whose removal hurts MMLU most: <b>{_e(s['critical_layers'])}</b>.")
    elif kind == "transplant":
        if "best_layer" in s:
            lines.append(
                f"Best transplant: layer <b>{_e(s['best_layer'])}</b>, {_pct(s.get('best_accuracy'))} "
                f"vs baseline {_pct(s.get('baseline_accuracy'))}."
            )
    elif kind == "sweep":
        if s.get("top_head"):
            lines.append(f"Most critical head: <b>{_e(s['top_head'])}</b> (ablating it costs {_pct(s.get('top_drop'))} "
                         f"of {_pct(s.get('baseline_acc'))}).")
    elif kind == "retain":
        both, none = s.get("both") or {}, s.get("none") or {}
        for t in ("mmlu", "lab-mmlu"):
            if t in both:
                lines.append(f"{_e(t)} with both critical heads kept: <b>{_pct(both[t])}</b>; with none: "
                             f"<b>{_pct(none.get(t))}</b>.")
    elif kind == "mask_last_row":
        for t in ("mmlu", "lab-mmlu", "knowledge", "lab-knowledge"):
            if s.get(f"{t}_intact") is not None:
                last = f"; last scored position masked <b>{_pct(s[f'{t}_masked_last'])}</b>" if f"{t}_masked_last" in s else ""
                lines.append(f"{_e(t)} intact <b>{_pct(s[f'{t}_intact'])}</b> → last prompt token masked "
                             f"<b>{_pct(s.get(f'{t}_masked'))}</b>{last}.")
    elif kind == "kv_curve":
        if "mean_gap" in s:
            lines.append(f"Mean accuracy lost by ablating the heads: <b>{_pct(s['mean_gap'])}</b>.")
        for name, fall in (s.get("fall") or {}).items():
            lines.append(f"{_e(name)}: loses <b>{_pct(fall)}</b> from the fewest to the most pairs "
                         f"(at the most: {_pct((s.get('at_max_pairs') or {}).get(name))}).")
    elif kind == "roles":
        for role in ("gather", "aggregate"):
            if s.get(role):
                lines.append(f"{role.capitalize()} head <b>{_e(s[role])}</b>: {_pct(s.get('baseline'))} → "
                             f"<b>{_pct(s.get(f'{role}_ablated'))}</b> (control task {_pct(-(s.get(f'{role}_control_drop') or 0))} "
                             f"change); {role} heads: {_e(', '.join(s.get(f'{role}_heads') or []))}.")
        if "heads_to_chance" in s:
            lines.append(f"Heads ablated together (most damaging first) to reach chance: "
                         f"<b>{_e(s['heads_to_chance'] or 'more than ' + str(s.get('heads_to_chance_max')))}</b>.")
    elif kind == "lab_findings":
        for key, label in (("reproduced", "Reproduced"), ("partly", "Partly reproduced"), ("not", "Not reproduced")):
            lines.append(f"{label}: <b>{_e(', '.join(str(x) for x in s.get(key) or []) or 'none')}</b>")
        if s.get("seconds") is not None:
            lines.append(f"The programme ran in {float(s['seconds']):.0f} s.")
    if not lines:
        return ""
    return '<div class="headline">' + "<br>".join(lines) + "</div>"


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _csv_table(path: Path) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return ""
    body = records_table(rows, MAX_CSV_ROWS)
    return f"<details><summary>{_e(path.name)} ({len(rows)} rows)</summary>{body}</details>"


def _fallback_figures(result: dict[str, Any], tmp: Path) -> list[Path]:
    """Draw figures for a run dir that has none, when its kind knows how.

    Any result with ``tokens`` and ``maps`` (head -> matrix, optional ``map_kinds``) gets G&A
    attention panels; experiment kinds redraw themselves from their JSON.
    """
    if isinstance(result.get("maps"), dict) and isinstance(result.get("tokens"), list) and result["maps"]:
        try:
            from .figures import attention_panels

            return [attention_panels(result["maps"], result["tokens"], result.get("map_kinds") or {},
                                     tmp / "attention.png", rows=result.get("rows") if isinstance(
                                         result.get("rows"), list) and all(isinstance(r, int) for r in result["rows"]) else None)]
        except Exception:  # noqa: BLE001
            return []
    try:
        from ..experiments import draw_result
    except Exception:  # noqa: BLE001 - the report must render even if experiments cannot import
        return []
    try:
        return list(draw_result(result, tmp))
    except Exception:  # noqa: BLE001
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
    if not rfile.exists() and (run_dir / "results.jsonl").exists():
        result = sweep_result(run_dir / "results.jsonl")
    elif rfile.exists():
        try:
            result = json.loads(rfile.read_text())
        except json.JSONDecodeError as exc:
            result = {"kind": "?", "error": f"result.json is not valid JSON: {exc}"}
    else:
        result = {"kind": "?", "error": "no result.json in this directory"}
    if not isinstance(result, dict):
        result = {"kind": "?", "value": result}
    kind = result.get("kind", "?")
    parts = [f'<section class="run" id="run{index}"><h2>{_e(kind)} — {_e(run_dir.name)}</h2>']
    meta = {k: result[k] for k in ("model", "command", "seed", "ganda_version", "created") if k in result}
    parts.append('<div class="meta">' + " · ".join(f"{_e(k)}: <code>{_e(v)}</code>" for k, v in meta.items()) + "</div>")
    parts.append(headline(result))
    pngs = sorted(run_dir.glob("*.png"))
    with tempfile.TemporaryDirectory() as td:
        if not pngs and rfile.exists():
            pngs = _fallback_figures(result, Path(td))
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
