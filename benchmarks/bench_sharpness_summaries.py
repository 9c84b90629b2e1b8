"""Finding 4's sharpness under both summary tokens: two passes over the maps vs one.

`ganda lab` scores the G&A heads' maps twice, with the paper's summary token (the ``\\n``) and with
the option's last word. Each summary needs other rows of the same maps, so reading both summaries'
rows in one call per prompt (``compare_sharpness_summaries``) replaces a second full pass
(two ``compare_sharpness`` calls). The arms alternate per repeat on the shipped lab-llama and
lab-mamba2, with the heads and prompts `ganda lab` uses (n = 200, seed 100, one torch thread);
the table gives the median wall and CPU time and the largest relative difference of any metric:

    .venv/bin/python benchmarks/bench_sharpness_summaries.py [--repeats 3] [--out benchmarks/results/sharpness_summaries.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import ganda
from ganda.experiments.sharpness import compare_sharpness, compare_sharpness_summaries

# the heads `ganda lab` measures (its roles step on the shipped checkpoints)
HEADS = {"lab-llama": (["L1H1"], ["L0H3"]), "lab-mamba2": (["L1H2"], ["L0H2"])}


def two_passes(models, n, seed):
    return [compare_sharpness(models, "lab-mmlu", n=n, seed=seed, heads=HEADS, progress=False, summary=s)
            for s in ("end", "last")]


def one_pass(models, n, seed):
    return compare_sharpness_summaries(models, "lab-mmlu", n=n, seed=seed, heads=HEADS, progress=False,
                                       summaries=["end", "last"])


def max_rel_diff(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        for name, m in ra["models"].items():
            for metric, v in m["metrics"].items():
                x, y = v["value"], rb["models"][name]["metrics"][metric]["value"]
                worst = max(worst, abs(x - y) / max(abs(x), 1e-12))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/sharpness_summaries.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = {name: ganda.load_model(name, device="cpu", dtype=torch.float32) for name in HEADS}
    arms = {"two passes (baseline)": two_passes, "one pass": one_pass}
    times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in arms}
    results = {}
    for _ in range(args.repeats):
        for name, fn in arms.items():
            w, c = time.perf_counter(), time.process_time()
            results[name] = fn(models, args.n, 100)
            times[name]["wall"].append(time.perf_counter() - w)
            times[name]["cpu"].append(time.process_time() - c)
    base = statistics.median(times["two passes (baseline)"]["wall"])
    rows = []
    for name in arms:
        wall, cpu = statistics.median(times[name]["wall"]), statistics.median(times[name]["cpu"])
        rows.append({"arm": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "speedup": round(base / wall, 2)})
        print(f"{name:24s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  {base / wall:.2f}x")
    diff = max_rel_diff(results["two passes (baseline)"], results["one pass"])
    print(f"largest relative metric difference: {diff:.1e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"n": args.n, "repeats": args.repeats, "rows": rows, "max_rel_diff": diff,
                               "times": times}, indent=2))


if __name__ == "__main__":
    main()
