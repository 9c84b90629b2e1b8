"""Peak device memory of bench_gpu.py's sections, replayed on the meta device: no GPU, no arithmetic.

Every tensor an operation creates is counted (in the CUDA caching allocator's 512-byte blocks) from
its creation until its storage is freed, as ``torch.cuda.max_memory_allocated`` counts it; the
peak above the weights is printed per section. The code paths are ganda's own (the scorer's suffix
batches, the sweep's engines, attribution's layer-by-layer backward), with the budgets a GPU with
``--free`` bytes free gives them (:func:`ganda.scoring.budget_for`, :func:`batch_tokens_for` of the
full-size model). What a meta tensor cannot say (a value read on the host) reads as zeros, and
``scaled_dot_product_attention`` allocates what CUDA's fused kernels do (the output and a float32
log-sum-exp per query, no T x T scores). Per-layer transients do not depend on depth: ``--layers``
shortens the model and keeps its widths.

    python benchmarks/meta_peaks.py cartesia-ai/Llamba-8B [--layers 2] [--sections eval,sweep,attribution,fb]

Sections: ``eval`` (evaluate_examples twice, as bench_gpu times it), ``rows`` (its whole-row check
of 8 questions), ``sweep`` (the fast sweep), ``naive`` (the naive loop beside it), ``attribution``
(AtP* twice), ``fb`` (the plain forward + backward with weight gradients beside attribution).
Reproduces the H200's peaks within 2% (docs/scale.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]
SECTIONS = ("eval", "rows", "sweep", "naive", "attribution", "fb")


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created inside the block and still alive; ``peak``: the most at once."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.seen: Any = WeakIdKeyDictionary()
        for t in existing:  # the weights and buffers: there before, never counted
            self.seen[t.untyped_storage()] = 0
        self.refs: list[Any] = []
        self.live = self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in self.seen:
                st = t.untyped_storage()
                n = -(-st.nbytes() // 512) * 512
                self.seen[st] = n
                self.refs.append(weakref.ref(st, lambda _r, n=n: self._free(n)))
                self.live += n
                self.peak = max(self.peak, self.live)
        return out


class _Fused(torch.autograd.Function):
    """Fused attention's memory: the output and a float32 log-sum-exp (kept for the backward)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx: Any, _g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def install() -> None:
    """Meta tensors answer host reads with zeros; attention allocates as the fused kernels do."""
    import torch.fx.experimental._config as fx_config

    fx_config.meta_nonzero_assume_all_nonzero = True
    T = torch.Tensor

    def zeros(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(t.shape, dtype=t.dtype)

    answers = {"__float__": lambda t: 0.0, "__bool__": lambda t: False, "__int__": lambda t: 0,
               "__index__": lambda t: 0, "item": lambda t: 0.0 if t.dtype.is_floating_point else 0,
               "tolist": lambda t: zeros(t).tolist(), "cpu": lambda t, *a, **k: zeros(t),
               "numpy": lambda t: zeros(t).numpy(), "index_add_": lambda t, *a, **k: t}
    for name, answer in answers.items():
        orig = getattr(T, name)
        setattr(T, name, lambda self, *a, _o=orig, _m=answer, **k: _m(self, *a, **k) if self.is_meta
                else _o(self, *a, **k))
    for name in ("allclose", "equal"):
        orig = getattr(torch, name)
        setattr(torch, name, lambda a, b, *x, _o=orig, **k: True if getattr(a, "is_meta", False)
                or getattr(b, "is_meta", False) else _o(a, b, *x, **k))
    repeat = torch.repeat_interleave

    def repeat_interleave(x: Any, repeats: Any = None, *a: Any, **k: Any) -> Any:
        if isinstance(repeats, torch.Tensor) and repeats.is_meta and "output_size" not in k:
            return torch.zeros(repeats.numel(), dtype=torch.long, device="meta")  # index_add_ skips it
        return repeat(x, *a, **k) if repeats is None else repeat(x, repeats, *a, **k)

    torch.repeat_interleave = repeat_interleave  # type: ignore[assignment]
    sdpa = F.scaled_dot_product_attention

    def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *a: Any, **kw: Any) -> torch.Tensor:
        return _Fused.apply(q, k, v) if q.is_meta else sdpa(q, k, v, *a, **kw)

    F.scaled_dot_product_attention = fused  # type: ignore[assignment]


def budgets(spec: str, free: float) -> tuple[Any, int]:
    """The scorer's Budget and attribution's batch tokens the full-size model gets with ``free`` bytes."""
    from ganda import scoring
    from ganda.attribution.engine import GRADDROP_BLOCKS, batch_tokens_for
    from ganda.models import meta

    ad = meta.build(spec)
    cfg = ad.model.config
    d = ad.mixers()[0].out_proj.out_features
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    layers = len(ad.decoder_layers())
    vocab = int(getattr(cfg, "vocab_size", None) or 1 << 15)
    score = scoring.budget_for(layers, d, d * kv // heads if heads and kv else d, vocab, 2, free)
    return score, batch_tokens_for(layers, d, 2, GRADDROP_BLOCKS, free)


def shortened(spec: str, layers: int | None) -> dict[str, Any]:
    raw = bench.config(spec, False)
    if not layers:
        return raw
    if "n_layer" in raw:
        return {**raw, "n_layer": layers}
    out = {**raw, "num_hidden_layers": layers}
    if "layers_block_type" in raw:
        out["layers_block_type"] = raw["layers_block_type"][:layers]
    return out


def run(spec: str, layers: int | None, sections: list[str], free: float, n: int, sweep_heads: int) -> dict[str, float]:
    import ganda
    from ganda import scoring
    from ganda.attribution import attribute
    from ganda.models import meta
    from ganda.sweep import run_sweep

    score, batch_tokens = budgets(spec, free)
    scoring.score_budget = lambda _adapter: score  # type: ignore[assignment]
    model = meta.build_model(shortened(spec, layers), torch.bfloat16)
    vocab = int(bench.embedding(model).weight.shape[0])
    adapter = ganda.from_model(model.eval(), bench.tokenizer(ROOT / "benchmarks" / "tokenizers" / "smollm2-135m",
                                                             vocab), spec=spec)
    examples = bench.examples_for(n, 5)
    heads = bench._sweep_heads(adapter, sweep_heads)
    steps = {
        "eval": lambda: [scoring.evaluate_examples(adapter, examples, progress=False) for _ in range(2)],
        "rows": lambda: scoring.score_examples(adapter, examples[:8], prefix_cache=False),
        "sweep": lambda: run_sweep(adapter, examples[:8], heads=heads, progress=False),
        "naive": lambda: run_sweep(adapter, examples[:8], heads=heads, naive=True, progress=False),
        "attribution": lambda: [attribute(adapter, examples[:4], method="atp*", progress=False,
                                          batch_tokens=batch_tokens) for _ in range(2)],
        "fb": lambda: bench._forward_backward(SimpleNamespace(adapter=adapter, dev=torch.device("meta")), examples[:4]),
    }
    print(f"{spec}: {len(adapter.decoder_layers())} layers on the meta device; score budget {score}; "
          f"attribution batch tokens {batch_tokens}", flush=True)
    out = {}
    for name in sections:
        t0 = time.perf_counter()
        with LiveBytes([*model.parameters(), *model.buffers()]) as live:
            steps[name]()
        out[name] = live.peak
        print(f"  {name:<12} peak {live.peak / 2**30:7.3f} GiB above the weights ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="a shipped config: meta-llama/Llama-3.1-8B, cartesia-ai/Llamba-8B, Zyphra/Zamba2-7B")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    ap.add_argument("--sections", default="eval,sweep,attribution,fb")
    ap.add_argument("--free", type=float, default=123e9, help="free device bytes the budgets see (the H200's)")
    ap.add_argument("--n", type=int, default=64, help="5-shot MMLU questions for eval")
    ap.add_argument("--sweep-heads", type=int, default=None, help="heads per swept layer (default: bench_gpu's "
                                                                  "16 for Llama, 8 otherwise)")
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if bad := [s for s in sections if s not in SECTIONS]:
        raise SystemExit(f"unknown section(s) {', '.join(bad)}; known: {', '.join(SECTIONS)}")
    torch.set_num_threads(1)
    install()
    heads = args.sweep_heads or (16 if "Llama-" in args.spec else 8)
    run(args.spec, args.layers, sections, args.free, args.n, heads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
