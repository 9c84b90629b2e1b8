"""The one labeller every command uses (``heads``, ``roles``, the demo, the circuit view, the
report): each head gets **every** role whose rule it meets, **Gather**, **Aggregate**,
**induction**, **previous-token**, **sink**, each with its score, or **none**.

The scores (shares of ``|M|``, :mod:`ganda.patterns`):

* **aggregate** and **gather**: the G&A pattern scores on the task's prompts, at the summary token
  the model reads (``summary="auto"``: :func:`ganda.patterns.choose_summary`), the aggregate score
  with its 95% interval over prompts;
* **induction**, **previous_token**, **sink**: the task-free standard scores on repeated random
  tokens (:func:`ganda.patterns.standard_scores`);
* **gather evidence** = gather − min(gather_previous, previous_token): the gather score less what a
  previous-token pattern gives by itself. ``gather_previous`` is the share of each summary row on
  the token right before it (inside the segment, so the gather score counts it); a head that
  attends to the previous token everywhere (its standard previous-token score) earns that much
  of it without gathering anything.

Each role is judged on the attention a head does not park on the first token (``<bos>`` where
the model has one): a score ``x`` measured on rows that put ``s`` of their mass on the first
token counts as ``x / (1 - s)`` (:func:`off_sink`; ``s``: the final row's share for aggregate,
the summary rows' for gather, the second copy's rows' for induction, the standard sink share for
previous-token; each a ratio of means over the same rows), and
must itself reach half the minimum, so that crumbs beside a sink make no role. The rules
(``MIN_SCORE``, each on the score off the first token):

1. **Aggregate** where the aggregate score >= 0.05 *and* its 95% interval over prompts lies above 0
   (where one was measured: two prompts or more). The aggregate score is a contrast, the gold
   summary's share less the other summaries' mean, so a final row that reads the options without
   regard to which one is gold scores 0 in expectation; a mean of 0.05 whose interval reaches 0
   is such a reader seen on too few prompts.
2. **Gather** where the gather evidence >= 0.25 *and* exceeds the head's standard previous-token
   score (a head whose previous-token pattern is as strong as its gathering is not called Gather).
3. Where both G&A rules are met and a positional ablation was run and hurts (full ablation drop
   >= ``min_drop``), *where* it hurts keeps one of them (:func:`where_it_hurts`: the final
   position, Aggregate; before it, Gather); otherwise both are kept, the larger multiple of its
   minimum first.
4. **induction** where the induction score >= 0.3; **previous-token** where the previous-token
   score >= 0.5 — each in addition to any other role; **sink** where the sink share itself >= 0.5.
5. **none** where no rule is met.

``ganda roles`` also states each ablated head's *causal role* by the same position rule
(:func:`causal_role`): ``aggregate`` or ``gather`` where its ablation hurts, ``-`` where it costs
less than ``min_drop``, ``knowledge`` where it costs a control task more than ``max_control_drop``.

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
MAX_CONTROL_DROP = 0.1  # a head that costs a control task more than this carries knowledge, not retrieval
WHERE = {"aggregate": "at the final position", "gather": "before the final position"}


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


def where_it_hurts(ablation: Mapping[str, float] | None, min_drop: float = MIN_DROP) -> str | None:
    """The G&A role the position of a head's ablation points to: ``"aggregate"`` where ablating it
    at the final position alone (``drop_query``) costs more than before it (``drop_context``),
    ``"gather"`` otherwise (a Gather head writes into the segments, an Aggregate head reads them
    at the final position); None where no positional ablation was run or the full ablation
    (``drop_all``) costs less than ``min_drop``, so that the position of a harmless ablation
    decides nothing."""
    if not ablation or not _at_least(ablation.get("drop_all"), min_drop):
        return None
    query, context = ablation.get("drop_query"), ablation.get("drop_context")
    if query is None or context is None:
        return None
    return "aggregate" if query > context else "gather"


def causal_role(ablation: Mapping[str, float], *, control_drop: float | None = None, min_drop: float = MIN_DROP,
                max_control_drop: float = MAX_CONTROL_DROP) -> str:
    """A head's causal role from its ablations (``ganda roles``' ``role`` column): ``"-"`` where
    its full ablation costs less than ``min_drop``; ``"knowledge"`` where it costs a control task
    (``control_drop``, None where none was run) more than ``max_control_drop`` (it carries what the
    task needs to know, not how it is retrieved); else :func:`where_it_hurts`."""
    if not _at_least(ablation.get("drop_all"), min_drop):
        return "-"
    if control_drop is not None and control_drop > max_control_drop:
        return "knowledge"
    return where_it_hurts(ablation, min_drop) or "-"


def off_sink(x: float | None, sink: float | None) -> float | None:
    """A role score as a share of the attention a head does not park on the first token:
    ``x / (1 - sink)``, ``sink`` the share on the first token of the rows ``x`` was measured on."""
    if x is None or x != x:
        return None
    s = sink if sink is not None and sink == sink else 0.0
    return x / max(1.0 - s, 1e-9)


def meets(role: str, x: float | None, sink: float | None) -> bool:
    """A role's rule on its score (module docstring): the score off the first token reaches the
    minimum, and the score itself half of it."""
    rest = off_sink(x, sink)
    return _at_least(rest, MIN_SCORE[role]) and _at_least(x, MIN_SCORE[role] / 2)


def label_head(head: str, *, aggregate: float | None = None, gather: float | None = None,
               gather_previous: float | None = None, induction: float | None = None,
               previous_token: float | None = None, sink: float | None = None,
               aggregate_sink: float | None = None, gather_sink: float | None = None,
               induction_sink: float | None = None, aggregate_ci_low: float | None = None,
               ablation: Mapping[str, float] | None = None, min_drop: float = MIN_DROP) -> Label:
    """One head's label by the module docstring's rules. ``aggregate_sink`` and ``gather_sink``:
    the share of the final row and of the summary rows on the first token (task prompts);
    ``sink``: the standard sink share; ``aggregate_ci_low``: the lower end of the aggregate
    score's 95% interval over prompts (None: none measured, the score alone decides).
    ``ablation``, where one was run, holds the accuracy drops
    ``drop_all`` (the head zeroed everywhere), ``drop_query`` (at the final position only) and
    ``drop_context`` (everywhere before it)."""
    evidence = gather_evidence(gather, gather_previous, previous_token)
    scores = {"aggregate": aggregate, "gather": evidence, "induction": induction, "previous_token": previous_token}
    first = {"aggregate": aggregate_sink, "gather": gather_sink, "induction": induction_sink, "previous_token": sink}
    kept = {k: float(v) for k, v in {"aggregate": aggregate, "gather": gather, "gather_previous": gather_previous,
                                     "gather_evidence": evidence, "induction": induction,
                                     "previous_token": previous_token, "sink": sink, "aggregate_sink": aggregate_sink,
                                     "gather_sink": gather_sink, "induction_sink": induction_sink,
                                     "aggregate_ci_low": aggregate_ci_low}.items() if v is not None}
    where = where_it_hurts(ablation, min_drop)
    met = {r: float(off_sink(scores[r], first[r])) for r in scores if meets(r, scores[r], first[r])}  # type: ignore[arg-type]
    unsure = "aggregate" in met and aggregate_ci_low is not None and not aggregate_ci_low > 0
    if unsure:
        del met["aggregate"]
    beaten = "gather" in met and _at_least(previous_token, float(evidence))  # type: ignore[arg-type]
    if beaten:
        del met["gather"]
    ga = sorted((r for r in ("aggregate", "gather") if r in met), key=lambda r: -met[r] / MIN_SCORE[r])
    why: list[str] = []
    if len(ga) == 2 and where is not None:
        ga = [where]
        why.append(f"both G&A patterns qualify; the ablation hurts {WHERE[where]}")
    roles = [*ga, *(r for r in ("induction", "previous_token") if r in met)]
    for r in roles:
        what = "gather evidence" if r == "gather" else f"{r.replace('_', '-')} score"
        rest = "" if abs(met[r] - float(scores[r])) < 5e-4 else f" ({_f(met[r])} off the first token)"  # type: ignore[arg-type]
        note = ""
        if r in ("aggregate", "gather") and where is not None and len(ga) == 1 and not why[:1]:
            note = ("; the ablation agrees" if where == r else
                    f"; the ablation hurts {'at' if where == 'aggregate' else 'before'} the final position")
        low = f", 95% interval from {_f(aggregate_ci_low)}" if r == "aggregate" and aggregate_ci_low is not None else ""
        why.append(f"{what} {_f(float(scores[r]))}{rest} >= {MIN_SCORE[r]}{low}{note}")  # type: ignore[arg-type]
    if _at_least(sink, MIN_SCORE["sink"]):
        roles.append("sink")
        why.append(f"sink share {_f(float(sink))} >= {MIN_SCORE['sink']}")  # type: ignore[arg-type]
    not_gather = (f"not Gather: gather evidence {_f(float(evidence))} <= previous-token score "  # type: ignore[arg-type]
                  f"{_f(float(previous_token))}") if beaten else None  # type: ignore[arg-type]
    not_aggregate = (f"not Aggregate: aggregate score {_f(float(aggregate))}'s 95% interval over prompts "  # type: ignore[arg-type]
                     f"reaches {_f(float(aggregate_ci_low))}, not above 0") if unsure else None  # type: ignore[arg-type]
    nots = [n for n in (not_aggregate, not_gather) if n]
    names = [ROLE_NAME[r] for r in roles]
    if names:
        return Label(head, "+".join(names), "; ".join([*why, *nots]), kept, names)
    missed = [f"{'gather evidence' if k == 'gather' else k.replace('_', '-')} {_f(float(v))} < {MIN_SCORE[k]}"
              for k, v in (*scores.items(), ("sink", sink)) if _at_least(v, -1e9) and k not in met
              and not (k == "gather" and beaten) and not (k == "aggregate" and unsure)]
    missed += nots
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
                                 sink=g.get("sink"), induction_sink=g.get("induction_sink"),
                                 aggregate_sink=s.aggregate_sink, gather_sink=s.gather_sink,
                                 aggregate_ci_low=s.aggregate_ci_low, ablation=ablations.get(s.head),
                                 min_drop=min_drop)
    return out


def label_model(adapter: ModelAdapter, scores: Sequence[HeadScore], *,
                ablations: Mapping[str, Mapping[str, float]] | None = None,
                standard: Mapping[str, Mapping[str, float]] | None = None, min_drop: float = MIN_DROP
                ) -> dict[str, Label]:
    """The labels of the heads ``scores`` holds (:func:`ganda.patterns.pattern_scores`), with
    their standard scores measured here unless given; each :class:`~ganda.patterns.HeadScore`
    also takes its standard scores, gather evidence, label and reason."""
    if standard is None:
        heads = [HeadId.parse(s.head) for s in scores]
        measured = standard_scores(adapter, heads)
        standard = {s.head: measured[str(h)] for s, h in zip(scores, heads, strict=True)}
    labels = label_heads(scores, standard, ablations, min_drop)
    for s in scores:
        lab = labels[s.head]
        s.induction, s.previous_token, s.sink = (lab.scores.get(k) for k in GENERIC)
        s.induction_sink = lab.scores.get("induction_sink")
        s.gather_evidence, s.label, s.label_reason = lab.scores.get("gather_evidence"), lab.label, lab.reason
    return labels


def role_of(label: str | None) -> str:
    """The G&A role a label names, as the demo and the circuit view use it: ``"aggregate"``,
    ``"gather"`` (Aggregate first where a head has both) or ``"neither"``."""
    got = parts(label)
    return "aggregate" if "Aggregate" in got else "gather" if "Gather" in got else "neither"
