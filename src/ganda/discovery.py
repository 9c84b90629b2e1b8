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
* **gather_contrast** = mean in-segment |M| per token / mean out-of-segment |M| per token on e_k's row;
* **aggregate_neighbour** = |M[q, e_g]| / mean(|M[q, e_g − 1]|, |M[q, e_g + 1]|)  (the gold summary
  against the tokens right beside it: a one-hot read is ≫ 1, a smooth one ≈ 1);
* **gather_edge** = mean |M[e_k, j]| per token inside the segment (a_k ≤ j < e_k) / mean |M[e_k, j]|
  per token over the same number of tokens just before a_k (the sharp boundary the paper says SSMs
  lack; unlike ``gather_contrast`` it is not inflated by a decay that merely forgets far tokens;
  geometric mean over the segments).

**Which token is the summary.** The paper's summary token is the segment's last token (the
``\n``), ``summary="end"``. A model may summarise elsewhere: small lab models trained on
two-word options summarise into the option's last *word* (its ``\n`` is one token later), and
``summary="last"`` scores every metric with that token as the summary (the segment is then its
tokens up to the last word). The **read profile** (:func:`read_shares`, in ``ganda heads``)
says which one a head reads: the share of its final row on the gold and on the other segments'
first token, inner tokens, last token before the ``\n``, and ``\n``, and outside every segment.

Every metric is computed per prompt (:func:`prompt_metrics`) and kept (``HeadScore.samples``),
so each comes with a 95% interval over prompts (``HeadScore.<metric>_ci_low`` and
``HeadScore.<metric>_ci_high``, the names the result files use): a Student-t interval of the mean for ``aggregate``,
``aggregate_segment`` and ``gather``; the t interval of ``log x``, exponentiated, for the geometric
means of the ratios (``aggregate_peak``, ``aggregate_neighbour``, ``gather_contrast``,
``gather_edge``); a Wilson interval for the proportion ``aggregate_hit``. Intervals treat prompts as independent draws.
:func:`compare_sharpness` compares models' top heads with a paired bootstrap over prompts.

Causal verification then zero-ablates the top candidates one at a time and measures the drop in
task accuracy, which is what decides whether a head matters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import runio
from .errors import GandaError
from .figures import curves, pyplot
from .heads import HeadId, expand
from .intervals import bounds, ci, split, split_all
from .interventions import AblateHeads
from .labels import label_model
from .models.base import ModelAdapter
from .progress import tqdm
from .scoring import encode, evaluate_examples
from .stats import bootstrap_paired, geo_t_interval, pool_sets, t_interval, weak_note, wilson
from .sweep import run_sweep
from .tasks import get_task
from .tasks.base import Example, token_spans

METRICS = ("aggregate", "aggregate_segment", "gather", "aggregate_peak", "aggregate_hit", "gather_contrast",
           "aggregate_neighbour", "gather_edge")
# averaged geometrically, compared on log scale
RATIO_METRICS = ("aggregate_peak", "gather_contrast", "aggregate_neighbour", "gather_edge")
AGGREGATE_METRICS = ("aggregate", "aggregate_segment", "aggregate_peak", "aggregate_hit", "aggregate_neighbour")
SUMMARIES = ("end", "last")
# where the final position's row lands, as shares of its |mass|: the gold segment's and the other
# segments' first token, inner tokens, last token before the end, end token; the rest of the prompt
READ_PARTS = ("gold_first", "gold_inner", "gold_last", "gold_end", "other_first", "other_inner", "other_last",
              "other_end", "outside")
CI_METHOD = ("95% over prompts: Student-t interval of the mean (aggregate, aggregate_segment, gather); "
             "t interval of log x, exponentiated (geometric means aggregate_peak, aggregate_neighbour, "
             "gather_contrast, gather_edge); Wilson (aggregate_hit)")


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
    aggregate_neighbour: float = float("nan")
    gather_edge: float = float("nan")
    drop: float | None = None  # accuracy drop when this head alone is ablated (verified heads)
    ablated_accuracy: float | None = None
    n_prompts: int = 0
    # each metric's 95% interval over prompts (module docstring), None where it has none
    aggregate_ci_low: float | None = None
    aggregate_ci_high: float | None = None
    aggregate_segment_ci_low: float | None = None
    aggregate_segment_ci_high: float | None = None
    gather_ci_low: float | None = None
    gather_ci_high: float | None = None
    aggregate_peak_ci_low: float | None = None
    aggregate_peak_ci_high: float | None = None
    aggregate_hit_ci_low: float | None = None
    aggregate_hit_ci_high: float | None = None
    gather_contrast_ci_low: float | None = None
    gather_contrast_ci_high: float | None = None
    aggregate_neighbour_ci_low: float | None = None
    aggregate_neighbour_ci_high: float | None = None
    gather_edge_ci_low: float | None = None
    gather_edge_ci_high: float | None = None
    summary: str = "end"  # the token scored as each segment's summary (module docstring)
    label: str | None = None  # Gather, Aggregate, induction, previous-token, sink or none (ganda.labels)
    label_reason: str | None = None
    read: dict[str, float] = field(default_factory=dict)  # read profile: mean share per READ_PARTS
    samples: dict[str, list[float]] = field(default_factory=dict, repr=False)  # per-prompt values

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("samples")
        return split(d)

    def csv_row(self) -> dict[str, Any]:
        """``to_json`` with the read profile flattened into ``read_<part>`` columns."""
        d = self.to_json()
        for k, v in d.pop("read").items():
            d[f"read_{k}"] = v
        return d


def prompt_positions(adapter: ModelAdapter, ex: Example) -> tuple[list[int], list[tuple[int, int]], int]:
    """Token ids, segment token spans and query position for one example's prompt."""
    enc = adapter.require_tokenizer()(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
    ids = encode(adapter, ex.prompt)
    shift = len(ids) - len(enc.input_ids)  # a BOS token added by ``encode``
    spans = [(a + shift, b + shift) for a, b in token_spans(enc.offset_mapping, ex.segments)]
    return ids, spans, len(ids) - 1


def summary_spans(spans: Sequence[tuple[int, int]], summary: str = "end") -> list[tuple[int, int]]:
    """Segment spans whose last token is the summary: as they are (``"end"``), or cut before their
    last token (``"last"``: the summary is the last token before the ``\\n``; a one-token segment stays)."""
    if summary not in SUMMARIES:
        raise GandaError(f"summary must be one of {', '.join(SUMMARIES)}, not {summary!r}")
    if summary == "end":
        return list(spans)
    return [(a, e - 1 if e > a else e) for a, e in spans]


def read_shares(row: torch.Tensor, spans: Sequence[tuple[int, int]], gold: int) -> dict[str, float]:
    """One prompt's read profile: shares of |row| (the final position's row) per ``READ_PARTS``,
    plus ``at``: the index in ``READ_PARTS`` of the part holding the row's largest entry."""
    r = row.abs().float()
    tot = float(r.sum()) or 1e-30
    part = ["outside"] * r.shape[0]
    for k, (a, e) in enumerate(spans):
        who = "gold" if k == gold else "other"
        for j in range(a, e + 1):
            part[j] = f"{who}_{'first' if j == a else 'end' if j == e else 'last' if j == e - 1 else 'inner'}"
    out = dict.fromkeys(READ_PARTS, 0.0)
    for j, name in enumerate(part):
        out[name] += float(r[j]) / tot
    out["at"] = float(READ_PARTS.index(part[int(r.argmax())]))
    return out


def top_reads(read: Mapping[str, float], k: int = 1) -> list[tuple[str, float]]:
    """The ``k`` largest parts of a read profile (``HeadScore.read``), largest first."""
    return sorted(((p, read[p]) for p in READ_PARTS if p in read), key=lambda kv: -kv[1])[:k]


def prompt_metrics(m: torch.Tensor, spans: Sequence[tuple[int, int]], gold: int) -> dict[str, float]:
    """Every pattern metric of one head on one prompt (module docstring).

    ``m`` holds the rows of the head's mixing matrix that matter, ``[1 + K, T]``: row 0 is the
    final query position's row, row ``1 + k`` is the row of segment k's summary token ``e_k``;
    ``spans`` are the segments' token spans ``(a_k, e_k)``, ``gold`` the gold segment. Absolute
    values are taken here, so softmax and signed implicit-attention rows are scored alike.
    """
    m = m.abs().float()
    g = gold
    ends = [e for _, e in spans]
    row_q = m[0]
    tot_q = float(row_q.sum()) or 1e-30
    summ = row_q[ends]
    others = torch.cat([summ[:g], summ[g + 1 :]])
    seg_a, seg_e = spans[g]
    out = {
        "aggregate": (float(summ[g]) - float(others.mean())) / tot_q,
        "aggregate_segment": float(row_q[seg_a : seg_e + 1].sum()) / tot_q,
        "aggregate_peak": float(summ[g]) / max(float(others.max()), 1e-30),
        "aggregate_hit": float(int(summ.argmax()) == g),
    }
    e_g = ends[g]
    beside = [float(row_q[j]) for j in (e_g - 1, e_g + 1) if 0 <= j < row_q.shape[0]]
    out["aggregate_neighbour"] = float(summ[g]) / max(sum(beside) / max(len(beside), 1), 1e-30)
    gathers, contrasts, edges = [], [], []
    for k, (a, e) in enumerate(spans):
        row = m[1 + k, : e + 1]
        tot = float(row.sum()) or 1e-30
        inside = float(row[a:e].sum())
        gathers.append(inside / tot)
        n_in, n_out = max(e - a, 1), max(e + 1 - (e - a) - 1, 1)
        outside = tot - inside - float(row[e])
        contrasts.append((inside / n_in) / max(outside / n_out, 1e-30))
        before = row[max(a - n_in, 0) : a]
        if before.numel():
            edges.append((inside / n_in) / max(float(before.mean()), 1e-30))
    out["gather"] = sum(gathers) / len(gathers)
    out["gather_contrast"] = sum(contrasts) / len(contrasts)
    # a segment at the very start has nothing before it: the mean is over the others
    out["gather_edge"] = math.exp(sum(math.log(max(x, 1e-30)) for x in edges) / len(edges)) if edges else float("nan")
    return out


def head_score(head: str, layer: int, kind: str, samples: dict[str, list[float]], summary_token: str = "end",
               ) -> HeadScore:
    """Summaries (means, geometric means, hit rate) and 95% intervals over prompts from per-prompt values."""
    n = len(samples["aggregate"])
    read = {k: sum(samples[f"read:{k}"]) / n for k in READ_PARTS if f"read:{k}" in samples}
    if "read:at" in samples:
        read["argmax_gold"] = sum(READ_PARTS[int(i)].startswith("gold") for i in samples["read:at"]) / n
    summary: dict[str, Any] = {"summary": summary_token, "read": read}
    for k in METRICS:
        xs = samples[k]
        if k in RATIO_METRICS:
            summary[k], pair = _geo_mean(xs), geo_t_interval(xs)
        elif k == "aggregate_hit":
            summary[k], pair = sum(xs) / n, wilson(int(round(sum(xs))), n)
        else:
            summary[k], pair = sum(xs) / n, t_interval(xs)
        summary.update(ci(pair, k))
    return HeadScore(head=head, layer=layer, kind=kind, n_prompts=n, samples=samples, **summary)


def pattern_scores(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    heads: Sequence[HeadId] | None = None,
    progress: bool = True,
    summary: str = "end",
) -> list[HeadScore]:
    """Aggregate/Gather pattern scores and sharpness for every head, with per-prompt values and
    95% intervals over prompts, and each head's read profile (see module docstring). ``summary``:
    the token scored as each segment's summary, ``"end"`` (the ``\\n``) or ``"last"``."""
    return pattern_scores_by_summary(adapter, examples, heads, progress, (summary,))[summary]


def pattern_scores_by_summary(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    heads: Sequence[HeadId] | None = None,
    progress: bool = True,
    summaries: Sequence[str] = SUMMARIES,
) -> dict[str, list[HeadScore]]:
    """:func:`pattern_scores` under several summary tokens from one pass over the prompts: each
    prompt's map rows for every summary are read in one call, so two summaries cost one map."""
    heads = list(heads) if heads is not None else adapter.heads()
    summaries = list(dict.fromkeys(summaries))
    for s in summaries:
        summary_spans([], s)  # validates
    acc: dict[str, dict[HeadId, dict[str, list[float]]]] = {
        s: {h: {k: [] for k in METRICS} for h in heads} for s in summaries}
    for ex in tqdm(examples, desc="pattern scores", disable=not progress, leave=False):
        ids, full, q = prompt_positions(adapter, ex)
        spans = {s: summary_spans(full, s) for s in summaries}
        g = ex.gold_segment if ex.gold_segment is not None else ex.gold
        rows = list(dict.fromkeys([q, *(e for s in summaries for _, e in spans[s])]))
        at = {r: i for i, r in enumerate(rows)}
        maps = adapter.attention_maps(torch.tensor([ids]), heads, rows=rows)
        for s in summaries:
            pick = torch.tensor([at[q], *(at[e] for _, e in spans[s])])
            for h, m in maps.items():
                for k, v in prompt_metrics(m[pick], spans[s], g).items():
                    acc[s][h][k].append(v)
                for k, v in read_shares(m[0], full, g).items():
                    acc[s][h].setdefault(f"read:{k}", []).append(v)
    return {s: [head_score(str(h), h.layer, adapter.mixer_of(h).kind, acc[s][h], s) for h in heads]
            for s in summaries}


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
    summary: str = "end",
) -> Discovery:
    """Rank heads by pattern scores, then verify the top ``top`` of each list by ablation; every
    head is labelled by :func:`ganda.labels.label_heads` (a candidate is not a Gather or Aggregate
    head unless its score reaches the labeller's minimum)."""
    scores = pattern_scores(adapter, pattern_examples, progress=progress, summary=summary)
    labels = label_model(adapter, pattern_examples, scores)
    for s in scores:
        s.label, s.label_reason = labels[s.head].label, labels[s.head].reason
    by_name = {s.head: s for s in scores}
    top_agg = [s.head for s in sorted(scores, key=lambda s: -s.aggregate)[:top]]
    top_gat = [s.head for s in sorted(scores, key=lambda s: -s.gather)[:top]]
    # gather heads must sit before some aggregate candidate to feed it; we still verify them all.
    # Single-head ablations through the sweep engine: the same numbers as
    # ``evaluate_examples(..., [AblateHeads([h])])`` per head (tested), several times faster.
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
    """``result.json`` (kind ``heads``), ``heads.csv`` (every head, sorted by aggregate score, with
    ``<metric>_ci_low`` / ``<metric>_ci_high`` intervals) and ``per_prompt.csv`` (every head's metrics on every prompt)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(d.scores, key=lambda s: -s.aggregate)
    rows = [s.to_json() for s in ordered]
    verified = [r for r in rows if r["drop"] is not None]
    result = {
        "kind": "heads", "model": model, "ganda_version": runio.ganda_version(), "config": d.task,
        "summary": {
            "baseline_accuracy": d.baseline_accuracy, "n_pattern": d.n_pattern, "n_verify": d.n_verify,
            "top_aggregate": d.top_aggregate, "top_gather": d.top_gather, "ci_method": CI_METHOD,
            "labels": {s.head: s.label for s in ordered if s.label not in (None, "none")},
        },
        "rows": verified,
        "all_heads": rows,
    }
    runio.write_json(out / "result.json", result)
    runio.write_csv(out / "heads.csv", [s.csv_row() for s in ordered])
    runio.write_csv(out / "per_prompt.csv", [{"head": s.head, "prompt": i, **{k: s.samples[k][i] for k in METRICS}}
                                       for s in ordered if s.samples for i in range(s.n_prompts)])


def ablate_until_chance(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    ranked_heads: Sequence[str],
    *,
    chance: float,
    max_heads: int = 24,
    margin: float = 0.05,
    progress: bool = True,
    ablation: str = "zero",
) -> list[dict[str, Any]]:
    """Ablate heads cumulatively in ranked order until accuracy is within ``margin`` of chance
    (``ablation``: zero, mean or resample, :mod:`ganda.ablation`, over ``examples``).

    For models with no single-head bottleneck this answers "how many heads must go": the
    returned curve lists the accuracy after each added head; the last row reached chance (or
    ``max_heads`` was hit).
    """
    curve = []
    chosen: list[str] = []
    for name in tqdm(list(ranked_heads)[:max_heads], desc="cumulative ablation", disable=not progress, leave=False):
        chosen.append(name)
        iv = AblateHeads(list(chosen), how=ablation, reference=examples if ablation != "zero" else None)
        r = evaluate_examples(adapter, examples, [iv], progress=False)
        curve.append({"n_heads": len(chosen), "added": name, "accuracy": r.accuracy, **ci((r.ci_low, r.ci_high))})
        if r.accuracy <= chance + margin:
            break
    return curve


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
) -> dict[str, Any]:
    """:func:`ablate_until_chance` with chance taken from the examples (mean of 1/choices), as a
    JSON-able record; with ``out_dir`` also ``cumulative.json``, ``cumulative.csv`` and a figure.

    The number of heads it takes is the paper's "SSMs need more heads for G&A" measured: a model
    whose retrieval runs through one bottleneck head reaches chance after one or two."""
    chance = sum(1 / len(ex.choices) for ex in examples) / len(examples)
    base = evaluate_examples(adapter, examples, progress=False)
    curve = ablate_until_chance(adapter, examples, ranked_heads, chance=chance, max_heads=max_heads,
                                margin=margin, progress=progress)
    reached = bool(curve) and curve[-1]["accuracy"] <= chance + margin
    rec = {"model": adapter.spec, "n": len(examples), "chance": chance, "margin": margin,
           "baseline": base.accuracy, **ci((base.ci_low, base.ci_high), "baseline"), "reached_chance": reached,
           "heads_to_chance": curve[-1]["n_heads"] if reached else None, "max_heads": max_heads, "curve": curve}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        runio.write_json(out / "cumulative.json", rec)
        runio.write_csv(out / "cumulative.csv", curve)
        x = [0] + [r["n_heads"] for r in curve]
        ys = [base.accuracy] + [r["accuracy"] for r in curve]
        los = [base.ci_low] + [r["ci_low"] for r in curve]
        his = [base.ci_high] + [r["ci_high"] for r in curve]
        curves(x, {"accuracy": ys}, out / "cumulative.png", bands={"accuracy": (los, his)},
               xlabel="heads ablated (most damaging first)", hlines={"chance": chance},
               title=f"Cumulative head ablation ({adapter.spec})", integer_x=True,
               point_labels={"accuracy": added_heads(curve)})
    return rec


def _select_heads(adapter: ModelAdapter, examples: Sequence[Example], k: int, select: str,
                  progress: bool, summary: str = "end") -> tuple[list[str], list[str], dict[str, float]]:
    """Top-``k`` Aggregate-role and Gather-role heads of a model, chosen on ``examples``."""
    if select == "pattern":
        sc = pattern_scores(adapter, examples, progress=progress, summary=summary)
        agg = [s.head for s in sorted(sc, key=lambda s: -s.aggregate)[:k]]
        gat = [s.head for s in sorted(sc, key=lambda s: -s.gather)[:k]]
        return agg, gat, {s.head: s.aggregate for s in sc}
    if select == "drop":
        base = evaluate_examples(adapter, examples, progress=False).accuracy
        drops = {}
        for h in tqdm(adapter.heads(), desc="single-head ablations", disable=not progress, leave=False):
            drops[str(h)] = base - evaluate_examples(adapter, examples, [AblateHeads([str(h)])], progress=False).accuracy
        top = sorted(drops, key=lambda h: -drops[h])[:k]
        return top, list(top), drops
    raise ValueError(f"select must be 'pattern' or 'drop', not {select!r}")


def compare_sharpness(
    adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter],
    task: Any = "lab-mmlu",
    *,
    k: int = 3,
    n: int = 100,
    seed: int = 0,
    select: str = "pattern",
    select_n: int | None = None,
    resamples: int = 2000,
    progress: bool = True,
    heads: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
    summary: str | Mapping[str, str] = "end",
) -> dict[str, Any]:
    """How sharp each model's top G&A heads are, and the differences between models, with CIs.

    ``summary``: the token scored as each segment's summary (``"end"``, the paper's ``\\n``, or
    ``"last"``), for every model or per model name: each model is measured at the token it
    summarises into (see the read profile), which need not be the same token for both.

    ``heads`` (model name -> (Aggregate-role heads, Gather-role heads)) skips the selection and
    measures these heads, e.g. the ones :func:`ganda.experiments.roles.head_roles` labelled
    causally (chosen on other prompts than ``seed``'s).

    Heads are **chosen on other prompts** (``select_n`` prompts, seed ``seed + 1``) than those they
    are measured on (``n`` prompts, seed ``seed``), so selection does not inflate the scores:

    * ``select="pattern"``: the Aggregate-role heads are the top ``k`` by Aggregate score, the
      Gather-role heads the top ``k`` by Gather score;
    * ``select="drop"``: the top ``k`` heads by accuracy drop when each head alone is zero-ablated
      (both roles use the same heads).

    Aggregate metrics (``aggregate``, ``aggregate_segment``, ``aggregate_peak``, ``aggregate_hit``)
    are read from the Aggregate-role heads, Gather metrics from the Gather-role heads. A model's
    value on one prompt is the mean over its ``k`` heads (of ``log x`` for the ratio metrics
    ``aggregate_peak`` and ``gather_contrast``); its summary is the mean over prompts (exponentiated
    for the ratios: a geometric mean). Every model sees the same prompts, so differences are
    paired: the 95% intervals are percentile bootstraps over prompts (``resamples`` draws, seeded
    with ``seed``), the same draw for both models. Differences are first model minus each other
    model (for the ratios: the first model's geometric mean divided by the other's). Positive
    means the first model is sharper: every metric grows with sharpness.

    :func:`compare_sharpness_summaries` gives the same result under several ``summary`` choices
    at the cost of one.
    """
    return compare_sharpness_summaries(adapters, task, k=k, n=n, seed=seed, select=select, select_n=select_n,
                                       resamples=resamples, progress=progress, heads=heads,
                                       summaries=[summary])[0]


def compare_sharpness_summaries(
    adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter],
    task: Any = "lab-mmlu",
    *,
    k: int = 3,
    n: int = 100,
    seed: int = 0,
    select: str = "pattern",
    select_n: int | None = None,
    resamples: int = 2000,
    progress: bool = True,
    heads: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
    summaries: Sequence[str | Mapping[str, str]] = SUMMARIES,
) -> list[dict[str, Any]]:
    """One :func:`compare_sharpness` result per entry of ``summaries`` (each what ``summary`` is
    there), every model's maps read once for all of them (:func:`pattern_scores_by_summary`)."""
    named = dict(adapters) if isinstance(adapters, Mapping) else {a.spec: a for a in adapters}
    if len(named) < 1:
        raise ValueError("give at least one model")
    if isinstance(task, str):
        # paired comparisons need the same prompts: every model must read them in the same world
        built = {name: get_task(task, adapter=a) for name, a in named.items()}
        configs = {name: t.config() for name, t in built.items()}
        first = next(iter(configs.values()))
        odd = [name for name, c in configs.items() if c != first]
        if odd:
            raise GandaError(f"{task}: {', '.join(odd)} was trained on another world than {next(iter(named))}; "
                             "a paired comparison needs the same prompts for every model")
        t = next(iter(built.values()))
    else:
        t = task
    measure = t.examples(limit=n, seed=seed)
    chooser = t.examples(limit=select_n or n, seed=seed + 1)
    models: list[dict[str, Any]] = [{} for _ in summaries]
    per_prompt: list[dict[str, dict[str, list[float]]]] = [{} for _ in summaries]
    for name, adapter in named.items():
        summs = [s.get(name, "end") if isinstance(s, Mapping) else s for s in summaries]
        picks = []  # (Aggregate heads, Gather heads, selection scores) per summary
        for summ in summs:
            if heads is not None and name in heads:
                agg, gat = list(heads[name][0]), list(heads[name][1])
                if not agg or not gat:
                    raise GandaError(f"{name}: give at least one Aggregate-role and one Gather-role head")
                picks.append((agg, gat, {h: float("nan") for h in agg + gat}))
            else:
                picks.append(_select_heads(adapter, chooser, k, select, progress, summ))
        chosen = list(dict.fromkeys(h for agg, gat, _ in picks for h in agg + gat))
        by_summary = pattern_scores_by_summary(adapter, measure, [expand([h], adapter)[0] for h in chosen],
                                               progress, summs)
        for i, (summ, (agg, gat, sel_scores)) in enumerate(zip(summs, picks, strict=True)):
            scored = dict(zip(chosen, by_summary[summ], strict=True))
            values: dict[str, list[float]] = {}
            for metric in METRICS:
                role = agg if metric in AGGREGATE_METRICS else gat
                f = (lambda x: math.log(max(x, 1e-30))) if metric in RATIO_METRICS else (lambda x: x)
                values[metric] = [sum(f(scored[h].samples[metric][j]) for h in role) / len(role)
                                  for j in range(len(measure))]
            per_prompt[i][name] = values
            metrics = {}
            for metric, xs in values.items():
                b = bootstrap_paired(xs, resamples=resamples, seed=seed)
                if metric in RATIO_METRICS:
                    metrics[metric] = {"value": math.exp(b["a"]), **ci([math.exp(v) for v in bounds(b, "a")]),
                                       "scale": "geometric mean"}
                else:
                    metrics[metric] = {"value": b["a"], **ci(bounds(b, "a")), "scale": "mean"}
            models[i][name] = {
                "spec": adapter.spec, "summary": summ, "aggregate_heads": agg, "gather_heads": gat,
                "selection_scores": {h: sel_scores[h] for h in dict.fromkeys(agg + gat)},
                "heads": [scored[h].to_json() for h in dict.fromkeys(agg + gat)], "metrics": metrics,
            }
    names = list(named)
    out = []
    for i in range(len(summaries)):
        diffs = []
        for other in names[1:]:
            for metric in METRICS:
                b = bootstrap_paired(per_prompt[i][names[0]][metric], per_prompt[i][other][metric],
                                     resamples=resamples, seed=seed)
                if metric in RATIO_METRICS:
                    row = {"value": math.exp(b["diff"]), **ci([math.exp(v) for v in bounds(b, "diff")]),
                           "scale": f"ratio {names[0]} / {other} of geometric means"}
                else:
                    row = {"value": b["diff"], **ci(bounds(b, "diff")), "scale": f"difference {names[0]} - {other}"}
                lo, hi = bounds(row)
                neutral = 1.0 if metric in RATIO_METRICS else 0.0
                row["sharper"] = (names[0] if lo > neutral else other if hi < neutral
                                  else "undecided (CI covers no difference)")
                diffs.append({"a": names[0], "b": other, "metric": metric, **row})
        out.append({
            "kind": "sharpness", "task": t.config(), "n": len(measure), "seed": seed, "k": k,
            "select": "given" if heads is not None else select,
            "select_n": len(chooser), "select_seed": seed + 1, "resamples": resamples,
            "ci_method": "percentile bootstrap over prompts (paired: one draw for all models), seeded",
            "models": models[i], "differences": diffs,
        })
    return out


def sharpness_sets(adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter], task: Any = "lab-mmlu", *,
                   prompt_sets: int = 3, seed: int = 0, **kw: Any) -> dict[str, Any]:
    """:func:`compare_sharpness` on ``prompt_sets`` prompt sets (set ``i``: heads chosen on seed
    ``seed + 2i + 1``, measured on ``seed + 2i``), then every difference pooled over the sets
    (:func:`pool_sharpness`). The result is set 1's, with ``sets``, ``seeds`` and ``pooled`` added."""
    sets = [compare_sharpness(adapters, task, seed=seed + 2 * i, **kw) for i in range(prompt_sets)]
    return {**sets[0], "prompt_sets": prompt_sets, "seeds": [seed + 2 * i for i in range(prompt_sets)],
            "sets": sets, "pooled": pool_sharpness(sets)}


def pool_sharpness(sets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each between-model difference of K :func:`compare_sharpness` results pooled
    (:func:`ganda.stats.pool_sets`; ratios on the log scale): the pooled value and interval, on
    how many sets the first model is sharper (its set interval clear of no difference), on how many
    the other is, and which one the pooled interval names (``undecided`` where it covers none)."""
    out = []
    for j, first in enumerate(sets[0]["differences"]):
        rows = [s["differences"][j] for s in sets]
        ratio = first["metric"] in RATIO_METRICS
        f = math.log if ratio else float
        pooled = pool_sets([f(r["value"]) for r in rows], [f(bounds(r)[0]) for r in rows],
                           [f(bounds(r)[1]) for r in rows])
        back = math.exp if ratio else float
        lo, hi = (back(x) for x in bounds(pooled))
        a, b = first["a"], first["b"]
        out.append({"a": a, "b": b, "metric": first["metric"], "value": back(pooled["estimate"]), **ci((lo, hi)),
                    "scale": first["scale"], "k": len(sets),
                    "a_sharper_on": sum(str(r["sharper"]) == a for r in rows),
                    "b_sharper_on": sum(str(r["sharper"]) == b for r in rows),
                    "sharper": a if pooled["pooled_holds"] else b if bounds(pooled)[1] < 0 else
                    "undecided (pooled CI covers no difference)",
                    "between_sd": pooled["between_sd"], "method": pooled["method"]})
    return out


def pooled_sharpness_lines(pooled: Sequence[dict[str, Any]]) -> list[str]:
    """One line per metric: the pooled difference, its interval and how many sets agree."""
    return [f"{r['metric']:<18} {r['value']:9.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]  {r['a']} sharper on "
            f"{r['a_sharper_on']} of {r['k']} sets, {r['b']} on {r['b_sharper_on']}; pooled: {r['sharper']}"
            for r in pooled]


def save_sharpness(res: dict[str, Any], out: Any) -> list[dict[str, Any]]:
    """``result.json`` (kind ``sharpness``), ``sharpness.csv`` and ``sharpness.png`` (a forest plot
    of every between-model difference with its 95% interval) for a :func:`compare_sharpness` result;
    returns the CSV rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runio.write_json(out / "result.json", res)
    rows = [{"model": m, "metric": k, "value": v["value"], **ci(bounds(v)),
             "scale": v["scale"], "heads": ",".join(d["aggregate_heads"] if k.startswith("aggregate")
                                                    else d["gather_heads"])}
            for m, d in res["models"].items() for k, v in d["metrics"].items()]
    rows += [{"model": f"{r['a']} vs {r['b']}", "metric": r["metric"], "value": r["value"], **ci(bounds(r)),
              "scale": r["scale"], "heads": r["sharper"]} for r in res["differences"]]
    runio.write_csv(out / "sharpness.csv", rows)
    if res["differences"]:
        _forest(res["differences"], out / "sharpness.png")
    if res.get("pooled"):
        def row(which: Any, seed: Any, r: dict[str, Any]) -> dict[str, Any]:
            return {"set": which, "seed": seed, "model": f"{r['a']} vs {r['b']}", "metric": r["metric"],
                    "value": r["value"], **ci(bounds(r)), "sharper": r["sharper"]}

        runio.write_csv(out / "prompt_sets.csv",
                        [row(i + 1, st["seed"], r) for i, st in enumerate(res["sets"]) for r in st["differences"]]
                        + [row("pooled", "", r) for r in res["pooled"]])
    return rows


def _forest(diffs: list[dict[str, Any]], path: Any) -> None:
    """One row per metric: ratio (log axis) or difference with its interval; right of the line
    means the first model is sharper."""
    plt = pyplot()
    ratios = [d for d in diffs if d["metric"] in RATIO_METRICS]
    plain = [d for d in diffs if d["metric"] not in RATIO_METRICS]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * max(len(ratios), len(plain)) + 1.6))
    for ax, group, neutral, log in ((axes[0], ratios, 1.0, True), (axes[1], plain, 0.0, False)):
        for i, d in enumerate(group):
            lo, hi = bounds(d)
            color = "C0" if lo > neutral else "C3" if hi < neutral else "0.5"
            ax.errorbar([d["value"]], [i], xerr=[[d["value"] - lo], [hi - d["value"]]], fmt="o", color=color,
                        capsize=3)
        ax.axvline(neutral, color="k", lw=0.8, ls="--")
        ax.set_yticks(range(len(group)), [f"{d['metric']} ({d['b']})" if len(diffs) > len(METRICS) else d["metric"]
                                          for d in group], fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.set_title(("ratio" if log else "difference") + f": {group[0]['a']} vs other" if group else "", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("Sharpness, first model vs the other (blue: first sharper, red: other sharper, grey: undecided)",
                 fontsize=9)
    fig.tight_layout()
    try:
        with runio.atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


class HeadsResult:
    """A saved ``heads`` run (:func:`save_discovery`) as ``ganda report`` shows it: what was found."""

    def __init__(self, d: dict[str, Any]) -> None:
        d = split_all(d)
        self.summary, self.rows = d.get("summary") or {}, d.get("rows") or []

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HeadsResult:
        return cls(d)

    def headline(self) -> str:
        s, lines = self.summary, []
        base, n = s.get("baseline_accuracy"), s.get("n_verify")
        by = {r["head"]: r for r in self.rows if r.get("drop") is not None}
        for role in ("gather", "aggregate"):
            cands = [by[h] for h in s.get(f"top_{role}") or [] if h in by]
            if not cands:
                continue
            best = max(cands, key=lambda r: r["drop"])
            lines.append(f"{role.capitalize()} head **{best['head']}** ({role} score {best[role]:.3g}, best of "
                         f"{len(cands)} verified): ablating it alone takes accuracy from {_pct(base)} to "
                         f"**{_pct(best.get('ablated_accuracy'))}** on {n} prompts"
                         f"{weak_note(base, best.get('ablated_accuracy'), n)}.")
        if lines:
            lines.append(f"Every head ranked by its pattern scores on {s.get('n_pattern')} prompts; the table lists "
                         "the verified ones, heads.csv all of them.")
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        return []


class SharpnessResult:
    """A saved ``sharpness`` run (:func:`save_sharpness`): which model's G&A maps are sharper."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = split_all(d)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SharpnessResult:
        return cls(d)

    def headline(self) -> str:
        lines = []
        for r in self.d.get("differences") or []:
            if r.get("metric") not in ("aggregate", "gather", "aggregate_peak", "gather_contrast"):
                continue
            lo, hi = bounds(r)
            decided = not str(r.get("sharper", "")).startswith("undecided")
            verdict = f"**{r['sharper']}** sharper" if decided else "**undecided** (the 95% interval covers no difference)"
            lines.append(f"{r['metric']}: {verdict}; {r.get('scale', '')} {r['value']:.3g} "
                         f"(95% CI {lo:.3g} to {hi:.3g}, n={self.d.get('n')}).")
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        return []

