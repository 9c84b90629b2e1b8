"""The one labeller every command uses (``heads``, ``roles``, the demo, the circuit view, the
report): each head gets **every** role whose rule it meets, **Gather**, **Aggregate**,
**induction**, **previous-token**, **sink**, each with its score, or **none**.

The scores (shares of ``|M|``, :mod:`ganda.patterns`):

* **aggregate** and **gather**: the G&A pattern scores on the task's prompts, at the summary token
  the model reads (``summary="auto"``: :func:`ganda.patterns.choose_summary`);
* **induction**, **previous_token**, **sink**: the task-free standard scores on repeated random
  tokens (:func:`ganda.patterns.standard_scores`);
* **gather evidence** = gather − min(gather_previous, previous_token): the gather score less what a
  previous-token pattern gives by itself. ``gather_previous`` is the share of each summary row on
  the token right before it (inside the segment, so the gather score counts it); a head that
  attends to the previous token everywhere (its standard previous-token score) earns that much
  of it without gathering anything.

The rules (``MIN_SCORE``):

1. **Aggregate** where the aggregate score >= 0.05.
2. **Gather** where the gather evidence >= 0.25 *and* exceeds the head's standard previous-token
   score (a head whose previous-token pattern is stronger than its gathering is not called Gather).
3. Where both G&A rules are met and a positional ablation was run and hurts (full ablation drop
   >= ``min_drop``), *where* it hurts keeps one of them (the final position: Aggregate; before it:
   Gather); otherwise both are kept, the larger multiple of its minimum first.
4. **induction** where the induction score >= 0.3; **previous-token** where the previous-token
   score >= 0.5; **sink** where the sink share >= 0.5 — each in addition to any other role.
5. **none** where no rule is met.

A label is its roles joined by ``+`` in that order (``"induction+sink"``); ``sink`` alone thus
names only heads that meet no other rule. Every label carries its reason (:attr:`Label.reason`):
each role with the score that met its rule, or every score and the minimum it missed, and where
an ablation was run whether it agrees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .heads import HeadId
from .models.base import ModelAdapter
from .patterns import MIN_AGGREGATE, HeadScore, standard_scores

LABELS = ("Gather", "Aggregate", "induction", "previous-token", "sink", "none")
ROLE_NAME = {"aggregate": "Aggregate", "gather": "Gather", "induction": "induction",
             "previous_token": "previous-token", "sink": "sink"}
# the least score each role needs (shares of |M|; the module docstring). gather: the gather evidence
MIN_SCORE = {"aggregate": MIN_AGGREGATE, "gather": 0.25, "induction": 0.3, "previous_token": 0.5, "sink": 0.5}
GENERIC = ("induction", "previous_token", "sink")  # the task-free roles, in label order
MIN_DROP = 0.05  # a positional ablation speaks only where the full ablation costs this much


@dataclass
class Label:
    head: str
    label: str  # the roles joined by "+", or "none"
    reason: str
    scores: dict[str, float] = field(default_factory=dict)
    roles: list[str] = field(default_factory=list)  # display names (ROLE_NAME), in label order

    def has(self, role: str) -> bool:
        """Whether the head has a role (``"Gather"``, ``"induction"``, ...)."""
        return role in self.roles

    def to_json(self) -> dict[str, Any]:
        return {"head": self.head, "label": self.label, "reason": self.reason, "roles": self.roles, **self.scores}


def parts(label: str | None) -> list[str]:
    """The roles of a joined label (``"induction+sink"`` -> ``["induction", "sink"]``)."""
    return [p for p in (label or "").split("+") if p]


def gather_evidence(gather: float | None, gather_previous: float | None, previous_token: float | None
                    ) -> float | None:
    """The gather score less what a previous-token pattern gives by itself (module docstring);
    with no standard previous-token score the whole previous-token share is taken off."""
    if gather is None:
        return None
    prev = gather_previous or 0.0
    if previous_token is not None and previous_token == previous_token:
        prev = min(prev, previous_token)
    return gather - prev


def _at_least(x: float | None, minimum: float) -> bool:
    return x is not None and x == x and x >= minimum


def _f(x: float) -> str:
    return f"{x:.3f}"


def label_head(head: str, *, aggregate: float | None = None, gather: float | None = None,
               gather_previous: float | None = None, induction: float | None = None,
               previous_token: float | None = None, sink: float | None = None,
               ablation: Mapping[str, float] | None = None, min_drop: float = MIN_DROP) -> Label:
    """One head's label by the module docstring's rules. ``ablation``, where one was run, holds
    the accuracy drops ``drop_all`` (the head zeroed everywhere), ``drop_query`` (at the final
    position only) and ``drop_context`` (everywhere before it)."""
    evidence = gather_evidence(gather, gather_previous, previous_token)
    scores = {"aggregate": aggregate, "gather": evidence, "induction": induction, "previous_token": previous_token,
              "sink": sink}
    kept = {k: float(v) for k, v in {"aggregate": aggregate, "gather": gather, "gather_previous": gather_previous,
                                     "gather_evidence": evidence, "induction": induction,
                                     "previous_token": previous_token, "sink": sink}.items() if v is not None}
    where = None
    if ablation and _at_least(ablation.get("drop_all"), min_drop) and "drop_query" in ablation \
            and "drop_context" in ablation:
        where = "aggregate" if ablation["drop_query"] > ablation["drop_context"] else "gather"
    ga = [r for r in ("aggregate", "gather") if _at_least(scores[r], MIN_SCORE[r])]
    if "gather" in ga and previous_token is not None and previous_token == previous_token \
            and previous_token >= float(evidence):  # type: ignore[arg-type]
        ga.remove("gather")
    why: list[str] = []
    if len(ga) == 2 and where is not None:
        ga = [where]
        why.append("both G&A patterns qualify; the ablation hurts " +
                   ("at the final position" if where == "aggregate" else "before the final position"))
    ga.sort(key=lambda r: -float(scores[r]) / MIN_SCORE[r])  # type: ignore[arg-type]
    for r in ga:
        what = "gather evidence" if r == "gather" else f"{r} score"
        note = ""
        if where is not None and len(why) == 0:
            note = ("; the ablation agrees" if where == r else
                    f"; the ablation hurts {'at' if where == 'aggregate' else 'before'} the final position")
        why.append(f"{what} {_f(float(scores[r]))} >= {MIN_SCORE[r]}{note}")  # type: ignore[arg-type]
    roles = list(ga)
    for k in GENERIC:
        if _at_least(scores[k], MIN_SCORE[k]):
            roles.append(k)
            why.append(f"{k.replace('_', '-')} score {_f(float(scores[k]))} >= {MIN_SCORE[k]}")  # type: ignore[arg-type]
    names = [ROLE_NAME[r] for r in roles]
    if names:
        return Label(head, "+".join(names), "; ".join(why), kept, names)
    missed = [f"{'gather evidence' if k == 'gather' else k} {_f(float(scores[k]))} < {MIN_SCORE[k]}"  # type: ignore[arg-type]
              for k in MIN_SCORE if _at_least(scores[k], -1e9)]
    if _at_least(evidence, MIN_SCORE["gather"]):
        missed.append(f"gather evidence {_f(float(evidence))} <= previous-token score "  # type: ignore[arg-type]
                      f"{_f(float(previous_token))}")  # type: ignore[arg-type]
    return Label(head, "none", f"no rule met ({', '.join(missed)})" if missed else "no score measured", kept, [])


def label_heads(scores: Sequence[HeadScore], standard: Mapping[str, Mapping[str, float]] | None = None,
                ablations: Mapping[str, Mapping[str, float]] | None = None, min_drop: float = MIN_DROP
                ) -> dict[str, Label]:
    """Every scored head's :class:`Label`: ``scores`` from :func:`ganda.patterns.pattern_scores`,
    ``standard`` from :func:`ganda.patterns.standard_scores`, ``ablations`` (head -> drops, see
    :func:`label_head`) for the heads whose ablation was run."""
    standard, ablations = standard or {}, ablations or {}
    out = {}
    for s in scores:
        g = standard.get(s.head, {})
        out[s.head] = label_head(s.head, aggregate=s.aggregate, gather=s.gather, gather_previous=s.gather_previous,
                                 induction=g.get("induction"), previous_token=g.get("previous_token"),
                                 sink=g.get("sink"), ablation=ablations.get(s.head), min_drop=min_drop)
    return out


def label_model(adapter: ModelAdapter, scores: Sequence[HeadScore], *,
                ablations: Mapping[str, Mapping[str, float]] | None = None,
                standard: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Label]:
    """The labels of the heads ``scores`` holds (:func:`ganda.patterns.pattern_scores`), with
    their standard scores measured here unless given; each :class:`~ganda.patterns.HeadScore`
    also takes its standard scores, gather evidence, label and reason."""
    if standard is None:
        heads = [HeadId.parse(s.head) for s in scores]
        measured = standard_scores(adapter, heads)
        standard = {s.head: measured[str(h)] for s, h in zip(scores, heads, strict=True)}
    labels = label_heads(scores, standard, ablations)
    for s in scores:
        lab = labels[s.head]
        s.induction, s.previous_token, s.sink = (lab.scores.get(k) for k in GENERIC)
        s.gather_evidence, s.label, s.label_reason = lab.scores.get("gather_evidence"), lab.label, lab.reason
    return labels


def role_of(label: str | None) -> str:
    """The G&A role a label names, as the demo and the circuit view use it: ``"aggregate"``,
    ``"gather"`` (Aggregate first where a head has both) or ``"neither"``."""
    got = parts(label)
    return "aggregate" if "Aggregate" in got else "gather" if "Gather" in got else "neither"
