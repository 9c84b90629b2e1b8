"""Fig. 4 of the paper: KV-retrieval accuracy against the number of key-value pairs, for the
intact model and with the given heads zero-ablated (every position), with Wilson 95% intervals.

Chance is 1/pairs (multiple choice over the dictionary's values). The summary reports the mean
gap (intact - ablated) and the gap at the largest number of pairs, which is where the paper sees
the gap widen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..heads import expand, format_heads
from ..interventions import AblateHeads, Intervention, KeepLayers
from ..models.base import ModelAdapter
from .common import ExperimentResult, Scorer, flat_scores


@dataclass
class KVCurveResult(ExperimentResult):
    kind: str = "kv_curve"

    def draw(self, out_dir: Path) -> list[Path]:
        from ..report.figures import curves

        rows = sorted(self.rows, key=lambda r: r["pairs"])
        x = [r["pairs"] for r in rows]
        series, bands = {}, {}
        for cond in ("intact", "ablated"):
            if all(cond in r for r in rows):
                series[cond] = [r[cond] for r in rows]
                bands[cond] = ([r[f"{cond}_lo"] for r in rows], [r[f"{cond}_hi"] for r in rows])
        series["chance (1/pairs)"] = [1 / p for p in x]
        heads = self.config.get("heads") or "-"
        return [curves(x, series, Path(out_dir) / "kv_curve.png", bands=bands, xlabel="key-value pairs",
                       title=f"KV retrieval, intact vs {heads} ablated ({self.model})")]


def kv_curve(
    adapter: ModelAdapter,
    heads: str | None,
    pairs: Sequence[int],
    *,
    limit: int | None = 100,
    seed: int = 0,
    keep_layers: list[int] | None = None,
    progress: bool = True,
) -> KVCurveResult:
    hs = expand(heads, adapter) if heads else []
    base: list[Intervention] = [KeepLayers(keep_layers)] if keep_layers else []
    ablated: list[Intervention] = base + ([AblateHeads(hs)] if hs else [])
    rows: list[dict[str, Any]] = []
    for p in tqdm(list(pairs), desc="kv-curve", leave=False, disable=not progress):
        scorer = Scorer(adapter, [f"kv{p}"], limit=limit, seed=seed, progress=progress)
        row: dict[str, Any] = {"pairs": p, "chance": 1 / p}
        for cond, ivs in (("intact", base), ("ablated", ablated)):
            if cond == "ablated" and not hs:
                continue
            s = flat_scores(scorer.score(ivs, label=f"{cond} {p}"))
            row[cond], row[f"{cond}_lo"], row[f"{cond}_hi"] = s[f"kv{p}"], s[f"kv{p}_lo"], s[f"kv{p}_hi"]
        if hs:
            row["gap"] = row["intact"] - row["ablated"]
        rows.append(row)
    summary: dict[str, Any] = {"pairs": list(pairs)}
    if hs and rows:
        summary["mean_gap"] = sum(r["gap"] for r in rows) / len(rows)
        summary["gap_at_max_pairs"] = max(rows, key=lambda r: r["pairs"])["gap"]
        summary["gap_at_min_pairs"] = min(rows, key=lambda r: r["pairs"])["gap"]
    return KVCurveResult(
        model=adapter.spec, rows=rows, summary=summary,
        config={"heads": format_heads(hs) if hs else None, "pairs": list(pairs), "limit": limit, "seed": seed,
                "keep_layers": keep_layers},
        interventions=[iv.describe() for iv in ablated],
    )
