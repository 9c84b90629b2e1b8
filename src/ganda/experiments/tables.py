"""The tables ``ganda NAME`` prints for a reader (:meth:`ganda.experiments.base.Experiment.show`):
rich tables on a terminal, and lines that never wrap in a log file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..attribution.ranking import sign_flip_sentence
from ..effects import NAMES
from ..intervals import bounds
from ..patterns import top_reads
from .common import interval_text

#: the width of a table printed to a file or pipe (a log): wide enough that no cell wraps or is cut
LOG_WIDTH = 1000


def console() -> Any:
    """A rich Console for a command's tables on stdout: the terminal's width on a terminal, and
    :data:`LOG_WIDTH` columns in a file or pipe, where rich would otherwise wrap at 80."""
    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)


def print_split(con: Any, table: Any, matter: list[Any], helpful: list[Any], top: int, what: str,
                heads: str = "head") -> None:
    """The heads that matter (ablation lowers ``what``), then those helpful when ablated, each as
    ``table(rows, title)``; one line where no ``heads`` qualifies. Shared by ``sweep`` and ``rank``."""
    if matter:
        con.print(table(matter[:top], f"heads that matter: top {min(top, len(matter))} of {len(matter)}, "
                                      f"by {what} drop when ablated"))
    else:
        con.print(f"no {heads}'s ablation lowers the {what}")
    if helpful:
        con.print(table(helpful[:top], f"helpful when ablated: {len(helpful)} head(s) whose ablation raises the {what}"))


def _num(v: float | None, spec: str = "+.4f") -> str:
    """A number in a table cell (``spec``: its format), ``-`` where there is none."""
    return "-" if v is None else format(v, spec)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


# ---- sweep ----------------------------------------------------------------------------------

def _sweep_table(res: Any, rows: list, title: str) -> Any:
    """One table of heads: their accuracies and the drops of accuracy and mean margin when ablated,
    each drop with its paired 95% interval over the prompts."""
    table = Table(title=title)
    for col in ("rank", "head", "acc", "acc drop [paired 95% CI]", "margin drop [paired 95% CI]", "acc_norm",
                "drop_norm", "gold logp drop"):
        table.add_column(escape(col), justify="right")  # escaped: rich reads "[paired ...]" as markup
    cis = res.intervals()
    for i, r in enumerate(rows, 1):
        ci = cis.get(r["head"], {})
        table.add_row(str(i), r["head"], f"{r['acc']:.3f}", f"{res.drop(r):+.3f}{interval_text(bounds(ci, 'drop'), 1)}",
                      f"{res.drop(r, 'margin'):+.4f}{interval_text(bounds(ci, 'margin_drop'), 1)}",
                      f"{r['acc_norm']:.3f}", f"{res.drop(r, 'acc_norm'):+.3f}", f"{res.ll_drop(r):+.3f}")
    return table


def print_sweep(con: Any, res: Any, options: Any, run: Any, out_dir: Path) -> None:
    """The intact accuracy, the heads that matter and those helpful when ablated, and the cumulative
    ablation of ``--until-chance``."""
    b = res.baseline
    con.print(f"[bold]{run.model}[/bold] on {run.task} (n={b['n']}): intact acc {b['acc']:.3f}"
              f" (acc_norm {b['acc_norm']:.3f}); {len(res.records)} heads {options.ablation}-ablated in {res.seconds:.1f} s")
    print_split(con, lambda rows, title: _sweep_table(res, rows, title), res.matter(), res.helpful_when_ablated(),
                options.top, NAMES[res.metric])
    con.print(f"wrote {out_dir}/results.jsonl, results.csv, heatmap.png, result.json")
    cum = getattr(res, "cumulative", None)
    if not cum:
        return
    last = cum["curve"][-1] if cum["curve"] else None
    if cum.get("baseline_at_chance"):
        con.print(f"cumulative ablation: {cum['note']}; wrote {out_dir}/cumulative.json")
    elif last is not None:
        verdict = "reached" if cum["reached_chance"] else "did not reach"
        con.print(f"cumulative ablation {verdict} chance ({cum['chance']:.3f} + {cum['margin']:.2f}) "
                  f"with {last['n_heads']} heads: acc {last['accuracy']:.3f}; wrote {out_dir}/cumulative.json")


# ---- rank -----------------------------------------------------------------------------------

def _rank_table(res: Any, heads: list[str], title: str) -> Any:
    """One table of verified heads: estimate, exact margin drop, exact accuracy drop and both ranks."""
    table = Table(title=title)
    for col in ("rank", "head", "estimate", "margin drop [paired 95% CI]", "acc drop [paired 95% CI]",
                "rank by estimate", "rank by exact"):
        table.add_column(escape(col), justify="right")
    rows = {r["head"]: r for r in res.rows()}
    for i, h in enumerate(heads, 1):
        row = rows[h]
        table.add_row(str(i), h, _num(row["estimate"]), _num(row["exact"]) + interval_text(bounds(row, "exact"), 1),
                      _num(row["acc_drop"]) + interval_text(bounds(row, "acc_drop"), 1),
                      str(row["rank_estimate"] or "-"), str(row["rank_exact"] or "-"))
    return table


def print_ranking(con: Any, res: Any, options: Any, run: Any, out_dir: Path) -> None:
    """How the heads were ranked, the verified heads that matter and those helpful when ablated,
    the false-negative bound and the sign flips between estimate and exact effect."""
    s = res.seconds
    timing = ", ".join(f"{k} {s[k]:.1f} s" for k in ("attribution", "screen", "verification", "total") if k in s)
    blocks = res.config.get("graddrop_blocks")
    how = f"{options.method} (GradDrop over {blocks} blocks of layers)" if blocks else options.method
    if res.config.get("ig_steps"):
        how = f"{options.method} ({res.config['ig_steps']} steps)"
    n = res.config.get("n")
    con.print(f"[bold]{run.model}[/bold] on {run.task} (n={n}), {how}, {options.ablation}-ablation, "
              f"{options.margin} margin {res.clean:+.3f}; {len(res.heads)} heads, {len(res.exact)} verified"
              + (f" ({res.config['widened']} by --widen)" if res.config.get("widened") else "") + f"; {timing}")
    print_split(con, lambda rows, title: _rank_table(res, rows, title), res.matter(), res.helpful_when_ablated(),
                options.top, f"{res.margin} margin", heads="verified head")
    if res.bound is not None and res.audited:
        con.print(f"bound: {res.bound.sentence()}")
    elif res.bound is not None:
        con.print("bound: none without an audit (--audit N verifies N random unverified heads for one)")
    if flips := sign_flip_sentence(res.sign_flips()):
        con.print(f"sign: {flips}")
    con.print(f"wrote {out_dir}/ranking.json, ranking.csv" + (", scatter.png" if res.estimate and res.exact else "")
              + (", verify_heatmap.png" if res.exact else "") + ", result.json")


# ---- path and edges -------------------------------------------------------------------------

def print_path(res: Any, options: Any, run: Any) -> None:
    """Accuracy and margin of each condition with each drop's paired 95% interval."""
    s = res.summary
    print(f"{run.model} on {run.task} (n={s['n']}): {s['sender']} -> {s['receiver']}, {s['paths']} paths, "
          f"{options.margin} margin, {options.ablation}-ablation")
    print(f"{'condition':24s} {'accuracy [95% CI]':>22s} {'drop, paired CI':>22s} {'margin':>8s} "
          f"{'margin drop, paired CI':>28s}")
    for r in res.rows:
        drop = f"{_pct(r['drop'])}{interval_text(bounds(r, 'drop'))}" if "drop" in r else ""
        mdrop = f"{r['margin_drop']:.3f}{interval_text(bounds(r, 'margin_drop'), 1)}" if "margin_drop" in r else ""
        print(f"{r['condition']:24s} {_pct(r['accuracy']) + interval_text(bounds(r, 'accuracy')):>22s} {drop:>22s} "
              f"{r['margin']:8.3f} {mdrop:>28s}")


def print_edges(res: Any, options: Any, run: Any) -> None:
    """The top edges: estimate, exact effect with its paired interval, accuracy drop, the two heads' roles."""
    s = res.summary
    print(f"{run.model} on {run.task} (n={s['n']}): {s['edges']:,} edges, {s['verified']} verified, "
          f"{options.ablation}-ablation, edge attribution {s['attribution_cpu']:.1f} CPU s, exact checks "
          f"{s['verification_cpu']:.1f} CPU s")
    print(f"{'edge':>22s} {'estimate':>9s} {'exact [paired 95% CI]':>28s} {'acc. drop':>9s} {'roles':>20s}")
    roles_of = res.extra.get("roles") or {}
    for r in res.rows[:options.top]:
        exact = f"{r['exact']:.3f}{interval_text(bounds(r, 'exact'), 1)}" if r["exact"] is not None else "-"
        acc = _pct(r["accuracy_drop"]) if r["accuracy_drop"] is not None else "-"
        who = f"{roles_of.get(r['sender'], '')} > {roles_of.get(r['receiver'], '')}" if roles_of else ""
        print(f"{r['edge']:>22s} {r['estimate']:9.3f} {exact:>28s} {acc:>9s} {who:>20s}")
    if s.get("bound"):
        print(s["bound"])


# ---- heads -------------------------------------------------------------------------------------

def _reads(read: dict) -> str:
    """The two largest parts of a read profile, e.g. ``gold_last .62, other_last .21``."""
    return ", ".join(f"{k} {v:.2f}" for k, v in top_reads(read, 2))


def print_heads(con: Any, d: Any) -> None:
    """The baseline, the summary token chosen, the top candidates of each role with every score and
    their ablation, and the labels of every head."""
    con.print(f"baseline accuracy {d.baseline_accuracy:.3f} on {d.n_verify} prompts; summary token: {d.summary}"
              + (" (chosen from the final rows: best aggregate " + ", ".join(
                  f"{k} {v['aggregate']:.3f}{interval_text(bounds(v, 'aggregate'), 1)} {v['head']}" for k, v in d.summary_choice.items()) + ")"
                 if d.summary_choice else ""))
    for role, names in (("Aggregate", d.top_aggregate), ("Gather", d.top_gather)):
        tab = Table(title=f"top {role} candidates")
        for col in ("head", "label", "aggregate", "gather [evidence]", "induction", "prev-token", "sink",
                    "agg peak [95% CI]", "final row reads", "ablated acc", "drop"):
            tab.add_column(escape(col))  # "[evidence]" is not rich markup
        by = {s.head: s for s in d.scores}
        for name in names:
            s = by[name]
            low, high = s.aggregate_peak_ci_low, s.aggregate_peak_ci_high
            peak = f"{s.aggregate_peak:.2f}" + (f" [{low:.2f}, {high:.2f}]" if low is not None else "")
            ev = f" [{s.gather_evidence:.3f}]" if s.gather_evidence is not None else ""
            tab.add_row(name, s.label or "-", f"{s.aggregate:.3f}", f"{s.gather:.3f}{ev}", _num(s.induction, ".3f"),
                        _num(s.previous_token, ".3f"), _num(s.sink, ".3f"), peak, _reads(s.read),
                        _num(s.ablated_accuracy, ".3f"), _num(s.drop, "+.3f"))
        con.print(tab)
    order = sorted(d.scores, key=lambda s: (s.layer, len(s.head), s.head))
    named = [f"{s.head} {s.label}" for s in order if s.label not in (None, "none", "sink")]
    sinks = sum(s.label == "sink" for s in order)
    con.print("labels: " + (", ".join(named) if named else "none but sink" if sinks else "none (no rule met: docs/heads.md)")
              + (f"; sink alone: {sinks} of {len(order)} heads" if sinks else ""))


__all__ = ["LOG_WIDTH", "console", "print_heads", "print_edges", "print_path", "print_ranking", "print_split", "print_sweep"]
