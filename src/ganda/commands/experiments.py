"""``kv-curve`` (Figure 4: its own prompts per number of pairs, and other models' curves) and
``roles`` (a task, a control task and further tasks, on prompt sets): analyses whose inputs are
not one task's examples nor one task list. Each writes ``result.json``, a CSV, PNG figures and
``report.html`` into ``--out`` and prints the summary as JSON. (prune, retain, mask-last-row and
transplant are built from their Experiments: :mod:`ganda.commands.analyses`.)
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from ..tasks import get_task
from .core import (
    MODEL,
    PICKLE,
    QUIET,
    SAMPLE,
    SEED,
    at_least,
    limit_option,
    mmlu_options,
    model_inputs,
)

LIMIT = limit_option(100, "examples per task (the same examples in every condition)")
HTML = typer.Option(True, "--html/--no-html", help="also write report.html into the run directory")
KEEP = typer.Option(None, "--keep-layers", help="run on a submodel of these layers, e.g. 0-17")
OUT = typer.Option(None, "--out", "-o", help="run directory (default: runs/<experiment>-<model>)")


def _out(out: Path | None, kind: str, model: str) -> Path:
    """The run directory, checked and locked for this run (called before the model loads)."""
    return runio.claim_run_dir(out if out is not None else Path("runs") / f"{kind}-{Path(model).stem or model}",
                               kind=runio.RESULT_COMMANDS.get(kind, kind), models=model_inputs(model))


def _finish(result, out: Path, html: bool) -> None:
    from ..report import write_report

    command = "ganda " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result.save(out, command=command)
    if html:
        write_report([out], out / "report.html", title=f"ganda {result.kind}: {result.model}")
    print(runio.json_text({"out": str(out), "summary": result.summary}, indent=2))


def _layers(text: str | None) -> list[int] | None:
    from ..interventions import parse_layers

    return parse_layers(text) if text else None


def register(app: typer.Typer) -> None:
    @app.command(short_help="Where the most damaging heads matter, and their labels")
    def roles(
        model: str = MODEL,
        task: str = typer.Option("lab-mmlu", "--task", "-t", help="multiple-choice task the heads are ranked on"),
        control: str | None = typer.Option("lab-knowledge", "--control", help="control task scored with the full "
                                           "ablation (knowledge); 'none' to skip"),
        also: str | None = typer.Option(None, "--also", help="further tasks scored with the full ablation, e.g. lab-letters"),
        top: int = typer.Option(6, "--top", help="heads labelled (the most damaging of a single-head sweep)"),
        max_heads: int = typer.Option(24, "--max-heads", help="cumulative ablation gives up after this many heads"),
        keep_layers: str | None = typer.Option(None, "--keep-layers", help="find the roles in a submodel, e.g. the "
                                               "minimal model 0-17 (the paper's protocol)"),
        limit: int = LIMIT,
        sample: bool = SAMPLE,
        seed: int = SEED,
        prompt_sets: int = typer.Option(1, "--prompt-sets", help="prompt sets the roles found on set 1 are measured "
                                        "on (set k: seed seed+k, prompts disjoint where the task allows), pooled and counted"),
        out: Path | None = OUT,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Where ablating each of the most damaging heads hurts (final position or before it) and each
        head's label (Gather and Aggregate only above their minimum pattern scores: docs/heads.md), with a
        control task and the number of heads it takes to reach chance."""
        from ..experiments.roles import WHERE, head_roles, role_sets, sets_lines
        from ..models import load_model

        for flag, value in (("--limit", limit), ("--top", top), ("--max-heads", max_heads)):
            at_least(flag, value)
        at_least("--prompt-sets", prompt_sets)
        _layers(keep_layers)
        for name in [task, control, *(also or "").split(",")]:
            if name and name.strip() and name != "none":
                get_task(name.strip())  # an unknown task name fails before the model loads
        _out(out, "roles", model)
        adapter = load_model(model, allow_pickle=allow_pickle)

        def exs(name: str):
            t = get_task(name, adapter=adapter, **(mmlu_options(sample) if name == "mmlu" else {}))
            if t.kind != "mc":
                raise GandaError(f"task {name!r} is not multiple-choice")
            return t.examples(limit=limit, seed=seed)

        ctrl = None if control in (None, "", "none") else control
        more = {t.strip(): exs(t.strip()) for t in (also or "").split(",") if t.strip()}
        result = head_roles(adapter, exs(task), control=exs(ctrl) if ctrl else None, also=more, top=top,
                            max_heads=max_heads, task_name=task, control_name=ctrl, progress=not quiet,
                            keep_layers=_layers(keep_layers))
        result.config.update({"limit": limit, "seed": seed})
        if prompt_sets > 1:
            t = get_task(task, adapter=adapter, **(mmlu_options(sample) if task == "mmlu" else {}))
            sets = role_sets(adapter, lambda n, s: t.examples(limit=n, seed=s), result.summary, limit=limit, seed=seed,
                             count=prompt_sets, keep_layers=_layers(keep_layers))
            result.extra.update(sets)
            result.config["prompt_sets"] = prompt_sets
            result.summary.update({"seeds": sets["seeds"],
                                   "holds_on": {r: f["holds_on"] for r, f in sets["findings"].items()}})
        _finish(result, _out(out, "roles", model), html)
        s = result.summary
        for role in ("gather", "aggregate"):
            if s.get(role):
                label = (s.get("labels") or {}).get(s[role])
                print(f"hurts most {WHERE[role]}: {s[role]}" + (f" (label {label})" if label else "") + f": {task} {s['baseline']:.3f} -> {s[f'{role}_ablated']:.3f}"
                      + (f", {ctrl} drop {s[f'{role}_control_drop']:+.3f}" if ctrl else "")
                      + (f"; answers it serves: {s[f'{role}_answers_lost']}" if s.get(f"{role}_answers_lost") else ""))
        if "heads_to_chance" in s:
            n_heads = s["heads_to_chance"] or f"more than {s['heads_to_chance_max']}"
            print(f"heads to chance: {n_heads}")
        for line in sets_lines(result.extra):
            print(line.replace("**", ""))

