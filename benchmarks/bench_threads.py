"""Torch intra-op threads under contention: 1 vs N threads, with and without ``OMP_WAIT_POLICY``.

Each arm is a fresh process (``OMP_WAIT_POLICY`` is read when torch loads OpenMP) that loads
SmolLM2-135M and times ``evaluate_examples`` on KV-retrieval prompts, once on an otherwise idle
machine and once beside a competing single-thread job (another process doing fp32 matmuls in a
loop, as another engineer's test or a second ganda command would). The competing job's rate is
recorded too: a policy that is fast for ganda but starves its neighbour is not a win.

    .venv/bin/python benchmarks/bench_threads.py            # raw: benchmarks/results/threads.json

The load average before each arm is recorded; run it on an idle machine for the idle column to
mean "idle".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORK = """
import json, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
import ganda
from ganda.scoring import evaluate_examples
from ganda.tasks import get_task
a = ganda.load_model("smollm2-135m")
exs = get_task("kv", pairs=int(sys.argv[3])).examples(limit=int(sys.argv[2]), seed=0)
evaluate_examples(a, exs[:1], progress=False)  # warm-up
t, c = time.perf_counter(), time.process_time()
res = evaluate_examples(a, exs, progress=False)
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c, "acc": res.accuracy,
                  "threads": torch.get_num_threads()}))
"""

BUSY = """
import sys, time
import torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
n, t0 = 0, time.perf_counter()
out = sys.argv[1]
while True:
    a = torch.tanh(a @ a)
    n += 1
    if n % 200 == 0:
        with open(out, "w") as f:
            f.write(f"{n} {time.perf_counter() - t0}")
"""


def _env(policy: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GANDA_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    return env


def _busy_rate(path: Path) -> float | None:
    try:
        n, s = path.read_text().split()
        return int(n) / float(s)
    except (OSError, ValueError):
        return None


def arm(threads: int, policy: str | None, contended: bool, n: int, pairs: int, tmp: Path) -> dict:
    """One timed evaluation in a fresh process, optionally beside a single-thread busy job."""
    load = os.getloadavg()[0]
    busy = None
    rate_file = tmp / "busy.txt"
    rate_file.unlink(missing_ok=True)
    if contended:
        busy = subprocess.Popen([sys.executable, "-c", BUSY, str(rate_file)], env=_env(None))
        time.sleep(3)  # the competing job's start-up (torch import) is over
    try:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", WORK, str(threads), str(n), str(pairs)], env=_env(policy),
                             capture_output=True, text=True, check=True)
        span = time.perf_counter() - t0
        res = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        if busy is not None:
            rate_before = _busy_rate(rate_file)
            busy.kill()
            busy.wait()
    res.update({"threads_requested": threads, "omp_wait_policy": policy or "unset", "contended": contended,
                "load_before": round(load, 2), "process_seconds": round(span, 1)})
    if contended:
        res["busy_matmuls_per_s"] = rate_before
    return res


API = """
import sys
import ganda
from ganda.scoring import evaluate_examples
from ganda.tasks import get_task
a = ganda.load_model("smollm2-135m")
res = evaluate_examples(a, get_task("kv", pairs=int(sys.argv[2])).examples(limit=int(sys.argv[1]), seed=0), progress=False)
print(res.accuracy)
"""


def whole_process(argv: list[str]) -> dict:
    """Wall and CPU seconds (user + system) of one child process, start-up and model load included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=_env(None), capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": time.perf_counter() - t0, "cpu": cpu}


def api_vs_cli(n: int, pairs: int, repeats: int, tmp: Path) -> list[dict]:
    """The README's Python path (``import ganda``, ``evaluate_examples``) against ``ganda eval`` on the
    same prompts, each a fresh process with the environment's thread settings removed, beside a
    single-thread busy job: what importing ganda sets up is what the API run gets."""
    rate_file = tmp / "busy.txt"
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(rate_file)], env=_env(None))
    time.sleep(3)
    rows = []
    try:
        for rep in range(repeats):
            for name, argv in (("api", [sys.executable, "-c", API, str(n), str(pairs)]),
                               ("cli", [sys.executable, "-m", "ganda", "-q", "eval", "smollm2-135m", "--task",
                                        f"kv{pairs}", "--limit", str(n), "--json"])):
                r = {"arm": name, "repeat": rep, "load_before": round(os.getloadavg()[0], 2), **whole_process(argv)}
                rows.append(r)
                print(json.dumps(r), flush=True)
    finally:
        busy.kill()
        busy.wait()
        rate_file.unlink(missing_ok=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api-vs-cli", action="store_true", help="only the Python path against the command line")
    ap.add_argument("--n", type=int, default=6, help="KV prompts per arm")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="rounds over all arms; the table gives medians")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", help="thread counts to compare")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "threads.json"))
    args = ap.parse_args()
    tmp = Path(args.out).parent
    tmp.mkdir(parents=True, exist_ok=True)
    if args.api_vs_cli:
        rows = api_vs_cli(args.n, args.pairs, args.repeats, tmp)
        med = {a: {k: statistics.median(r[k] for r in rows if r["arm"] == a) for k in ("wall", "cpu")}
               for a in ("api", "cli")}
        print(f"\napi: {med['api']['cpu']:.1f} CPU s, {med['api']['wall']:.1f} s wall; cli: {med['cli']['cpu']:.1f} CPU s, "
              f"{med['cli']['wall']:.1f} s wall; api / cli CPU {med['api']['cpu'] / med['cli']['cpu']:.2f}")
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/bench_threads.py " + " ".join(sys.argv[1:]),
                                              "cpus": os.cpu_count(), "n": args.n, "pairs": args.pairs,
                                              "median": med, "arms": rows}, indent=2) + "\n")
        return
    counts = [int(x) for x in args.threads.split(",")]
    arms = [(c, t, p) for c in (False, True) for t in counts for p in ([None] if t == 1 else [None, "PASSIVE"])]
    rows = []
    for rep in range(args.repeats):  # rounds, so that a change in the machine's load hits every arm
        for contended, threads, policy in arms:
            r = arm(threads, policy, contended, args.n, args.pairs, tmp)
            r["repeat"] = rep
            rows.append(r)
            print(json.dumps(r), flush=True)
    (tmp / "busy.txt").unlink(missing_ok=True)
    print("\n| threads | OMP_WAIT_POLICY | competing job | wall s | CPU s | competing job's matmuls/s | load before |")
    print("|---|---|---|---:|---:|---:|---:|")
    summary = []
    for contended, threads, policy in arms:
        mine = [r for r in rows if (r["contended"], r["threads_requested"], r["omp_wait_policy"])
                == (contended, threads, policy or "unset")]
        busy = [r["busy_matmuls_per_s"] for r in mine if r.get("busy_matmuls_per_s")]
        s = {"threads": threads, "omp_wait_policy": policy or "unset", "contended": contended,
             "wall": statistics.median(r["wall"] for r in mine), "cpu": statistics.median(r["cpu"] for r in mine),
             "busy_matmuls_per_s": statistics.median(busy) if busy else None,
             "load_before": statistics.median(r["load_before"] for r in mine)}
        summary.append(s)
        rate = f"{s['busy_matmuls_per_s']:.0f}" if busy else "-"
        print(f"| {threads} | {s['omp_wait_policy']} | {'yes' if contended else 'no'} | {s['wall']:.1f} | "
              f"{s['cpu']:.1f} | {rate} | {s['load_before']:.1f} |")
    result = {"command": "python benchmarks/bench_threads.py " + " ".join(sys.argv[1:]), "cpus": os.cpu_count(),
              "n": args.n, "pairs": args.pairs, "repeats": args.repeats, "median": summary, "arms": rows, "load_average_at_end": list(os.getloadavg())}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
