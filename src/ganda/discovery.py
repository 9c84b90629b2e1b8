"""Finding Gather and Aggregate heads: pattern scores over prompts, then causal verification.

Pattern scores use each head's mixing matrix M (softmax attention, or the SSM's implicit
attention) restricted to the rows that matter, with row mass measured as |M| so that signed SSM
maps and softmax maps are scored by the same formula. For a prompt with segments
``S_1..S_K`` (token spans ``[a_k, e_k]``; ``e_k`` is the segment's last token, its summary ``\\n``),
gold segment ``g`` and final query position ``q``:

* **Aggregate score** = share(e_g) − mean_{k≠g} share(e_k), with share(j) = |M[q, j]| / Σ_i |M[q, i]|
  — the share of the final position's row that lands on the gold segment's summary token, minus
  what the other summaries get (a head that spreads evenly over all ``\n`` tokens scores ~0);
* **Gather score** = mean_k Σ_{a_k ≤ j < e_k} |M[e_k, j]| / Σ_j |M[e_k, j]|  — the share of each
  summary token's row that lands on its own segment's other tokens.

Both are averaged over prompts. Sharpness (how one-hot the pattern is, the paper's "sharp vs
smooth") is measured per head as well:

* **aggregate_peak** = |M[q, e_g]| / max_{k≠g} |M[q, e_k]|  (gold summary vs the best other summary),
* **aggregate_hit** = fraction of prompts where e_g has the largest |M[q, ·]| among summaries,
* **gather_contrast** = mean in-segment |M| per token / mean out-of-segment |M| per token on e_k's row.

Causal verification then zero-ablates the top candidates one at a time and measures the drop in
task accuracy, which is what decides whether a head matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from .heads import HeadId
from .interventions import AblateHeads
from .models.base import ModelAdapter
from .scoring import encode, evaluate_examples
from .tasks.base import Example, token_spans


@dataclass
class HeadScore:
    head: str
    layer: int
    kind: str
    aggregate: float
    aggregate_segment: float  # share of the final row on the whole gold segment (not only its summary)
    gather: float
    aggregate_peak: float
    aggregate_hit: float
    gather_contrast: float
    drop: float | None = None  # accuracy drop when this head alone is ablated (verified heads)
    ablated_accuracy: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def prompt_positions(adapter: ModelAdapter, ex: Example) -> tuple[list[int], list[tuple[int, int]], int]:
    """Token ids, segment token spans and query position for one example's prompt."""
    enc = adapter.tokenizer(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
    ids = encode(adapter, ex.prompt)
    shift = len(ids) - len(enc.input_ids)  # a BOS token added by ``encode``
    spans = [(a + shift, b + shift) for a, b in token_spans(enc.offset_mapping, ex.segments)]
    return ids, spans, len(ids) - 1


def pattern_scores(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    heads: Sequence[HeadId] | None = None,
    progress: bool = True,
) -> list[HeadScore]:
    """Aggregate/Gather pattern scores and sharpness for every head (see module docstring)."""
    heads = list(heads) if heads is not None else adapter.heads()
    acc: dict[HeadId, dict[str, list[float]]] = {h: {} for h in heads}
    for ex in tqdm(examples, desc="pattern scores", disable=not progress, leave=False):
        ids, spans, q = prompt_positions(adapter, ex)
        g = ex.gold_segment if ex.gold_segment is not None else ex.gold
        ends = [e for _, e in spans]
        rows = [q, *ends]
        maps = adapter.attention_maps(torch.tensor([ids]), heads, rows=rows)
        for h, m in maps.items():
            m = m.abs()
            row_q = m[0]
            tot_q = float(row_q.sum()) or 1e-30
            summ = row_q[ends]
            others = torch.cat([summ[:g], summ[g + 1 :]])
            d = acc[h]
            d.setdefault("aggregate", []).append((float(summ[g]) - float(others.mean())) / tot_q)
            seg_a, seg_e = spans[g]
            d.setdefault("aggregate_segment", []).append(float(row_q[seg_a : seg_e + 1].sum()) / tot_q)
            d.setdefault("aggregate_peak", []).append(float(summ[g]) / max(float(others.max()), 1e-30))
            d.setdefault("aggregate_hit", []).append(float(int(summ.argmax()) == g))
            gathers, contrasts = [], []
            for k, (a, e) in enumerate(spans):
                row = m[1 + k, : e + 1]
                tot = float(row.sum()) or 1e-30
                inside = float(row[a:e].sum())
                gathers.append(inside / tot)
                n_in, n_out = max(e - a, 1), max(e + 1 - (e - a) - 1, 1)
                outside = tot - inside - float(row[e])
                contrasts.append((inside / n_in) / max(outside / n_out, 1e-30))
            d.setdefault("gather", []).append(sum(gathers) / len(gathers))
            d.setdefault("gather_contrast", []).append(sum(contrasts) / len(contrasts))
    out = []
    for h in heads:
        d = acc[h]
        mean = {k: sum(v) / len(v) for k, v in d.items()}
        out.append(
            HeadScore(
                head=str(h), layer=h.layer, kind=adapter.mixer_of(h).kind,
                aggregate=mean["aggregate"], aggregate_segment=mean["aggregate_segment"], gather=mean["gather"],
                aggregate_peak=_geo_mean(d["aggregate_peak"]), aggregate_hit=mean["aggregate_hit"],
                gather_contrast=_geo_mean(d["gather_contrast"]),
            )
        )
    return out


def _geo_mean(xs: list[float]) -> float:
    """Ratios are averaged geometrically (a 10x and a 0.1x prompt average to 1x)."""
    return math.exp(sum(math.log(max(x, 1e-30)) for x in xs) / len(xs))


@dataclass
class Discovery:
    task: dict[str, Any]
    baseline_accuracy: float
    n_pattern: int
    n_verify: int
    scores: list[HeadScore]
    top_aggregate: list[str]
    top_gather: list[str]

    def best(self, role: str) -> HeadScore | None:
        """The verified head of a role with the largest accuracy drop."""
        names = self.top_aggregate if role == "aggregate" else self.top_gather
        cands = [s for s in self.scores if s.head in names and s.drop is not None]
        return max(cands, key=lambda s: s.drop) if cands else None  # type: ignore[arg-type,return-value]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["scores"] = [s.to_json() for s in self.scores]
        return d


def discover(
    adapter: ModelAdapter,
    pattern_examples: Sequence[Example],
    verify_examples: Sequence[Example],
    *,
    top: int = 5,
    task_config: dict[str, Any] | None = None,
    progress: bool = True,
) -> Discovery:
    """Rank heads by pattern scores, then verify the top ``top`` of each list by ablation."""
    scores = pattern_scores(adapter, pattern_examples, progress=progress)
    by_name = {s.head: s for s in scores}
    top_agg = [s.head for s in sorted(scores, key=lambda s: -s.aggregate)[:top]]
    top_gat = [s.head for s in sorted(scores, key=lambda s: -s.gather)[:top]]
    # gather heads must sit before some aggregate candidate to feed it; we still verify them all.
    # Single-head ablations through the sweep engine: the same numbers as
    # ``evaluate_examples(..., [AblateHeads([h])])`` per head (tested), several times faster.
    from .sweep import run_sweep

    to_verify = list(dict.fromkeys(top_agg + top_gat))
    sw = run_sweep(adapter, verify_examples, heads=[HeadId.parse(h) for h in to_verify], progress=progress)
    by_str = {rec["head"]: rec for rec in sw.records}
    for name in to_verify:
        rec = by_str[str(adapter.canonical(HeadId.parse(name)))]
        by_name[name].ablated_accuracy = rec["acc"]
        by_name[name].drop = sw.baseline["acc"] - rec["acc"]
    return Discovery(
        task=task_config or {}, baseline_accuracy=sw.baseline["acc"], n_pattern=len(pattern_examples),
        n_verify=len(verify_examples), scores=scores, top_aggregate=top_agg, top_gather=top_gat,
    )


def save_discovery(d: Discovery, out: Any, model: str) -> None:
    """``result.json`` (kind ``heads``) and ``heads.csv`` (every head, sorted by aggregate score)."""
    import json
    from pathlib import Path

    from .experiments.common import ganda_version, write_csv

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [s.to_json() for s in sorted(d.scores, key=lambda s: -s.aggregate)]
    verified = [r for r in rows if r["drop"] is not None]
    result = {
        "kind": "heads", "model": model, "ganda_version": ganda_version(), "config": d.task,
        "summary": {
            "baseline_accuracy": d.baseline_accuracy, "n_pattern": d.n_pattern, "n_verify": d.n_verify,
            "top_aggregate": d.top_aggregate, "top_gather": d.top_gather,
        },
        "rows": verified,
        "all_heads": rows,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    write_csv(out / "heads.csv", rows)


def ablate_until_chance(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    ranked_heads: Sequence[str],
    *,
    chance: float,
    max_heads: int = 24,
    margin: float = 0.05,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Ablate heads cumulatively in ranked order until accuracy is within ``margin`` of chance.

    For models with no single-head bottleneck this answers "how many heads must go": the
    returned curve lists the accuracy after each added head; the last row reached chance (or
    ``max_heads`` was hit).
    """
    curve = []
    chosen: list[str] = []
    for name in tqdm(list(ranked_heads)[:max_heads], desc="cumulative ablation", disable=not progress, leave=False):
        chosen.append(name)
        r = evaluate_examples(adapter, examples, [AblateHeads(list(chosen))], progress=False)
        curve.append({"n_heads": len(chosen), "added": name, "accuracy": r.accuracy, "ci95": list(r.ci95)})
        if r.accuracy <= chance + margin:
            break
    return curve
