"""Fig. 4 of the paper: KV-retrieval accuracy against the number of key-value pairs, for the
intact model and with the given heads zero-ablated (every position), with Wilson 95% intervals.

Chance is 1/pairs (multiple choice over the dictionary's values). The summary reports the mean
gap (intact - ablated) and the gap at the largest number of pairs, which is where the paper sees
the gap widen.

``compare`` adds other models' intact curves on the same prompts (the lab's Transformer vs SSM:
which one's accuracy falls faster with the number of pairs). ``task`` is ``kv`` (SmolLM2's
dictionary prompt) or ``lab-kv`` (the lab world's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GandaError
from ..figures import curves
from ..heads import expand, format_heads, require_heads
from ..interventions import AblateHeads, Intervention, KeepLayers, describe_all, parse_layers
from ..models import load_model
from ..models.base import ModelAdapter
from ..progress import tqdm
from ..tasks import get_task
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult, Scorer, flat_scores, pct, points


@dataclass
class KVCurveResult(ExperimentResult):
    kind: str = "kv_curve"
    title = "KV retrieval against the number of pairs"

    def headline(self) -> str:
        s, lines = self.summary, []
        if "mean_gap" in s:
            lines.append(f"Mean accuracy lost by ablating the heads: **{points(s['mean_gap'])}**.")
        for name, fall in (s.get("fall") or {}).items():
            lines.append(f"{name}: loses **{points(fall)}** from the fewest to the most pairs "
                         f"(at the most: {pct((s.get('at_max_pairs') or {}).get(name))}).")
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        rows = sorted(self.rows, key=lambda r: r["pairs"])
        x = [r["pairs"] for r in rows]
        others = list(self.config.get("compare") or [])
        series, bands = {}, {}
        for cond in ("intact", "ablated", *others):
            if all(cond in r for r in rows):
                label = f"{self.model}" if cond == "intact" and others else cond
                series[label] = [r[cond] for r in rows]
                bands[label] = ([r[f"{cond}_ci_low"] for r in rows], [r[f"{cond}_ci_high"] for r in rows])
        series["chance (1/pairs)"] = [1 / p for p in x]
        heads = self.config.get("heads")
        title = (f"KV retrieval, intact vs {heads} ablated ({self.model})" if heads and not others
                 else f"KV retrieval vs number of pairs ({self.config.get('task', 'kv')})")
        return [curves(x, series, Path(out_dir) / "kv_curve.png", bands=bands, xlabel="key-value pairs", title=title)]


def kv_curve(
    adapter: ModelAdapter,
    heads: str | None,
    pairs: Sequence[int],
    *,
    limit: int | None = 100,
    seed: int = 0,
    keep_layers: list[int] | None = None,
    progress: bool = True,
    task: str = "kv",
    compare: Mapping[str, ModelAdapter] | None = None,
) -> KVCurveResult:
    if task not in ("kv", "lab-kv"):
        raise GandaError(f"kv-curve task must be kv or lab-kv, not {task!r}")
    hs = expand(heads, adapter) if heads else []
    base: list[Intervention] = [KeepLayers(keep_layers)] if keep_layers else []
    ablated: list[Intervention] = base + ([AblateHeads(hs)] if hs else [])
    compare = dict(compare or {})
    rows: list[dict[str, Any]] = []
    for p in tqdm(list(pairs), desc="kv-curve", leave=False, disable=not progress):
        name = f"{task}{p}"
        scorer = Scorer(adapter, [name], limit=limit, seed=seed, progress=progress)
        row: dict[str, Any] = {"pairs": p, "chance": 1 / p}
        runs: list[tuple[str, Scorer, list[Intervention]]] = [("intact", scorer, base)]
        if hs:
            runs.append(("ablated", scorer, ablated))
        runs += [(label, Scorer(other, [name], limit=limit, seed=seed, progress=progress), base)
                 for label, other in compare.items()]
        for cond, sc, ivs in runs:
            s = flat_scores(sc.score(ivs, label=f"{cond} {p}"))
            row[cond], row[f"{cond}_ci_low"], row[f"{cond}_ci_high"] = s[name], s[f"{name}_ci_low"], s[f"{name}_ci_high"]
        if hs:
            row["gap"] = row["intact"] - row["ablated"]
        rows.append(row)
    summary: dict[str, Any] = {"pairs": list(pairs)}
    if hs and rows:
        summary["mean_gap"] = sum(r["gap"] for r in rows) / len(rows)
        summary["gap_at_max_pairs"] = max(rows, key=lambda r: r["pairs"])["gap"]
        summary["gap_at_min_pairs"] = min(rows, key=lambda r: r["pairs"])["gap"]
    if compare and rows:
        lo, hi = min(rows, key=lambda r: r["pairs"]), max(rows, key=lambda r: r["pairs"])
        # how much of each model's accuracy is lost between the fewest and the most pairs
        summary["fall"] = {label: lo[col] - hi[col] for label, col in [(adapter.spec, "intact"), *((k, k) for k in compare)]}
        summary["at_max_pairs"] = {label: hi[col] for label, col in [(adapter.spec, "intact"), *((k, k) for k in compare)]}
    return KVCurveResult(
        model=adapter.spec, rows=rows, summary=summary,
        config={"heads": format_heads(hs) if hs else None, "pairs": list(pairs), "limit": limit, "seed": seed,
                "keep_layers": keep_layers, "task": task, "compare": list(compare)},
        interventions=describe_all(ablated),
    )


def _pairs(opts: KVCurveOptions) -> list[int]:
    try:
        ps = [int(p) for p in opts.pairs.split(",") if p.strip()]
    except ValueError:
        raise GandaError(f"{opts.flag('pairs')}: not a list of integers: {opts.pairs!r}") from None
    if not ps:
        raise GandaError(f"{opts.flag('pairs')}: no numbers in {opts.pairs!r}")
    return ps


@dataclass
class KVCurveOptions(Options):
    heads: str | None = option(None, "heads to ablate, e.g. L17H24 (none: intact only)")
    pairs: str = option("5,10,20,30,40,50", "numbers of key-value pairs")
    task: str = option("kv", "kv (SmolLM2's dictionary prompt) or lab-kv (the lab world)", choices=("kv", "lab-kv"))
    compare: str | None = option(None, "other models' intact curves on the same prompts, comma-separated (e.g. "
                                 "lab-kv-mamba2)")
    keep_layers: str | None = option(None, "run on a submodel of these layers, e.g. 0-17")

    def check(self) -> None:
        for p in _pairs(self):
            get_task(self.task, pairs=p)  # --pairs 0 or 10000: refused by the task's declared bounds
        require_heads(self.flag("heads"), self.heads)
        parse_layers(self.keep_layers) if self.keep_layers else None


class KVCurve(ScoredExperiment):
    """Fig. 4: KV-retrieval accuracy vs number of pairs, intact vs heads ablated (Wilson CIs)."""

    name = "kv-curve"
    inputs = "model"  # its prompts are its own: --limit of them per number of pairs
    Options = KVCurveOptions

    def out_name(self, options: Options) -> str:
        return "kv_curve"

    def run_tasks(self, adapter: ModelAdapter, scorer: Any, options: KVCurveOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> KVCurveResult:
        others = {m.strip(): load_model(m.strip(), allow_pickle=run.allow_pickle)
                  for m in (options.compare or "").split(",") if m.strip()}
        keep = parse_layers(options.keep_layers) if options.keep_layers else None
        return self.finish(kv_curve(adapter, options.heads, _pairs(options), limit=run.limit, seed=run.seed,
                                    keep_layers=keep, progress=run.progress, task=options.task, compare=others),
                           out_dir)
