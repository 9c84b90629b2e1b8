"""Lab training step: one padded batch (the baseline) vs the same batch split into length buckets.

The lab's training mixture mixes 8-token fact statements with 70-token option drills, so a
right-padded batch is mostly padding. ``ganda_lab.train.bucket_batch`` sorts the batch by length
and cuts it into groups, each run at its own width; the weighted losses are summed and divided
once, so the gradient is the whole batch's (checked here, and in tests/test_lab_train.py).

Both variants run on the *same* batches, one after the other, alternating per step, one torch
thread, forward + backward (no optimizer step, so both see the same weights):

    .venv/bin/python benchmarks/bench_lab_train.py [--steps 30] [--buckets 3] [--out benchmarks/results/lab_train.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ganda_lab.configs import build_model, resolve_config
from ganda_lab.tokenizer import build_tokenizer
from ganda_lab.train import bucket_batch, lm_loss_parts, make_batch
from ganda_lab.world import World, WorldConfig

MODELS = {
    "llama (lab-llama size)": ("llama", {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 3,
                                         "num_attention_heads": 4, "num_key_value_heads": 4,
                                         "max_position_embeddings": 512}),
    "mamba2 (lab-mamba2 size)": ("mamba2", {"hidden_size": 64, "num_hidden_layers": 4, "num_heads": 8, "head_dim": 16,
                                            "state_size": 8, "expand": 2, "n_groups": 1, "chunk_size": 32}),
}


def step(model, parts: list[dict[str, torch.Tensor]]) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    weight = sum(float(p["weights"][:, 1:][p["labels"][:, 1:] != -100].sum()) for p in parts)
    t0 = time.perf_counter()
    for p in parts:
        s, _ = lm_loss_parts(model, p)
        (s / weight).backward()
    dt = time.perf_counter() - t0
    return dt, [q.grad.detach().clone() for q in model.parameters() if q.grad is not None]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--buckets", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/lab_train.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"steps": args.steps, "buckets": args.buckets, "threads": 1, "models": {}}
    for name, (arch, model_cfg) in MODELS.items():
        cfg = resolve_config({"arch": arch, "model": model_cfg, "world": {"distractors": "hard", "n_values": 36},
                              "train": {"answer_weight": 5.0, "kv_pairs": [2, 12],
                                        "mixture": {"statement": 0.2, "mmlu": 0.25, "letters": 0.15, "kv": 0.2,
                                                    "drill": 0.2}}})
        world = World(WorldConfig.from_json(cfg["world"]))
        tok = build_tokenizer(world)
        torch.manual_seed(0)
        model = build_model(cfg, tok)
        batches = [make_batch(world, tok, cfg["train"], 0, s) for s in range(args.steps + 2)]
        base_t, buck_t, worst = [], [], 0.0
        fill = []
        for i, b in enumerate(batches):
            t_base, g_base = step(model, [b])
            t_buck, g_buck = step(model, bucket_batch(b, args.buckets))
            worst = max(worst, max(float((x - y).abs().max()) for x, y in zip(g_base, g_buck, strict=True)))
            if i >= 2:  # warm-up
                base_t.append(t_base)
                buck_t.append(t_buck)
                fill.append(float(b["attention_mask"].float().mean()))
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        r = {"padded_ms": 1000 * med(base_t), "bucketed_ms": 1000 * med(buck_t),
             "speedup": med(base_t) / med(buck_t), "max_grad_diff": worst, "batch_fill": sum(fill) / len(fill)}
        results["models"][name] = r
        print(f"{name:26s} padded {r['padded_ms']:6.1f} ms  bucketed {r['bucketed_ms']:6.1f} ms  "
              f"x{r['speedup']:.2f}  (batch {100 * r['batch_fill']:.0f}% real tokens; max |grad diff| {worst:.1e})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
