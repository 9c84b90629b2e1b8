"""``ganda grid SPEC.yaml``: models × tasks × experiments as one resumable job list, optionally on
Ray; and the ``--ray`` options the long-running commands share (:mod:`ganda.distributed`)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from .core import PICKLE, QUIET

RAY = typer.Option(None, "--ray", metavar="ADDRESS",
                   help="run the work on Ray: 'local' starts an instance with this machine's cores; an "
                   "address (auto, HOST:6379, ray://HOST:10001) joins that cluster. Same files as a local run")
RAY_ACTORS = typer.Option(None, "--ray-actors", help="Ray actors, each with the model loaded once "
                          "(default: one per GPU, else one per CPU core)")


def register(app: typer.Typer) -> None:
    @app.command()
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
        runio.claim_run_dir(parsed["out"])

        def show(job: dict) -> None:
            res = job.get("result") or {}
            head = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items())
            print(f"{job['status']:>5}  {job['model']} / {job['task']} / {job['experiment']}: {head}", flush=True)

        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):
            done = run_grid(parsed, allow_pickle=allow_pickle, on_job=show)
        print(f"wrote {parsed['out']}/grid.json ({len(done)} jobs)")
