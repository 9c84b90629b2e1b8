"""Sweeps on Ray against the local engine, side by side in one process (``ganda.distributed``).

Arms (all the same exhaustive single-head sweep, same prompts, same head batches):

* ``local-1t`` / ``local-2t``: ``run_sweep`` in this process with 1 / 2 torch threads;
* ``ray-1`` / ``ray-2``: the same on a local Ray instance (2 CPUs) with 1 / 2 actors of 1 thread;
* ``ray-kill``: 2 actors, one SIGKILLed when the first head is saved (its unit is retried elsewhere);
* ``ray-restart``: 2 actors, the driver stopped when half the heads are saved, then run again from
  the files (a fresh pool): the units recomputed are counted.

Identity: every Ray arm's heads, predictions and accuracies against ``local-1t`` exactly, and the
largest |Δ log-likelihood|; ``results.csv`` byte-identical or not. Time: wall and CPU (the driver's
process plus the actors', read from each actor) for the sweep itself; the pool's start-up (Ray
workers importing torch and loading the model) separately.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_distributed.py --model smollm2-135m --task kv \\
        --pairs 5 --n 4 --out benchmarks/results/distributed_smollm2.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_distributed.py --model lab-llama --task lab-mmlu \\
        --n 32 --batch-heads 2 --out benchmarks/results/distributed_lab.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

from ganda.distributed import RayOptions, RayScorer
from ganda.models import load_model
from ganda.sweep import run_sweep, scored_by
from ganda.tasks import get_task, task_for_model


class DriverStopped(Exception):
    pass


def compare(res: Any, ref: Any, out: Path, ref_out: Path) -> dict[str, Any]:
    same = all(r["head"] == q["head"] and r["pred"] == q["pred"] and r["pred_norm"] == q["pred_norm"]
               and r["correct"] == q["correct"] for r, q in zip(res.records, ref.records, strict=True))
    worst = max(abs(x - y) for r, q in zip(res.records + [res.baseline], ref.records + [ref.baseline], strict=True)
                for lr, lq in zip(r["loglik"], q["loglik"], strict=True) for x, y in zip(lr, lq, strict=True))
    csv_same = (out / "results.csv").read_text() == (ref_out / "results.csv").read_text()
    return {"identical_text": same, "max_abs_dloglik": worst, "results_csv_identical": csv_same}


def ray_arm(arm: str, adapter: Any, sweep: Any) -> tuple[Any, dict[str, Any]]:
    """One Ray arm: the pool started (timed apart), then the sweep (and its fault, if any)."""
    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    with RayScorer(RayOptions(actors=1 if arm == "ray-1" else 2)) as scorer, scored_by(scorer):
        scorer._start(adapter)  # the pool's start-up: Ray workers import torch and load the model
        row["startup_s"] = time.perf_counter() - t0
        a0, c0, t0 = scorer.cpu_seconds(), time.process_time(), time.perf_counter()
        seen: list[str] = []
        half = len(adapter.heads()) // 2

        def kill(rec: dict[str, Any]) -> None:  # units are in flight on both actors when a head is saved
            if not seen:
                seen.append(rec["head"])
                os.kill(scorer.pids()[0], signal.SIGKILL)

        def stop(rec: dict[str, Any]) -> None:
            seen.append(rec["head"])
            if len(seen) == half:
                raise DriverStopped

        if arm == "ray-kill":
            res = sweep(on_head=kill)
            row["actor_crashes"] = scorer.crashes
        elif arm == "ray-restart":
            try:
                sweep(on_head=stop)
            except DriverStopped:
                pass
            row.update(units_first=scorer.units_run, heads_saved_before_restart=half)
            scorer.close()  # a new driver: a fresh pool reads the files
            scorer._start(adapter)
            before, batches = scorer.units_run, scorer.batches_run
            res = sweep()
            row.update(units_after_restart=scorer.units_run - before, batches_after_restart=scorer.batches_run - batches)
        else:
            res = sweep()
        row.update(wall_s=time.perf_counter() - t0, driver_cpu_s=time.process_time() - c0)
        if arm in ("ray-1", "ray-2"):  # a killed or restarted actor's CPU time left with its process
            row["actors_cpu_s"] = scorer.cpu_seconds() - a0
            row["cpu_s"] = row["actors_cpu_s"] + row["driver_cpu_s"]
        row["units"] = scorer.units_run
    return res, row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="kv")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--batch-heads", type=int, default=16)
    ap.add_argument("--arms", default="local-1t,local-2t,ray-1,ray-2,ray-kill,ray-restart")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/distributed.json"))
    args = ap.parse_args()
    arms = args.arms.split(",")

    adapter = load_model(args.model, device="cpu")
    opts = {"pairs": args.pairs} if args.pairs else {}
    task = task_for_model(args.task, get_task(args.task, **opts), adapter, **opts)
    examples = task.examples(limit=args.n, seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows: dict[str, dict[str, Any]] = {}
    ref, ref_out = None, tmp / "local-1t"

    def sweep(out: Path, **kw: Any) -> Any:
        return run_sweep(adapter, examples, out_dir=out, batch_heads=args.batch_heads, progress=False,
                         config={"seed": 0}, **kw)

    for arm in arms:
        out = tmp / arm
        row: dict[str, Any] = {}
        if arm.startswith("local"):
            torch.set_num_threads(int(arm[-2]))
            c0, t0 = time.process_time(), time.perf_counter()
            res = sweep(out)
            row.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
            torch.set_num_threads(1)
            if arm == "local-1t":
                ref = res
        else:
            res, row = ray_arm(arm, adapter, lambda o=out, **kw: sweep(o, **kw))
        if ref is not None and arm != "local-1t":
            row.update(compare(res, ref, out, ref_out))
        rows[arm] = row
        print(arm, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    ray.shutdown()
    base = rows.get("local-1t", {}).get("wall_s")
    for row in rows.values():
        if base and row.get("wall_s"):
            row["wall_vs_local_1t"] = base / row["wall_s"]
    meta = {"model": args.model, "task": args.task, "pairs": args.pairs, "n": args.n,
            "heads": len(adapter.heads()), "batch_heads": args.batch_heads, "cpus": os.cpu_count(),
            "torch": torch.__version__, "ray": ray.__version__, "python": platform.python_version()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "arms": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
