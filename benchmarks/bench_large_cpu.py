"""A full-size model on this CPU: a randomly initialised Llama-3.1-8B (its exact config, bf16, ~16 GB)
runs one MMLU-length prompt with L17H24 ablated and gives that head's attention map; timed, peak
memory recorded, compared with ``ganda plan``'s prediction.

    .venv/bin/python benchmarks/bench_large_cpu.py [--model meta-llama/Llama-3.1-8B] [--tokens 512]
        [--override num_hidden_layers=2 ...] [--min-free-gib 20] [--out FILE]

Random weights: this checks that the large-model path fits and runs (build on the meta device,
materialise in bf16, ganda's adapter, interventions and maps), not the science. The run refuses
to start unless ``--min-free-gib`` of memory is available (the machine is shared); with
``--override`` it runs the same code path on a smaller config (what the tests do).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from ganda import AblateHeads, HeadId
from ganda import plan as planner
from ganda.interventions import parse_layers
from ganda.models import meta
from ganda.registry import adapter_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # importable from the tests too
from peak_rss import PeakRSS  # noqa: E402


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@torch.no_grad()
def materialise(model: torch.nn.Module, seed: int = 0) -> None:
    """Give a meta-device model real CPU tensors: N(0, 0.02) weights, unit norms, zero biases."""
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or p.ndim == 1 and "norm" in name:
            p.fill_(1.0)
        elif p.ndim == 1:
            p.zero_()
        else:
            for chunk in p.view(-1).split(1 << 24):  # bf16 normal in pieces: no fp32 copy of a whole matrix
                chunk.copy_(torch.randn(chunk.numel(), generator=g) * 0.02)
    rotary = {name.rsplit(".", 1)[0] for name, _ in model.named_buffers() if name.endswith("inv_freq")}
    for name in rotary:  # computed buffers (rotary frequencies): rebuild the module on the CPU
        module = model.get_submodule(name)
        parent, _, attr = name.rpartition(".")
        with torch.device("cpu"):
            setattr(model.get_submodule(parent) if parent else model, attr, type(module)(module.config))


def run(args: argparse.Namespace) -> dict[str, Any]:
    raw, source = meta.config_of(args.model)
    raw = {**raw, **dict((k, _value(v)) for k, v in (o.split("=", 1) for o in args.override))}
    heads = [HeadId.parse(h) for h in args.heads.split(",")]
    torch.set_num_threads(args.threads)
    mem = PeakRSS(interval=0.005).start()
    t0 = time.perf_counter()
    model = meta.build_model(raw, torch.bfloat16)
    materialise(model)
    adapter = adapter_for(model.eval(), None, args.model)
    build_s = time.perf_counter() - t0
    resident_after_build = mem.proc.memory_info().rss - mem.base
    ids = torch.randint(0, int(raw.get("vocab_size", 1000)), (1, args.tokens), generator=torch.Generator().manual_seed(1))
    t1 = time.perf_counter()
    with torch.no_grad():
        base = adapter.forward(ids)
        with AblateHeads(heads[-1:]).apply(adapter):
            ablated = adapter.forward(ids)
    forward_s = (time.perf_counter() - t1) / 2
    t2 = time.perf_counter()
    maps = adapter.attention_maps(ids, heads)
    maps_s = time.perf_counter() - t2
    peak = mem.stop()
    effect = float((ablated[0, -1].float() - base[0, -1].float()).abs().max())
    row_sums = {str(h): float(m[-1].sum()) for h, m in maps.items()}
    prof = planner.profile(adapter)
    w = planner.Workload(n=1, tokens=args.tokens, max_tokens=args.tokens)
    pred_eval = planner.plan(prof, "eval", w, "cpu")
    map_layers = sorted({h.layer for h in heads})
    pred_maps = planner.plan(prof, "maps", w, "cpu", map_layers=map_layers)
    scale = args.threads  # the planner's cpu row is one thread
    return {
        "model": args.model, "source": source, "overrides": args.override, "n_params": meta.param_count(model),
        "dtype": "bfloat16", "tokens": args.tokens, "threads": args.threads, "heads": [str(h) for h in heads],
        "build_s": build_s, "forward_s": forward_s, "maps_s": maps_s,
        "predicted_forward_s": pred_eval.seconds / scale, "predicted_maps_s": pred_maps.seconds / scale,
        "resident_after_build_bytes": resident_after_build, "peak_bytes": peak,
        "predicted_peak_bytes": pred_eval.memory["total"],
        "ablation_effect_last_logits": effect, "map_last_row_sums": row_sums,
        "map_shapes": {str(h): list(m.shape) for h, m in maps.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    ap.add_argument("--tokens", type=int, default=512, help="prompt length (a 5-shot MMLU prompt is ~500-700)")
    ap.add_argument("--heads", default="L16H22,L17H24", help="maps of these; the last one is ablated")
    ap.add_argument("--override", nargs="*", default=[], help="config KEY=VALUE (a smaller model, same code path)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-free-gib", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "large_cpu.json")
    args = ap.parse_args()
    need = args.min_free_gib * 2**30
    free = psutil.virtual_memory().available
    if free < need:
        print(f"not run: {free / 2**30:.1f} GiB available, --min-free-gib {args.min_free_gib:g} required")
        return 0
    parse_layers("0")  # ganda importable and working before the long build
    res = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    gib = 2.0**30
    print(f"{res['model']} ({res['n_params'] / 1e9:.2f}B, bf16, random weights{', ' + ' '.join(args.override) if args.override else ''}): "
          f"built in {res['build_s']:.0f} s, {res['resident_after_build_bytes'] / gib:.1f} GiB resident")
    print(f"  one {args.tokens}-token forward ({args.threads} threads): {res['forward_s']:.1f} s "
          f"(planner {res['predicted_forward_s']:.1f} s); maps of {', '.join(res['heads'])}: {res['maps_s']:.1f} s "
          f"(planner {res['predicted_maps_s']:.1f} s)")
    print(f"  peak memory {res['peak_bytes'] / gib:.2f} GiB (planner {res['predicted_peak_bytes'] / gib:.2f} GiB); "
          f"ablating {res['heads'][-1]} moves the last position's logits by up to {res['ablation_effect_last_logits']:.3g}; "
          f"map last rows sum to {', '.join(f'{v:.3f}' for v in res['map_last_row_sums'].values())}")
    ok = all(math.isclose(v, 1.0, abs_tol=1e-2) for v in res["map_last_row_sums"].values())
    return 0 if ok and res["ablation_effect_last_logits"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
