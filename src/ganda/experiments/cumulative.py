"""Heads ablated together, in ranked order, until the task is at chance: how many heads must go
(the paper's "SSMs need more heads for G&A" measured). ``sweep --until-chance``, ``roles`` and
the demo use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import runio
from ..figures import curves
from ..intervals import ci
from ..interventions import AblateHeads
from ..models.base import ModelAdapter
from ..progress import tqdm
from ..scoring import evaluate_examples
from ..tasks.base import Example


def at_chance(accuracy: float, chance: float, margin: float = 0.05) -> bool:
    """Whether an accuracy is within ``margin`` of chance (or below it): the "until chance" rule's
    stop, and the intact model's state in which ablating heads toward chance measures nothing."""
    return accuracy <= chance + margin


def chance_sentence(accuracy: float, chance: float, margin: float = 0.05) -> str:
    """Why no head count to chance exists: the intact model is already there."""
    return (f"the intact model's accuracy {accuracy:.3f} is already at or below chance ({chance:.3f} + {margin:.2f}): "
            "there is no retrieval for ablated heads to remove, so no number of heads to chance")


def added_heads(curve: Sequence[dict[str, Any]]) -> list[str]:
    """The names of a cumulative ablation curve's points, the intact point first: each point is
    named by the head its step adds."""
    return ["", *(str(r.get("added") or "") for r in curve)]


def cumulative_ablation(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    ranked_heads: Sequence[str],
    *,
    max_heads: int = 24,
    margin: float = 0.05,
    out_dir: Any = None,
    progress: bool = True,
    base: Any = None,
    ablation: str = "zero",
    chance: float | None = None,
) -> dict[str, Any]:
    """Heads ablated cumulatively in ranked order until accuracy is within ``margin`` of chance
    (``ablation``: zero, mean or resample, :mod:`ganda.ablation`, over ``examples``), as a JSON-able
    record: its ``curve`` lists the accuracy after each added head, the last point at chance (or
    ``max_heads`` was hit). ``chance`` is by default taken from the examples (mean of 1/choices);
    ``base``: the intact model's result on ``examples`` where the caller has scored it already; with
    ``out_dir`` also ``cumulative.json``, ``cumulative.csv`` and a figure.

    For models with no single-head bottleneck this answers "how many heads must go", the paper's
    "SSMs need more heads for G&A" measured: a model whose retrieval runs through one bottleneck
    head reaches chance after one or two."""
    chance = chance if chance is not None else sum(1 / len(ex.choices) for ex in examples) / len(examples)
    base = base if base is not None else evaluate_examples(adapter, examples, progress=False)
    baseline_at_chance = at_chance(base.accuracy, chance, margin)  # nothing to ablate toward: no curve, said so
    curve: list[dict[str, Any]] = []
    chosen: list[str] = []
    heads = [] if baseline_at_chance else list(ranked_heads)[:max_heads]
    for name in tqdm(heads, desc="cumulative ablation", disable=not progress or not heads, leave=False):
        chosen.append(name)
        r = evaluate_examples(adapter, examples, [AblateHeads(list(chosen), how=ablation)], progress=False)
        curve.append({"n_heads": len(chosen), "added": name, "accuracy": r.accuracy, **ci((r.ci_low, r.ci_high))})
        if at_chance(r.accuracy, chance, margin):
            break
    reached = bool(curve) and at_chance(curve[-1]["accuracy"], chance, margin)
    rec = {"model": adapter.spec, "n": len(examples), "chance": chance, "margin": margin,
           "baseline": base.accuracy, **ci((base.ci_low, base.ci_high), "baseline"), "reached_chance": reached,
           "heads_to_chance": curve[-1]["n_heads"] if reached else None, "max_heads": max_heads, "curve": curve,
           "baseline_at_chance": baseline_at_chance}
    if baseline_at_chance:
        rec["note"] = chance_sentence(base.accuracy, chance, margin)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        runio.write_json(out / "cumulative.json", rec)
        runio.write_csv(out / "cumulative.csv", curve)
        curve_figure(curve, base, chance, out / "cumulative.png", series="accuracy",
                     xlabel="heads ablated (most damaging first)", title=f"Cumulative head ablation ({adapter.spec})")
    return rec


def curve_figure(curve: Sequence[dict[str, Any]], base: Any, chance: float, path: Path, *, series: str,
                 xlabel: str, title: str) -> Path:
    """A cumulative ablation curve drawn: accuracy with its interval from the intact model (``base``,
    anything with ``accuracy``, ``ci_low`` and ``ci_high``) over each added head, on whole-number
    head counts, each point named by the head it adds, against chance."""
    xs = [0] + [r["n_heads"] for r in curve]
    ys = [base.accuracy] + [r["accuracy"] for r in curve]
    los = [base.ci_low] + [r["ci_low"] for r in curve]
    his = [base.ci_high] + [r["ci_high"] for r in curve]
    return curves(xs, {series: ys}, path, bands={series: (los, his)}, xlabel=xlabel, hlines={"chance": chance},
                  title=title, integer_x=True, point_labels={series: added_heads(curve)})
