"""Table 1 of the paper: keep only the critical heads in the last two layers.

In the Gather layer and the Aggregate layer (by default the last two layers of the model, or of the
minimal model given with ``keep_layers``) every head is zeroed except the retained ones, in four
configurations:

1. ``none``: no critical head retained (both layers' mixers contribute nothing),
2. ``aggregate``: only the last layer's critical heads retained,
3. ``gather``: only the second-last layer's critical heads retained,
4. ``both``: the critical heads of both layers retained,

plus the reference ``intact`` row (no head zeroed). The paper finds MMLU collapses unless both are
kept while knowledge scores barely move. Zeroing is at the output-projection input (KeepHeads), so
only the mixer (attention or SSM) of those layers is touched, never their MLPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GandaError
from ..figures import bars
from ..heads import HeadId, expand, format_heads, require_heads
from ..interventions import Intervention, KeepHeads, KeepLayers, describe_all, parse_layers
from ..models.base import ModelAdapter
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult, Scorer, chance, flat_scores, pct, task_columns, task_series

CONFIGS = ("intact", "none", "aggregate", "gather", "both")


def _keep(adapter: ModelAdapter, heads: list[HeadId], layers: dict[int, str | None]) -> list[Intervention]:
    """One KeepHeads per layer (so hybrid layers with several mixers name the right one)."""
    out: list[Intervention] = []
    for layer, kind in sorted(layers.items()):
        kept = [h for h in heads if h.layer == layer]
        out.append(KeepHeads(kept, layers=[layer], kind=kind))
    return out


@dataclass
class RetainResult(ExperimentResult):
    kind: str = "retain"
    title = "Only the critical heads kept"

    def headline(self) -> str:
        both, none = self.summary.get("both") or {}, self.summary.get("none") or {}
        return "\n".join(f"{t} with both critical heads kept: **{pct(both[t])}**; with none: **{pct(none.get(t))}**."
                         for t in ("mmlu", "lab-mmlu") if t in both)

    def draw(self, out_dir: Path) -> list[Path]:
        labels = [r["config"] for r in self.rows]
        series, errors = task_series(self.rows)
        return [bars(labels, series, Path(out_dir) / "retain.png", errors=errors, hlines={"MMLU chance": chance("mmlu")},
                     title=f"Critical heads retained in layers {self.config.get('gather_layer')}-"
                           f"{self.config.get('aggregate_layer')}")]


def retain(
    adapter: ModelAdapter,
    scorer: Scorer,
    gather: str,
    aggregate: str,
    *,
    keep_layers: list[int] | None = None,
) -> RetainResult:
    """Table 1's four configurations (plus intact) on the model or the ``keep_layers`` submodel."""
    g_heads, a_heads = expand(gather, adapter), expand(aggregate, adapter)
    if not g_heads or not a_heads:
        raise GandaError("give --gather and --aggregate heads, e.g. --gather L16H22 --aggregate L17H24")
    g_layers = {h.layer for h in g_heads}
    a_layers = {h.layer for h in a_heads}
    if len(g_layers) != 1 or len(a_layers) != 1:
        raise GandaError("--gather heads must share one layer and --aggregate heads another")
    g_layer, a_layer = g_layers.pop(), a_layers.pop()
    if g_layer == a_layer:
        raise GandaError(f"Gather and Aggregate heads are both in layer {g_layer}; Table 1 needs two layers")
    base: list[Intervention] = [KeepLayers(keep_layers)] if keep_layers else []
    kept_layers = sorted(keep_layers) if keep_layers else list(range(len(adapter.decoder_layers())))
    for layer in (g_layer, a_layer):
        if layer not in kept_layers:
            raise GandaError(f"layer {layer} is not among the kept layers {kept_layers[0]}-{kept_layers[-1]}")
    notes = []
    if kept_layers[-2:] != sorted([g_layer, a_layer]):
        notes.append(f"the critical layers {g_layer},{a_layer} are not the last two kept layers "
                     f"({kept_layers[-2:]}); the configurations apply to layers {g_layer} and {a_layer}")
    layers = {g_layer: adapter.mixer_of(g_heads[0]).kind if g_heads[0].kind else None,
              a_layer: adapter.mixer_of(a_heads[0]).kind if a_heads[0].kind else None}
    configs: dict[str, list[Intervention]] = {
        "intact": base,
        "none": base + _keep(adapter, [], layers),
        "aggregate": base + _keep(adapter, a_heads, layers),
        "gather": base + _keep(adapter, g_heads, layers),
        "both": base + _keep(adapter, g_heads + a_heads, layers),
    }
    rows: list[dict[str, Any]] = []
    described = {}
    for name, ivs in configs.items():
        scores = scorer.score(ivs, label=name)
        kept = {"intact": "all", "none": "-", "aggregate": format_heads(a_heads), "gather": format_heads(g_heads),
                "both": format_heads(g_heads + a_heads)}[name]
        rows.append({"config": name, "kept_heads": kept, **flat_scores(scores)})
        described[name] = describe_all(ivs)
    summary = {r["config"]: {t: r.get(t) for t in task_columns(rows)} for r in rows}
    return RetainResult(
        model=adapter.spec, rows=rows, summary=summary, notes=notes,
        config={**scorer.config(), "gather": format_heads(g_heads), "aggregate": format_heads(a_heads),
                "gather_layer": g_layer, "aggregate_layer": a_layer, "keep_layers": keep_layers},
        extra={"conditions": described},
    )


@dataclass
class RetainOptions(Options):
    gather: str = option("", "Gather head(s), one layer, e.g. L16H22", required=True)
    aggregate: str = option("", "Aggregate head(s), one later layer, e.g. L17H24", required=True)
    keep_layers: str | None = option(None, "run on a submodel of these layers, e.g. 0-17")

    def check(self) -> None:
        for name in ("gather", "aggregate"):
            if not getattr(self, name):
                raise GandaError(f"{self.flag(name)} is required: head ids such as L16H22")
            require_heads(self.flag(name), getattr(self, name))
        parse_layers(self.keep_layers) if self.keep_layers else None


class Retain(ScoredExperiment):
    """Table 1: keep none / only Aggregate / only Gather / both critical heads in the two layers."""

    name = "retain"
    Options = RetainOptions

    def run_tasks(self, adapter: ModelAdapter, scorer: Scorer, options: RetainOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> RetainResult:
        keep = parse_layers(options.keep_layers) if options.keep_layers else None
        return self.finish(retain(adapter, scorer, options.gather, options.aggregate, keep_layers=keep), out_dir)
