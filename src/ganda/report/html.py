"""One self-contained HTML page for one or more run directories.

A run directory holds ``result.json`` (at least ``{"kind": ..., "model": ...}``) plus any ``*.png``
and ``*.csv`` files, and maybe attention maps saved as JSON (:mod:`.viewer`). The page has no
external references at all: CSS and the attention viewer's script are inline, PNGs are inlined as
base64 ``data:`` URIs, and nothing is fetched from a CDN, so it can be mailed or archived as one
file and opened offline. The markup lives in jinja2 templates (``templates/``, package data).

Each run directory is read by its kind's registered result class (:func:`ganda.experiments.read_run`:
``result.json``, or the files the class reads, a sweep's ``results.jsonl``, a ranking's
``ranking.json``), which also gives the section its ``title``. Each run section reads top to
bottom as a reader asks: what was found (the result class's
``headline()``, :func:`ganda.registry.register_result`), the attention maps to explore (when the
run saved any), the figures (drawn on the fly by the class's ``draw()`` when the run directory
holds no PNG), then the numbers: the summary, every other value (wide or long tables folded),
the CSVs and the raw ``result.json``. What the runs cost (:data:`COST_KEYS`: seconds, CPU seconds
by phase) closes the page in its own section, after every result. Empty values are left out.
Kinds are registered by whoever defines them (``ganda.experiments``, plugins), never here.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import functools
import html
import json
import logging
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import experiments, runio
from ..errors import GandaError
from ..experiments import ExperimentResult
from . import viewer

log = logging.getLogger(__name__)

MAX_ROWS = 200  # longest table rendered in full; longer ones are cut with a note
MAX_CSV_ROWS = 60
FOLD_COLUMNS = 8  # tables wider than this, or longer than FOLD_ROWS, are folded in <details>
FOLD_ROWS = 12
TEMPLATES = Path(__file__).parent / "templates"

def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """The jinja2 environment of the report's templates (autoescaping on)."""
    import jinja2  # the templates are loaded when the first page is written, not when ganda starts

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = lambda v: _safe(_fmt(v))
    env.tests["numeric"] = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    env.tests["records"] = is_records
    env.globals["fold_columns"] = FOLD_COLUMNS
    env.globals["fold_rows"] = FOLD_ROWS
    return env


def _safe(text: str) -> Any:
    from markupsafe import Markup  # jinja2's own dependency

    return Markup(text)


def _fmt(v: Any) -> str:
    """One value as table-cell HTML (escaped; long JSON folded in <details>)."""
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


def is_records(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(r, dict) for r in v)


def is_empty(v: Any) -> bool:
    """Nothing to show: an empty list, dict or string (``interventions: []`` gets no section)."""
    return v is None or (isinstance(v, list | dict | str) and len(v) == 0)


def records_table(rows: Sequence[dict[str, Any]], max_rows: int = MAX_ROWS) -> str:
    """A list of dicts as an HTML table (columns in first-seen order)."""
    return environment().get_template("macros.html.j2").module.table(runio.columns(rows), rows, max_rows)


def _shown(v: Any) -> Any:
    """``v`` with empty values left out of every dict, at any depth."""
    if isinstance(v, dict):
        return {k: _shown(x) for k, x in v.items() if not is_empty(x)}
    return v


def headline_html(text: str) -> str:
    """A result's ``headline()`` as the page's headline box: escaped, ``**x**`` in bold, ``*x*``
    in italics, one line per fact (empty text: no box)."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    marked = [re.sub(r"\*(.+?)\*", r"<i>\1</i>", re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", _e(ln))) for ln in lines]
    return '<div class="headline">' + "<br>".join(marked) + "</div>"


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _csv(path: Path) -> dict[str, Any] | None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {"name": path.name, "rows": rows, "columns": runio.columns(rows)} if rows else None


def _figures(run_dir: Path, obj: ExperimentResult | None, tmp: Path) -> list[Path]:
    """The run's PNGs, and the figures its result class draws where it lacks them: all of them
    for a run directory without any PNG; for a run that lacks one of its class's
    :attr:`~ganda.experiments.ExperimentResult.figures`, the ones it lacks."""
    pngs = sorted(run_dir.glob("*.png"))
    if obj is None or (pngs and set(obj.figures) <= {p.name for p in pngs}):
        return pngs
    try:
        drawn = list(obj.draw(tmp))
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not cost the page
        log.warning("cannot draw the %s result: %s", obj.kind, exc)
        return pngs
    return pngs + [p for p in drawn if not (run_dir / p.name).exists()]


SKIP_KEYS = {"kind", "model", "summary", "panels"}  # panels: figure specs, drawn as PNG
COST_KEYS = ("seconds", "cpu_seconds", "cpu_seconds_by_phase")  # shown in the page's closing Cost section
META_KEYS = ("model", "command", "seed", "ganda_version", "created")


def _viewer(run_dir: Path, result: dict[str, Any], uid: str) -> dict[str, Any] | None:
    """The run's attention maps as an embedded viewer (None: the run saved no maps)."""
    docs = [(path.stem, doc) for path, doc in viewer.read_attention_files(run_dir)]
    if not docs:
        return None
    payload = viewer.viewer_payload(docs, viewer.result_roles(result))
    if not payload["prompts"]:
        return None
    return {"id": uid, "json": _safe(viewer.payload_json(payload)), "omitted": payload["omitted"],
            "heads": sorted({h["name"] for p in payload["prompts"] for h in p["heads"]})}


def run_context(run_dir: Path, index: int, tmp: Path) -> dict[str, Any]:
    """Everything one run's section shows, in the order it shows it."""
    run_dir = Path(run_dir)
    obj = experiments.read_run(run_dir)
    result = obj.page() if obj is not None else {"kind": "?", "error": "no result.json in this directory"}
    kind = obj.kind if obj is not None else "?"
    meta = {k: result[k] for k in META_KEYS if k in result}
    pngs = _figures(run_dir, obj, tmp)
    view = _viewer(run_dir, result, f"gv{index}")
    skip = SKIP_KEYS | set(meta)
    summary, cost = _split_cost(result.get("summary"))
    rest, top_cost = _split_cost({k: v for k, v in result.items() if k not in skip and not is_empty(v)})
    return {
        "index": index, "kind": kind, "dir": run_dir.name, "model": result.get("model"),
        "title": (obj.title if obj is not None and obj.title else kind) + (" (partial: not finished)" if _partial(summary) else ""),
        "meta": meta,
        "headline": _safe(headline_html(_headline(obj))),
        "viewer": view,
        "figures": [{"name": p.name, "uri": _png_data_uri(p)} for p in pngs],
        "summary": _shown(summary) if isinstance(summary, dict) and summary else None,
        "scalars": {k: v for k, v in rest.items() if not isinstance(v, dict | list)},
        "blocks": {k: _shown(v) for k, v in rest.items() if isinstance(v, dict | list)},
        "csvs": [c for c in (_csv(p) for p in sorted(run_dir.glob("*.csv"))) if c],
        "raw": json.dumps(result, indent=1, default=str),
        "cost": _shown({**top_cost, **cost}),
    }


def _headline(obj: ExperimentResult | None) -> str:
    """The result's headline; none where its class cannot make one of what the run holds."""
    try:
        return obj.headline() if obj is not None else ""
    except Exception as exc:  # noqa: BLE001 - a headline that cannot be made must not cost the page
        log.warning("cannot headline the %s result: %s", obj.kind if obj is not None else "?", exc)
        return ""


def _split_cost(d: Any) -> tuple[Any, dict[str, Any]]:
    """``d`` without its :data:`COST_KEYS`, and those keys (a value that is no dict: itself, no cost)."""
    if not isinstance(d, dict):
        return d, {}
    return ({k: v for k, v in d.items() if k not in COST_KEYS},
            {k: d[k] for k in COST_KEYS if k in d and not is_empty(d[k])})


def _partial(summary: Any) -> bool:
    return isinstance(summary, dict) and summary.get("partial") is True


def _render_run(run_dir: Path, index: int) -> tuple[str, dict[str, Any]]:
    """One run's ``<section>`` and its entry in the page's Cost section (``cost`` empty: none)."""
    with tempfile.TemporaryDirectory() as td:
        ctx = run_context(run_dir, index, Path(td))
        html_ = environment().get_template("run.html.j2").render(run=ctx, columns=runio.columns, max_rows=MAX_ROWS,
                                                                 max_csv_rows=MAX_CSV_ROWS)
    return html_, {"title": ctx["title"], "dir": ctx["dir"], "cost": ctx["cost"]}


def render_page(run_dirs: Sequence[Path], title: str = "ganda report") -> str:
    """The whole page for ``run_dirs`` as text: a section per run, then what the runs cost."""
    runs = [Path(d) for d in run_dirs]
    rendered = [_render_run(d, i) for i, d in enumerate(runs)]
    sections = [s for s, _ in rendered]
    env = environment()
    has_viewer = any('class="gv"' in s for s in sections)
    return env.get_template("page.html.j2").render(
        title=title, runs=[{"index": i, "name": d.name} for i, d in enumerate(runs)],
        costs=[c for _, c in rendered if c["cost"]], columns=runio.columns,
        sections=[_safe(s) for s in sections], stamp=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        css=_safe((TEMPLATES / "report.css").read_text()),
        viewer_css=_safe((TEMPLATES / "viewer.css").read_text()) if has_viewer else "",
        viewer_js=_safe((TEMPLATES / "viewer.js").read_text()) if has_viewer else "")


def write_report(run_dirs: list[Path], out: Path, title: str = "ganda report") -> Path:
    """Write one self-contained HTML page covering every run directory; returns ``out``."""
    out = Path(out)
    runs = [Path(d) for d in run_dirs]
    if not any((d / f).is_file() for d in runs for f in experiments.run_files()):  # result.json or a kind's own
        names = ", ".join(str(d) for d in runs) or "none given"
        raise GandaError(f"nothing to report: no {', '.join(experiments.run_files())} in {names}")
    runio.write_text(out, render_page(runs, title))
    return out
