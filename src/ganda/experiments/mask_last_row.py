"""Section 5.3 of the paper (Zamba2): disable attention's last row and score MMLU and knowledge.

Masking the final query position's attention row (after the softmax) of a head makes that head's
output at the last position zero: exactly ``interventions.mask_last_row``, which zeroes the head's
slice of the output-projection input at the query position only. Every other position and every
SSM layer is untouched, so what is removed is the attention heads' ability to *aggregate* into the
answer position. Default heads: every attention head of the model (``L*.attnH*``), which is the
paper's "every attention matrix" setting; on a pure Transformer that is all heads.

With ``per_layer=True`` each attention layer is also masked on its own (the authors' exploratory
search for Zamba2's Aggregate layers), giving one row per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..errors import GandaError
from ..heads import expand, format_heads
from ..interventions import Intervention, KeepLayers, mask_last_row
from ..models.base import ModelAdapter
from .common import CHANCE, ExperimentResult, Scorer, flat_scores
from .prune import _tasks_in


@dataclass
class MaskLastRowResult(ExperimentResult):
    kind: str = "mask_last_row"

    def draw(self, out_dir: Path) -> list[Path]:
        from ..report.figures import bars

        labels = [r["condition"] for r in self.rows]
        series, errors = {}, {}
        for t in _tasks_in(self.rows):
            series[t] = [r.get(t) for r in self.rows]
            if all(f"{t}_lo" in r for r in self.rows):
                errors[t] = ([r[f"{t}_lo"] for r in self.rows], [r[f"{t}_hi"] for r in self.rows])
        return [bars(labels, series, Path(out_dir) / "mask_last_row.png", errors=errors,
                     hlines={"MMLU chance": CHANCE["mmlu"]}, rotate=45 if len(labels) > 4 else 0,
                     title=f"Last attention row masked ({self.model})")]


def mask_last_row_experiment(
    adapter: ModelAdapter,
    scorer: Scorer,
    heads: str | None = None,
    *,
    per_layer: bool = False,
    keep_layers: list[int] | None = None,
) -> MaskLastRowResult:
    spec = heads or "L*.attnH*"
    try:
        hs = expand(spec, adapter)
    except GandaError:
        if heads:
            raise
        hs = []
    if not hs:
        raise GandaError(f"{adapter.spec} has no attention heads to mask")
    base: list[Intervention] = [KeepLayers(keep_layers)] if keep_layers else []
    if keep_layers:
        hs = [h for h in hs if h.layer in set(keep_layers)]
    conditions: list[tuple[str, list[Intervention], str]] = [
        ("intact", base, "-"),
        ("masked", base + [mask_last_row(hs)], format_heads(hs) if len(hs) <= 12 else f"{len(hs)} heads ({spec})"),
    ]
    if per_layer:
        for layer in sorted({h.layer for h in hs}):
            lh = [h for h in hs if h.layer == layer]
            conditions.append((f"masked L{layer}", base + [mask_last_row(lh)], format_heads(lh)))
    rows: list[dict[str, Any]] = []
    for name, ivs, desc in tqdm(conditions, desc="mask-last-row", leave=False, disable=not scorer.progress):
        rows.append({"condition": name, "heads": desc, **flat_scores(scorer.score(ivs, label=name))})
    intact, masked = rows[0], rows[1]
    summary: dict[str, Any] = {"n_heads_masked": len(hs)}
    for t in _tasks_in(rows):
        summary[f"{t}_intact"], summary[f"{t}_masked"] = intact.get(t), masked.get(t)
    if per_layer and len(rows) > 2 and intact.get("mmlu") is not None:
        worst = min(rows[2:], key=lambda r: r.get("mmlu") if r.get("mmlu") is not None else 1.0)
        summary["most_critical_layer"] = worst["condition"]
    return MaskLastRowResult(
        model=adapter.spec, rows=rows, summary=summary,
        config={**scorer.config(), "heads": spec, "per_layer": per_layer, "keep_layers": keep_layers},
        interventions=[iv.describe() for iv in conditions[1][1]],
    )
