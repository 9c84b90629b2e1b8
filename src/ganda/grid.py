"""A study as one grid: models × tasks × experiments, each job in its own resumable directory.

A grid spec (YAML or the same dict in Python)::

    models: [lab-llama, lab-mamba2]        # aliases, paths or hub ids every Ray node can reach
    tasks: [lab-mmlu, kv]
    experiments: [sweep, rank]
    options: {limit: 16, seed: 0, pairs: 5, sweep: {batch_heads: 16}, rank: {method: atp, verify_top: 10}}
    out: runs/grid

expands into one job per (model, task, experiment), written to ``out/<model>/<task>/<experiment>/``
with the experiment's own files (a sweep's ``progress.jsonl`` and ``results.*``, a ranking's
``ranking.*`` and ``verify/``). Jobs run in that order; each model loads once. A finished job is
skipped on a rerun and a stopped one resumes from its files, so rerunning the same grid finishes it.
Inside :func:`ganda.distributed.ray_sweeps` every job's sweep work runs on Ray. ``out/grid.json``
lists every job with its status and headline numbers.

The spec is checked before any model loads, the shared options by
:class:`ganda.experiments.runner.TaskInputs` (as ``ganda NAME``'s ``--limit``, ``--seed``, ...) and each
experiment's own by its registered ``Options``: every problem
is one line naming its key. Each job records how it is made in ``grid-job.json`` (its options, the
weights' fingerprint, the dtype) before it starts. A rerun skips or resumes a job only when that
record matches the job as the spec and the model give it now; otherwise it refuses in one line
before any work, so numbers made under other options are never reported under these.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import registry, runio
from .device import default_device, default_dtype
from .errors import GandaError
from .experiments.runner import RunInputs, TaskInputs, check_inputs, run_loaded
from .fingerprint import fingerprint
from .models.base import ModelAdapter
from .models.loading import load_model, model_path
from .tasks import get_task

TASK_OPTIONS = ("pairs", "shots", "subjects", "sample")


def task_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The task's own options among a spec's shared ones, as ``ganda NAME`` passes them
    (:meth:`TaskInputs.task_options`: mmlu's ``sample`` only where it is true)."""
    return {k: opts[k] for k in TASK_OPTIONS if k in opts and (k != "sample" or opts[k])}
COMMON = tuple(f.name for f in TaskInputs.fields())  # limit, sample, pairs, shots, subjects, seed


def grid_experiments(aliases: bool = False) -> list[str]:
    """The registered experiments that run as grid jobs (one model, one task's examples); with
    ``aliases``, their other names too (``attribution`` for ``rank``)."""
    return [n for n in registry.experiment_names() if registry.experiment(n).on_task
            and (aliases or registry.experiment(n).name == n)]


def _canonical(names: list[str], opts: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The spec's experiments and options under each experiment's own name (an alias is that name)."""
    own = {n: registry.experiment(n).name for n in grid_experiments(aliases=True)}
    bad = [e for e in names if e not in own]
    if bad:
        raise GandaError(f"grid spec: experiment {bad[0]!r} is not one of {', '.join(grid_experiments())}")
    out: dict[str, Any] = {}
    for key, val in opts.items():
        name = own.get(key, key)
        if name in out:
            raise GandaError(f"grid spec: options.{key} names the experiment {name} a second time; give it once")
        out[name] = val
    return [own[e] for e in names], out


JOB_FILE = "grid-job.json"


def _list(spec: dict[str, Any], key: str) -> list[str]:
    val = spec.get(key)
    if isinstance(val, str):
        val = [val]
    if not isinstance(val, list) or not val or not all(isinstance(v, str) and v.strip() for v in val):
        raise GandaError(f"grid spec: {key!r} must be a non-empty list of names")
    return [v.strip() for v in val]


def safe_name(text: str) -> str:
    """A model spec or task name as one directory name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip("/")).strip("_") or "_"


def parse_spec(spec: dict[str, Any] | str | Path) -> dict[str, Any]:
    """Read and check a grid spec (a YAML file or a dict); every problem is one line, before any model loads."""
    if not isinstance(spec, dict):
        path = Path(spec)
        if not path.is_file():
            raise GandaError(f"no grid spec at {path}")
        try:
            spec = yaml.safe_load(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            raise GandaError(f"{path}: not a grid spec (not UTF-8 text: a binary file?)") from None
        except OSError as exc:
            raise GandaError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        except yaml.YAMLError as exc:
            raise GandaError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(spec, dict):
            raise GandaError(f"{path}: a grid spec is a mapping with models, tasks, experiments, options, out")
    unknown = sorted(set(spec) - {"models", "tasks", "experiments", "options", "out"})
    if unknown:
        raise GandaError(f"grid spec: unknown key {unknown[0]!r} (expected models, tasks, experiments, options, out)")
    models, tasks = _list(spec, "models"), _list(spec, "tasks")
    opts = spec.get("options") or {}
    if not isinstance(opts, dict):
        raise GandaError("grid spec: 'options' must be a mapping")
    exps, opts = _canonical(_list(spec, "experiments"), opts)
    known = grid_experiments()
    for key, val in opts.items():
        if key in known:
            if not isinstance(val, dict):
                raise GandaError(f"grid spec: options.{key} must be a mapping of that experiment's options")
            registry.experiment(key).Options.build(val, where=f"grid spec: options.{key}: ")
        elif key not in COMMON:
            raise GandaError(f"grid spec: unknown option {key!r} (expected {', '.join(COMMON)} or an experiment name)")
    shared = {k: v for k, v in opts.items() if k in COMMON}
    if isinstance(shared.get("subjects"), list):  # a list of names is the comma list --subjects takes
        shared["subjects"] = ",".join(str(x) for x in shared["subjects"])
    TaskInputs.build(shared, where="grid spec: options.")
    out = "runs/grid" if spec.get("out") is None else spec["out"]
    if not isinstance(out, str) or not out.strip():
        raise GandaError(f"grid spec: 'out' must be a directory name, got {out!r}")
    names = [safe_name(m) for m in models]
    if len(set(names)) != len(names):
        raise GandaError("grid spec: two models share one directory name; list each model once")
    for t in tasks:
        try:
            task = get_task(t, **task_options(opts))
        except GandaError as exc:
            raise GandaError(f"grid spec: {exc}") from None
        if task.kind != "mc":
            raise GandaError(f"grid spec: task {t!r} is a generation task; sweeps and rankings score multiple choice")
    return {"models": models, "tasks": tasks, "experiments": exps, "options": opts, "out": out}


def jobs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid's jobs in run order (model, then task, then experiment), each with its directory."""
    out = Path(spec["out"])
    return [{"model": m, "task": t, "experiment": e, "dir": str(out / safe_name(m) / safe_name(t) / e)}
            for m in spec["models"] for t in spec["tasks"] for e in spec["experiments"]]


def _earlier(path: Path) -> dict[str, dict[str, Any]]:
    """The jobs a previous run of the grid recorded, by directory (their headline numbers are kept)."""
    try:
        return {j["dir"]: j for j in json.loads(path.read_text())["jobs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _limit(opts: dict[str, Any], experiment: str) -> int | None:
    """A job's prompts: the spec's ``limit``, else (absent or null) the experiment's own default, as
    ``ganda NAME`` without ``--limit`` takes (32; ``heads`` 16)."""
    return registry.experiment(experiment).default_limit if opts.get("limit") is None else int(opts["limit"])


def job_inputs(job: dict[str, Any], opts: dict[str, Any], *, ray: str | None = None,
               allow_pickle: bool = False) -> RunInputs:
    """A job's inputs as ``ganda NAME`` would take them (its prompts from the spec's shared options;
    ``ray``: the grid runs on Ray, which the experiment's checks read)."""
    shared = {k: opts[k] for k in TASK_OPTIONS if opts.get(k) is not None}
    return RunInputs(model=job["model"], task=job["task"], limit=_limit(opts, job["experiment"]), seed=int(opts.get("seed", 0)), **shared,
                     ray=ray, allow_pickle=allow_pickle, progress=False)


def job_record(job: dict[str, Any], opts: dict[str, Any], weights: str | None, dtype: str) -> dict[str, Any]:
    """What makes a job's numbers what they are: written to its ``grid-job.json`` before it starts,
    compared on every rerun."""
    options = {"limit": _limit(opts, job["experiment"]), "seed": int(opts.get("seed", 0)),
               **task_options(opts), job["experiment"]: opts.get(job["experiment"], {})}
    return {"model": job["model"], "task": job["task"], "experiment": job["experiment"], "options": options,
            "weights": weights, "dtype": dtype}


def _journaled(record: Any, cls: type) -> Any:
    """``record`` as a rerun compares it: without the experiment's options that its units do not
    depend on (``journal=False``: the rows it prints, a step run after them)."""
    opts = record.get("options") if isinstance(record, dict) else None
    own = opts.get(record.get("experiment")) if isinstance(opts, dict) else None
    if not isinstance(own, dict):
        return record
    quiet = {f.name for f in cls.Options.fields() if not f.metadata.get("journal", True)}
    return {**record, "options": {**opts, record["experiment"]: {k: v for k, v in own.items() if k not in quiet}}}


def _check_job(job: dict[str, Any], want: dict[str, Any], cls: type) -> bool:
    """Refuse a job directory made under another record (or with results but no record); True where
    the record differs only in options the job's units do not depend on, so the job runs again
    from its journal."""
    jdir = Path(job["dir"])
    record = jdir / JOB_FILE
    if not record.exists():
        if jdir.is_dir() and any(jdir.iterdir()):
            raise GandaError(f"{jdir} holds results but no {JOB_FILE} saying how they were made; delete it to run "
                             "the job again, or use another out")
        return False
    try:
        have = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GandaError(f"{record}: not a readable job record ({exc})") from None
    if have == want:
        return False
    if _journaled(have, cls) == _journaled(want, cls):
        return True
    have = have if isinstance(have, dict) else {}
    diff = [k for k in want if have.get(k) != want[k]]
    opts = [k for k in want["options"] if (have.get("options") or {}).get(k) != want["options"][k]] \
        if "options" in diff and isinstance(have.get("options"), dict) else []
    what = ", ".join(f"options.{k}" for k in opts) or ", ".join(diff) or "its record"
    detail = "; the weights changed since" if "weights" in diff else ""
    raise GandaError(f"the grid job {jdir} was made with other {what} than the spec gives now{detail}; "
                     "use another out, or delete that directory to run the job again")


def run_grid(spec: dict[str, Any] | str | Path, *, allow_pickle: bool = False, ray: str | None = None,
             on_job: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run (or finish) every job of the grid; return the job list as written to ``out/grid.json``.

    Every job is checked against its ``grid-job.json``, and by its experiment as ``ganda NAME``
    checks a run (:func:`ganda.experiments.runner.check_inputs`; ``ray``: the address the command's
    ``--ray`` runs the jobs on), before any job runs; each runs through the runner's
    :func:`~ganda.experiments.runner.run_loaded`, so its files are those of ``ganda NAME``."""
    spec = parse_spec(spec)
    out = Path(spec["out"])
    opts = spec["options"]
    todo = jobs(spec)
    dtype = str(default_dtype(default_device())).removeprefix("torch.")
    weights: dict[str, str | None] = {}
    for m in spec["models"]:
        path = model_path(m)
        weights[m] = fingerprint(path.resolve()) if path is not None else None
    records = {job["dir"]: job_record(job, opts, weights[job["model"]], dtype) for job in todo}
    earlier = _earlier(out / "grid.json")
    adapters: dict[str, ModelAdapter] = {}
    with runio.run_dir_lock(out):
        checked = {}
        for job in todo:  # every job before any work: one stale or refused job refuses the run
            cls = registry.experiment(job["experiment"])
            again = _check_job(job, records[job["dir"]], cls)
            run = job_inputs(job, opts, ray=ray, allow_pickle=allow_pickle)
            options = cls.Options.build(opts.get(job["experiment"], {}))
            checked[job["dir"]] = (cls, run, options, check_inputs(cls, run, options), again)
        for job in todo:
            cls, run, options, task, again = checked[job["dir"]]
            jdir = Path(job["dir"])
            if (jdir / cls.done_file).exists() and not again:
                job.update({k: v for k, v in earlier.get(job["dir"], {}).items() if k in ("result", "seconds")})
                job["status"] = "done"
            else:
                if job["model"] not in adapters:
                    adapters.clear()  # one model in memory at a time
                    adapters[job["model"]] = load_model(job["model"], allow_pickle=allow_pickle)
                jdir.mkdir(parents=True, exist_ok=True)
                runio.write_text(jdir / JOB_FILE, json.dumps(records[job["dir"]], indent=1) + "\n")  # a record, compared exactly
                t0 = time.perf_counter()
                done = run_loaded(cls, run, options, adapters[job["model"]], task, jdir)
                job["result"] = done.experiment.job_summary(done.result)
                job["status"], job["seconds"] = "done", round(time.perf_counter() - t0, 2)
            runio.write_json(out / "grid.json", {"spec": spec, "jobs": todo}, indent=1)
            if on_job:
                on_job(job)
    return todo


__all__ = ["JOB_FILE", "grid_experiments", "job_inputs", "job_record", "jobs", "parse_spec", "run_grid", "safe_name"]
