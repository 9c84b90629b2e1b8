"""The results of the per-head analyses that keep their own files: the single-head sweep
(``results.jsonl``, or its journal while it runs) and the attribution ranking (``ranking.json``),
each read, tabled and drawn by its class (:mod:`ganda.experiments.reading`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..attribution.ranking import CI_KEYS, RankResult, sign_flip_sentence
from ..effects import NAMES, ordered, split
from ..errors import GandaError
from ..intervals import bounds
from ..stats import overlap, weak_note
from ..sweep import SweepResult, has_per_prompt_lists, read_sweep
from .common import ExperimentResult, interval_text, pct, points, prediction_row, read_json_object, run_row

TOP = 20  # heads the report lists of a sweep or a ranking
WEAK = " (*weak*: its paired 95% interval includes 0)"  # a headline's top head not told from no effect


@dataclass
class HeadSweepResult(ExperimentResult):
    """A head sweep's run directory: ``results.jsonl`` (:class:`ganda.sweep.SweepResult`), or the
    journal (``progress.jsonl``) of one that has not finished, marked ``partial``."""

    kind: str = "sweep"
    sweep: SweepResult | None = field(default=None, repr=False, compare=False)

    title = "Every head ablated alone"
    files = ("results.jsonl", "progress.jsonl")

    @classmethod
    def read(cls, run_dir: Path) -> HeadSweepResult:
        run_dir = Path(run_dir)
        partial = not (run_dir / "results.jsonl").is_file()
        sw = read_sweep(run_dir / ("progress.jsonl" if partial else "results.jsonl"), partial=partial)
        return cls.of(sw, run_dir, partial)

    @classmethod
    def of(cls, sw: SweepResult, run_dir: Path, partial: bool = False) -> HeadSweepResult:
        """The result of a sweep's numbers and of the cumulative ablation in ``run_dir``, if any:
        every head's row in ``ganda sweep``'s order, with its drops and their intervals, and the
        summary a report and ``result.json`` give."""
        cumulative = Path(run_dir) / "cumulative.json"  # ``ganda sweep --until-chance``
        cumulative = read_json_object(cumulative) if cumulative.is_file() else None
        drop = {"acc": "drop", "acc_norm": "drop_norm"}.get(sw.metric, f"{sw.metric}_drop")
        rows = [sw.row(r) for r in sw.records]
        by = {r["head"]: r for r in rows}
        # ``ganda sweep``'s order (SweepResult.top): signed effect, largest first, ties by the other of
        # accuracy and margin, then head order; an effect an older file lacks counts as 0
        tie = "drop" if sw.metric == "margin" else "margin_drop"
        effects = ({r["head"]: r.get(drop) or 0.0 for r in rows}, {r["head"]: r.get(tie) or 0.0 for r in rows})
        rows = [by[h] for h in ordered(*effects)]
        matter, helpful = split(*effects)
        top = by[matter[0]] if matter else {}
        summary = {"baseline_acc": sw.baseline["acc"], "n": sw.baseline.get("n"), "heads": len(rows), "metric": sw.metric,
                   "top_head": top.get("head"), "top_drop": top.get("drop"), "top_margin_drop": top.get("margin_drop"),
                   **{f"top_{k}": top[k] for k in ("drop_ci_low", "drop_ci_high") if k in top},
                   "helpful_when_ablated": helpful}
        if partial:
            summary.update({"partial": True, "heads_total": len(sw.config.get("heads") or []) or None})
        extra: dict[str, Any] = {}
        if cumulative is not None:
            summary["heads_to_chance"] = cumulative.get("heads_to_chance")
            extra["cumulative_ablation"] = cumulative.get("curve", [])
        return cls(model=sw.config.get("model", "?"), config={k: v for k, v in sw.config.items() if k != "heads"},
                   summary=summary, rows=rows, extra=extra, sweep=sw)

    def page(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "summary": self.summary, "top_heads": self.rows[:TOP],
                "config": self.config, **({"cumulative_ablation": self.extra["cumulative_ablation"]}
                                          if "cumulative_ablation" in self.extra else {})}

    def tables(self, run: str) -> dict[str, list[dict[str, Any]]]:
        """One run row, one head row per head (head order), and every example intact and under each
        head's ablation."""
        sw = self.sweep
        if sw is None:
            return super().tables(run)
        base = sw.baseline
        heads = []
        for r in sw.records:  # a record's "kind" is its head's mixer ("" for attention)
            row = sw.row(r)
            heads.append({"run": run, **{k: v for k, v in row.items() if k != "kind"}, "mixer": row.get("kind") or ""})
        return {"runs": [run_row(run, "sweep", sw.config.get("model"), sw.config.get("task"), base.get("n"), base["acc"],
                                 {"acc_norm": base.get("acc_norm"), "heads": len(sw.records), "seed": sw.config.get("seed"),
                                  **({"partial": True} if self.summary.get("partial") else {})})],
                "heads": heads, "predictions": example_rows(run, sw)}

    def headline(self) -> str:
        s = self.summary
        partial = (f"**Partial sweep**: {s.get('heads')} of {s.get('heads_total') or '?'} heads measured so far; "
                   "rerun the same command to finish it." if s.get("partial") else "")
        if not s.get("top_head"):
            return partial
        base, drop = s.get("baseline_acc"), s.get("top_drop")
        paired = bounds(s, "top_drop")
        if None not in paired:  # the paired interval over the prompts; else (no per-prompt lists) Wilson intervals
            weak = WEAK if overlap(paired, (0.0, 0.0)) else ""
        else:
            weak = weak_note(base, base - drop, s.get("n")) if isinstance(base, float | int) and isinstance(
                drop, float | int) else ""
        lines = [partial] if partial else []
        margin = s.get("top_margin_drop")
        also = (f"lowers the mean margin by {margin:+.3f} and " if s.get("metric") == "margin"
                and isinstance(margin, int | float) else "")
        lines += [f"Most critical head: **{s['top_head']}**; ablating it alone {also}costs {points(drop)}{interval_text(paired)} of {pct(base)}"
                  f"{' on ' + str(s['n']) + ' prompts' if s.get('n') else ''}{weak}."]
        if s.get("heads_to_chance"):
            lines.append(f"Heads ablated together, most damaging first, to reach chance: **{s['heads_to_chance']}**.")
        if helpful := helped_sentence(s.get("helpful_when_ablated"), NAMES.get(s.get("metric", "acc"), "accuracy")):
            lines.append(helpful)
        return "\n".join(lines)


def example_rows(run: str, sw: SweepResult) -> list[dict[str, Any]]:
    """Every example of a sweep, intact and under each head's ablation, one row each (none where its
    records do not keep their per-prompt lists)."""
    recs = [sw.baseline, *sw.records]
    if not all(has_per_prompt_lists(r) for r in recs):
        return []
    task, ids = sw.config.get("task"), sw.config.get("ids")
    task = task.get("task") if isinstance(task, dict) else task
    out = []
    for condition, rec in zip(["intact", *(r["head"] for r in sw.records)], recs, strict=True):
        for i, (gold, pred, pred_norm, ll) in enumerate(zip(rec["gold"], rec["pred"], rec["pred_norm"], rec["loglik"],
                                                            strict=True)):
            key = ids[i] if ids else {"task": task}
            out.append({**prediction_row(run, condition, key, i), "gold": gold, "pred": pred, "pred_norm": pred_norm,
                        "correct": pred == gold, "correct_norm": pred_norm == gold, "loglik": ll})
    return out


def helped_sentence(heads: Sequence[str] | None, what: str, shown: int = 5) -> str:
    """``"Helpful when ablated: ablating L3H1 or L0H2 alone raises the accuracy."``, or ``""``."""
    if not heads:
        return ""
    more = f" (and {len(heads) - shown} more)" if len(heads) > shown else ""
    return f"Helpful when ablated: ablating {' or '.join(heads[:shown])}{more} alone raises the {what}."


@dataclass
class RankingResult(ExperimentResult):
    """A head ranking's run directory (``ganda rank``): ``ranking.json`` (:class:`RankResult`), and
    in ``verify/`` the exact sweep of its verified heads, part of the ranking."""

    kind: str = "rank"
    ranking: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # ranking.json as written
    verify: SweepResult | None = field(default=None, repr=False, compare=False)

    title = "Heads ranked by attribution, the top verified exactly"
    files = ("ranking.json",)
    claims = ("attribution.jsonl",)
    figures = ("scatter.png", "verify_heatmap.png")
    holds_below = True

    @classmethod
    def read(cls, run_dir: Path) -> RankingResult:
        path = Path(run_dir) / "ranking.json"
        verify = Path(run_dir) / "verify" / "results.jsonl"
        return cls.of(read_json_object(path), read_sweep(verify) if verify.is_file() else None, path)

    @classmethod
    def of(cls, d: dict[str, Any], verify: SweepResult | None = None, path: Path | str = "ranking.json") -> RankingResult:
        """The result of a ranking as ``ranking.json`` holds it (``d``) and of its verification's
        exact sweep: every head's row in final order, and the summary a report and ``result.json`` give."""
        rows = d.get("ranking")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "head" in r for r in rows):
            raise GandaError(f"{path} is not a ganda ranking (no list of ranked heads)")
        rank = RankResult.from_json(d)  # the heads that matter and those helpful when ablated, as ganda rank splits them
        matter = rank.matter()
        summary = {k: d.get(k) for k in ("method", "ablation", "margin", "clean", "n", "spearman_verified")}
        summary["helpful_when_ablated"] = rank.helpful_when_ablated()
        flips = d.get("sign_flips")
        flips = flips if isinstance(flips, list) and all(
            isinstance(f, dict) and "head" in f and _number(f.get("estimate")) and _number(f.get("exact")) for f in flips) else []
        summary.update({"verified": d.get("verified"), "heads": len(rows), "top_head": matter[0] if matter else None,
                        "top_exact": rank.exact[matter[0]] if matter else None, "sign_flips": flips,
                        **({f"top_{k}": v for k, v in rank.intervals.get(matter[0], {}).items() if k.startswith("exact")}
                           if matter else {})})
        return cls(model=d.get("model", "?"), summary=summary, config=d.get("config") or {}, rows=rows,
                   extra={"bound": d.get("bound")}, ranking=d, verify=verify)

    def page(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "summary": self.summary, "top_heads": self.rows[:TOP],
                "bound": self.extra.get("bound"), "config": self.config or None}

    def tables(self, run: str) -> dict[str, list[dict[str, Any]]]:
        """One run row, every head with its estimate, exact effect and both ranks, and the examples of
        the exact sweep of the verified heads, where it ran one."""
        d = self.ranking
        rows = d.get("ranking") or []  # the final order: verified heads by signed exact effect, then the rest by estimate
        ranks = {r["head"]: r for r in RankResult.from_json(d).rows()}  # ganda rank's ranks
        audited = set(d.get("audited") or [])
        heads = [{"run": run, "head": r["head"], "rank": i, "estimate": r.get("estimate"), "exact": r.get("exact"),
                  "acc_drop": r.get("acc_drop"), **{k: r.get(k) for k in CI_KEYS},
                  "rank_estimate": ranks.get(r["head"], {}).get("rank_estimate"),
                  "rank_exact": ranks.get(r["head"], {}).get("rank_exact"), "audited": r["head"] in audited}
                 for i, r in enumerate(rows, 1)]
        seconds = d.get("seconds") if isinstance(d.get("seconds"), dict) else {}
        more = {"method": d.get("method"), "ablation": d.get("ablation"), "margin": d.get("margin"),
                "metric": d.get("metric", "margin"), "clean_margin": d.get("clean"), "verified": d.get("verified"),
                "spearman_verified": d.get("spearman_verified"), "seconds": seconds.get("total")}
        return {"runs": [run_row(run, "rank", d.get("model"), d.get("task"), d.get("n"), d.get("clean_acc"), more)],
                "heads": heads,
                "predictions": example_rows(run, self.verify) if self.verify is not None else []}

    def headline(self) -> str:
        s = self.summary
        helpful = helped_sentence(s.get("helpful_when_ablated"), f"{s.get('margin', '?')} margin")
        if not s.get("top_head") or not isinstance(s.get("top_exact"), int | float):
            return f"No verified head's ablation lowers the {s.get('margin', '?')} margin. {helpful}" if helpful else ""
        clean = f" (intact {s['clean']:+.3f})" if isinstance(s.get("clean"), int | float) else ""
        flips = sign_flip_sentence(s.get("sign_flips") or [])
        paired = bounds(s, "top_exact")
        weak = WEAK if None not in paired and overlap(paired, (0.0, 0.0)) else ""
        return (f"Largest exact effect: **{s['top_head']}**; ablating it alone lowers the {s.get('margin', '?')} "
                f"margin by {s['top_exact']:+.3f}{interval_text(paired, 1)}{clean}{weak}; "
                f"{s.get('verified', '?')} heads verified exactly"
                + (f"; {flips}." if flips else ".") + (f" {helpful}" if helpful else ""))

    def draw(self, out_dir: Path) -> list[Path]:
        """The estimate-vs-exact scatter and the verified heads' heat map (none without exact effects)."""
        rank = RankResult.from_json(self.ranking)
        if not rank.exact:
            return []
        drawn = []
        if rank.estimate:
            rank.scatter(out_dir / "scatter.png")
            drawn.append(out_dir / "scatter.png")
        return [*drawn, rank.verify_heatmap(out_dir / "verify_heatmap.png")]


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


__all__ = ["HeadSweepResult", "RankingResult", "example_rows", "helped_sentence"]
