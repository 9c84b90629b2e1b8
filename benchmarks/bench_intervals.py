"""Per-head paired intervals of a sweep: one shared bootstrap draw for every head
(``ganda.stats.paired_intervals``) against one ``paired_difference`` a head, side by side on the
same synthetic drops (0/1 per prompt, as an accuracy drop), CPU seconds and wall.

    python benchmarks/bench_intervals.py [--heads 1024] [--prompts 1000] [--reference-heads 32]

The reference runs on ``--reference-heads`` heads and is scaled to all of them (its cost is the
same for every head); both give the same intervals (checked on those heads to 1e-12)."""

from __future__ import annotations

import argparse
import time

import numpy as np

from ganda.stats import paired_difference, paired_intervals


def timed(fn):
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--reference-heads", type=int, default=32)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    intact = (rng.random(a.prompts) < 0.7).astype(float).tolist()
    ablated = {f"L{i}H0": (rng.random(a.prompts) < 0.6).astype(float).tolist() for i in range(a.heads)}
    shared, cpu, wall = timed(lambda: paired_intervals(intact, ablated, "drop", seed=0))
    some = dict(list(ablated.items())[: a.reference_heads])
    ref, rcpu, rwall = timed(lambda: {h: paired_difference(intact, v, 0) for h, v in some.items()})
    for h, r in ref.items():
        assert abs(r["drop_ci_low"] - shared[h]["drop_ci_low"]) < 1e-12
        assert abs(r["drop_ci_high"] - shared[h]["drop_ci_high"]) < 1e-12
    scale = a.heads / a.reference_heads
    print(f"{a.heads} heads x {a.prompts} prompts, 2000 resamples")
    print(f"  one draw for every head:  {cpu:6.2f} CPU s  {wall:6.2f} s wall")
    print(f"  one bootstrap a head:     {rcpu * scale:6.2f} CPU s  {rwall * scale:6.2f} s wall "
          f"(measured on {a.reference_heads} heads, x{scale:g})")
    print(f"  ratio (reference / shared): {rcpu * scale / cpu:.0f}x CPU, {rwall * scale / wall:.0f}x wall")


if __name__ == "__main__":
    main()
