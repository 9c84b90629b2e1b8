"""Lab training batches: the tokenizer's own call vs memoised ids from its Rust backend.

A training step first builds its batch in Python: ~135 text pieces (statements, option lines,
prompts, dictionary lines) sampled from the world and tokenised one by one. The transformers
tokenizer call wraps each in a BatchEncoding, which cost more than the tokenisation itself, and
half of the pieces recur. ``ganda.lab.train.token_ids`` calls the backend directly and memoises;
the batches must be *identical* (a shipped checkpoint retrains bit for bit only then).

Per config, the same steps' batches built both ways, alternating blocks of steps, one thread;
the table gives ms per batch and whether every tensor of every batch is equal:

    .venv/bin/python benchmarks/bench_lab_batch.py [--steps 300] [--out benchmarks/results/lab_batch.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ganda.lab import train as T
from ganda.lab.configs import resolve_config
from ganda.lab.tokenizer import build_tokenizer
from ganda.lab.world import World, WorldConfig

CONFIGS = {"llama-h1 (lab-llama-h1)": "llama-h1", "mamba2 (lab-mamba2)": "mamba2",
           "hybrid-late (lab-hybrid-late)": "hybrid-late"}
MEMOISED = T.token_ids


def tokenizer_call(tok, text: str) -> tuple[int, ...]:
    """The baseline: what the training code did before (``tok(text).input_ids``)."""
    return tuple(tok(text, add_special_tokens=False).input_ids)


def build(world, tok, tr, steps: range, fn) -> tuple[float, list[dict[str, torch.Tensor]]]:
    T.token_ids = fn
    try:
        t0 = time.perf_counter()
        batches = [T.make_batch(world, tok, tr, tr["seed"], s) for s in steps]
        return time.perf_counter() - t0, batches
    finally:
        T.token_ids = MEMOISED


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/lab_batch.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, name in CONFIGS.items():
        cfg = resolve_config(name)
        tr = cfg["train"]
        world = World(WorldConfig.from_json(cfg["world"]))
        tok = build_tokenizer(world)
        MEMOISED.cache_clear()  # a cold cache: the first steps pay for every new piece
        t = {"call": 0.0, "memo": 0.0}
        equal = True
        half = args.steps // 2
        for block in (range(0, half), range(5000, 5000 + args.steps - half)):  # early and mid-run steps
            dt_call, ref = build(world, tok, tr, block, tokenizer_call)
            dt_memo, got = build(world, tok, tr, block, MEMOISED)
            t["call"] += dt_call
            t["memo"] += dt_memo
            equal &= all(torch.equal(a[k], b[k]) for a, b in zip(ref, got, strict=True) for k in a)
        info = MEMOISED.cache_info()
        rows.append({"config": label, "steps": args.steps, "call_ms": 1000 * t["call"] / args.steps,
                     "memo_ms": 1000 * t["memo"] / args.steps, "speedup": t["call"] / t["memo"],
                     "identical": equal, "cache_hit_rate": info.hits / max(1, info.hits + info.misses)})
        r = rows[-1]
        print(f"{label:32s} call {r['call_ms']:6.1f} ms  memoised {r['memo_ms']:6.1f} ms  "
              f"{r['speedup']:.2f}x  identical {equal}  hit rate {r['cache_hit_rate']:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "torch_threads": 1}, indent=2))


if __name__ == "__main__":
    main()
