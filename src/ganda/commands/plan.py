"""``ganda plan``: FLOPs, peak memory and time of an experiment before running it."""

from __future__ import annotations

import inspect
import json
import os
import typing
from pathlib import Path
from typing import Any

import click
import typer
import typer.main

from ..errors import GandaError
from ..heads import expand
from ..tasks import get_task
from .analyses import AnalysisGroup
from .estimate import CHARS_PER_TOKEN, SAMPLE, layer_skip
from .options import FORCE, QUIET, at_least, model_inputs, parse_options

# ganda.plan.DEVICES, spelled here so that --help needs no torch
DEVICES = ("h100", "h200", "a100", "l40s", "cpu")

def _adapter_and_tokenizer(model: str, dtype: Any) -> tuple[Any, Any]:
    """The model's full-size layout (meta device) and, where the model has one locally, its tokenizer.
    A GGUF file (or an alias of one) has no config to build from: it is loaded."""
    from ..models import hub, load_model, meta
    from ..models.loading import _load_tokenizer, model_path

    found = None if hub.is_hub_id(model) or model in meta.shipped() else model_path(model)
    if found is not None and found.is_file() and found.suffix.lower() == ".gguf":
        adapter = load_model(model, device="cpu", dtype=dtype)
        return adapter, adapter.tokenizer
    adapter = meta.build(model, dtype)
    path = model_path(model) if not hub.is_hub_id(model) and model not in meta.shipped() else None
    tok = _load_tokenizer(str(path)) if path is not None and path.is_dir() else None
    if tok is not None:
        tok.model_max_length = 1 << 62  # it counts tokens; a prompt past the model's context is the plan's to say
        adapter.tokenizer = tok
    return adapter, tok


def workload(adapter: Any, tok: Any, task: str, n: int, shots: int | None, tokens: int | None,
             seed: int = 0) -> Any:
    """``n`` examples of ``task`` as token counts (measured on up to 200 of them), or ``tokens`` each."""
    from .. import plan as planner
    from ..scoring import encode

    if tokens is not None:
        return planner.Workload(n=n, tokens=float(tokens), max_tokens=tokens)
    opts: dict[str, Any] = {"shots": shots} if shots is not None else {}
    if "sample" in type(get_task(task)).option_types():  # mmlu: lengths from a sample across subjects
        opts["sample"] = True
    exs = get_task(task, **opts).examples(limit=min(n, SAMPLE), seed=seed)
    if not exs:
        raise GandaError(f"task {task!r} gave no examples to measure")
    enc = (lambda text: encode(adapter, text)) if tok is not None else None
    w = planner.workload_from_examples(exs, enc, CHARS_PER_TOKEN)
    return planner.Workload(n=n, tokens=w.tokens, choices=w.choices, choice_tokens=w.choice_tokens,
                            max_tokens=w.max_tokens)


def _sweep_heads(adapter: Any, heads: str | None) -> list[int] | None:
    if heads is None:
        return None
    per_layer = [0] * len(adapter.original_layers())
    for h in expand(heads, adapter):
        per_layer[h.layer] += 1
    return per_layer


def _layers_of(adapter: Any, flag: str, text: str) -> list[int]:
    """A layer list of the model's own layers: one past the last is one line, not an IndexError."""
    from ..interventions import parse_layers

    layers = parse_layers(text)
    n = len(adapter.original_layers())
    if bad := [i for i in layers if not 0 <= i < n]:
        raise GandaError(f"{flag} {bad} outside the model's layers 0..{n - 1}")
    return layers


def paper_plans(device: str, devices: int, shots: int | None = None) -> list[tuple[str, Any]]:
    """The paper's headline runs as plans (shipped configs, bf16): each experiment's ``paper`` runs."""
    from .. import plan as planner
    from .. import registry
    from ..device import parse_dtype
    from ..interventions import parse_layers

    out = []
    classes = list(dict.fromkeys(registry.experiment(n) for n in registry.experiment_names(ordered=False)))
    for cls in classes:
        for run in cls.paper:
            opts = run.workload
            adapter, tok = _adapter_and_tokenizer(run.model, parse_dtype("bfloat16"))
            w = workload(adapter, tok, opts.get("task", "mmlu"), opts["n"], shots, opts.get("tokens"))
            extra: dict[str, Any] = {"layer_skip": layer_skip(adapter)}
            if "rows" in opts:
                extra["rows"] = opts["rows"]
            if "map_layers" in opts:
                extra["map_layers"] = parse_layers(opts["map_layers"])
            extra.update({k: opts[k] for k in ("method", "verify_top", "active", "audit") if k in opts})
            plan = planner.plan(planner.profile(adapter), run.experiment or cls.name, w, device, devices, **extra)
            out.append((run.what, plan))
    return out


def _experiment_options(experiment: str, items: list[str] | None) -> dict[str, Any]:
    """``--option KEY=VALUE`` as the experiment's own options, built and checked by its ``Options``
    (the values given; the others keep the costs' defaults)."""
    from .. import registry
    given = parse_options(items)
    if not given:
        return {}
    built = registry.experiment(experiment).Options.build(given, where="--option ")
    return {k: v for k, v in built.to_json().items() if k in given}


#: plan's own inputs; every other flag is an option of a costed experiment (:func:`_experiment_flags`)
OWN = ("model", "experiment", "task", "limit", "shots", "tokens", "device", "devices", "dtype", "option", "paper",
       "as_json", "out", "force", "quiet")


def _own_parameters() -> list[inspect.Parameter]:
    def p(name: str, default: Any, annotation: Any, kind: Any = inspect.Parameter.KEYWORD_ONLY) -> inspect.Parameter:
        return inspect.Parameter(name, kind, default=default, annotation=annotation)

    return [
        p("model", typer.Argument(None, help="a shipped config (meta-llama/Llama-3.1-8B, ...), a config.json, a model "
                                  "directory or a hub id; omit with --paper"), str | None),
        p("experiment", typer.Option("eval", "--experiment", "-e", help="a registered experiment with costs: eval, attn "
                                     "(or maps), sweep, rank, path, edges, prune, transplant or a plugin's (an unknown "
                                     "name lists them)"), str),
        p("task", typer.Option("mmlu", "--task", "-t", help="the task whose prompts set the lengths"), str),
        p("limit", typer.Option(1000, "--limit", "-n", help="number of examples the run scores (in all; mmlu's --limit "
                                "elsewhere counts per subject)"), int),
        p("shots", typer.Option(None, "--shots", help="few-shot exemplars (mmlu)"), int | None),
        p("tokens", typer.Option(None, "--tokens", help="tokens per prompt instead of the task's"), int | None),
        p("device", typer.Option("h100", "--device", help=", ".join(DEVICES)), str),
        p("devices", typer.Option(1, "--devices", help="number of devices working side by side"), int),
        p("dtype", typer.Option(None, "--dtype", help="weights' precision (default bf16; fp32 for cpu)"), str | None),
        p("option", typer.Option(None, "--option", help="an option of the experiment KEY=VALUE (repeatable; any "
                                 "registered experiment's own, checked as ganda run checks it)"), list[str] | None),
        p("paper", typer.Option(False, "--paper", help="print the paper's headline runs"), bool),
        p("as_json", typer.Option(False, "--json", help="one JSON object"), bool),
        p("out", typer.Option(None, "--out", "-o", help="also write the plan(s) as JSON here"), Path | None),
        p("force", FORCE, bool),
        p("quiet", QUIET, bool),
    ]


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
    from .analyses import _turns_off

    meta = f.metadata
    flag = meta.get("flag") or "--" + f.name.replace("_", "-")
    text = f"{', '.join(owners)}: {meta.get('help', '')}"
    if option_type(hint) is bool:  # a switch: given or not (``--no-x`` given: the option off)
        return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(False, flag, help=text),
                                 annotation=bool)
    assert not _turns_off(f)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(None, flag, help=text),
                             annotation=option_type(hint) | None)


def _phase_options(experiment: str, adapter: Any, given: dict[str, Any], items: list[str] | None) -> dict[str, Any]:
    """The options the experiment's costs read: the flags it declares (checked by its ``Options``,
    as its own command checks them) and ``--option``, in the forms its phases take."""
    from .. import registry
    from .analyses import _turns_off

    cls = registry.experiment(experiment)
    fields = {f.name: f for f in _costed_fields(cls)}
    mine = {k: (not v if _turns_off(fields[k]) else v) for k, v in given.items() if k in fields}
    built = cls.Options.build(mine, cli=True)
    opts: dict[str, Any] = {k: getattr(built, k) for k in mine}
    if cls.name == "rank" and opts.get("method") == "exact":
        raise GandaError("--method exact is the exhaustive sweep: cost it with -e sweep")
    opts.update(_experiment_options(experiment, items))
    if "heads" in opts:
        opts["heads_per_layer"] = _sweep_heads(adapter, opts.pop("heads"))
    for name in ("verify_layers", "map_layers"):
        if opts.get(name) is not None:
            opts[name] = _layers_of(adapter, "--" + name.replace("_", "-"), opts[name])
    if opts.get("remove_restore") is True:  # prune's costs read the minimal model's size
        opts["remove_restore"] = opts.get("minimal") or len(adapter.original_layers())
    if "graddrop_blocks" in opts:
        opts["graddrop_blocks"] = opts["graddrop_blocks"] or None  # 0: one block per layer
    return opts


def plan_command(**values: Any) -> None:
    """Estimate FLOPs, peak memory (weights, activations, kept tensors) and time of an experiment."""
    from .. import plan as planner
    from ..device import parse_dtype

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
        plans = paper_plans(own["device"], devices, own["shots"])
    else:
        if model is None:
            raise GandaError("give a MODEL (or --paper)")
        if experiment not in planner.costed_experiments():
            raise GandaError(f"--experiment must be one of {', '.join(planner.costed_experiments())}, "
                             f"not {experiment!r}")
        default = os.environ.get("GANDA_DTYPE") or ("float32" if own["device"] == "cpu" else "bfloat16")
        adapter, tok = _adapter_and_tokenizer(model, parse_dtype(own["dtype"] or default, "--dtype"))
        w = workload(adapter, tok, own["task"], own["limit"], own["shots"], own["tokens"])
        opts = {"layer_skip": layer_skip(adapter), **_phase_options(experiment, adapter, given, own["option"])}
        plans = [(experiment, planner.plan(planner.profile(adapter), experiment, w, own["device"], devices, **opts))]
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
    params = _own_parameters() + [_flag_parameter(f, hint, owners) for f, hint, owners in flags.values()]
    plan_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    plan_command.__annotations__ = {p.name: p.annotation for p in params}
    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command("plan", short_help=SUMMARY)(plan_command)
    return typer.main.get_command(app)


SUMMARY = "Estimate FLOPs, peak memory and time of an experiment"
AnalysisGroup.lazy["plan"] = (SUMMARY, build_plan)
