"""``ganda plan``: FLOPs, peak memory and time of an experiment before running it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from ..errors import GandaError
from ..heads import expand
from ..tasks import get_task
from .options import ACTIVE_EDGES, FORCE, QUIET, at_least, model_inputs, parse_options, require_heads

# ganda.plan.DEVICES, spelled here so that --help needs no torch
DEVICES = ("h100", "h200", "a100", "l40s", "cpu")
METHODS = ("atp", "atp*", "ig")  # ganda.attribution.METHODS

# Published token counts are not at hand for a config alone: characters per token of English
# text under a ~128k BPE vocabulary (Llama-3's tokenizer gives 4.1-4.4 on MMLU).
CHARS_PER_TOKEN = 4.2
SAMPLE = 200  # examples read to measure prompt lengths


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


ANNOUNCE_AFTER = 60.0  # seconds: a run estimated to take longer says so before it starts


def _new_chars(examples: list) -> float:
    """The fraction of the prompts' characters not shared with the previous prompt: what is left to
    compute when a shared prefix (MMLU's k-shot exemplars of one subject) is computed once."""
    total = new = 0
    prev = ""
    for ex in examples:
        shared = len(os.path.commonprefix([prev, ex.prompt]))
        total += len(ex.prompt)
        new += len(ex.prompt) - shared
        prev = ex.prompt
    return new / total if total else 1.0


def announce(adapter: Any, examples: list, experiment: str = "eval", shared_prefix: bool = True,
             **opts: Any) -> float | None:
    """Before a long run, one line on stderr with ``ganda plan``'s estimate of its time on this CPU
    (lengths measured on 50 of the examples, a prefix shared with the previous prompt counted once
    when ``shared_prefix``); returns the estimate in seconds. Nothing on a GPU (no calibrated rates)
    or when the run is estimated under :data:`ANNOUNCE_AFTER`."""
    from .. import plan as planner
    from ..progress import note
    from ..scoring import encode

    if not examples or adapter.device.type != "cpu":
        return None
    try:
        some = examples[:: max(1, len(examples) // 50)][:50]
        w = planner.workload_from_examples(some, lambda text: encode(adapter, text), CHARS_PER_TOKEN)
        tokens = w.tokens * (_new_chars(examples) if shared_prefix else 1.0)
        w = planner.Workload(n=len(examples), tokens=tokens, choices=w.choices, choice_tokens=w.choice_tokens,
                             max_tokens=w.max_tokens)
        seconds = planner.plan(planner.profile(adapter), experiment, w, "cpu", 1,
                               layer_skip=layer_skip(adapter), **opts).seconds
    except Exception:  # noqa: BLE001 - an estimate is a courtesy; a model the planner cannot cost runs anyway
        return None
    if seconds >= ANNOUNCE_AFTER:
        took = f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
        note(f"this run: {len(examples):,} examples, ~{w.tokens:.0f} tokens each to compute: about {took} on one "
             f"CPU core (ganda plan's calibrated rates); --limit N runs fewer")
    return seconds


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


def layer_skip(adapter: Any) -> bool:
    """Whether the exact sweep recomputes only the layers after each head's (the family skips layers)."""
    return bool(adapter.skips_layers())


PAPER = [
    ("meta-llama/Llama-3.1-8B", "sweep", {"task": "mmlu", "n": 1000}, "exhaustive single-head sweep, 1,000 MMLU"),
    ("meta-llama/Llama-3.1-8B", "attribution", {"task": "mmlu", "n": 1000, "method": "atp*", "verify_top": 30, "active": 0,
                                                 "audit": 10}, "the same ranked by attribution (AtP*)"),
    ("tiiuae/falcon-mamba-7b", "maps", {"tokens": 4096, "n": 1, "rows": 1},
     "implicit maps at L=4,096: every channel of every layer, last row"),
    ("tiiuae/falcon-mamba-7b", "maps", {"tokens": 4096, "n": 1, "map_layers": "32"},
     "implicit maps at L=4,096: every channel of one layer, full 4,096 x 4,096"),
]


def paper_plans(device: str, devices: int, shots: int | None = None) -> list[tuple[str, Any]]:
    """The paper's headline runs as plans (shipped configs, bf16)."""
    from .. import plan as planner
    from ..device import parse_dtype
    from ..interventions import parse_layers

    out = []
    for model, experiment, opts, what in PAPER:
        adapter, tok = _adapter_and_tokenizer(model, parse_dtype("bfloat16"))
        w = workload(adapter, tok, opts.get("task", "mmlu"), opts["n"], shots, opts.get("tokens"))
        extra: dict[str, Any] = {"layer_skip": layer_skip(adapter)}
        if "rows" in opts:
            extra["rows"] = opts["rows"]
        if "map_layers" in opts:
            extra["map_layers"] = parse_layers(opts["map_layers"])
        extra.update({k: opts[k] for k in ("method", "verify_top", "active", "audit") if k in opts})
        out.append((what, planner.plan(planner.profile(adapter), experiment, w, device, devices, **extra)))
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


def register(app: typer.Typer) -> None:
    @app.command("plan", short_help="Estimate FLOPs, peak memory and time of an experiment")
    def plan_cmd(
        model: str | None = typer.Argument(None, help="a shipped config (meta-llama/Llama-3.1-8B, ...), a config.json, "
                                           "a model directory or a hub id; omit with --paper"),
        experiment: str = typer.Option("eval", "--experiment", "-e", help="a registered experiment with costs: eval, "
                                       "maps, sweep, rank, path, edges, prune, transplant or a plugin's (an unknown "
                                       "name lists them)"),
        task: str = typer.Option("mmlu", "--task", "-t", help="the task whose prompts set the lengths"),
        limit: int = typer.Option(1000, "--limit", "-n", help="number of examples the run scores (in all; "
                                  "mmlu's --limit elsewhere counts per subject)"),
        shots: int | None = typer.Option(None, "--shots", help="few-shot exemplars (mmlu)"),
        tokens: int | None = typer.Option(None, "--tokens", help="tokens per prompt instead of the task's"),
        device: str = typer.Option("h100", "--device", help=", ".join(DEVICES)),
        devices: int = typer.Option(1, "--devices", help="number of devices working side by side"),
        dtype: str | None = typer.Option(None, "--dtype", help="weights' precision (default bf16; fp32 for cpu)"),
        heads: str | None = typer.Option(None, "--heads", help="sweep: only these heads (e.g. 'L0H*,L15H*')"),
        batch_heads: int = typer.Option(16, "--batch-heads", help="sweep: heads ablated per forward"),
        method: str = typer.Option("atp", "--method", help="attribution: atp, atp* or ig"),
        ig_steps: int = typer.Option(5, "--ig-steps", help="attribution (ig): integrated gradients' steps (as ganda rank)"),
        verify_top: int | None = typer.Option(None, "--verify-top", help="attribution, edges: heads (edges) verified "
                                              "exactly (default: ganda rank's 10, ganda edges' 10)"),
        audit: int | None = typer.Option(None, "--audit", help="attribution, edges: random other heads (edges) "
                                         "verified (default: ganda rank's 0, ganda edges' 10)"),
        active: int | None = typer.Option(None, "--active", help="attribution, edges: the most active heads (edges) "
                                          f"verified (default: ganda rank's 30, ganda edges' {ACTIVE_EDGES})"),
        widen: int = typer.Option(0, "--widen", help="attribution, edges: the first round of --widen W (as ganda "
                                  "rank and ganda edges; later rounds depend on what it finds)"),
        verify_layers: str | None = typer.Option(None, "--verify-layers", help="attribution: also verify every head "
                                                 "of these layers (as ganda rank), e.g. 0,1"),
        graddrop_blocks: int = typer.Option(6, "--graddrop-blocks", help="attribution (atp*): GradDrop blocks of "
                                            "layers, 0 for one per layer (as ganda rank)"),
        rows: int | None = typer.Option(None, "--rows", help="maps: rows per map (default: every row)"),
        map_layers: str | None = typer.Option(None, "--map-layers", help="maps: layers (default: every layer)"),
        option: list[str] = typer.Option(None, "--option", help="an option of the experiment KEY=VALUE (repeatable; "
                                         "any registered experiment's own, checked as ganda run checks it)"),
        paper: bool = typer.Option(False, "--paper", help="print the paper's headline runs"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object"),
        out: Path | None = typer.Option(None, "--out", "-o", help="also write the plan(s) as JSON here"),
        force: bool = FORCE,
        quiet: bool = QUIET,
    ) -> None:
        """Estimate FLOPs, peak memory (weights, activations, kept tensors) and time of an experiment."""
        from .. import plan as planner
        from ..device import parse_dtype

        for name, value in (("--devices", devices), ("--limit", limit), ("--tokens", tokens), ("--rows", rows),
                            ("--batch-heads", batch_heads), ("--ig-steps", ig_steps)):
            at_least(name, value)

        require_heads("--heads", heads)
        if method not in METHODS:
            raise GandaError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
        n = limit
        planner.device(device)
        if out is not None:  # checked before any work; replaced only when ganda wrote it as a plan, or with --force
            from .. import runio

            runio.check_output_file(out, "--out", inputs=model_inputs(model) if model else [], kind="plan", force=force)
        if paper:
            plans = paper_plans(device, devices, shots)
        else:
            if model is None:
                raise GandaError("give a MODEL (or --paper)")
            if experiment not in planner.costed_experiments():
                raise GandaError(f"--experiment must be one of {', '.join(planner.costed_experiments())}, "
                                 f"not {experiment!r}")
            default = os.environ.get("GANDA_DTYPE") or ("float32" if device == "cpu" else "bfloat16")
            dt = parse_dtype(dtype or default, "--dtype")
            adapter, tok = _adapter_and_tokenizer(model, dt)
            w = workload(adapter, tok, task, n, shots, tokens)
            if graddrop_blocks < 0:
                raise GandaError("--graddrop-blocks must be at least 0 (0: one block per layer)")
            if min(verify_top or 0, audit or 0, active or 0, widen) < 0:
                raise GandaError("--verify-top, --audit, --active and --widen must be at least 0")
            opts: dict[str, Any] = {"batch_heads": batch_heads, "method": method, "layer_skip": layer_skip(adapter),
                                    "graddrop_blocks": graddrop_blocks or None, "ig_steps": ig_steps, "widen": widen}
            # unset: the experiment's own default (rank and edges differ in --audit and --active)
            opts.update({k: v for k, v in (("verify_top", verify_top), ("audit", audit), ("active", active))
                         if v is not None})
            if verify_layers is not None:
                opts["verify_layers"] = _layers_of(adapter, "--verify-layers", verify_layers)
            if heads is not None:
                opts["heads_per_layer"] = _sweep_heads(adapter, heads)
            if rows is not None:
                opts["rows"] = rows
            if map_layers is not None:
                opts["map_layers"] = _layers_of(adapter, "--map-layers", map_layers)
            opts.update(_experiment_options(experiment, option))
            plans = [(experiment, planner.plan(planner.profile(adapter), experiment, w, device, devices, **opts))]
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
