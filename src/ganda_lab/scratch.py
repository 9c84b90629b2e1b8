"""Train the seven lab models from scratch, several at a time, resumably.

Each model trains in its own process with one torch thread, through the same ``ganda train`` /
``ganda distill`` commands a user would type. The distilled student waits for its teacher. A
finished model (its ``lab.json`` written at the end of training) is skipped on a rerun; an
interrupted one resumes from its last checkpoint. Wall times go to ``WORKDIR/timing.json``; with
the shipped recipes unchanged, ``WORKDIR/rebuild.json`` says whether each model came out bit for
bit the shipped checkpoint.

Two at a time (the default) on a 2-core machine: in the plan's order the SSM and the teacher start
together; the SSM's slot then takes the hybrid, the teacher's its student, the grown model and the
KV pair. The two ~28-minute trainings back to back (SSM, hybrid) set the wall clock; the teacher's
chain (33 + 6 + 3 + 11 minutes) ends ~5 minutes earlier (measured: 57.8 vs 53.1 min). The trainings nothing
waits for run niced, so that with three at a time (``--jobs 3``) the teacher keeps a core: the
two niced ones then share the other core at 0.87 of a core between them (cache
thrash), about 5 core-minutes lost over the run. Priority changes only when each process runs,
never what it computes; with more jobs than cores the niced ones still yield to the teacher and
its student.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from ganda.errors import GandaError

from . import DEFAULT_MODELS, checkpoint


@dataclass
class Job:
    role: str
    argv: list[str]
    out: Path
    after: str | None = None
    nice: int = 0  # added to the process's niceness: > 0 for jobs off the critical path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started: float = 0.0
    seconds: float | None = None


def finished(out: Path) -> bool:
    """A training run is finished when its model directory has ``lab.json`` with a history."""
    f = out / "lab.json"
    if not (f.is_file() and (out / "config.json").is_file()):
        return False
    try:
        return "history" in json.loads(f.read_text())
    except json.JSONDecodeError:
        return False


OFF_PATH_NICE = 10  # CFS weight 110 vs 1024: the critical-path job gets a core of its own


def plan(workdir: Path, configs: dict[str, str] | None = None, steps: int | None = None,
         eval_every: int | None = None, distill_steps: int | None = None, grow_steps: int | None = None) -> list[Job]:
    """The jobs: SSM, transformer and hybrid from their configs, then the student from the
    transformer, then finding 2's deep model grown from it, then finding 3's KV pair.

    Started in this order: with two slots (the default) the SSM and the transformer start, the
    SSM's slot then takes the hybrid and the transformer's the student, the deep model, then the KV pair; with
    three, the three trainings start at once and the student takes the transformer's slot."""
    cfg = {"transformer": "llama-h1", "ssm": "mamba2-9k", "hybrid": "hybrid-late-7k5", "kv_transformer": "kv-llama",
           "kv_ssm": "kv-mamba2", **(configs or {})}
    g = [sys.executable, "-m", "ganda"]
    extra = ["--steps", str(steps)] if steps else []
    extra += ["--eval-every", str(eval_every)] if eval_every else []
    jobs = [Job(role, [*g, "train", cfg[role], "--out", str(workdir / role), "--resume", "--quiet", *extra],
                workdir / role) for role in ("ssm", "transformer", "hybrid")]
    dextra = ["--steps", str(distill_steps)] if distill_steps else []
    jobs.append(Job("distilled", [*g, "distill", str(workdir / "transformer"), "--out", str(workdir / "distilled"),
                                  "--quiet", *dextra], workdir / "distilled", after="transformer"))
    # finding 2's deep Transformer: the transformer grown by two blocks (~2.5 min)
    gextra = ["--steps", str(grow_steps)] if grow_steps else []
    jobs.append(Job("deep", [*g, "grow", str(workdir / "transformer"), "--out", str(workdir / "deep"),
                             "--quiet", *gextra], workdir / "deep", after="transformer"))
    # finding 3's KV pair: minutes each, queued behind the rest (the first free slot takes them)
    jobs += [Job(role, [*g, "train", cfg[role], "--out", str(workdir / role), "--resume", "--quiet", *extra],
                 workdir / role) for role in ("kv_transformer", "kv_ssm")]
    waited_for = {j.after for j in jobs if j.after}
    for j in jobs:
        if j.role not in waited_for and not j.after:
            j.nice = OFF_PATH_NICE
    return jobs


def train_all(workdir: str | Path, *, jobs: int = 2, configs: dict[str, str] | None = None, steps: int | None = None,
              log: Callable[[str], None] = print, poll: float = 2.0, eval_every: int | None = None,
              distill_steps: int | None = None, grow_steps: int | None = None) -> dict[str, str]:
    """Run the plan with at most ``jobs`` processes at a time; returns role -> model directory.
    ``eval_every`` sets the trainings' quick-evaluation interval (logged history only);
    ``distill_steps`` overrides the student's alignment steps (default: ``DISTILL_DEFAULTS``)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    todo = plan(workdir, configs, steps, eval_every, distill_steps, grow_steps)
    timing_file = workdir / "timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
    done = {j.role for j in todo if finished(j.out)}
    for r in sorted(done):
        log(f"[lab] {r}: already trained in {workdir / r}")
    pending = [j for j in todo if j.role not in done]
    running: list[Job] = []
    t0 = time.perf_counter()
    try:
        while pending or running:
            for j in list(pending):
                if len(running) >= jobs:
                    break
                if j.after and j.after not in done:
                    continue
                logf = open(j.out.parent / f"{j.role}.log", "a")  # noqa: SIM115 (closed with the process)
                lower = (lambda n=j.nice: os.nice(n)) if j.nice and os.name == "posix" else None
                j.proc = subprocess.Popen(j.argv, stdout=logf, stderr=subprocess.STDOUT, preexec_fn=lower)
                j.started = time.perf_counter()
                log(f"[lab] {j.role}: started ({' '.join(j.argv[2:5])} ...), log {j.out.parent / (j.role + '.log')}")
                pending.remove(j)
                running.append(j)
            time.sleep(poll)
            for j in list(running):
                rc = j.proc.poll() if j.proc else None
                if rc is None:
                    continue
                running.remove(j)
                j.seconds = round(time.perf_counter() - j.started, 1)
                if rc != 0 or not finished(j.out):
                    raise GandaError(f"training {j.role} failed (exit {rc}); see {j.out.parent / (j.role + '.log')}")
                done.add(j.role)
                timing[j.role] = j.seconds
                timing_file.write_text(json.dumps(timing, indent=2))
                log(f"[lab] {j.role}: done in {j.seconds:.0f} s")
    finally:
        for j in running:
            if j.proc and j.proc.poll() is None:
                j.proc.terminate()
    timing["wall_seconds_this_run"] = round(time.perf_counter() - t0, 1)
    timing_file.write_text(json.dumps(timing, indent=2))
    built = {j.role: str(j.out) for j in todo}
    if configs is None and steps is None and distill_steps is None and grow_steps is None:  # the shipped recipes
        report = compare_with_shipped(built, DEFAULT_MODELS)
        (workdir / "rebuild.json").write_text(json.dumps(report, indent=2))
        for role, r in report.items():
            log(f"[lab] {role}: " + (f"bit-identical to the shipped {r['shipped']} ({r['tensors']} tensors)"
                                     if r["identical"] else
                                     f"differs from the shipped {r['shipped']} (largest difference "
                                     f"{r['max_abs_diff']:.3g}, in {r['worst']})"))
    return built


def compare_with_shipped(built: dict[str, str], shipped_names: dict[str, str]) -> dict[str, dict]:
    """Each rebuilt model against the shipped checkpoint it should equal. Training is seeded and
    deterministic on one thread, so a rebuild is either bit for bit the shipped model (and then
    every verdict is the shipped run's to the digit) or something in the stack changed: say so
    rather than let a user compare findings of different weights."""

    report: dict[str, dict] = {}
    for role, path in built.items():
        name = shipped_names.get(role)
        if not name:
            continue
        a = load_file(str(Path(path) / "model.safetensors"))
        b = load_file(str(checkpoint(name) / "model.safetensors"))
        diffs = {k: (float((a[k].double() - b[k].double()).abs().max()) if a[k].shape == b[k].shape else float("inf"))
                 for k in a.keys() & b.keys()}
        worst = max(diffs, key=diffs.get) if diffs else None
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        report[role] = {"shipped": name, "tensors": len(a), "identical": same,
                        "max_abs_diff": 0.0 if same else (diffs[worst] if worst else float("inf")),
                        "worst": None if same else (worst or "tensor names differ"),
                        "missing": sorted(b.keys() - a.keys()), "extra": sorted(a.keys() - b.keys())}
    return report
