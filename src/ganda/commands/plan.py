"""``ganda plan``: FLOPs, peak memory and time of an experiment before running it."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

import click
import typer
import typer.main

from ..errors import GandaError
from .analyses import AnalysisGroup, flag_name, option_values, param, turns_off
from .options import FORCE, QUIET, at_least, int_option, model_inputs, parse_options

# ganda.plan.DEVICES, spelled here so that --help needs no torch
DEVICES = ("h100", "h200", "a100", "l40s", "cpu")

#: plan's own inputs (name -> typer default, type), in the order of ``--help``; every other flag is
#: an option of a costed experiment (:func:`_experiment_flags`)
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
    "paper": (typer.Option(False, "--paper", help="print the paper's headline runs"), bool),
    "as_json": (typer.Option(False, "--json", help="one JSON object"), bool),
    "out": (typer.Option(None, "--out", "-o", help="also write the plan(s) as JSON here"), Path | None),
    "force": (FORCE, bool),
    "quiet": (QUIET, bool),
}


def _experiment_flags() -> dict[str, tuple[Any, Any, list[str]]]:
    """Every option of the experiments ganda plan costs, as a flag of its own: name -> (field, type,
    the experiments that declare it). Not given, an option keeps each experiment's own default (rank
    and edges differ in --audit and --active); a name two experiments declare with different types
    (prune's --layers, a count; transplant's, a list) is the first's, the other reached by --option."""
    from .. import plan as planner
    from .. import registry
    from ..experiments.base import option_type

    flags: dict[str, tuple[Any, Any, list[str]]] = {}
    for name in planner.costed_experiments():
        cls = registry.experiment(name)
        if cls.name != name:  # an alias (attribution)
            continue
        hints = typing.get_type_hints(cls.Options)
        for f in _costed_fields(cls):
            if f.name in OWN:
                continue
            if f.name not in flags:
                flags[f.name] = (f, hints[f.name], [name])
            elif option_type(flags[f.name][1]) is option_type(hints[f.name]):
                flags[f.name][2].append(name)
    return flags


def _costed_fields(cls: Any) -> list[Any]:
    """The options an experiment's costs read (``costed_options``; by default every option)."""
    return [f for f in cls.Options.fields() if cls.costed_options is None or f.name in cls.costed_options]


def _flag_parameter(f: Any, hint: Any, owners: list[str]) -> inspect.Parameter:
    from ..experiments.base import option_type

    flag = flag_name(f)
    text = f"{', '.join(owners)}: {f.metadata.get('help', '')}"
    if option_type(hint) is bool:  # a switch: given or not (``--no-x`` given: the option off)
        return param(f.name, typer.Option(False, flag, help=text), bool)
    assert not turns_off(f)
    make = int_option if option_type(hint) is int else typer.Option
    return param(f.name, make(None, flag, help=text), option_type(hint) | None)


def plan_command(**values: Any) -> None:
    """Estimate FLOPs, peak memory (weights, activations, kept tensors) and time of an experiment."""
    import torch

    from .. import plan as planner
    from .. import registry
    from ..device import default_dtype, parse_dtype

    own = {k: values.pop(k) for k in OWN}
    given = {k: v for k, v in values.items() if v is not None and v is not False}
    model, experiment, devices, out = own["model"], own["experiment"], own["devices"], own["out"]
    for name in ("devices", "limit", "tokens"):
        at_least("--" + name, own[name])
    planner.device(own["device"])
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
        # the flags the experiment declares (a ``--no-x`` flag given: its option off) and ``--option``
        flags = option_values(_costed_fields(registry.experiment(experiment)), given)
        plans = [(experiment, planner.model_plan(
            model, experiment, dtype, own["task"], own["limit"], own["shots"],
            own["tokens"], own["device"], devices,
            lambda adapter: planner.phase_options(experiment, adapter, flags, parse_options(own["option"]))))]
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
    flags = _experiment_flags()
    params = [param(name, *own) for name, own in OWN.items()]
    params += [_flag_parameter(f, hint, owners) for f, hint, owners in flags.values()]
    plan_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    plan_command.__annotations__ = {p.name: p.annotation for p in params}
    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command("plan", short_help=SUMMARY)(plan_command)
    return typer.main.get_command(app)


SUMMARY = "Estimate FLOPs, peak memory and time of an experiment"
AnalysisGroup.lazy["plan"] = (SUMMARY, build_plan)
