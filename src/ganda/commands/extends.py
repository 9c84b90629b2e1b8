"""``ganda extends``: does the G&A bottleneck reach beyond MMLU (:mod:`ganda.experiments.extends`)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from ..tasks import get_task
from .core import (
    MODEL_HELP,
    PICKLE,
    QUIET,
    TASKS_ALIAS,
    at_least,
    limit_option,
    model_inputs,
    one_of,
    parse_options,
    require_heads,
    task_list,
    task_list_option,
)
from .grid import RAY, RAY_ACTORS
from .options import ABLATIONS, ablation_option

# ganda.experiments.extends.DEFAULT_TASKS and CONDITIONS, spelled here so that --help needs no torch
DEFAULT_TASKS = "gsm8k-cot,bbh,dream,dream-letters,mmlu,knowledge"
CONDITIONS = ("intact", "ablated", "control")


def register(app: typer.Typer) -> None:
    @app.command(short_help="Each task intact, G&A heads ablated, random heads ablated")
    def extends(
        model: str = typer.Argument(..., help=MODEL_HELP),
        heads: str = typer.Option(..., "--heads", help="the G&A heads to ablate, e.g. L16H22,L17H24"),
        task: str | None = task_list_option(DEFAULT_TASKS, "registered task names or 'knowledge'"),
        tasks: str | None = TASKS_ALIAS,
        limit: int | None = limit_option(None, "examples per task (default: every example)"),
        seed: int = typer.Option(0, "--seed", help="seed of the prompt sample, the control draw and its bootstrap"),
        out: Path = typer.Option(Path("runs/extends"), "--out", "-o", help="directory for JSON, CSV, predictions"),
        option: list[str] = typer.Option([], "--option", help="task option TASK.KEY=VALUE (repeatable), e.g. bbh.cot=false"),
        data_dir: str | None = typer.Option(None, "--data-dir", help="DREAM data directory (non-commercial licence)"),
        conditions: str = typer.Option(",".join(CONDITIONS), "--conditions",
                                       help="which of intact,ablated,control to run"),
        prompt_sets: int = typer.Option(1, "--prompt-sets", help="prompt sets the comparison runs on (set k: seed "
                                        "seed+k, prompts disjoint where the task allows), pooled and counted"),
        ablation: str = ablation_option("zero|mean|resample (over each task's scored prompts; the control heads are "
                                        "drawn by their zero-ablation effect)"),
        ray: str | None = RAY,
        ray_actors: int | None = RAY_ACTORS,
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Each task intact vs G&A heads ablated vs as many heads from the same layers ablated, drawn at
        random among those whose own ablation is within noise on the run's multiple-choice prompts."""
        from ..distributed import ray_sweeps
        from ..experiments.extends import control_sentence, run_extends, sets_sentence
        from ..models import load_model

        tasks = task_list(task, tasks, DEFAULT_TASKS)
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        if not names:
            raise GandaError(f"--task: no task names in {tasks!r}")
        require_heads("--heads", heads)
        at_least("--limit", limit)
        at_least("--prompt-sets", prompt_sets)
        one_of("--ablation", ablation, ABLATIONS)
        if ablation != "zero" and ray is not None:  # a shard's mean would be over the shard's prompts only
            raise GandaError(f"--ablation {ablation} runs in this process only; drop --ray")
        opts = parse_options(option, per_task=True)
        stray = [t for t in opts if t not in names]
        if stray:
            raise GandaError(f"--option {stray[0]}.*: task {stray[0]!r} is not among --task {','.join(names)}")
        if data_dir:
            dreams = [n for n in names if n.startswith("dream")]
            if not dreams:
                raise GandaError("--data-dir is the DREAM data directory, and --task names no dream task")
            for n in dreams:
                opts.setdefault(n, {})["data_dir"] = data_dir
        for n in names:  # unknown names, bad options, missing data: refused before the model loads
            if n != "knowledge":
                get_task(n, **opts.get(n, {}))
            elif opts.get(n):
                raise GandaError("--option knowledge.*: the knowledge tasks take no options")
        conds = tuple(c.strip() for c in conditions.split(",") if c.strip())
        bad = [c for c in conds if c not in CONDITIONS]
        if bad or not conds:
            raise GandaError(f"--conditions: expected some of {','.join(CONDITIONS)}, got {conditions!r}")
        runio.claim_run_dir(out, kind="extends", models=model_inputs(model))
        adapter = load_model(model, allow_pickle=allow_pickle)
        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):
            result = run_extends(adapter, heads, names, limit=limit, seed=seed, out=out, options=opts,
                                 conditions=conds, prompt_sets=prompt_sets, ablation=ablation)
        for r in result["results"]:
            ci = [float("nan") if x is None else x for x in (r.get("ci_low"), r.get("ci_high"))]
            acc = r["accuracy"]
            print(f"{r['task']:>14} {r['condition']:>8}  acc {acc if acc is None else round(acc, 4)}"
                  f"  CI [{ci[0]:.3f}, {ci[1]:.3f}]  n={r['n']}")
        if ablation != "zero":
            print(f"ablation: {ablation}")
        print(control_sentence(result))
        if prompt_sets > 1:
            print(sets_sentence(result))
        print(f"wrote {out}/extends.json and {out}/extends.csv" + (f" and {out}/prompt_sets.csv" if prompt_sets > 1 else ""))
