"""``ganda path`` (one sender head ablated only along its paths into one receiver head) and
``ganda edges`` (every head pair scored by edge attribution, the top verified exactly)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from .. import runio
from ..errors import GandaError
from ..intervals import bounds
from ..tasks import get_task
from .core import MODEL, PAIRS, PICKLE, QUIET, SEED, at_least, limit_option, model_inputs, require_heads
from .options import ACTIVE_EDGES, ablation_option


def _examples(model: str, task: str, pairs: int | None, limit: int, seed: int, allow_pickle: bool) -> tuple[Any, Any, list]:
    """The model and ``limit`` examples of a multiple-choice task (options checked before loading)."""
    from ..models import load_model
    from ..tasks import task_for_model

    opts = {"pairs": pairs}
    task_obj = get_task(task, **opts)
    if task_obj.kind != "mc":
        raise GandaError(f"task {task!r} is a generation task; the circuit scores multiple-choice tasks")
    adapter = load_model(model, allow_pickle=allow_pickle)
    task_obj = task_for_model(task, task_obj, adapter, **opts)
    examples = task_obj.examples(limit=limit, seed=seed)
    if not examples:
        raise GandaError(f"task {task!r} gave no examples")
    return adapter, task_obj, examples


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(ci: Any, scale: float = 100.0, digits: int = 1) -> str:
    return f"[{scale * ci[0]:.{digits}f}, {scale * ci[1]:.{digits}f}]" if ci and len(ci) == 2 and None not in ci else ""


def register(app: typer.Typer) -> None:
    @app.command(short_help="Remove one head's contribution along its paths into another")
    def path(
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="any multiple-choice task (kv, lab-mmlu, mmlu, ...)"),
        sender: str = typer.Option(..., "--from", help="the sender head, e.g. L2H0"),
        receiver: str = typer.Option(..., "--to", help="the receiver head in a later layer, e.g. L3H0"),
        paths: str = typer.Option("all", "--paths", help="all: every path from sender to receiver (the ablated stream "
                                  "from the sender's layer on); direct: the edge alone (the sender's write)"),
        parts: str = typer.Option("together", "--parts", help="what the receiver reads from the ablated stream: "
                                  "together, or parts such as q,k,v (attention) or x,B,C,dt,gate (SSM); k+v: both"),
        margin: str = typer.Option("mean", "--margin", help="gold log-likelihood minus the mean or the max of the others'"),
        limit: int | None = limit_option(None, "number of prompts (default: 32)", mmlu=False),
        pairs: int | None = PAIRS,
        seed: int = SEED,
        out: Path = typer.Option(None, "--out", "-o", help="run directory (default: runs/path-<task>)"),
        as_json: bool = typer.Option(False, "--json", help="print the rows as one JSON object"),
        ablation: str = ablation_option("zero|mean (resample needs a donor per scored row: eval runs it)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Remove one head's contribution only along its paths into another, everything else intact.

        Reports accuracy and margin with each drop's paired 95% interval, next to the sender ablated everywhere.
        Writes OUT/result.json, circuit_path.csv and path.png.
        """
        from ..experiments.circuit import PathExperiment, PathOptions

        at_least("--limit", limit)
        opts = PathOptions.build({"sender": sender, "receiver": receiver, "paths": paths, "parts": parts,
                                  "margin": margin, "ablation": ablation}, cli=True)
        out_dir = runio.claim_run_dir(out if out is not None else Path("runs") / f"path-{task}", kind="path",
                                         models=model_inputs(model))
        n = limit if limit is not None else 32
        adapter, task_obj, examples = _examples(model, task, pairs, n, seed, allow_pickle)
        config = {"task": task_obj.config(), "limit": n, "n": len(examples), "seed": seed, "options": opts.to_json()}
        res = PathExperiment().run(adapter, examples, opts, out_dir=out_dir, config=config,
                                   progress=not (quiet or as_json))
        if as_json:
            print(json.dumps(runio.rounded({"out": str(out_dir), **res.summary, "rows": res.rows}), default=str))
            return
        s = res.summary
        print(f"{model} on {task} (n={s['n']}): {s['sender']} -> {s['receiver']}, {s['paths']} paths, {margin} margin, "
              f"{ablation}-ablation")
        print(f"{'condition':24s} {'accuracy [95% CI]':>22s} {'drop, paired CI':>22s} {'margin':>8s} "
              f"{'margin drop, paired CI':>28s}")
        for r in res.rows:
            drop = f"{_pct(r['drop'])} {_ci(bounds(r, 'drop'))}" if "drop" in r else ""
            mdrop = f"{r['margin_drop']:.3f} {_ci(bounds(r, 'margin_drop'), 1, 3)}" if "margin_drop" in r else ""
            print(f"{r['condition']:24s} {_pct(r['accuracy']) + ' ' + _ci(bounds(r, 'accuracy')):>22s} {drop:>22s} "
                  f"{r['margin']:8.3f} {mdrop:>28s}")


    @app.command(short_help="Score every sender -> receiver head pair and draw the circuit")
    def edges(
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="any multiple-choice task (kv, lab-mmlu, mmlu, ...)"),
        verify_top: int = typer.Option(10, "--verify-top", "-k", help="verify this many top edges exactly"),
        audit: int = typer.Option(10, "--audit", help="also verify this many random other edges (the false-negative bound)"),
        active: int = typer.Option(ACTIVE_EDGES, "--active", help="also verify this many edges with the largest mean "
                                   "|estimate| per prompt (their prompts' scores can cancel in the mean)"),
        widen: int = typer.Option(0, "--widen", help="then verify this many more edges by estimate, round after round, "
                                  "until a round leaves the top --top by |exact| unchanged (0: off)"),
        top: int = typer.Option(10, "--top", help="the bound's default threshold: the smallest exact effect in the "
                                "verified top TOP; rows printed"),
        threshold: float | None = typer.Option(None, "--threshold", help="effect size the bound speaks about"),
        senders: str | None = typer.Option(None, "--senders", help="only these senders (default: every head), e.g. 'L16H*'"),
        receivers: str | None = typer.Option(None, "--receivers", help="only these receivers (default: every head), "
                                             "e.g. L19H1"),
        margin: str = typer.Option("mean", "--margin", help="gold log-likelihood minus the mean or the max of the others'"),
        no_roles: bool = typer.Option(False, "--no-roles", help="leave the drawn heads unlabelled (by default ganda "
                                      "roles' rule labels them Gather/Aggregate: three ablations per head)"),
        show: int = typer.Option(10, "--show", help="verified edges drawn in circuit.png"),
        limit: int | None = limit_option(None, "number of prompts (default: 32)", mmlu=False),
        pairs: int | None = PAIRS,
        seed: int = typer.Option(0, "--seed", help="prompt sample and audit draw"),
        out: Path = typer.Option(None, "--out", "-o", help="run directory (default: runs/edges-<task>)"),
        resume: bool = typer.Option(True, "--resume/--no-resume", help="reuse the exact checks a stopped run left in --out"),
        as_json: bool = typer.Option(False, "--json", help="print the summary and the top rows as one JSON object"),
        ablation: str = ablation_option("zero|mean (resample needs a donor per scored row: eval runs it)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Score every sender -> receiver head pair by edge attribution, verify the top edges exactly, draw the circuit.

        Writes OUT/result.json, edges.json, edges.csv (every edge), circuit.png and edges_exact.jsonl (resumes).
        """
        from ..experiments.circuit import EdgesExperiment, EdgesOptions

        at_least("--limit", limit)
        require_heads("--senders", senders)
        require_heads("--receivers", receivers)
        opts = EdgesOptions.build({"verify_top": verify_top, "audit": audit, "active": active, "widen": widen, "top": top,
                                   "threshold": threshold,
                                   "senders": senders or "", "receivers": receivers or "", "margin": margin,
                                   "roles": not no_roles, "show": show, "ablation": ablation}, cli=True)
        out_dir = runio.claim_run_dir(out if out is not None else Path("runs") / f"edges-{task}", kind="edges",
                                         models=model_inputs(model))
        n = limit if limit is not None else 32
        adapter, task_obj, examples = _examples(model, task, pairs, n, seed, allow_pickle)
        config = {"task": task_obj.config(), "limit": n, "n": len(examples), "seed": seed, "options": opts.to_json()}
        res = EdgesExperiment(resume=resume).run(adapter, examples, opts, out_dir=out_dir, config=config,
                                    progress=not (quiet or as_json))
        if as_json:
            print(json.dumps(runio.rounded({"out": str(out_dir), **res.summary, "rows": res.rows[:top]}), default=str))
            return
        s = res.summary
        print(f"{model} on {task} (n={s['n']}): {s['edges']:,} edges, {s['verified']} verified, {ablation}-ablation, "
              f"edge attribution {s['attribution_cpu']:.1f} CPU s, exact checks {s['verification_cpu']:.1f} CPU s")
        print(f"{'edge':>22s} {'estimate':>9s} {'exact [paired 95% CI]':>28s} {'acc. drop':>9s} {'roles':>20s}")
        roles_of = res.extra.get("roles") or {}
        for r in res.rows[:top]:
            exact = f"{r['exact']:.3f} [{r['exact_ci_low']:.3f}, {r['exact_ci_high']:.3f}]" if r["exact"] is not None else "-"
            acc = _pct(r["accuracy_drop"]) if r["accuracy_drop"] is not None else "-"
            who = f"{roles_of.get(r['sender'], '')} > {roles_of.get(r['receiver'], '')}" if roles_of else ""
            print(f"{r['edge']:>22s} {r['estimate']:9.3f} {exact:>28s} {acc:>9s} {who:>20s}")
        if s.get("bound"):
            print(s["bound"])
