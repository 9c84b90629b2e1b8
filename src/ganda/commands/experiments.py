"""The paper's experiments as commands: ``prune``, ``retain``, ``kv-curve``, ``mask-last-row``,
``transplant``. Each writes ``result.json``, a CSV, PNG figures and ``report.html`` into ``--out``
and prints the summary as JSON.
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
    MODEL_HELP,
    PICKLE,
    QUIET,
    SAMPLE,
    SEED,
    TASKS_ALIAS,
    at_least,
    limit_option,
    mmlu_options,
    model_inputs,
    require_heads,
    task_list,
    task_list_option,
)
from .grid import RAY, RAY_ACTORS

LIMIT = limit_option(100, "examples per task (the same examples in every condition)")
KLIMIT = typer.Option(None, "--knowledge-limit", help="examples per knowledge task (default: --limit)")
DEFAULT_TASKS = "mmlu,knowledge"
TASKS = task_list_option(DEFAULT_TASKS, "mmlu, knowledge, letters, kv20, ...")
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


def _check_inputs(limit: int | None = None, klimit: int | None = None, tasks: str | None = None,
                  **counts: int | None) -> list[str]:
    """Bad counts and task lists fail here, before any model loads; returns the task names.
    ``counts``: flag name without dashes (``min_layers``) -> value, each at least 1."""
    from ..experiments.common import parse_tasks

    at_least("--limit", limit)
    at_least("--knowledge-limit", klimit)
    for flag, value in counts.items():
        at_least("--" + flag.replace("_", "-"), value)
    return parse_tasks(tasks) if tasks is not None else []  # kv1, lab-kv999: refused by the task's bounds


def _scorer(adapter, tasks: str, limit: int, klimit: int | None, seed: int, quiet: bool, sample: bool = False):
    from ..experiments.common import Scorer, parse_tasks

    names = parse_tasks(tasks)
    return Scorer(adapter, names, limit=limit, knowledge_limit=klimit, seed=seed, progress=not quiet, sample=sample)


def register(app: typer.Typer) -> None:
    @app.command(short_help="Cumulative layer pruning and the minimal model (Figures 2, 3)")
    def prune(
        model: str = MODEL,
        limit: int = LIMIT,
        sample: bool = SAMPLE,
        knowledge_limit: int | None = KLIMIT,
        task: str | None = TASKS,
        tasks: str | None = TASKS_ALIAS,
        layers: int = typer.Option(1, "--layers", help="pruning step: score every LAYERS-th truncation"),
        min_layers: int = typer.Option(1, "--min-layers", help="smallest number of kept layers"),
        remove_restore: bool = typer.Option(False, "--remove-restore", help="Fig. 3 on the minimal model"),
        minimal: int | None = typer.Option(None, "--minimal", help="minimal model size (skips the curve)"),
        drop_task: str | None = typer.Option(None, "--drop-task", help="task whose drop defines the minimal "
                                             "model (default: mmlu if scored, else the first task)"),
        seed: int = SEED,
        out: Path | None = OUT,
        ray: str | None = RAY,
        ray_actors: int | None = RAY_ACTORS,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Cumulative layer pruning (Fig. 2) and the minimal model; --remove-restore: Fig. 3."""
        from ..distributed import ray_sweeps
        from ..experiments.prune import prune_curve
        from ..experiments.prune import remove_restore as run_remove_restore
        from ..models import load_model

        tasks = task_list(task, tasks, DEFAULT_TASKS)
        names = _check_inputs(limit, knowledge_limit, tasks, layers=layers, min_layers=min_layers, minimal=minimal)
        if drop_task is not None and drop_task not in names:
            raise GandaError(f"--drop-task {drop_task} is not among --task {','.join(names)}")
        _out(out, "remove_restore" if remove_restore else "prune", model)
        adapter = load_model(model, allow_pickle=allow_pickle)
        scorer = _scorer(adapter, tasks, limit, knowledge_limit, seed, quiet, sample)
        drop_task = drop_task or ("mmlu" if "mmlu" in scorer.tasks else scorer.tasks[0])
        if drop_task not in scorer.tasks:
            raise GandaError(f"--drop-task {drop_task} is not among --task {','.join(scorer.tasks)}")
        out_dir = _out(out, "remove_restore" if remove_restore else "prune", model)
        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):
            if not remove_restore:
                curve = prune_curve(adapter, scorer, step=layers, min_layers=min_layers, drop_task=drop_task)
                _finish(curve, out_dir, html)
                return
            if minimal is None:
                curve = prune_curve(adapter, scorer, step=layers, min_layers=min_layers, drop_task=drop_task)
                _finish(curve, out_dir / "prune", html)
                if "minimal_layers" not in curve.summary:
                    raise GandaError("could not find the minimal model; pass --minimal N")
                minimal = int(curve.summary["minimal_layers"])
            _finish(run_remove_restore(adapter, scorer, minimal, drop_task=drop_task), out_dir, html)

    @app.command(short_help="Keep none, either or both critical heads (Table 1)")
    def retain(
        model: str = MODEL,
        gather: str = typer.Option(..., "--gather", help="Gather head(s), one layer, e.g. L16H22"),
        aggregate: str = typer.Option(..., "--aggregate", help="Aggregate head(s), one later layer, e.g. L17H24"),
        keep_layers: str | None = KEEP,
        limit: int = LIMIT,
        sample: bool = SAMPLE,
        knowledge_limit: int | None = KLIMIT,
        task: str | None = TASKS,
        tasks: str | None = TASKS_ALIAS,
        seed: int = SEED,
        out: Path | None = OUT,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Table 1: keep none / only Aggregate / only Gather / both critical heads in the two layers."""
        from ..experiments.retain import retain as run_retain
        from ..models import load_model

        tasks = task_list(task, tasks, DEFAULT_TASKS)
        _check_inputs(limit, knowledge_limit, tasks)
        require_heads("--gather", gather)
        require_heads("--aggregate", aggregate)
        _layers(keep_layers)
        _out(out, "retain", model)
        adapter = load_model(model, allow_pickle=allow_pickle)
        scorer = _scorer(adapter, tasks, limit, knowledge_limit, seed, quiet, sample)
        result = run_retain(adapter, scorer, gather, aggregate, keep_layers=_layers(keep_layers))
        _finish(result, _out(out, "retain", model), html)

    @app.command("kv-curve", short_help="KV-retrieval accuracy against the number of pairs (Figure 4)")
    def kv_curve(
        model: str = MODEL,
        heads: str | None = typer.Option(None, "--heads", help="heads to ablate, e.g. L17H24 (none: intact only)"),
        pairs: str = typer.Option("5,10,20,30,40,50", "--pairs", help="numbers of key-value pairs"),
        task: str = typer.Option("kv", "--task", help="kv (SmolLM2's dictionary prompt) or lab-kv (the lab world)"),
        compare: str | None = typer.Option(None, "--compare", help="other models' intact curves on the same "
                                           "prompts, comma-separated (e.g. lab-kv-mamba2)"),
        keep_layers: str | None = KEEP,
        limit: int = limit_option(100, "prompts per number of pairs (the same prompts in every condition)", mmlu=False),
        seed: int = SEED,
        out: Path | None = OUT,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Fig. 4: KV-retrieval accuracy vs number of pairs, intact vs heads ablated (Wilson CIs)."""
        from ..experiments.kv_curve import kv_curve as run_kv_curve
        from ..models import load_model

        try:
            ps = [int(p) for p in pairs.split(",") if p.strip()]
        except ValueError:
            raise GandaError(f"--pairs: not a list of integers: {pairs!r}") from None
        if not ps:
            raise GandaError(f"--pairs: no numbers in {pairs!r}")
        if task not in ("kv", "lab-kv"):
            raise GandaError(f"--task must be kv or lab-kv, not {task!r}")
        _check_inputs(limit)
        require_heads("--heads", heads)
        _layers(keep_layers)
        for p in ps:
            get_task(task, pairs=p)  # --pairs 0 or 10000: refused by the task's declared bounds
        _out(out, "kv_curve", model)
        adapter = load_model(model, allow_pickle=allow_pickle)
        others = {m.strip(): load_model(m.strip(), allow_pickle=allow_pickle)
                  for m in (compare or "").split(",") if m.strip()}
        result = run_kv_curve(adapter, heads, ps, limit=limit, seed=seed, keep_layers=_layers(keep_layers), progress=not quiet,
                     task=task, compare=others)
        _finish(result, _out(out, "kv_curve", model), html)

    @app.command("mask-last-row", short_help="Zero attention's last row and score MMLU and knowledge")
    def mask_last_row(
        model: str = MODEL,
        heads: str | None = typer.Option(None, "--heads", help="attention heads (default: all, L*.attnH*)"),
        per_layer: bool = typer.Option(False, "--per-layer", help="also mask each attention layer alone"),
        rule: str = typer.Option("both", "--rule", help="which row: query (last prompt token), last (last scored "
                                 "position, the authors' code) or both; they differ only for multi-token answers"),
        keep_layers: str | None = KEEP,
        limit: int = LIMIT,
        sample: bool = SAMPLE,
        knowledge_limit: int | None = KLIMIT,
        task: str | None = TASKS,
        tasks: str | None = TASKS_ALIAS,
        seed: int = SEED,
        out: Path | None = OUT,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Sec. 5.3: zero attention's last row (the answer position) and score MMLU and knowledge."""
        from ..experiments.mask_last_row import mask_last_row_experiment
        from ..models import load_model

        rules = {"both": ("query", "last"), "query": ("query",), "last": ("last",)}.get(rule)
        if rules is None:
            raise GandaError(f"--rule must be query, last or both, not {rule!r}")
        tasks = task_list(task, tasks, DEFAULT_TASKS)
        _check_inputs(limit, knowledge_limit, tasks)
        require_heads("--heads", heads)
        _layers(keep_layers)
        _out(out, "mask_last_row", model)
        adapter = load_model(model, allow_pickle=allow_pickle)
        scorer = _scorer(adapter, tasks, limit, knowledge_limit, seed, quiet, sample)
        result = mask_last_row_experiment(adapter, scorer, heads, per_layer=per_layer, keep_layers=_layers(keep_layers),
                                          rules=rules)
        _finish(result, _out(out, "mask_last_row", model), html)

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

        _check_inputs(limit, top=top, max_heads=max_heads)
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

    @app.command(short_help="Replace student layers or heads with a donor's (Figure 7)")
    def transplant(
        student: str = typer.Argument(..., help="the model that receives the donor's pieces: " + MODEL_HELP),
        donor: str = typer.Option(..., "--donor", help="Transformer donor with the same d_model"),
        layers: str | None = typer.Option(None, "--layers", help="student layers to sweep (default: all)"),
        head: str | None = typer.Option(None, "--head", help="transplant single heads instead, e.g. L17H3"),
        donor_head: str | None = typer.Option(None, "--donor-head", help="donor head (default: same L/H)"),
        score_donor: bool = typer.Option(False, "--score-donor", help="also score the donor itself"),
        limit: int = LIMIT,
        sample: bool = SAMPLE,
        knowledge_limit: int | None = KLIMIT,
        task: str | None = task_list_option("mmlu", "mmlu, knowledge, lab-mmlu, ..."),
        tasks: str | None = TASKS_ALIAS,
        seed: int = SEED,
        out: Path | None = OUT,
        allow_pickle: bool = PICKLE,
        html: bool = HTML,
        quiet: bool = QUIET,
    ) -> None:
        """Fig. 7: replace each student layer (or one head) with the donor's, score the student."""
        from ..experiments.transplant import transplant_sweep
        from ..models import load_model

        tasks = task_list(task, tasks, "mmlu")
        _check_inputs(limit, knowledge_limit, tasks)
        require_heads("--head", head)
        require_heads("--donor-head", donor_head)
        _layers(layers)
        _out(out, "transplant", student)
        s = load_model(student, allow_pickle=allow_pickle)
        d = s if donor == student else load_model(donor, allow_pickle=allow_pickle)
        scorer = _scorer(s, tasks, limit, knowledge_limit, seed, quiet, sample)
        result = transplant_sweep(s, d, scorer, layers=_layers(layers), heads=head, donor_head=donor_head,
                                  score_donor=score_donor)
        _finish(result, _out(out, "transplant", student), html)
