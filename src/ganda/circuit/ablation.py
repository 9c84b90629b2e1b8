"""``path_ablation``: one sender -> receiver pair ablated along its paths, next to the sender ablated
everywhere, on a task's prompts, with paired intervals (:mod:`.paths` defines the paths).

Per prompt, each condition gives the choices' log-likelihoods (the sweep's), hence whether the
gold choice wins (accuracy) and the margin (gold minus the mean, or the best, of the others). A
drop is intact minus ablated, per prompt; its interval is the paired percentile bootstrap over
prompts (:func:`ganda.stats.bootstrap_paired`). ``vs_sender`` compares the path ablation with the
sender ablated everywhere on the same prompts: ``path − everywhere``, the part of the sender's
effect that does not run through the receiver (0: all of it does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ablation import check_batched_ablation, reference_means
from ..attribution.engine import default_batch_tokens, margin_of
from ..effects import predicted
from ..errors import GandaError
from ..heads import HeadId
from ..intervals import ci
from ..models.base import ModelAdapter
from ..prepared import make_batch, plan_batches
from ..progress import cpu_clock, tqdm
from ..scoring import examples_digest
from ..stats import paired_difference, t_interval, wilson
from ..tasks.base import Example
from .paths import (
    TOGETHER,
    PathBatch,
    Variant,
    check_parts,
    check_paths,
    parse_pair,
)

INTACT, EVERYWHERE = "intact", "sender everywhere"


def condition_name(part: str) -> str:
    return f"path ({part})"


def per_prompt(logliks: Sequence[Sequence[float]], golds: Sequence[int], margin: str) -> tuple[list[float], list[float]]:
    """(1.0 where the gold choice has the largest log-likelihood else 0.0, margin) per prompt."""
    correct = [float(predicted(ll) == g) for ll, g in zip(logliks, golds, strict=True)]
    margins = [float(margin_of(torch.tensor(ll, dtype=torch.float64), g, margin))
               for ll, g in zip(logliks, golds, strict=True)]
    return correct, margins


@dataclass
class PathAblation:
    """Each condition's per-prompt log-likelihoods, and the statistics read from them."""

    sender: str
    receiver: str
    paths: str
    parts: list[str]
    margin: str
    golds: list[int]
    logliks: dict[str, list[list[float]]]  # condition -> per prompt, per choice
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def conditions(self) -> list[str]:
        return [INTACT, EVERYWHERE, *(condition_name(p) for p in self.parts)]

    def rows(self, resamples: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
        """One row per condition: accuracy and mean margin with intervals, drops from intact with
        paired intervals, and (path conditions) the paired difference from the sender everywhere."""
        acc = {c: per_prompt(self.logliks[c], self.golds, self.margin) for c in self.conditions()}
        n = len(self.golds)
        out = []
        for c in self.conditions():
            right, marg = acc[c]
            lo, hi = wilson(round(sum(right)), n)
            row: dict[str, Any] = {"condition": c, "accuracy": sum(right) / n, **ci((lo, hi), "accuracy"),
                                   "margin": sum(marg) / n, **ci(t_interval(marg), "margin")}
            if c != INTACT:
                row.update({**paired_difference(acc[INTACT][0], right, seed, "drop", resamples),
                            **paired_difference(acc[INTACT][1], marg, seed, "margin_drop", resamples)})
            if c not in (INTACT, EVERYWHERE):
                row.update({**paired_difference(right, acc[EVERYWHERE][0], seed, "vs_sender", resamples),
                            **paired_difference(marg, acc[EVERYWHERE][1], seed, "margin_vs_sender", resamples)})
                every = out[1]["margin_drop"]
                row["share_of_sender"] = row["margin_drop"] / every if abs(every) > 1e-12 else None
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"sender": self.sender, "receiver": self.receiver, "paths": self.paths, "parts": self.parts,
                "margin": self.margin, "n": len(self.golds), "rows": self.rows(), "golds": self.golds,
                "logliks": self.logliks, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds,
                "config": self.config}


def path_inputs(adapter: ModelAdapter, sender: HeadId | str, receiver: HeadId | str, paths: str,
                parts: Sequence[str]) -> tuple[HeadId, HeadId, list[str]]:
    """The pair and the parts a path ablation runs, checked in the model (one line each): what
    :func:`path_ablation` runs and ``ganda plan -e path`` costs."""
    s, r = parse_pair(adapter, sender, receiver)
    check_paths(adapter, paths, [s])
    return s, r, check_parts(adapter, r, parts)


def path_ablation(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    sender: HeadId | str,
    receiver: HeadId | str,
    *,
    paths: str = "all",
    parts: Sequence[str] = (TOGETHER,),
    margin: str = "mean",
    batch_tokens: int | None = None,
    progress: bool = True,
    ablation: str = "zero",
) -> PathAblation:
    """Ablate the sender along its paths into the receiver (``paths``: ``"all"`` or ``"direct"``,
    :mod:`.paths`), once per part in ``parts`` (``together``, or the receiver's ``q``/``k``/``v``,
    ``x``/``B``/``C``/``dt``/``gate``), and the sender everywhere, on ``examples``. ``ablation``:
    ``"zero"`` or ``"mean"`` (the sender's slice set to its mean over every token of ``examples``,
    :mod:`ganda.ablation`; a direct path then removes ``c·W_O (z - μ)``)."""
    check_batched_ablation(ablation, "ablation", "path ablation")
    if not examples:
        raise GandaError("no examples to ablate paths on")
    if any(len(ex.choices) < 2 for ex in examples):
        raise GandaError("path ablation scores multiple-choice examples with at least two choices")
    s, r, part_list = path_inputs(adapter, sender, receiver, paths, parts)
    means = reference_means(adapter, examples, [adapter.mixer_of(s)]) if ablation == "mean" else None
    with cpu_clock() as clock:
        plan, packed = plan_batches(adapter, examples, batch_tokens or default_batch_tokens(adapter))
        lls: dict[str, list[list[float]]] = {c: [[] for _ in examples] for c in
                                             [INTACT, EVERYWHERE, *(condition_name(p) for p in part_list)]}
        variants = [Variant(r, p) for p in part_list]
        for items in tqdm(plan, desc=f"path {s} -> {r}", unit="batch", disable=not progress):
            pb = PathBatch(adapter, make_batch(adapter, items, packed), margin, means)
            got = {INTACT: pb.clean[0], EVERYWHERE: pb.sender_everywhere(s)[0]}
            for p, ll in zip(part_list, pb.ablate(s, variants, paths), strict=True):
                got[condition_name(p)] = ll
            for cond, vals in got.items():
                for it, v in zip(items, vals, strict=True):
                    lls[cond][it.index] = v
    cfg = {"model": adapter.spec, "n": len(examples), "prompts_sha": examples_digest(examples), "layout":
           "packed" if packed else "rows", "ablation": ablation}
    return PathAblation(str(s), str(r), paths, part_list, margin, [ex.gold for ex in examples], lls,
                        clock["wall"], clock["cpu"], cfg)


__all__ = ["EVERYWHERE", "INTACT", "PathAblation", "condition_name", "path_ablation", "path_inputs", "per_prompt"]
