"""What a head's mixing matrix shows: the task-based Gather and Aggregate pattern scores, and the
task-free standard scores (induction, previous-token, sink) the labeller (:mod:`ganda.labels`) reads.


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
``\n``), ``summary="end"``. A model may summarise elsewhere: into the option's last *word*
(``"last"``, the token before the ``\n``), or into a token counted from the segment's start
(``"first"``, ``"first+1"``, ...: in lab-mmlu's ``A. cold port\n`` the letter, the ``.`` and
the first word). Every metric is then scored with that token as the summary (the segment is its
tokens up to it). ``summary="auto"`` (:func:`choose_summary`) finds the token from the final
rows: the candidate of ``SUMMARY_TOKENS`` on which some head's final row reads the gold segment
most (the largest Aggregate score of any head whose score meets the labeller's Aggregate rule:
the minimum, with a 95% interval over prompts above 0, :func:`reads_gold`), else the ``\n``.
The **read profile** (:func:`read_shares`, in ``ganda heads``) shows where each head's final row lands: the share on the gold and on the other segments' first
token, inner tokens, last token before the ``\n``, and ``\n``, and outside every segment.

Every metric is computed per prompt (:func:`prompt_metrics`) and kept (``HeadScore.samples``),
so each comes with a 95% interval over prompts (``HeadScore.<metric>_ci_low`` and
``HeadScore.<metric>_ci_high``, the names the result files use): a Student-t interval of the mean for ``aggregate``,
``aggregate_segment`` and ``gather``; the t interval of ``log x``, exponentiated, for the geometric
means of the ratios (``aggregate_peak``, ``aggregate_neighbour``, ``gather_contrast``,
``gather_edge``); a Wilson interval for the proportion ``aggregate_hit``. Intervals treat prompts as independent draws.
:func:`ganda.experiments.sharpness.compare_sharpness` compares models' top heads with a paired bootstrap over prompts.


**Standard scores** (:func:`standard_scores`), the field's task-free protocol (TransformerLens;
Olsson et al. 2022): ``STANDARD["batch"]`` sequences, each ``<bos>`` (the tokenizer's, where it has
one) then ``L = STANDARD["length"]`` tokens drawn uniformly (with replacement, seeded
``STANDARD["seed"]``) from the vocabulary less its special tokens, the ``L`` tokens shown twice.
With ``p`` the prefix length (1 with ``<bos>``) and ``share(i, j) = |M[i, j]| / Σ_k |M[i, k]|``:

* **induction** = mean over rows ``i`` of the second copy (``p + L <= i < p + 2L``) of
  ``share(i, i - L + 1)``, the token after the earlier occurrence of ``x_i``;
* **previous_token** = mean over rows ``i >= 1`` of ``share(i, i - 1)``;
* **sink** = mean over rows ``i >= 1`` of ``share(i, 0)``, the first token (``induction_sink``:
  the same over the second copy's rows, for :func:`ganda.labels.off_sink`);

each averaged over the sequences. For softmax heads ``share`` is the attention itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .errors import GandaError
from .heads import HeadId
from .intervals import ci, split
from .models.base import ModelAdapter
from .progress import tqdm
from .scoring import encode
from .stats import geo_t_interval, t_interval, wilson
from .tasks.base import Example, token_spans

METRICS = ("aggregate", "aggregate_segment", "gather", "aggregate_peak", "aggregate_hit", "gather_contrast",
           "aggregate_neighbour", "gather_edge")
# averaged geometrically, compared on log scale
RATIO_METRICS = ("aggregate_peak", "gather_contrast", "aggregate_neighbour", "gather_edge")
AGGREGATE_METRICS = ("aggregate", "aggregate_segment", "aggregate_peak", "aggregate_hit", "aggregate_neighbour")
SUMMARIES = ("end", "last")  # the summaries ganda sharpness compares
# every token a summary may be (module docstring); "auto" chooses one of them (choose_summary)
SUMMARY_TOKENS = ("end", "last", "first", "first+1", "first+2", "first+3")
AUTO = "auto"
MIN_AGGREGATE = 0.05  # the Aggregate minimum of ganda.labels: a summary is chosen only where a head meets it (reads_gold)
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
    gather_previous: float | None = None  # share of each summary row on its previous token (inside the segment)
    gather_evidence: float | None = None  # gather less what a previous-token pattern gives by itself (ganda.labels)
    gather_sink: float | None = None  # share of each summary row on the first token
    aggregate_sink: float | None = None  # share of the final row on the first token
    # the task-free standard scores (standard_scores); None where they were not measured
    induction: float | None = None
    previous_token: float | None = None
    sink: float | None = None
    induction_sink: float | None = None  # the sink share of the rows induction is measured on (ganda.labels)
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
    # every role the head's scores meet, joined by "+" (e.g. "induction+sink"), or none (ganda.labels)
    label: str | None = None
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
    """Segment spans whose last token is the summary: as they are (``"end"``), cut before their
    last token (``"last"``: the last token before the ``\\n``), or cut after their ``k``-th token
    (``"first+k"``; ``"first"`` is ``k = 0``); a segment too short keeps its own last token."""
    if summary not in SUMMARY_TOKENS:
        raise GandaError(f"summary must be one of {', '.join(SUMMARY_TOKENS)}, not {summary!r}")
    if summary == "end":
        return list(spans)
    if summary == "last":
        return [(a, e - 1 if e > a else e) for a, e in spans]
    k = int(summary.partition("+")[2] or 0)
    return [(a, min(a + k, e)) for a, e in spans]


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
    gathers, previous, first, contrasts, edges = [], [], [], [], []
    for k, (a, e) in enumerate(spans):
        row = m[1 + k, : e + 1]
        tot = float(row.sum()) or 1e-30
        inside = float(row[a:e].sum())
        gathers.append(inside / tot)
        previous.append(float(row[e - 1]) / tot if e > a else 0.0)
        first.append(float(row[0]) / tot if a > 0 else 0.0)
        n_in, n_out = max(e - a, 1), max(e + 1 - (e - a) - 1, 1)
        outside = tot - inside - float(row[e])
        contrasts.append((inside / n_in) / max(outside / n_out, 1e-30))
        before = row[max(a - n_in, 0) : a]
        if before.numel():
            edges.append((inside / n_in) / max(float(before.mean()), 1e-30))
    out["gather"] = sum(gathers) / len(gathers)
    out["gather_previous"] = sum(previous) / len(previous)
    out["gather_sink"] = sum(first) / len(first)
    out["aggregate_sink"] = float(row_q[0]) / tot_q
    out["gather_contrast"] = sum(contrasts) / len(contrasts)
    # a segment at the very start has nothing before it: the mean is over the others
    out["gather_edge"] = _geo_mean(edges) if edges else float("nan")
    return out


def head_score(head: str, layer: int, kind: str, samples: dict[str, list[float]], summary_token: str = "end",
               ) -> HeadScore:
    """Summaries (means, geometric means, hit rate) and 95% intervals over prompts from per-prompt values."""
    n = len(samples["aggregate"])
    read = {k: sum(samples[f"read:{k}"]) / n for k in READ_PARTS if f"read:{k}" in samples}
    if "read:at" in samples:
        read["argmax_gold"] = sum(READ_PARTS[int(i)].startswith("gold") for i in samples["read:at"]) / n
    summary: dict[str, Any] = {"summary": summary_token, "read": read}
    for k in ("gather_previous", "gather_sink", "aggregate_sink"):
        if samples.get(k):
            summary[k] = sum(samples[k]) / n
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
    the token scored as each segment's summary, one of ``SUMMARY_TOKENS`` or ``"auto"``
    (:func:`choose_summary` over every head the model runs, whichever ``heads`` are returned)."""
    return summary_scores(adapter, examples, heads, progress, summary)[0]


def summary_scores(adapter: ModelAdapter, examples: Sequence[Example], heads: Sequence[HeadId] | None = None,
                   progress: bool = True, summary: str = "end") -> tuple[list[HeadScore], str, dict[str, Any]]:
    """:func:`pattern_scores`, with the summary token scored and, where ``summary`` is ``"auto"``,
    the choice's evidence (:func:`choose_summary`; empty where a token was named)."""
    if summary != AUTO:
        return pattern_scores_by_summary(adapter, examples, heads, progress, (summary,))[summary], summary, {}
    by = pattern_scores_by_summary(adapter, examples, None, progress, SUMMARY_TOKENS)  # the choice reads every running head
    chosen, best = choose_summary(by)
    if heads is None:
        return by[chosen], chosen, best
    named = {s.head: s for s in by[chosen]}
    return [named[str(adapter.canonical(h))] for h in heads], chosen, best


def reads_gold(score: HeadScore, minimum: float = MIN_AGGREGATE) -> bool:
    """Whether a head's final row reads the gold summary (module docstring): its Aggregate score
    reaches ``minimum`` and the score's 95% interval over prompts lies above 0 (where one was
    measured), so that a row blind to which segment is gold, whose score is 0 in expectation,
    does not pass on a few lucky prompts."""
    low = score.aggregate_ci_low
    return score.aggregate >= minimum and (low is None or low > 0)


def choose_summary(by_summary: Mapping[str, Sequence[HeadScore]], minimum: float = MIN_AGGREGATE
                   ) -> tuple[str, dict[str, dict[str, Any]]]:
    """The summary token the model reads (module docstring): of the candidates scored in
    ``by_summary`` (:func:`pattern_scores_by_summary`), the one on which a head's final row reads
    the gold summary (:func:`reads_gold`) with the largest Aggregate score; else ``"end"``. Also
    each candidate's evidence: its best such head (else its best head by score), the score and its
    interval, and whether it reads the gold (``reads_gold``)."""
    best = {}
    for s, scores in by_summary.items():
        reading = [x for x in scores if reads_gold(x, minimum)]
        top = max(reading or scores, key=lambda x: x.aggregate)
        best[s] = {"head": top.head, "aggregate": top.aggregate, "aggregate_ci_low": top.aggregate_ci_low,
                   "aggregate_ci_high": top.aggregate_ci_high, "reads_gold": bool(reading)}
    found = [s for s in best if best[s]["reads_gold"]]
    return (max(found, key=lambda s: best[s]["aggregate"]) if found else "end"), best


def pattern_scores_by_summary(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    heads: Sequence[HeadId] | None = None,
    progress: bool = True,
    summaries: Sequence[str] = SUMMARIES,
) -> dict[str, list[HeadScore]]:
    """:func:`pattern_scores` under several summary tokens from one pass over the prompts: each
    prompt's map rows for every summary are read in one call, so two summaries cost one map."""
    heads = list(heads) if heads is not None else adapter.heads(running=True)  # a submodel: its own heads
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
                    acc[s][h].setdefault(k, []).append(v)
                for k, v in read_shares(m[0], full, g).items():
                    acc[s][h].setdefault(f"read:{k}", []).append(v)
    return {s: [head_score(str(h), h.layer, adapter.mixer_of(h).kind, acc[s][h], s) for h in heads]
            for s in summaries}


def _geo_mean(xs: list[float]) -> float:
    """Ratios are averaged geometrically (a 10x and a 0.1x prompt average to 1x)."""
    return math.exp(sum(math.log(max(x, 1e-30)) for x in xs) / len(xs))



# the standard protocol (module docstring): sequences, tokens per copy, seed of the token draw
STANDARD = {"batch": 10, "length": 50, "seed": 0}
# the scores of the protocol, and the first-token share of the rows induction is measured on
STANDARD_SCORES = ("induction", "previous_token", "sink", "induction_sink")
MAP_BUDGET = 256 * 2**20  # bytes of full [T, T] maps held at once by standard_scores


def repeated_tokens(adapter: ModelAdapter, batch: int = STANDARD["batch"], length: int = STANDARD["length"],
                    seed: int = STANDARD["seed"]) -> tuple[list[list[int]], int, int]:
    """The standard protocol's sequences (module docstring): ``batch`` lists of token ids, each
    ``<bos>`` (where the tokenizer has one) then ``length`` random tokens twice; also the prefix
    length and the length used (shortened to fit the model's context where it must)."""
    tok = adapter.require_tokenizer()
    special = set(getattr(tok, "all_special_ids", []) or [])
    emb = adapter.model.get_input_embeddings() if hasattr(adapter.model, "get_input_embeddings") else None
    n_vocab = min(len(tok), getattr(emb, "num_embeddings", len(tok)) or len(tok))
    pool = torch.tensor([i for i in range(n_vocab) if i not in special])
    prefix = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []
    if adapter.n_ctx is not None:
        length = min(length, (adapter.n_ctx - len(prefix)) // 2)
    if length < 2 or len(pool) < 2:
        raise GandaError(f"{adapter.spec}: too short a context or vocabulary for the standard role scores")
    g = torch.Generator().manual_seed(seed)
    draws = pool[torch.randint(len(pool), (batch, length), generator=g)].tolist()
    return [[*prefix, *d, *d] for d in draws], len(prefix), length


def standard_map_scores(m: torch.Tensor, prefix: int, length: int) -> dict[str, float]:
    """Induction, previous-token and sink scores of one head's full ``[T, T]`` map of one
    protocol sequence (module docstring; shares of ``|M|``)."""
    r = m.abs().float()
    share = r / r.sum(dim=1, keepdim=True).clamp_min(1e-30)
    second = torch.arange(prefix + length, prefix + 2 * length)
    rows = torch.arange(1, share.shape[0])
    return {"induction": float(share[second, second - length + 1].mean()),
            "previous_token": float(share[rows, rows - 1].mean()),
            "sink": float(share[rows, 0].mean()),
            "induction_sink": float(share[second, 0].mean())}


def standard_scores(adapter: ModelAdapter, heads: Sequence[HeadId] | None = None, *, batch: int = STANDARD["batch"],
                    length: int = STANDARD["length"], seed: int = STANDARD["seed"], progress: bool = False
                    ) -> dict[str, dict[str, float]]:
    """Per head (by name), its standard induction, previous-token and sink scores, each the mean
    over the ``batch`` protocol sequences of :func:`repeated_tokens` (module docstring)."""
    heads = list(heads) if heads is not None else adapter.heads(running=True)
    seqs, prefix, length = repeated_tokens(adapter, batch, length, seed)
    acc = {h: dict.fromkeys(STANDARD_SCORES, 0.0) for h in heads}
    step = max(1, MAP_BUDGET // (4 * len(seqs[0]) ** 2))  # heads per pass: full fp32 maps within the budget
    for ids in tqdm(seqs, desc="standard scores", disable=not progress, leave=False):
        for i in range(0, len(heads), step):
            for h, m in adapter.attention_maps(torch.tensor([ids]), heads[i : i + step]).items():
                for k, v in standard_map_scores(m, prefix, length).items():
                    acc[h][k] += v / len(seqs)
    return {str(h): v for h, v in acc.items()}


def standard_protocol(adapter: ModelAdapter, batch: int = STANDARD["batch"], length: int = STANDARD["length"],
                      seed: int = STANDARD["seed"]) -> dict[str, Any]:
    """The protocol as a result file records it: sequences, length, prefix, seed."""
    _, prefix, used = repeated_tokens(adapter, 1, length, seed)
    return {"protocol": "repeated random tokens (TransformerLens)", "batch": batch, "length": used,
            "bos_prefix": bool(prefix), "seed": seed}
