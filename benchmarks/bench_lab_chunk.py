"""Lab SSM training step: the Mamba-2 scan's chunk size (32, the old lab configs, vs smaller).

transformers' pure-PyTorch Mamba-2 path (the one ganda trains with on a CPU) computes the SSD scan
chunk by chunk: quadratic "attention-like" work inside each chunk, a recurrence between chunks,
and every sequence padded up to a multiple of the chunk. The result does not depend on the chunk
size (the same maths, summed in another order), but the cost does: lab sequences are 8-70 tokens,
so 32-token chunks spend most of their quadratic work on padding.

One model per config, the *same* weights and the *same* length-bucketed batches (as training
runs them), forward + backward, one torch thread; the variants alternate per step, and the table
gives the median step and the largest gradient difference from the baseline:

    .venv/bin/python benchmarks/bench_lab_chunk.py [--steps 30] [--chunks 32,16,8] [--out benchmarks/results/lab_chunk.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from bench_lab_train import step  # the same timed forward + backward, gradients returned

from ganda_lab.configs import build_model, resolve_config
from ganda_lab.tokenizer import build_tokenizer
from ganda_lab.train import bucket_batch, make_batch
from ganda_lab.world import World, WorldConfig

CONFIGS = {"mamba2 (lab-mamba2)": "mamba2", "hybrid (lab-hybrid-late, Bamba)": "hybrid-late"}


def set_chunk(model: torch.nn.Module, chunk: int) -> int:
    """Set the scan chunk of every Mamba-2 mixer in place (the weights do not change)."""
    n = 0
    for m in model.modules():
        if hasattr(m, "chunk_size") and hasattr(m, "A_log"):
            m.chunk_size = chunk
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--chunks", default="32,16,8", help="chunk sizes; the first is the baseline")
    ap.add_argument("--out", default="benchmarks/results/lab_chunk.json")
    args = ap.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    torch.set_num_threads(1)
    results = {"steps": args.steps, "chunks": chunks, "threads": 1, "torch": torch.__version__, "models": {}}
    for name, cfg_name in CONFIGS.items():
        cfg = resolve_config(cfg_name)
        world = World(WorldConfig.from_json(cfg["world"]))
        tok = build_tokenizer(world)
        torch.manual_seed(0)
        model = build_model(cfg, tok)
        assert set_chunk(model, chunks[0]) > 0, f"{name}: no Mamba-2 mixer found"
        buckets = int(cfg["train"].get("buckets", 1))
        batches = [bucket_batch(make_batch(world, tok, cfg["train"], 0, s), buckets) for s in range(args.steps + 2)]
        times: dict[int, list[float]] = {c: [] for c in chunks}
        worst = dict.fromkeys(chunks, 0.0)
        for i, parts in enumerate(batches):
            ref = None
            for c in chunks:
                set_chunk(model, c)
                dt, g = step(model, parts)
                if ref is None:
                    ref = g
                else:
                    worst[c] = max(worst[c], max(float((x - y).abs().max()) for x, y in zip(ref, g, strict=True)))
                if i >= 2:  # warm-up
                    times[c].append(dt)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        base = med(times[chunks[0]])
        r = {f"chunk{c}": {"ms": 1000 * med(times[c]), "speedup": base / med(times[c]), "max_grad_diff": worst[c]}
             for c in chunks}
        results["models"][name] = r
        print(name)
        for c in chunks:
            x = r[f"chunk{c}"]
            print(f"  chunk {c:3d}: {x['ms']:6.1f} ms/step  x{x['speedup']:.2f}  max |grad diff| {x['max_grad_diff']:.1e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
