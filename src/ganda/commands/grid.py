"""``ganda grid SPEC.yaml``: models × tasks × experiments as one resumable job list, optionally on
Ray; and the ``--ray`` options the long-running commands share (:mod:`ganda.distributed`)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from .options import PICKLE, QUIET, int_option, model_inputs


def _check_ray(value: str | None) -> str | None:
    """``--ray``, checked when the command line is read, before any model loads: Ray is installed and
    the address answers within a bounded wait (GANDA_RAY_CONNECT_TIMEOUT seconds, default 10)."""
    if value is None:
        return value
    from .. import distributed  # torch: loaded only when --ray is given

    if not distributed.ray_installed():
        raise GandaError("--ray needs Ray, which is not installed here: pip install 'ganda[distributed]' "
                         "(or pip install 'ray>=2.9')")
    distributed.check_reachable(value)
    return value


RAY = typer.Option(None, "--ray", metavar="ADDRESS", callback=_check_ray,
                   help="run the work on Ray: 'local' starts an instance with this machine's cores; an "
                   "address (auto, HOST:6379, ray://HOST:10001) joins that cluster, refused if it does not answer "
                   "within GANDA_RAY_CONNECT_TIMEOUT seconds (default 10). Same files as a local run")
RAY_ACTORS = int_option(None, "--ray-actors", help="Ray actors, each with the model loaded once "
                          "(default: one per GPU, else one per CPU core)")


def register(app: typer.Typer) -> None:
    @app.command(short_help="Run every (model, task, experiment) job of a grid, resumably")
    def grid(
        spec: Path = typer.Argument(..., help="grid spec (YAML): models, tasks, experiments, options, out"),
        out: Path = typer.Option(None, "--out", "-o", help="directory (default: the spec's out, else runs/grid)"),
        ray: str | None = RAY,
        ray_actors: int | None = RAY_ACTORS,
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Run every (model, task, experiment) job of a grid; a rerun skips finished jobs and resumes the rest.

        Writes OUT/<model>/<task>/<experiment>/ (the experiment's own files) and OUT/grid.json.
        """
        from ..distributed import ray_sweeps  # torch and the sweep engine: loaded when the command runs
        from ..grid import parse_spec, run_grid

        parsed = parse_spec(spec)
        if out is not None:
            parsed["out"] = str(out)
        runio.claim_run_dir(parsed["out"], kind="grid", models=[p for m in parsed["models"] for p in model_inputs(m)])

        def show(job: dict) -> None:
            res = job.get("result") or {}
            head = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items())
            print(f"{job['status']:>5}  {job['model']} / {job['task']} / {job['experiment']}: {head}", flush=True)

        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):
            done = run_grid(parsed, allow_pickle=allow_pickle, ray=ray, on_job=show)
        print(f"wrote {parsed['out']}/grid.json ({len(done)} jobs)")
