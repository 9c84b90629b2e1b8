"""The circuit's experiments: ``path`` (one sender -> receiver pair ablated along its paths, next to
the sender ablated everywhere) and ``edges`` (every pair scored by edge attribution, the top
verified exactly, drawn as a circuit). Their engines are :mod:`ganda.circuit`; this module says
what ``ganda run``, ``ganda grid``, ``ganda plan``, ``ganda report`` and ``ganda.results`` need."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ablation import check_batched_ablation
from ..attention import draw_attention
from ..attribution.ranking import MARGIN_HELP
from ..circuit import PATHS, TOGETHER, path_ablation
from ..circuit.ablation import EVERYWHERE, INTACT, path_inputs
from ..circuit.edges import EdgesOptions, bound_sentence, edge_heads, edge_positions, parse_edge, rank_edges
from ..circuit.view import draw_circuit
from ..errors import GandaError
from ..figures import bars
from ..heads import HeadId, expand
from ..intervals import bounds
from ..models.base import ModelAdapter
from ..plan import heads_per_layer
from ..scoring import encode
from ..stats import overlap
from ..tasks.base import Example
from .base import Experiment, Options, option
from .common import ExperimentResult, interval_text
from .roles import head_roles
from .tables import print_edges, print_path


def _head(flag: str, text: str) -> HeadId:
    if not text:
        raise GandaError(f"{flag} is required: one head id such as L3H0")
    return HeadId.parse(text)


def check_pair_text(sender: str, receiver: str, flags: tuple[str, str] = ("sender", "receiver"),
                    adapter: ModelAdapter | None = None) -> None:
    """Two head ids. Without ``adapter`` (before any model loads) only their form is checked: a layer
    order between a head the model lacks and another would say the wrong thing; with it, each head
    is checked in the model, named by its flag (the order is then
    :func:`ganda.circuit.paths.parse_pair`'s, checked by :func:`ganda.circuit.path_ablation` before any pass)."""
    s, r = _head(flags[0], sender), _head(flags[1], receiver)
    if adapter is None:
        return
    for flag, h in zip(flags, (s, r), strict=True):
        try:
            adapter.canonical(h)
        except GandaError as exc:
            why = str(exc) if str(exc).startswith(f"{h}:") else f"{h}: {exc}"
            raise GandaError(f"{flag} {why}") from None


@dataclass
class PathOptions(Options):
    sender: str = option("", "the sender head, e.g. L2H0", flag="--from")
    receiver: str = option("", "the receiver head in a later layer, e.g. L3H0", flag="--to")
    paths: str = option("all", "all: every path from sender to receiver (the ablated stream from the sender's layer "
                        "on); direct: the edge alone (the sender's write)", choices=PATHS)
    parts: str = option(TOGETHER, "what the receiver reads from the ablated stream: together, or parts such as q,k,v "
                        "(attention) or x,B,C,dt,gate (SSM); k+v: both")
    margin: str = option("mean", MARGIN_HELP, choices=("mean", "max"))
    ablation: str = option("zero", "the sender's ablation: zero or mean (its mean over every token of the prompts); "
                           "resample needs a donor per scored row: eval runs it")

    def check(self) -> None:
        check_batched_ablation(self.ablation, self.flag("ablation"), "path ablation")
        check_pair_text(self.sender, self.receiver, (self.flag("sender"), self.flag("receiver")))
        if not [p for p in self.parts.split(",") if p.strip()]:
            raise GandaError(f"{self.flag('parts')}: no parts in {self.parts!r} (together, or e.g. q,k,v)")


@dataclass
class PathResult(ExperimentResult):
    kind: str = "circuit_path"
    title = "One head's effect along its paths into another"

    def headline(self) -> str:
        s = self.summary
        rows = {r["condition"]: r for r in self.rows}
        base, every = rows.get(INTACT), rows.get(EVERYWHERE)
        if not base or not every:
            return ""
        what = "every path" if s.get("paths") == "all" else "its direct path"
        lines = [f"Intact: {100 * base['accuracy']:.1f}% on {s.get('n')} prompts, margin {base['margin']:.3f}. "
                 f"{s['sender']} ablated everywhere: accuracy drop **{100 * every['drop']:.1f}** points"
                 f"{interval_text(bounds(every, 'drop'))}, margin drop **{every['margin_drop']:.3f}**"
                 f"{interval_text(bounds(every, 'margin_drop'), 1)}."]
        for r in self.rows:
            if r["condition"] in (INTACT, EVERYWHERE):
                continue
            share = f" ({100 * r['share_of_sender']:.0f}% of the sender's)" if r.get("share_of_sender") is not None else ""
            weak = " — *weak*: its interval includes 0" if overlap(bounds(r, "margin_drop"), [0.0, 0.0]) else ""
            lines.append(f"{s['sender']} removed only along {what} into {s['receiver']}, {r['condition']}: "
                         f"accuracy drop **{100 * r['drop']:.1f}** points{interval_text(bounds(r, 'drop'))}, margin drop "
                         f"**{r['margin_drop']:.3f}**{interval_text(bounds(r, 'margin_drop'), 1)}{share}{weak}.")
        return "\n".join(lines)

    def draw(self, out_dir: Path) -> list[Path]:
        rows = [r for r in self.rows if r["condition"] != INTACT]
        if not rows:
            return []
        s = self.summary
        return [bars([r["condition"] for r in rows], {"margin drop": [r["margin_drop"] for r in rows]},
                     Path(out_dir) / "path.png", ylim=None, ylabel="drop of the margin (paired 95% CI)",
                     errors={"margin drop": ([bounds(r, "margin_drop")[0] for r in rows],
                                             [bounds(r, "margin_drop")[1] for r in rows])},
                     rotate=20, title=f"{s.get('sender')} -> {s.get('receiver')} ({s.get('paths')} paths), {self.model}")]


def path_result(adapter: ModelAdapter, res: Any, config: dict[str, Any]) -> PathResult:
    """A :class:`ganda.circuit.PathAblation` as the saved result (per-prompt log-likelihoods in ``extra``)."""
    d = res.to_json()
    summary = {k: d[k] for k in ("sender", "receiver", "paths", "parts", "margin", "n", "seconds", "cpu_seconds")}
    summary["ablation"] = d["config"].get("ablation", "zero")
    extra = {"golds": d["golds"], "logliks": d["logliks"]}
    return PathResult(model=adapter.spec, config={**config, **d["config"]}, summary=summary, rows=d["rows"], extra=extra)


class PathExperiment(Experiment):
    """Remove one head's contribution only along its paths into another, everything else intact.

    Reports accuracy and margin with each drop's paired 95% interval, next to the sender ablated everywhere.
    Writes OUT/result.json, circuit_path.csv and path.png.
    """

    name = "path"
    Options = PathOptions
    phases = "ganda.circuit.costs:path_phases"

    @classmethod
    def plan_options(cls, adapter: ModelAdapter, options: PathOptions, opts: dict[str, Any]) -> None:  # type: ignore[override]
        """The pair and the parts as :meth:`run` checks them (:func:`ganda.circuit.ablation.path_inputs`)."""
        check_pair_text(options.sender, options.receiver, (options.flag("sender"), options.flag("receiver")), adapter)
        s, r, parts = path_inputs(adapter, options.sender, options.receiver, options.paths, options.parts.split(","))
        opts.update(sender=str(s), receiver=str(r), parts=",".join(parts))

    def run(self, adapter: ModelAdapter, examples: list[Example], options: PathOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> PathResult:
        check_pair_text(options.sender, options.receiver, (options.flag("sender"), options.flag("receiver")), adapter)
        res = path_ablation(adapter, examples, options.sender, options.receiver, paths=options.paths,
                            parts=[p for p in options.parts.split(",") if p.strip()], margin=options.margin,
                            progress=progress, ablation=options.ablation)
        out = path_result(adapter, res, config)
        out.save(out_dir)
        return out

    def job_summary(self, result: Any) -> dict[str, Any]:
        rows = {r["condition"]: r for r in result.rows}
        paths = [r for r in result.rows if r["condition"] not in (INTACT, EVERYWHERE)]
        return {"sender": result.summary["sender"], "receiver": result.summary["receiver"],
                "accuracy": rows[INTACT]["accuracy"], "sender_margin_drop": rows[EVERYWHERE]["margin_drop"],
                "path_margin_drop": paths[0]["margin_drop"] if paths else None}

    def as_json(self, result: Any, options: Options, out_dir: Path) -> dict[str, Any]:
        return {"out": str(out_dir), **result.summary, "rows": result.rows}

    def show(self, result: Any, options: Options, run: Any, out_dir: Path) -> None:
        print_path(result, options, run)




@dataclass
class EdgesResult(ExperimentResult):
    kind: str = "circuit_edges"
    title = "The circuit: which head feeds which"
    claims = ("edges.json", "edges_exact.jsonl")

    def verified_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("verified")]

    def headline(self) -> str:
        s = self.summary
        lines = [f"{s.get('edges', 0):,} edges scored by edge attribution in {s.get('attribution_cpu', 0):.0f} CPU s "
                 f"({s.get('n')} prompts); {len(self.verified_rows())} ablated exactly along their direct "
                 f"paths{self._chosen()}."]
        roles = self.extra.get("roles") or {}

        def who(head: str) -> str:
            return f" ({roles[head]})" if roles.get(head) else ""

        for r in sorted(self.verified_rows(), key=lambda r: -abs(r["exact"]))[:3]:
            weak = " — *weak*: its interval includes 0" if r["exact_ci_low"] <= 0 <= r["exact_ci_high"] else ""
            lines.append(f"**{r['sender']}**{who(r['sender'])} → **{r['receiver']}**{who(r['receiver'])}: "
                         "removing the edge drops the margin by "
                         f"**{r['exact']:.3f}** [{r['exact_ci_low']:.3f}, {r['exact_ci_high']:.3f}] (accuracy "
                         f"{-100 * r['accuracy_drop']:+.1f} points; estimate {r['estimate']:.3f}){weak}.")
        if s.get("bound"):
            lines.append(s["bound"])
        return "\n".join(lines)

    def _chosen(self) -> str:
        top, active = self.config.get("verify_top"), self.config.get("active")
        if top is None:
            return ""
        return f" (the top {top} by estimate" + (f" and the {active} most active" if active else "") + ")"

    def draw(self, out_dir: Path) -> list[Path]:
        rows = sorted(self.verified_rows(), key=lambda r: -abs(r["exact"]))[: int(self.config.get("show", 10))]
        if not rows:
            return []
        return [draw_circuit(rows, Path(out_dir) / "circuit.png", roles=self.extra.get("roles") or {},
                             title=f"{self.model}: verified edges, exact drop of the margin [paired 95% CI]",
                             n_layers=self.summary.get("layers"))]


MARKS = 3  # sender positions marked in the attention view


def attention_view(adapter: ModelAdapter, example: Example, sender: HeadId, receiver: HeadId, out_dir: Path,
                   roles: dict[str, str]) -> str:
    """The receiver's (and the sender's) map on one prompt as ``attention.png`` and ``attention.json``,
    the JSON marking the :data:`MARKS` prompt positions where the sender's write moves the receiver's
    effect most (:func:`ganda.circuit.edges.edge_positions`): the report's view opens on the
    receiver's final row with them outlined. Returns a note for the result."""
    s, r = adapter.canonical(sender), adapter.canonical(receiver)
    n_prompt = len(encode(adapter, example.prompt))
    per_pos = edge_positions(adapter, example, s, r)[:n_prompt]
    marks = sorted(sorted(range(len(per_pos)), key=lambda i: -abs(per_pos[i]))[:MARKS])
    draw_attention(adapter, example, [str(r), str(s)], Path(out_dir) / "attention.png",
                   title=f"{adapter.spec}: receiver {r}, sender {s}", roles=roles,
                   marks={"marks": marks, "mark_label": f"where {s}'s write moves {r} most",
                          "mark_values": [per_pos[i] for i in marks]})
    return (f"attention.json: {r}'s map on the first prompt, positions {marks} marked (first-order drop of the "
            f"margin from {s}'s write there: {', '.join(f'{per_pos[i]:+.3f}' for i in marks)})")


def circuit_roles(adapter: ModelAdapter, examples: list[Example], heads: list[str], progress: bool = True
                  ) -> dict[str, str]:
    """Each of ``heads`` labelled by the labeller every command shares (:mod:`ganda.labels`, through
    :func:`ganda.experiments.roles.head_roles`, whose positional ablations it reads): every role
    whose rule the head meets, joined by ``+``, or none; ``unlabelled`` where the task's prompts
    have no segments to score."""
    if not heads:
        return {}
    res = head_roles(adapter, examples, ranked=heads, top=len(heads), until_chance=False, progress=progress)
    return {r["head"]: r.get("label") or "unlabelled" for r in res.rows}


def edges_result(adapter: ModelAdapter, res: Any, options: EdgesOptions, config: dict[str, Any],
                 roles: dict[str, str]) -> EdgesResult:
    """A :class:`ganda.circuit.edges.EdgeRanking` as the saved result (the top 100 edges and every
    exactly known one as rows)."""
    d = res.to_json()
    summary = {"n": d["n"], "edges": d["edges"], "verified": len(d["verified"]), "audited": len(d["audited"]),
               "clean": d["clean"], "spearman_verified": d["spearman_verified"],
               "bound": bound_sentence(res.bound) if res.bound else None,
               "layers": len(adapter.original_layers()), **d["seconds"]}
    top = next((r for r in d["ranking"] if r["verified"]), None)  # the largest verified edge (audited ones aside)
    if top is not None:
        summary.update(top_edge=top["edge"], top_exact=top["exact"])
    return EdgesResult(model=adapter.spec, config={**config, **res.config, "show": options.show}, summary=summary,
                       rows=d["ranking"], extra={"roles": roles, "bound": d["bound"], "atp": d["atp"]})


class EdgesExperiment(Experiment):
    """Score every sender -> receiver head pair by edge attribution, verify the top edges exactly, draw the circuit.

    Writes OUT/result.json, edges.json, edges.csv (every edge), circuit.png and edges_exact.jsonl (resumes).
    """

    name = "edges"
    Options = EdgesOptions
    phases = "ganda.circuit.costs:edges_phases"
    takes = frozenset({"resume"})  # reuse the exact checks a stopped run left in its directory

    @classmethod
    def plan_options(cls, adapter: ModelAdapter, options: EdgesOptions, opts: dict[str, Any]) -> None:  # type: ignore[override]
        """``senders`` or ``receivers``, with the other's default, as the heads per layer the edge
        pass joins (:func:`ganda.circuit.edges.edge_heads`); neither given: every head, the costs'
        own count, which skips listing the heads of a model with thousands of channels."""
        given = (options.senders, options.receivers)
        if any(given):
            ends = edge_heads(adapter, *(expand(v, adapter) if v else None for v in given))
            opts["senders_per_layer"], opts["receivers_per_layer"] = (heads_per_layer(adapter, hs) for hs in ends)

    def run(self, adapter: ModelAdapter, examples: list[Example], options: EdgesOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> EdgesResult:
        res = rank_edges(adapter, examples, options, seed=int(config.get("seed", 0)), out_dir=out_dir,
                         resume=self.resume, progress=progress, config=config)
        by_exact = sorted(res.verified, key=lambda e: -abs(res.exact[e]))
        shown = by_exact[: options.show]
        out = edges_result(adapter, res, options, config, {})
        # every head the figure, the table (its top rows) and the finding's three edges name
        named = shown + by_exact[:3] + [r["edge"] for r in out.rows[: options.top]]
        nodes = list(dict.fromkeys(h for e in named for h in e.split(">")))
        roles = circuit_roles(adapter, examples, nodes, progress) if options.roles else {}
        out.extra["roles"] = roles
        if shown:
            out.notes.append(attention_view(adapter, examples[0], *parse_edge(shown[0]), out_dir, roles))
        out.save(out_dir)
        return out

    def job_summary(self, result: Any) -> dict[str, Any]:
        s = result.summary
        return {k: s.get(k) for k in ("edges", "verified", "top_edge", "top_exact", "attribution_cpu")}

    def as_json(self, result: Any, options: EdgesOptions, out_dir: Path) -> dict[str, Any]:  # type: ignore[override]
        return {"out": str(out_dir), **result.summary, "rows": result.rows[: options.top]}

    def show(self, result: Any, options: EdgesOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_edges(result, options, run)


__all__ = ["EdgesExperiment", "EdgesOptions", "EdgesResult", "PathExperiment", "PathOptions", "PathResult",
           "check_pair_text", "circuit_roles", "edges_result", "path_result"]
