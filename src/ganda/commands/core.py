"""Core commands: ``ganda eval``, ``ganda attn``; and what every
command shares (the model argument, one vocabulary of options, count checks, ``--option`` parsing,
intervention flags).

Commands import the library (and with it torch) inside their bodies, so that ``ganda --help`` and
a bad flag answer at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .. import runio
from ..errors import GandaError
from ..experiments.base import LIMIT_MMLU
from ..tasks import get_task
from .options import (
    ABLATE_AT,
    ABLATIONS,
    FORCE,
    QUIET,
    ablation_option,
    at_least,
    model_inputs,
    parse_options,
    require_heads,
)

if TYPE_CHECKING:
    from ..interventions import Intervention

DEFAULT_MODEL = "smollm2-135m"  # ganda.models.DEFAULT_MODEL, spelled here so that --help needs no torch
MODEL_HELP = ("smollm2-135m, gemma3-270m, a lab model (lab-llama-h1, lab-mamba2-9k, lab-hybrid-late-7k5, "
              "lab-distilled-h1, ...), a .gguf file, a local HF directory or a hub id")
MODEL = typer.Argument(DEFAULT_MODEL, help=MODEL_HELP)
PICKLE = typer.Option(False, "--allow-pickle", help="allow *.bin/*.pt weights (unpickling runs code)")
SEED = typer.Option(0, "--seed", help="seed of the prompt sample")
PAIRS = typer.Option(None, "--pairs", help="kv: number of key-value pairs")
SHOTS = typer.Option(None, "--shots", help="few-shot exemplars (mmlu, letters)")
SUBJECTS = typer.Option(None, "--subjects", help="mmlu: comma-separated subjects")
SAMPLE = typer.Option(False, "--sample", help="mmlu: --limit N draws a seeded sample (--seed) of N questions "
                      "across the subjects instead of lm-eval's first N of each subject")


def limit_option(default: int | None, what: str = "examples per task", mmlu: bool = True) -> Any:
    """``-n/--limit``: one name and one meaning in every command (how many examples or prompts)."""
    return typer.Option(default, "--limit", "-n", help=what + (LIMIT_MMLU if mmlu else ""))


TASKS_ALIAS = typer.Option(None, "--tasks", hidden=True, help="another spelling of --task")


def task_list_option(default: str, examples: str) -> Any:
    """``-t/--task`` of a command that scores several tasks: the one task option, a comma list."""
    return typer.Option(None, "--task", "-t", help=f"comma-separated tasks: {examples} (default {default})")


def task_list(task: str | None, tasks: str | None, default: str) -> str:
    """The tasks of ``--task`` or of its other spelling ``--tasks`` (kept so that written command
    lines still run); the two naming different lists is an error, not a silent choice."""
    if task is not None and tasks is not None and task != tasks:
        raise GandaError(f"--task {task} and --tasks {tasks}: --tasks is another spelling of --task, give one")
    return task if task is not None else tasks if tasks is not None else default


def mmlu_options(sample: bool) -> dict[str, Any]:
    """``--sample`` as the mmlu task option ``sample`` (other tasks take no such option)."""
    return {"sample": True} if sample else {}


def build_interventions(
    ablate: str | None = None,
    keep_layers: str | None = None,
    remove_layers: str | None = None,
    mask_last_row: str | None = None,
    mask_rule: str = "query",
    ablation: str = "zero",
    reference: Any = None,
    ablate_at: str | None = None,
    seed: int = 0,
) -> list[Intervention]:
    """CLI flags -> interventions (layer edits first, so head ids keep their original layers);
    ``--ablate``'s heads ablated the ``ablation`` way (``reference``: the prompts of the mean and
    the resample donors) at ``ablate_at`` (a position class of :mod:`ganda.sites`; None: everywhere)."""
    from ..interventions import AblateHeads, KeepLayers, RemoveLayers, parse_layers
    from ..interventions import mask_last_row as mlr

    require_heads("--ablate", ablate)
    require_heads("--mask-last-row", mask_last_row)
    out: list[Intervention] = []
    if keep_layers is not None:
        out.append(KeepLayers(parse_layers(keep_layers)))
    if remove_layers is not None:
        out.append(RemoveLayers(parse_layers(remove_layers)))
    if ablate is not None:
        out.append(AblateHeads(ablate, positions=ablate_at, how=ablation, reference=reference, seed=seed))
    if mask_last_row is not None:
        out.append(mlr(mask_last_row, mask_rule))
    return out


def flag(option: str) -> str:
    """A library option's name as its command-line flag (``verify_top`` -> ``--verify-top``), for
    the library's checks to name what the user typed."""
    return "--" + option.replace("_", "-")


def one_of(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise GandaError(f"{flag} must be {' or '.join(choices)}, not {value!r}")


def validate_interventions(adapter, interventions: list[Intervention]) -> None:
    """Fail fast (before any long run) on a bad head id or layer."""
    from ..interventions import apply

    with apply(adapter, interventions):
        pass


def register(app: typer.Typer) -> None:
    @app.command("eval", short_help="Accuracy of a model on a task, optionally under interventions")
    def eval_(
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="kv, letters, mmlu, arc_easy, gsm8k, bbh, lab-mmlu, ..."),
        limit: int | None = limit_option(None, "number of examples (default: every example of the task)"),
        sample: bool = SAMPLE,
        shots: int | None = SHOTS,
        pairs: int | None = PAIRS,
        subjects: str | None = SUBJECTS,
        ablate: str | None = typer.Option(None, "--ablate", help="heads to ablate, e.g. L3H1,L4H2"),
        ablation: str = ablation_option(),
        ablate_at: str | None = typer.Option(None, "--ablate-at", help="ablate --ablate's heads only at these "
                                             "positions: ends (segment ends), key (the queried key), final (the "
                                             "last prompt token and the answer), elsewhere; default everywhere"),
        keep_layers: str | None = typer.Option(None, "--keep-layers", help="run only these layers, e.g. 0-17"),
        remove_layers: str | None = typer.Option(None, "--remove-layers", help="skip these layers"),
        mask_last_row: str | None = typer.Option(None, "--mask-last-row", help="attention heads whose last row is zeroed"),
        mask_rule: str = typer.Option("query", "--mask-rule", help="--mask-last-row's row: query (last prompt token) "
                                      "or last (last scored position, as the authors' Zamba2 code)"),
        seed: int = SEED,
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        predictions: Path | None = typer.Option(None, "--predictions", help="write per-example predictions (JSONL): id "
                                               "(task, subject, doc_id: lm-eval's doc_id), every choice's loglik, "
                                               "pred (acc), pred_norm (acc_norm), correct, correct_norm"),
        option: list[str] | None = typer.Option(None, "--option", help="any task option, KEY=VALUE (repeatable), "
                                                 "e.g. --option cot=true --option subtask=date_understanding"),
        no_prefix_cache: bool = typer.Option(False, "--no-prefix-cache", help="run every prompt whole instead of "
                                             "reusing shared prompt prefixes (same as GANDA_PREFIX_CACHE=0)"),
        allow_pickle: bool = PICKLE,
        force: bool = FORCE,
        quiet: bool = QUIET,
    ) -> None:
        """Accuracy of MODEL on a task (Wilson 95% CI), optionally under interventions."""
        from ..evaluation import evaluate
        from ..models import load_model
        from ..scoring import answers_text
        from ..tasks import task_for_model

        at_least("--limit", limit)
        one_of("--mask-rule", mask_rule, ("query", "last"))
        one_of("--ablation", ablation, ABLATIONS)
        if ablate_at is not None:
            one_of("--ablate-at", ablate_at, ABLATE_AT)
        if (ablation != "zero" or ablate_at is not None) and ablate is None:
            raise GandaError("--ablation and --ablate-at need --ablate HEADS")
        opts = {"shots": shots, "pairs": pairs, "subjects": subjects, **mmlu_options(sample), **parse_options(option)}
        task_obj = get_task(task, **opts)
        ivs = build_interventions(ablate, keep_layers, remove_layers, mask_last_row, mask_rule)
        if predictions:
            runio.check_output_file(predictions, "--predictions", inputs=model_inputs(model), kind="predictions",
                                    force=force)
        adapter = load_model(model, allow_pickle=allow_pickle)
        task_obj = task_for_model(task, task_obj, adapter, **opts)
        if task_obj.kind != "mc" and (ablation == "resample" or ablate_at is not None):
            raise GandaError(f"--ablation resample and --ablate-at score multiple-choice tasks only; {task!r} generates")
        validate_interventions(adapter, ivs)  # head ids and layers, before any reference prompt runs
        if ablation != "zero" or ablate_at is not None:  # mean and resample: over the scored prompts
            ivs = build_interventions(ablate, keep_layers, remove_layers, mask_last_row, mask_rule, ablation,
                                      None, ablate_at, seed)
        if task_obj.kind == "mc":
            from .estimate import announce

            announce(adapter, task_obj.examples(limit=limit, seed=seed), shared_prefix=not no_prefix_cache)
        res = evaluate(adapter, task_obj, ivs, limit=limit, seed=seed, progress=not (as_json or quiet),
                       prefix_cache=False if no_prefix_cache else None)
        if predictions:
            with runio.atomic_open(predictions) as f:
                for p in res.predictions:
                    f.write(json.dumps(p, allow_nan=False) + "\n")
        if as_json:
            print(json.dumps(runio.rounded(res.to_json()), allow_nan=False))  # every score is finite (ganda.finite)
        else:
            lo, hi = res.ci_low, res.ci_high
            ivtxt = "; ".join(json.dumps(i) for i in res.interventions) or "none"
            print(f"{res.task} on {res.model}: accuracy {res.accuracy:.3f} (95% CI {lo:.3f}-{hi:.3f}), "
                  f"n={res.n}, {res.seconds:.1f} s, interventions: {ivtxt}")
            if answers := res.by_answer():
                print("  " + answers_text(answers))

    @app.command(short_help="Draw attention maps of heads on one prompt")
    def attn(
        model: str = MODEL,
        heads: str = typer.Option(..., "--heads", help="heads to draw, e.g. L16H22,L17H24 or L6.attnH3,L7.ssmH2"),
        task: str = typer.Option("kv", "--task", "-t", help="the task whose example is drawn (kv, letters, mmlu, ...)"),
        index: int = typer.Option(0, "--index", "-i", help="which example of the task"),
        pairs: int | None = PAIRS,
        shots: int | None = SHOTS,
        prompt: str | None = typer.Option(None, "--prompt", help="draw this text instead of a task example"),
        out: Path = typer.Option(Path("attention.png"), "--out", "-o", help="PNG file"),
        last_rows: int | None = typer.Option(None, "--rows", help="draw only the last N query rows"),
        seed: int = SEED,
        allow_pickle: bool = PICKLE,
        force: bool = FORCE,
        quiet: bool = QUIET,
    ) -> None:
        """Draw attention maps (softmax, or exact SSM implicit attention) of heads on one prompt."""
        from ..attention import draw_attention, sidecar
        from ..models import load_model
        from ..tasks import task_for_model

        require_heads("--heads", heads)
        at_least("--index", index, 0)
        at_least("--rows", last_rows)
        if prompt is not None and not prompt.strip():
            raise GandaError("--prompt is empty")
        t = get_task(task, pairs=pairs, shots=shots) if prompt is None else None
        inputs = model_inputs(model)
        runio.check_output_file(out, "--out", inputs=inputs, kind="figure", force=force)
        if (side := sidecar(out)) is not None:  # the maps as JSON, beside the figure
            runio.check_output_file(side, "--out", inputs=inputs, kind="attention", force=force)
        adapter = load_model(model, allow_pickle=allow_pickle)
        if t is not None:
            exs = task_for_model(task, t, adapter, pairs=pairs, shots=shots).examples(limit=index + 1, seed=seed)
            if index >= len(exs):
                raise GandaError(f"--index {index}: task {task!r} has {len(exs)} examples (0-{len(exs) - 1})")
        # a task example also saves its segments and gold segment beside the maps (<out>.json)
        path = draw_attention(adapter, exs[index] if t is not None else prompt, heads, out, last_rows=last_rows)
        print(f"wrote {path}" + (f" and {side.name}" if side is not None else ""))
