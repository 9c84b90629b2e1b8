"""Mamba-1's chunked selective scan against transformers' sequential one: AtP* over every head of a
random Falcon-Mamba, beside one forward + backward of the same prompts, on the CPU.

Per scan (``chunked``: ganda's, what ``torch_path`` gives Mamba-1 mixers; ``sequential``:
transformers' loop, one step per token), on the same model and prompts (MMLU 5-shot, SmolLM2's
tokenizer with ids folded into the model's vocabulary):

* ``forward_backward``: one forward of the prompts (right-padded, one batch) on the PyTorch path
  and a backward from the last position's log-sum-exp, with input gradients only (what
  attribution's VJPs compute), wall and process CPU seconds;
* ``atp*``: ``ganda.attribution.attribute(method="atp*")`` over every head (every channel), wall
  and CPU seconds, and its ratio to the forward + backward;
* the peak resident memory of each, and (both scans run) how far apart their AtP* estimates are.

    python benchmarks/bench_scan.py [--hidden 4096] [--expand 2] [--state 16] [--layers 2] [--vocab 4096]
        [--n 4] [--scans chunked,sequential] [--threads 1] [--out FILE]

Random weights: the numbers are the cost of the code paths, not science.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def clocked(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``fn()``, its wall and process CPU seconds and the peak resident memory above the start."""
    from peak_rss import PeakRSS

    rss = PeakRSS(interval=0.01).start()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    clock = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
    clock["peak_bytes"] = rss.stop()
    return out, clock


def build(args: argparse.Namespace) -> Any:
    from bench_gpu import tokenizer
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    import ganda

    torch.manual_seed(0)
    cfg = FalconMambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, expand=args.expand,
                            state_size=args.state, num_hidden_layers=args.layers)
    model = FalconMambaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tok = tokenizer(ROOT / "tokenizers" / "smollm2-135m", args.vocab)
    return ganda.from_model(model, tok, spec=f"falcon-mamba {args.layers}x{args.hidden} (random)")


def forward_backward(adapter: Any, exs: list[Any]) -> dict[str, float]:
    """One forward + backward of the prompts on the PyTorch path, input gradients only."""
    from ganda.models.ssm.common import torch_path
    from ganda.scoring import encode, pad_rows

    ids, mask = pad_rows(adapter, [encode(adapter, ex.prompt) for ex in exs])
    emb = adapter.model.get_input_embeddings()

    def run() -> None:
        with torch_path(adapter.model):
            x = emb(ids).detach().requires_grad_(True)
            out = adapter.model(inputs_embeds=x, attention_mask=mask).logits
            out[:, -1].float().logsumexp(-1).sum().backward()

    _, clock = clocked(run)
    return {**clock, "tokens": int(ids.shape[1]), "rows": int(ids.shape[0])}


def run_scan(adapter: Any, exs: list[Any], scan: str) -> tuple[dict[str, Any], list[float]]:
    import ganda.models.ssm.common as common
    from ganda.attribution import attribute
    from ganda.models.ssm.selective_scan import selective_scan, sequential_scan

    common.selective_scan = selective_scan if scan == "chunked" else sequential_scan  # what torch_path swaps in
    try:
        fb = forward_backward(adapter, exs)
        res, clock = clocked(lambda: attribute(adapter, exs, method="atp*", progress=False))
    finally:
        common.selective_scan = selective_scan
    row = {"scan": scan, "forward_backward": fb, "atp*": {**clock, "heads": len(res.heads)},
           "atp*_over_forward_backward_wall": clock["wall_s"] / fb["wall_s"],
           "atp*_over_forward_backward_cpu": clock["cpu_s"] / fb["cpu_s"]}
    return row, list(res.estimate)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4, help="MMLU 5-shot prompts")
    ap.add_argument("--scans", default="chunked,sequential")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from bench_gpu import examples_for

    adapter = build(args)
    exs = examples_for(args.n, 5)
    with torch.no_grad():  # one-off set-up of the first call: not in any row's time
        adapter.forward(torch.arange(1, 33)[None] % args.vocab)
    lengths = [len(adapter.tokenizer(ex.prompt).input_ids) for ex in exs]
    result: dict[str, Any] = {"config": {**vars(args), "out": None, "d_inner": args.hidden * args.expand},
                              "prompt_tokens": lengths, "machine": platform.machine(),
                              "torch": torch.__version__, "rows": []}
    estimates = {}
    for scan in args.scans.split(","):
        row, estimates[scan] = run_scan(adapter, exs, scan)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    if len(estimates) == 2:
        a, b = (torch.tensor(v) for v in estimates.values())
        result["atp*_max_diff_relative"] = float((a - b).abs().max() / b.abs().max())
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
