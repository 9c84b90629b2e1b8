"""Where evaluation's and AtP*'s GPU time goes on the Llama-3.1-8B shape (random weights, bf16).

    python benchmarks/gpu_probe.py OUT_DIR

Each measurement runs twice on the same inputs: the first call includes the one-off set-up of every
new input shape (kernel plans, library handles), the second is the steady state. Also: eval's
forwards one by one (shape and seconds), whole-row forwards at 8 and 16 rows of 768 tokens with and
without a padding mask (the card's reachable rate), AtP, AtP* with 2 GradDrop blocks, a plain
forward/backward of the same prompts, and two profiler tables (eval_prof.txt, atp_prof.txt).
Writes OUT_DIR/probe.json (benchmarks/results/gpu-probe-nvidia-h200.json is one such run).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]


def profile_table(fn, rows: int) -> str:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)


def main(out_dir: Path) -> dict:
    from ganda import scoring
    from ganda.attribution import attribute

    out: dict = {}
    dev = torch.device("cuda")
    ad, info = bench.build("meta-llama/Llama-3.1-8B", dev, torch.bfloat16, False,
                           ROOT / "benchmarks" / "tokenizers" / "smollm2-135m")
    exs = bench.examples_for(64, 5)

    def timed(fn):
        return bench.timed(dev, fn)[1]

    def evaluate(examples=exs):
        return scoring.evaluate_examples(ad, examples, progress=False, task_name="mmlu")

    out["eval_cold_s"], out["eval_warm_s"] = timed(evaluate), timed(evaluate)
    calls: list = []
    orig = ad.forward_cached

    def each(ids, cache, pos, attention_mask=None, keep=None, read=None):
        torch.cuda.synchronize()
        t = time.perf_counter()
        r = orig(ids, cache, pos, attention_mask=attention_mask, keep=keep, read=read)
        torch.cuda.synchronize()
        calls.append([list(ids.shape), time.perf_counter() - t])
        return r

    ad.forward_cached = each
    out["eval_timed_s"] = timed(evaluate)
    ad.forward_cached = orig
    out["eval_calls"] = calls
    for rows in (8, 16):
        ids = torch.randint(0, 1000, (rows, 768), device=dev)
        mask = torch.ones_like(ids)
        mask[:, -5:] = 0
        with torch.no_grad():
            ad.model(input_ids=ids, use_cache=False, logits_to_keep=1)
            s = timed(lambda ids=ids: ad.model(input_ids=ids, use_cache=False, logits_to_keep=1))
            out[f"whole_{rows}x768_padmask_s"] = timed(
                lambda ids=ids, mask=mask: ad.model(input_ids=ids, attention_mask=mask, use_cache=False,
                                                    logits_to_keep=1))
        out[f"whole_{rows}x768_s"] = s
        out[f"whole_{rows}x768_tflops"] = 2 * info["n_params"] * rows * 768 / s / 1e12
    (out_dir / "eval_prof.txt").write_text(profile_table(lambda: evaluate(exs[:32]), 25))
    e4 = exs[:4]
    out["atp_cold_s"] = timed(lambda: attribute(ad, e4, method="atp*", progress=False))
    out["atp_warm_s"] = timed(lambda: attribute(ad, e4, method="atp*", progress=False))
    out["atp_plain_s"] = timed(lambda: attribute(ad, e4, method="atp", progress=False))
    out["atp_b2_s"] = timed(lambda: attribute(ad, e4, method="atp*", graddrop_blocks=2, progress=False))
    out["fb"] = bench._forward_backward(SimpleNamespace(adapter=ad, dev=dev), e4)
    (out_dir / "atp_prof.txt").write_text(profile_table(lambda: attribute(ad, e4, method="atp*", progress=False), 30))
    (out_dir / "probe.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    res = main(Path(sys.argv[1]))
    print(json.dumps({k: v for k, v in res.items() if k != "eval_calls"}, indent=1))
