"""``ganda plan``: FLOPs, peak memory and time of an experiment before running it."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import click
import typer
import typer.main

from ..errors import GandaError
from .analyses import AnalysisGroup, flag_name, param, turns_off
from .options import FORCE, QUIET, at_least, int_option, model_inputs, parse_options

# ganda.plan.DEVICES, spelled here so that --help needs no torch
DEVICES = ("h100", "h200", "a100", "l40s", "cpu")

#: plan's own inputs (name -> typer default, type), in the order of ``--help``; every other flag is
#: an option of a costed experiment (:func:`ganda.plan.plan_flags`)
OWN: dict[str, tuple[Any, Any]] = {
    "model": (typer.Argument(None, help="a shipped config (meta-llama/Llama-3.1-8B, ...), a config.json, a model "
                             "directory or a hub id; omit with --paper"), str | None),
    "experiment": (typer.Option("eval", "--experiment", "-e", help="a registered experiment with costs: eval, attn "
                                "(or maps), sweep, rank, path, edges, prune, transplant or a plugin's (an unknown "
                                "name lists them)"), str),
    "task": (typer.Option("mmlu", "--task", "-t", help="the task whose prompts set the lengths"), str),
    "limit": (int_option(1000, "--limit", "-n", help="number of examples the run scores (in all; mmlu's --limit "
                           "elsewhere counts per subject)"), int),
    "shots": (int_option(None, "--shots", help="few-shot exemplars (mmlu)"), int | None),
    "tokens": (int_option(None, "--tokens", help="tokens per prompt instead of the task's"), int | None),
    "device": (typer.Option("h100", "--device", help=", ".join(DEVICES)), str),
    "devices": (int_option(1, "--devices", help="number of devices working side by side"), int),
    "dtype": (typer.Option(None, "--dtype", help="weights' precision (default bf16; fp32 for cpu)"), str | None),
    "option": (typer.Option(None, "--option", help="an option of the experiment KEY=VALUE (repeatable; any "
                            "registered experiment's own, checked as ganda run checks it)"), list[str] | None),
    "paper": (typer.Option(False, "--paper", help="print the paper's headline runs (their own models, tasks and "
                           "options: it takes --device, --devices, --shots and the output flags only)"), bool),
    "as_json": (typer.Option(False, "--json", help="one JSON object"), bool),
    "out": (typer.Option(None, "--out", "-o", help="also write the plan(s) as JSON here"), Path | None),
    "force": (FORCE, bool),
    "quiet": (QUIET, bool),
}


def _flag_parameter(name: str, by: dict[str, Any], kind: Any, free: set[str]) -> inspect.Parameter:
    """The flag of option ``name``, read by the experiments ``by`` names: their help where they agree,
    else a pointer to each one's own; their short flag where they agree and it is ``free``."""
    f = next(iter(by.values()))
    helps = {g.metadata.get("help", "") for g in by.values()}
    owners = ", ".join(by)
    text = f"{owners}: " + (helps.pop() if len(helps) == 1 else
                            f"each as its own command's --help says ({', '.join('ganda ' + e for e in by)})")
    shorts = {g.metadata.get("short") for g in by.values()}
    names = [flag_name(f), *(shorts & free if len(shorts) == 1 else ())]
    if kind is bool:  # a switch: given or not (``--no-x`` given: the option off)
        return param(name, typer.Option(False, *names, help=text), bool)
    assert not turns_off(f)
    make = int_option if kind is int else typer.Option
    return param(name, make(None, *names, help=text), kind | None)


#: the inputs ``--paper`` reads: the paper's runs bring their own models, tasks, sizes and options
PAPER_INPUTS = ("paper", "device", "devices", "shots", "as_json", "out", "force", "quiet")


def _paper_only(ctx: Any) -> None:
    """Refuse an input ``--paper`` does not read (one line), never ignore it."""
    for p in ctx.command.params:
        if p.name not in PAPER_INPUTS and ctx.get_parameter_source(p.name).name != "DEFAULT":
            given = p.opts[0] if p.param_type_name == "option" else p.name.upper()
            raise GandaError(f"--paper costs the paper's own runs and takes no {given} (it takes --device, "
                             "--devices, --shots, --json, --out, --force, -q)")


def plan_command(ctx: typer.Context, **values: Any) -> None:
    """Estimate FLOPs, peak memory (weights, activations, kept tensors) and time of an experiment."""
    import torch

    from .. import plan as planner
    from ..device import default_dtype, parse_dtype

    own = {k: values.pop(k) for k in OWN}
    given = {k: v for k, v in values.items() if v is not None and v is not False}
    model, experiment, devices, out = own["model"], own["experiment"], own["devices"], own["out"]
    for name in ("devices", "limit", "tokens"):
        at_least("--" + name, own[name])
    planner.device(own["device"])
    if own["paper"]:
        _paper_only(ctx)
    if out is not None:  # checked before any work; replaced only when ganda wrote it as a plan, or with --force
        from .. import runio

        runio.check_output_file(out, "--out", inputs=model_inputs(model) if model else [], kind="plan",
                                force=own["force"])
    if own["paper"]:
        plans = planner.paper_plans(own["device"], devices, own["shots"])
    else:
        if model is None:
            raise GandaError("give a MODEL (or --paper)")
        if experiment not in planner.costed_experiments():
            raise GandaError(f"--experiment must be one of {', '.join(planner.costed_experiments())}, "
                             f"not {experiment!r}")
        # the precision a run on that device would load in (GANDA_DTYPE, else bf16 on an accelerator)
        dtype = parse_dtype(own["dtype"], "--dtype") if own["dtype"] else default_dtype(
            torch.device("cpu" if planner.device(own["device"]).host else "cuda"))
        flags, options = planner.plan_flag_values(experiment, given), parse_options(own["option"])
        plans = [(experiment, planner.model_plan(
            model, experiment, dtype, own["task"], own["limit"], own["shots"],
            own["tokens"], own["device"], devices,
            lambda adapter: planner.phase_options(experiment, adapter, flags, options)))]
    _print_plans(plans, own["paper"], own["as_json"], out)


def _print_plans(plans: list[tuple[str, Any]], paper: bool, as_json: bool, out: Path | None) -> None:
    from .. import plan as planner
    from .. import runio

    payload = [{"what": what, **p.to_json()} for what, p in plans]
    if out is not None:
        runio.write_text(out, json.dumps(payload, indent=2) + "\n")
    if as_json:
        print(json.dumps(payload if paper else payload[0], indent=2))
        return
    for what, p in plans:
        if paper:
            print(f"# {what}")
        print(planner.plan_text(p))


def build_plan() -> click.Command:
    """``ganda plan``: its own inputs and every costed experiment's options (built when it is called:
    the experiments' declarations load torch, which ``ganda --help`` does not)."""
    from .. import plan as planner

    flags = planner.plan_flags(set(OWN))
    taken = {d for default, _ in OWN.values() for d in getattr(default, "param_decls", None) or () if d[:2] != "--"}
    shorts = [s for by, _ in flags.values() for s in {g.metadata.get("short") for g in by.values()} if s]
    free = {s for s in shorts if shorts.count(s) == 1} - taken  # -k, -m: as rank's; never plan's own -e, -n, -o
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    params += [param(name, *own) for name, own in OWN.items()]
    params += [_flag_parameter(name, by, kind, free) for name, (by, kind) in flags.items()]
    plan_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    plan_command.__annotations__ = {p.name: p.annotation for p in params}
    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command("plan", short_help=SUMMARY)(plan_command)
    return typer.main.get_command(app)


SUMMARY = "Estimate FLOPs, peak memory and time of an experiment"
AnalysisGroup.lazy["plan"] = (SUMMARY, build_plan)
