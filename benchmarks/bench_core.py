"""Two everyday speed features of ganda, each against the baseline it replaces, side by side.

1. **Loading SmolLM2-135M**: dequantising the GGUF with transformers (what every run would pay,
   ~20 s) vs ganda's cached fp32 safetensors (``~/.cache/ganda/gguf``). Each load runs in a fresh
   process so nothing is shared; the cached path is checked to give identical logits.
2. **MMLU scoring**: lm-eval's way (one ``context + " X"`` row per choice, 4 rows per question,
   batched) vs ganda's (one forward of the context, the four letter log-probs read from the last
   position). Predictions and log-likelihoods are checked to agree.

    .venv/bin/python benchmarks/bench_core.py [--n 100] [--shots 0] [--out benchmarks/results/core.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LOAD = """
import sys, time, torch
t = time.perf_counter()
import ganda
a = ganda.load_model("smollm2-135m", use_cache={use_cache}, device="cpu", dtype=torch.float32)
dt = time.perf_counter() - t
ids = torch.tensor([[1, 504, 3458, 314, 260, 1345]])
print(dt, float(a.forward(ids).abs().sum()))
"""


def timed_load(use_cache: bool, env: dict[str, str]) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", LOAD.format(use_cache=use_cache)], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


@torch.no_grad()
def lm_eval_style(adapter, context: str, choices: list[str]) -> list[float]:
    """One padded row per choice (what lm-eval batches), summed continuation log-prob."""
    from ganda.scoring import encode_pair

    pairs = [encode_pair(adapter, context, c) for c in choices]
    rows = [c + t for c, t in pairs]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    logp = torch.log_softmax(adapter.forward(ids, attention_mask=mask).float(), -1)
    return [float(logp[i, len(c) - 1 + torch.arange(len(t)), torch.tensor(t)].sum())
            for i, (c, t) in enumerate(pairs)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="MMLU questions")
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--loads", type=int, default=2, help="fresh-process loads per mode")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "core.json"))
    args = ap.parse_args()
    res: dict = {"threads": torch.get_num_threads(), "cpu": os.cpu_count(), "torch": torch.__version__}

    # 1. loading: a private cache dir, so the first cached load writes it and the next ones read it
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GANDA_CACHE": cache}
        raw = [timed_load(False, env) for _ in range(args.loads)]
        timed_load(True, env)  # writes the cache (dequantise + save), not timed
        cached = [timed_load(True, env) for _ in range(args.loads)]
    same = abs(raw[0][1] - cached[0][1]) <= 1e-3 * abs(raw[0][1])
    res["load"] = {"dequantise_s": min(t for t, _ in raw), "cached_s": min(t for t, _ in cached),
                   "same_logits": same}
    res["load"]["ratio"] = res["load"]["dequantise_s"] / res["load"]["cached_s"]
    print(f"load: dequantise {res['load']['dequantise_s']:.2f} s, cached {res['load']['cached_s']:.2f} s, "
          f"{res['load']['ratio']:.1f}x, same logits: {same}", flush=True)

    # 2. MMLU scoring
    import ganda
    from ganda.scoring import score_choices
    from ganda.tasks import get_task

    adapter = ganda.load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    exs = get_task("mmlu", shots=args.shots, sample=True).examples(limit=args.n, seed=0)
    for ex in exs[:2]:  # warm-up
        score_choices(adapter, ex.prompt, ex.choices)
        lm_eval_style(adapter, ex.prompt, ex.choices)
    t = time.perf_counter()
    fast = [score_choices(adapter, ex.prompt, ex.choices).loglik for ex in exs]
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    slow = [lm_eval_style(adapter, ex.prompt, ex.choices) for ex in exs]
    t_slow = time.perf_counter() - t
    argmax = [max(range(4), key=lambda i, v=v: v[i]) for v in fast]
    same_pred = argmax == [max(range(4), key=lambda i, v=v: v[i]) for v in slow]
    diff = max(abs(a - b) for u, v in zip(fast, slow, strict=True) for a, b in zip(u, v, strict=True))
    res["mmlu"] = {"n": len(exs), "shots": args.shots, "lm_eval_style_s": t_slow, "ganda_s": t_fast,
                   "ratio": t_slow / t_fast, "same_predictions": same_pred, "max_loglik_diff": diff}
    print(f"mmlu {args.shots}-shot, n={len(exs)}: lm-eval style {t_slow:.1f} s, ganda {t_fast:.1f} s, "
          f"{t_slow / t_fast:.1f}x, same predictions: {same_pred}, max |dlogp| {diff:.1e}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
