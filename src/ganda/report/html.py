"""One self-contained HTML page for one or more run directories.

A run directory holds ``result.json`` (at least ``{"kind": ..., "model": ...}``) plus any ``*.png``
and ``*.csv`` files, and maybe attention maps saved as JSON (:mod:`.viewer`). The page has no
external references at all: CSS and the attention viewer's script are inline, PNGs are inlined as
base64 ``data:`` URIs, and nothing is fetched from a CDN, so it can be mailed or archived as one
file and opened offline. The markup lives in jinja2 templates (``templates/``, package data).

Each run section reads top to bottom as a reader asks: what was found (the result class's
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
import math
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import experiments as _experiments  # noqa: F401  (registers the built-in result kinds)
from .. import registry, runio
from ..attribution.ranking import RankResult, sign_flip_sentence
from ..effects import NAMES, effect, helpful_when_ablated, matters, mean_margin_or_nan, ordered
from ..errors import GandaError
from ..figures import attention_panels
from ..stats import weak_note
from . import viewer

log = logging.getLogger(__name__)

MAX_ROWS = 200  # longest table rendered in full; longer ones are cut with a note
MAX_CSV_ROWS = 60
FOLD_COLUMNS = 8  # tables wider than this, or longer than FOLD_ROWS, are folded in <details>
FOLD_ROWS = 12
TEMPLATES = Path(__file__).parent / "templates"

#: kind -> what its section is called (the kind itself where not listed)
KIND_TITLES = {
    "demo": "G&A heads found, verified and ablated",
    "heads": "Heads ranked by Gather and Aggregate pattern scores",
    "sweep": "Every head ablated alone",
    "sharpness": "G&A map sharpness compared",
    "prune": "Layer pruning curve",
    "remove_restore": "One layer removed and restored",
    "retain": "Only the critical heads kept",
    "kv_curve": "KV retrieval against the number of pairs",
    "mask_last_row": "Attention's last row masked",
    "transplant": "Donor layers transplanted",
    "roles": "Gather or Aggregate, by where a head matters",
    "circuit_path": "One head's effect along its paths into another",
    "circuit_edges": "The circuit: which head feeds which",
    "lab_findings": "The paper's findings on the lab models",
    "rank": "Heads ranked by attribution, the top verified exactly",
    "lab_models": "The lab models",
}


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


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def records_table(rows: Sequence[dict[str, Any]], max_rows: int = MAX_ROWS) -> str:
    """A list of dicts as an HTML table (columns in first-seen order)."""
    return environment().get_template("macros.html.j2").module.table(_columns(rows), rows, max_rows)


def kv_table(d: dict[str, Any]) -> str:
    return environment().get_template("macros.html.j2").module.kv(d)


def render_value(name: str, v: Any, depth: int = 0) -> str:
    """Render one JSON value: scalars inline, lists of dicts as tables, dicts as sub-sections."""
    return environment().get_template("macros.html.j2").module.value(name, _shown(v), depth, _columns)


def _shown(v: Any) -> Any:
    """``v`` with empty values left out of every dict, at any depth."""
    if isinstance(v, dict):
        return {k: _shown(x) for k, x in v.items() if not is_empty(x)}
    return v


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, int | float) else str(x)


def _points(x: Any) -> str:
    return f"{100 * x:.1f} points" if isinstance(x, int | float) else "?"


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
        partial = (f"**Partial sweep**: {s.get('heads')} of {s.get('heads_total') or '?'} heads measured so far; "
                   "rerun the same command to finish it." if s.get("partial") else "")
        if not s.get("top_head"):
            return partial
        base, drop = s.get("baseline_acc"), s.get("top_drop")
        weak = weak_note(base, base - drop, s.get("n")) if isinstance(base, float | int) and isinstance(
            drop, float | int) else ""
        lines = [partial] if partial else []
        also = (f"lowers the mean margin by {s['top_margin_drop']:+.3f} and " if s.get("metric") == "margin"
                and _number(s.get("top_margin_drop")) else "")
        lines += [f"Most critical head: **{s['top_head']}**; ablating it alone {also}costs {_points(drop)} of {_pct(base)}"
                 f"{' on ' + str(s['n']) + ' prompts' if s.get('n') else ''}{weak}."]
        if s.get("heads_to_chance"):
            lines.append(f"Heads ablated together, most damaging first, to reach chance: **{s['heads_to_chance']}**.")
        if helpful := helped_sentence(s.get("helpful_when_ablated"), NAMES.get(s.get("metric", "acc"), "accuracy")):
            lines.append(helpful)
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        return []


def helped_sentence(heads: Sequence[str] | None, what: str, shown: int = 5) -> str:
    """``"Helpful when ablated: ablating L3H1 or L0H2 alone raises the accuracy."``, or ``""``."""
    if not heads:
        return ""
    more = f" (and {len(heads) - shown} more)" if len(heads) > shown else ""
    return f"Helpful when ablated: ablating {' or '.join(heads[:shown])}{more} alone raises the {what}."


class RankRun:
    """A head ranking's ``ranking.json`` as summarised by :func:`rank_result`; with the file's
    ``path`` it draws the ranking's figures (:data:`FIGURES`)."""

    FIGURES = ("scatter.png", "verify_heatmap.png")

    def __init__(self, d: dict[str, Any], path: Path | None = None) -> None:
        self.summary = d.get("summary") or {}
        self.path = path

    def headline(self) -> str:
        s = self.summary
        helpful = helped_sentence(s.get("helpful_when_ablated"), f"{s.get('margin', '?')} margin")
        if not s.get("top_head") or not isinstance(s.get("top_exact"), int | float):
            return f"No verified head's ablation lowers the {s.get('margin', '?')} margin. {helpful}" if helpful else ""
        clean = f" (intact {s['clean']:+.3f})" if isinstance(s.get("clean"), int | float) else ""
        flips = sign_flip_sentence(s.get("sign_flips") or [])
        return (f"Largest exact effect: **{s['top_head']}**; ablating it alone lowers the {s.get('margin', '?')} "
                f"margin by {s['top_exact']:+.3f}{clean}; {s.get('verified', '?')} heads verified exactly"
                + (f"; {flips}." if flips else ".") + (f" {helpful}" if helpful else ""))

    def draw(self, out_dir: Path) -> list[Path]:
        """The estimate-vs-exact scatter and the verified heads' heat map (none without exact effects)."""
        rank = RankResult.from_json(_read_json(self.path)) if self.path is not None else None
        if rank is None or not rank.exact:
            return []
        drawn = []
        if rank.estimate:
            rank.scatter(out_dir / "scatter.png")
            drawn.append(out_dir / "scatter.png")
        return [*drawn, rank.verify_heatmap(out_dir / "verify_heatmap.png")]


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _csv(path: Path) -> dict[str, Any] | None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {"name": path.name, "rows": rows, "columns": _columns(rows)} if rows else None


def _fallback_figures(result: dict[str, Any], obj: Any, tmp: Path) -> list[Path]:
    """Draw figures for a run dir that has none, when its kind knows how.

    Any result with ``tokens`` and ``maps`` (head -> matrix, optional ``map_kinds``) gets G&A
    attention panels; registered kinds redraw themselves from their JSON.
    """
    if isinstance(result.get("maps"), dict) and isinstance(result.get("tokens"), list) and result["maps"]:
        rows = result.get("rows")
        rows = rows if isinstance(rows, list) and all(isinstance(r, int) for r in rows) else None
        try:
            return [attention_panels(result["maps"], result["tokens"], result.get("map_kinds") or {},
                                     tmp / "attention.png", rows=rows, roles=viewer.result_roles(result))]
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
COST_KEYS = ("seconds", "cpu_seconds", "cpu_seconds_by_phase")  # shown in the page's closing Cost section
VIEWER_KEYS = {"maps", "tokens", "map_kinds"}  # shown by the attention viewer, not as tables
META_KEYS = ("model", "command", "seed", "ganda_version", "created")
HEAVY = ("pred", "pred_norm", "gold", "loglik", "predictions")


def _records(path: Path, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; any line that is not one is an error naming it. With
    ``torn_tail`` (a journal a run may still be writing) a last line without its newline is left out."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise GandaError(f"{path}: cannot read it ({exc})") from None
    if torn_tail and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise GandaError(f"{path}, line {i}: not a JSON object; the file is damaged or not ganda's")
        out.append(rec)
    return out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def sweep_result(path: Path, top: int = 20, partial: bool = False) -> dict[str, Any]:
    """A head sweep's ``results.jsonl`` (header, baseline, one record per head) as a result dict:
    the heads whose ablation costs the most accuracy first, per-prompt lists left out. A file that
    is not a finished sweep is one error naming what it lacks. ``partial``: ``path`` is the journal
    (``progress.jsonl``) of a sweep that has not finished, read as far as it goes."""
    lines = _records(path, torn_tail=partial)
    header = next((x for x in lines if x.get("type") == "header"), None)
    base = next((x for x in lines if x.get("type") == "baseline"), None)
    recs = [x for x in lines if x.get("type") not in ("header", "baseline")]
    if header is None or not isinstance(header.get("config"), dict) or base is None or not _number(base.get("acc")):
        what = "a sweep's journal with its baseline" if partial else "a finished sweep"
        raise GandaError(f"{path} is not {what} (no header with its config, or no baseline with its accuracy)")
    if any(not isinstance(r.get("head"), str) or not _number(r.get("acc")) for r in recs):
        raise GandaError(f"{path} holds a head record without its head or accuracy; the file is damaged")
    metric = header.get("metric", "acc")
    slim = _sweep_rows(base, recs, metric)
    matter = [r for r in slim if matters(r.get(_drop_key(metric)))]
    helpful = [r["head"] for r in reversed(slim) if helpful_when_ablated(r.get(_drop_key(metric)))]
    b = base["acc"]
    cfg = header["config"]
    out: dict[str, Any] = {
        "kind": "sweep",
        "model": cfg.get("model", "?"),
        "summary": {"baseline_acc": b, "n": base.get("n"), "heads": len(recs), "metric": metric,
                    "top_head": matter[0]["head"] if matter else None, "top_drop": matter[0]["drop"] if matter else None,
                    "top_margin_drop": matter[0].get("margin_drop") if matter else None,
                    "helpful_when_ablated": helpful,
                    **({"partial": True, "heads_total": len(cfg.get("heads") or []) or None} if partial else {})},
        "top_heads": slim[:top],
        "config": {k: v for k, v in cfg.items() if k != "heads"},
    }
    cum = path.parent / "cumulative.json"
    if cum.is_file():  # ``ganda sweep --until-chance``
        c = _read_json(cum)
        out["summary"]["heads_to_chance"] = c.get("heads_to_chance")
        out["cumulative_ablation"] = c.get("curve", [])
    return out


def _drop_key(metric: str) -> str:
    """The column of a sweep's head rows that holds the effect on ``metric``."""
    return "drop" if metric == "acc" else f"{metric}_drop"


def _sweep_rows(base: dict[str, Any], recs: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """A sweep's head records without their per-prompt lists, with each head's effects (``drop``:
    accuracy; ``acc_norm_drop`` and ``margin_drop`` where the record holds what they need), by signed
    effect on ``metric``, largest first."""
    def margin(r: dict[str, Any]) -> float | None:
        ok = isinstance(r.get("loglik"), list) and isinstance(r.get("gold"), list)
        m = mean_margin_or_nan(r["loglik"], r["gold"]) if ok else math.nan
        return None if math.isnan(m) else m

    m0 = margin(base)
    rows = []
    for r in recs:
        row = {k: v for k, v in r.items() if k not in HEAVY and k != "type"}
        m = margin(r)
        row["drop"] = effect(base["acc"], r["acc"])
        if m0 is not None and m is not None:
            row["margin_drop"] = effect(m0, m)
        if _number(r.get("acc_norm")) and _number(base.get("acc_norm")):
            row["acc_norm_drop"] = effect(base["acc_norm"], r["acc_norm"])
        rows.append(row)
    key = {r["head"]: r.get(_drop_key(metric)) or 0.0 for r in rows}
    by = {r["head"]: r for r in rows}
    return [by[h] for h in ordered(key)]


def _sign_flips(d: dict[str, Any]) -> list[dict[str, Any]]:
    """A ranking's verified heads with the estimate's opposite sign (as it recorded them)."""
    flips = d.get("sign_flips")
    ok = isinstance(flips, list) and all(isinstance(f, dict) and _number(f.get("estimate")) and _number(f.get("exact"))
                                         and "head" in f for f in flips)
    return flips if ok else []


def rank_result(path: Path, top: int = 20) -> dict[str, Any]:
    """A head ranking's ``ranking.json`` (``ganda rank``) as a result dict: its summary, the head
    with the largest exact effect, the top of the ranking."""
    d = _read_json(path)
    rows = d.get("ranking")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "head" in r for r in rows):
        raise GandaError(f"{path} is not a ganda ranking (no list of ranked heads)")
    best = next((r for r in rows if _number(r.get("exact")) and matters(r["exact"])), None)  # rows: largest first
    summary = {k: d.get(k) for k in ("method", "ablation", "margin", "clean", "n", "spearman_verified")}
    summary["helpful_when_ablated"] = [r["head"] for r in sorted(
        (r for r in rows if _number(r.get("exact")) and helpful_when_ablated(r["exact"])), key=lambda r: r["exact"])]
    summary.update({"verified": d.get("verified"), "heads": len(rows), "top_head": best["head"] if best else None,
                    "top_exact": best["exact"] if best else None, "sign_flips": _sign_flips(d)})
    return {"kind": "rank", "model": d.get("model", "?"), "summary": summary, "top_heads": rows[:top],
            "bound": d.get("bound"), "config": d.get("config")}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GandaError(f"{path} is not valid JSON ({exc}); the file is damaged or not ganda's") from None
    if not isinstance(d, dict):
        raise GandaError(f"{path} is not a ganda result (a JSON {type(d).__name__}, not an object)")
    return d


#: the files that make a directory a run the report can show, in the order they are read (the
#: journal last: a sweep that has not finished yet)
RESULT_FILES = ("result.json", "results.jsonl", "ranking.json", "progress.jsonl")


def has_results(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's results (``result.json``, a sweep's ``results.jsonl``, a
    ranking's ``ranking.json``, or the ``progress.jsonl`` of a sweep still under way)."""
    return any((Path(run_dir) / f).is_file() for f in RESULT_FILES)


def _read_result(run_dir: Path) -> tuple[dict[str, Any], Any]:
    """The run's result dict and its result object (None when its kind is not registered); a result
    file that cannot be read is one error, never a page that shows it."""
    rfile = run_dir / "result.json"
    if not rfile.exists() and (run_dir / "results.jsonl").exists():
        result = sweep_result(run_dir / "results.jsonl")
        return result, SweepRun.from_json(result)
    if not rfile.exists() and (run_dir / "ranking.json").exists():
        result = rank_result(run_dir / "ranking.json")
        return result, RankRun(result, run_dir / "ranking.json")
    if not rfile.exists() and (run_dir / "progress.jsonl").exists():
        result = sweep_result(run_dir / "progress.jsonl", partial=True)
        return result, SweepRun.from_json(result)
    if not rfile.exists():
        return {"kind": "?", "error": "no result.json in this directory"}, None
    result = _read_json(rfile)
    return result, _result_object(result)


def _viewer(run_dir: Path, result: dict[str, Any], uid: str) -> dict[str, Any] | None:
    """The run's attention maps as an embedded viewer (None: the run saved no maps)."""
    docs = [(path.stem, doc) for path, doc in viewer.read_attention_files(run_dir)]
    from_result = viewer.result_attention(result)
    if from_result is not None:
        docs.append(("result", from_result))
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
    result, obj = _read_result(run_dir)
    kind = str(result.get("kind", "?"))
    meta = {k: result[k] for k in META_KEYS if k in result}
    pngs = sorted(run_dir.glob("*.png"))
    if not pngs and (run_dir / "result.json").exists():
        pngs = _fallback_figures(result, obj, tmp)
    elif isinstance(obj, RankRun) and not set(RankRun.FIGURES) <= {p.name for p in pngs}:
        pngs += [p for p in _fallback_figures(result, obj, tmp) if not (run_dir / p.name).exists()]
    view = _viewer(run_dir, result, f"gv{index}")
    skip = SKIP_KEYS | set(meta) | (VIEWER_KEYS if view else set())
    summary, cost = _split_cost(result.get("summary"))
    rest, top_cost = _split_cost({k: v for k, v in result.items() if k not in skip and not is_empty(v)})
    return {
        "index": index, "kind": kind, "dir": run_dir.name, "model": result.get("model"),
        "title": KIND_TITLES.get(kind, kind) + (" (partial: not finished)" if _partial(summary) else ""),
        "meta": meta,
        "headline": _safe(headline_html(obj.headline() if obj is not None else "")),
        "viewer": view,
        "figures": [{"name": p.name, "uri": _png_data_uri(p)} for p in pngs],
        "summary": _shown(summary) if isinstance(summary, dict) and summary else None,
        "scalars": {k: v for k, v in rest.items() if not isinstance(v, dict | list)},
        "blocks": {k: _shown(v) for k, v in rest.items() if isinstance(v, dict | list)},
        "csvs": [c for c in (_csv(p) for p in sorted(run_dir.glob("*.csv"))) if c],
        "raw": json.dumps(result, indent=1, default=str),
        "cost": _shown({**top_cost, **cost}),
    }


def _split_cost(d: Any) -> tuple[Any, dict[str, Any]]:
    """``d`` without its :data:`COST_KEYS`, and those keys (a value that is no dict: itself, no cost)."""
    if not isinstance(d, dict):
        return d, {}
    return ({k: v for k, v in d.items() if k not in COST_KEYS},
            {k: d[k] for k in COST_KEYS if k in d and not is_empty(d[k])})


def _partial(summary: Any) -> bool:
    return isinstance(summary, dict) and summary.get("partial") is True


def render_run(run_dir: Path, index: int) -> str:
    """One run's ``<section>``."""
    return _render_run(run_dir, index)[0]


def _render_run(run_dir: Path, index: int) -> tuple[str, dict[str, Any]]:
    """One run's ``<section>`` and its entry in the page's Cost section (``cost`` empty: none)."""
    with tempfile.TemporaryDirectory() as td:
        ctx = run_context(run_dir, index, Path(td))
        html_ = environment().get_template("run.html.j2").render(run=ctx, columns=_columns, max_rows=MAX_ROWS,
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
        costs=[c for _, c in rendered if c["cost"]], columns=_columns,
        sections=[_safe(s) for s in sections], stamp=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        css=_safe((TEMPLATES / "report.css").read_text()),
        viewer_css=_safe((TEMPLATES / "viewer.css").read_text()) if has_viewer else "",
        viewer_js=_safe((TEMPLATES / "viewer.js").read_text()) if has_viewer else "")


def write_report(run_dirs: list[Path], out: Path, title: str = "ganda report") -> Path:
    """Write one self-contained HTML page covering every run directory; returns ``out``."""
    out = Path(out)
    runs = [Path(d) for d in run_dirs]
    if not any(has_results(d) for d in runs):
        names = ", ".join(str(d) for d in runs) or "none given"
        raise GandaError(f"nothing to report: no result.json, results.jsonl, ranking.json or a sweep's "
                         f"progress.jsonl in {names}")
    runio.write_text(out, render_page(runs, title))
    return out
