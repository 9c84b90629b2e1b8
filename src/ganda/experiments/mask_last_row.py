"""Section 5.3 of the paper (Zamba2): disable attention's last row and score MMLU and knowledge.

Masking the final query position's attention row (after the softmax) of a head makes that head's
output at the last position zero: exactly ``interventions.mask_last_row``, which zeroes the head's
slice of the output-projection input at the query position only. Every other position and every
SSM layer is untouched, so what is removed is the attention heads' ability to *aggregate* into the
answer position. Default heads: every attention head of the model (``L*.attnH*``), which is the
paper's "every attention matrix" setting; on a pure Transformer that is all heads.

With ``per_layer=True`` each attention layer is also masked on its own (the authors' exploratory
search for Zamba2's Aggregate layers), giving one row per layer.

``rules`` says which position is "the last row" (``interventions.mask_last_row``): ``query``, the
last prompt token (it predicts an answer's first token: the stricter test), and/or ``last``, the
last position of the scored input (it predicts an answer's final token: what the authors' Zamba2
code masks). They coincide for one-token answers (MMLU letters) and differ for multi-token
answers (knowledge tasks), which is why both are reported by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GandaError
from ..figures import bars
from ..heads import expand, format_heads, require_heads
from ..interventions import Intervention, KeepLayers, describe_all, mask_last_row, parse_layers
from ..models.base import ModelAdapter
from ..progress import tqdm
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult, Scorer, chance, flat_scores, pct, task_columns, task_series


@dataclass
class MaskLastRowResult(ExperimentResult):
    kind: str = "mask_last_row"
    title = "Attention's last row masked"

    def headline(self) -> str:
        s, lines = self.summary, []
        for t in ("mmlu", "lab-mmlu", "knowledge", "lab-knowledge"):
            if s.get(f"{t}_intact") is not None:
                last = (f"; last scored position masked **{pct(s[f'{t}_masked_last'])}**"
                        if f"{t}_masked_last" in s else "")
                lines.append(f"{t} intact **{pct(s[f'{t}_intact'])}** → last prompt token masked "
                             f"**{pct(s.get(f'{t}_masked'))}**{last}.")
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        labels = [r["condition"] for r in self.rows]
        series, errors = task_series(self.rows)
        return [bars(labels, series, Path(out_dir) / "mask_last_row.png", errors=errors,
                     hlines={"MMLU chance": chance("mmlu")}, rotate=45 if len(labels) > 3 else 0,
                     title=f"Last attention row masked ({self.model})")]


def mask_last_row_experiment(
    adapter: ModelAdapter,
    scorer: Scorer,
    heads: str | None = None,
    *,
    per_layer: bool = False,
    keep_layers: list[int] | None = None,
    rules: tuple[str, ...] = ("query", "last"),
) -> MaskLastRowResult:
    if not rules or any(r not in ("query", "last") for r in rules):
        raise GandaError(f"rules must be 'query' and/or 'last', not {rules!r}")
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
    desc_all = format_heads(hs) if len(hs) <= 12 else f"{len(hs)} heads ({spec})"
    suffix = {"query": "", "last": " (last)"}
    conditions: list[tuple[str, list[Intervention], str, str]] = [("intact", base, "-", "-")]
    for rule in rules:
        conditions.append((f"masked{suffix[rule]}", base + [mask_last_row(hs, rule)], desc_all, rule))
    if per_layer:
        for layer in sorted({h.layer for h in hs}):
            lh = [h for h in hs if h.layer == layer]
            for rule in rules:
                conditions.append((f"masked L{layer}{suffix[rule]}", base + [mask_last_row(lh, rule)],
                                   format_heads(lh), rule))
    rows: list[dict[str, Any]] = []
    for name, ivs, desc, rule in tqdm(conditions, desc="mask-last-row", leave=False, disable=not scorer.progress):
        rows.append({"condition": name, "heads": desc, "rule": rule, **flat_scores(scorer.score(ivs, label=name))})
    intact = rows[0]
    summary: dict[str, Any] = {"n_heads_masked": len(hs), "rules": list(rules)}
    for t in task_columns(rows):
        summary[f"{t}_intact"] = intact.get(t)
        for rule in rules:
            masked = next(r for r in rows if r["condition"] == f"masked{suffix[rule]}")
            summary[f"{t}_masked{'' if rule == 'query' else '_last'}"] = masked.get(t)
    mm = next((t for t in ("mmlu", "lab-mmlu") if intact.get(t) is not None), None)
    layer_rows = [r for r in rows if r["condition"].startswith("masked L") and r["rule"] == rules[0]]
    if per_layer and layer_rows and mm:
        worst = min(layer_rows, key=lambda r: r.get(mm) if r.get(mm) is not None else 1.0)
        summary["most_critical_layer"] = worst["condition"]
    return MaskLastRowResult(
        model=adapter.spec, rows=rows, summary=summary,
        config={**scorer.config(), "heads": spec, "per_layer": per_layer, "keep_layers": keep_layers,
                "rules": list(rules)},
        interventions=describe_all(conditions[1][1]),
    )


RULES = {"both": ("query", "last"), "query": ("query",), "last": ("last",)}


@dataclass
class MaskLastRowOptions(Options):
    heads: str | None = option(None, "attention heads (default: all, L*.attnH*)")
    per_layer: bool = option(False, "also mask each attention layer alone")
    rule: str = option("both", "which row: query (last prompt token), last (last scored position, the authors' "
                       "code) or both; they differ only for multi-token answers", choices=tuple(RULES))
    keep_layers: str | None = option(None, "run on a submodel of these layers, e.g. 0-17")

    def check(self) -> None:
        require_heads(self.flag("heads"), self.heads)
        parse_layers(self.keep_layers) if self.keep_layers else None


class MaskLastRow(ScoredExperiment):
    """Sec. 5.3: zero attention's last row (the answer position) and score MMLU and knowledge."""

    name = "mask-last-row"
    Options = MaskLastRowOptions

    def out_name(self, options: Options) -> str:
        return "mask_last_row"

    def run_tasks(self, adapter: ModelAdapter, scorer: Scorer, options: MaskLastRowOptions, *,  # type: ignore[override]
                  out_dir: Path, run: Any) -> MaskLastRowResult:
        keep = parse_layers(options.keep_layers) if options.keep_layers else None
        return self.finish(mask_last_row_experiment(adapter, scorer, options.heads, per_layer=options.per_layer,
                                                    keep_layers=keep, rules=RULES[options.rule]), out_dir)
