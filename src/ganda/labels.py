"""One labeller for every command: each head is **Gather**, **Aggregate**, **induction**,
**previous-token**, **sink** or **none**, by stated rules.

The scores are shares of a head's mixing matrix ``M`` (softmax attention, or an SSM head's
implicit attention), each row's mass measured as ``|M|`` as in :mod:`ganda.discovery`:

* **aggregate** and **gather**: the G&A pattern scores of :mod:`ganda.discovery`
  (:class:`~ganda.discovery.HeadScore`), measured on the task's segmented prompts;
* **previous_token**: the mean share of row ``t`` on position ``t - 1`` (rows ``t >= 2``, so that
  the first token does not count twice);
* **sink**: the mean share of row ``t`` on position 0, the first token (``<bos>`` where the model
  has one) (rows ``t >= 1``);
* **induction**: for every row ``t`` whose token occurred before, the share of row ``t`` on the
  tokens *after* those earlier occurrences (``j + 1`` for each ``j < t`` with ``x_j = x_t``),
  averaged over such rows. :func:`probe_ids` adds a repeated random sequence to the task's
  prompts, so every head sees a prompt where induction is possible.

The rules, first match wins:

1. **Gather / Aggregate** only where the pattern score reaches its minimum
   (``MIN_SCORE``: aggregate >= 0.05, gather >= 0.5); below it a head is never called either,
   whatever its ablation costs. Where both reach it, the role whose score is the larger multiple
   of its minimum wins, unless a positional ablation was run and hurts (full ablation drop >=
   ``min_drop``): then the role of *where* it hurts wins (the final position: Aggregate; before
   it: Gather).
2. **induction** where the induction score is >= 0.3, then **previous-token** where the
   previous-token score is >= 0.5, then **sink** where the sink score is >= 0.5.
3. **none** otherwise.

Every label carries its reason (:attr:`Label.reason`), which names the score that decided it and,
where an ablation was run, whether it agrees (a G&A label whose ablation hurts at the other
position says so; the pattern still decides).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .heads import HeadId
from .models.base import ModelAdapter
from .scoring import encode
from .tasks.base import Example

if TYPE_CHECKING:
    from .discovery import HeadScore

LABELS = ("Gather", "Aggregate", "induction", "previous-token", "sink", "none")
# the least score a head needs for each label (shares of |M|; see the module docstring)
MIN_SCORE = {"aggregate": 0.05, "gather": 0.5, "induction": 0.3, "previous_token": 0.5, "sink": 0.5}
GENERIC = ("induction", "previous_token", "sink")  # in the order the rules try them
GENERIC_LABEL = {"induction": "induction", "previous_token": "previous-token", "sink": "sink"}
MIN_DROP = 0.05  # a positional ablation speaks only where the full ablation costs this much
MAP_BUDGET = 256 * 2**20  # bytes of full [T, T] maps held at once by generic_scores


@dataclass
class Label:
    head: str
    label: str
    reason: str
    scores: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"head": self.head, "label": self.label, "reason": self.reason, **self.scores}


def map_scores(m: torch.Tensor, ids: Sequence[int]) -> dict[str, tuple[float, int]]:
    """Previous-token, sink and induction scores of one full ``[T, T]`` map over tokens ``ids``,
    each as ``(sum of per-row shares, rows counted)`` so that prompts can be pooled."""
    r = m.abs().float()
    t_len = r.shape[0]
    tot = r.sum(dim=1).clamp_min(1e-30)
    share = r / tot[:, None]
    out: dict[str, tuple[float, int]] = {}
    rows = torch.arange(2, t_len)
    out["previous_token"] = (float(share[rows, rows - 1].sum()), len(rows))
    out["sink"] = (float(share[1:, 0].sum()), t_len - 1)
    ind, n = 0.0, 0
    seen: dict[int, list[int]] = {}
    for t, tok in enumerate(ids):
        before = seen.get(tok)
        if before:
            ind += float(share[t, [j + 1 for j in before]].sum())
            n += 1
        seen.setdefault(tok, []).append(t)
    out["induction"] = (ind, n)
    return out


def probe_ids(adapter: ModelAdapter, examples: Sequence[Example], n: int = 4, seed: int = 0,
              repeat_len: int = 16) -> list[list[int]]:
    """Token ids to score previous-token, sink and induction on: the first ``n`` prompts, and a
    random sequence of ``repeat_len`` of their distinct tokens shown twice (after ``<bos>`` where
    the prompts start with one), where an induction head can read the token after the earlier
    occurrence."""
    seqs = [encode(adapter, ex.prompt) for ex in list(examples)[:n]]
    if not seqs:
        return []
    tok = adapter.require_tokenizer()
    special = set(getattr(tok, "all_special_ids", []) or [])
    pool = sorted({i for s in seqs for i in s if i not in special})
    random.Random(seed).shuffle(pool)
    rep = pool[:repeat_len]
    if len(rep) >= 2:
        bos = seqs[0][:1] if seqs[0] and seqs[0][0] in special else []
        seqs.append([*bos, *rep, *rep])
    return seqs


def generic_scores(adapter: ModelAdapter, seqs: Sequence[Sequence[int]], heads: Sequence[HeadId] | None = None
                   ) -> dict[str, dict[str, float]]:
    """Per head (by name), its previous-token, sink and induction scores pooled over the rows of
    ``seqs`` (module docstring); ``nan`` where no row counts (no repeated token: no induction)."""
    heads = list(heads) if heads is not None else adapter.heads()
    acc = {h: {k: [0.0, 0] for k in GENERIC} for h in heads}
    for ids in seqs:
        step = max(1, MAP_BUDGET // (4 * len(ids) ** 2))  # heads per pass: full fp32 maps within the budget
        for i in range(0, len(heads), step):
            maps = adapter.attention_maps(torch.tensor([list(ids)]), heads[i : i + step])
            for h, m in maps.items():
                for k, (s, c) in map_scores(m, ids).items():
                    acc[h][k][0] += s
                    acc[h][k][1] += c
    return {str(h): {k: (s / c if c else float("nan")) for k, (s, c) in v.items()} for h, v in acc.items()}


def _at_least(x: float | None, minimum: float) -> bool:
    return x is not None and x == x and x >= minimum


def label_head(head: str, *, aggregate: float | None = None, gather: float | None = None,
               induction: float | None = None, previous_token: float | None = None, sink: float | None = None,
               ablation: Mapping[str, float] | None = None, min_drop: float = MIN_DROP) -> Label:
    """One head's label by the module docstring's rules. ``ablation``, where one was run, holds
    the accuracy drops ``drop_all`` (the head zeroed everywhere), ``drop_query`` (at the final
    position only) and ``drop_context`` (everywhere before it)."""
    scores = {"aggregate": aggregate, "gather": gather, "induction": induction, "previous_token": previous_token,
              "sink": sink}
    kept = {k: float(v) for k, v in scores.items() if v is not None}
    where = None
    if ablation and _at_least(ablation.get("drop_all"), min_drop) and "drop_query" in ablation \
            and "drop_context" in ablation:
        where = "aggregate" if ablation["drop_query"] > ablation["drop_context"] else "gather"
    cands = [r for r in ("aggregate", "gather") if _at_least(scores[r], MIN_SCORE[r])]
    if cands:
        if len(cands) == 2 and where is not None:
            role, why = where, "both patterns qualify; the ablation hurts "
            why += "at the final position" if where == "aggregate" else "before the final position"
        else:
            role = max(cands, key=lambda r: float(scores[r]) / MIN_SCORE[r])  # type: ignore[arg-type]
            why = f"{role} score {float(scores[role]):.3f} >= {MIN_SCORE[role]}"  # type: ignore[arg-type]
            if where is not None:
                why += ("; the ablation agrees" if where == role else
                        f"; the ablation hurts {'at' if where == 'aggregate' else 'before'} the final position")
        return Label(head, role.capitalize(), why, kept)
    for k in GENERIC:
        if _at_least(scores[k], MIN_SCORE[k]):
            return Label(head, GENERIC_LABEL[k], f"{k.replace('_', '-')} score {float(scores[k]):.3f} >= "
                                                 f"{MIN_SCORE[k]}", kept)
    best = ", ".join(f"{k} {float(scores[k]):.3f} < {MIN_SCORE[k]}" for k in MIN_SCORE if _at_least(scores[k], -1e9))
    return Label(head, "none", f"no score reaches its minimum ({best})" if best else "no score measured", kept)


def label_heads(scores: Sequence[HeadScore], generic: Mapping[str, Mapping[str, float]] | None = None,
                ablations: Mapping[str, Mapping[str, float]] | None = None, min_drop: float = MIN_DROP
                ) -> dict[str, Label]:
    """Every scored head's :class:`Label`: ``scores`` from :func:`ganda.discovery.pattern_scores`,
    ``generic`` from :func:`generic_scores`, ``ablations`` (head -> drops, see :func:`label_head`)
    for the heads whose ablation was run."""
    generic, ablations = generic or {}, ablations or {}
    out = {}
    for s in scores:
        g = generic.get(s.head, {})
        out[s.head] = label_head(s.head, aggregate=s.aggregate, gather=s.gather, induction=g.get("induction"),
                                 previous_token=g.get("previous_token"), sink=g.get("sink"),
                                 ablation=ablations.get(s.head), min_drop=min_drop)
    return out


def label_model(adapter: ModelAdapter, examples: Sequence[Example], scores: Sequence[HeadScore], *,
                ablations: Mapping[str, Mapping[str, float]] | None = None, seed: int = 0) -> dict[str, Label]:
    """The labels of the heads ``scores`` holds (pattern scores from
    :func:`ganda.discovery.pattern_scores` on ``examples``): their previous-token, sink and
    induction scores on :func:`probe_ids` of ``examples``, then :func:`label_heads`."""
    heads = [HeadId.parse(s.head) for s in scores]
    generic = generic_scores(adapter, probe_ids(adapter, examples, seed=seed), heads)
    return label_heads(scores, generic, ablations)
