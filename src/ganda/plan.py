"""What an experiment costs before it runs: FLOPs, peak memory and time on a named accelerator.

``plan(model, experiment, workload, device)`` reads the model's structure (a loaded model or the
full-size layout on the meta device, :mod:`ganda.models.meta`) layer by layer, counts what
ganda's implementation of the experiment runs (which layers, how many rows and tokens, where the
LM head is applied, what is kept in memory) and turns it into time with a roofline per forward:

    t = max(FLOPs / (peak FLOP/s · util), weight bytes / (bandwidth · bw_util))
        + decoder-layer calls · per-call overhead + sequential scan steps · per-step cost

The accelerator table states its peak numbers and the utilisation assumed; the ``cpu`` row is
calibrated on this machine by ``benchmarks/bench_plan.py``, which also checks predicted against
measured time and peak memory for every experiment (docs/scale.md has the table). N devices run
independent work (examples, heads) side by side; a model too large for one device is split over
several (layer by layer, as ``--device-map auto`` does), which adds memory, not speed.

Counted per decoder layer i and row of T tokens: ``2·P_i·T`` for its weights (mixture-of-experts
weights at ``top_k / n_experts``, a shared block at every invocation), ``4·H·d·T²`` for eager
softmax attention (the full square: eager attention does not skip the masked half), the SSD
chunked scan ``2·T·Q·H·(N + P) + 4·T·H·P·N`` (Mamba-2 family, chunk Q) or the selective scan
``9·T·E·N`` (Mamba-1), and ``2·d·V`` per position the LM head is applied at. A Mamba-1 scan also
costs a step overhead per sequential step: T steps of transformers' loop on plain forwards (where
no ``mamba_ssm`` kernel is installed), about 2·√T on the PyTorch path of analysis (attribution,
maps, circuits), which runs ganda's chunked scan (:mod:`ganda.models.ssm.selective_scan`).
"""

from __future__ import annotations

import math
import os
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import torch

from . import registry
from .attribution.engine import (
    ACTIVE,
    AUDIT,
    GRADDROP_BLOCKS,
    IG_STEPS,
    RANK_METHOD,
    VERIFY_TOP,
    batch_tokens_for,
    graddrop_blocks,
)
from .device import parse_dtype
from .errors import GandaError
from .heads import expand
from .interventions import check_layers, parse_layers
from .models import hub, load_model, meta
from .models.base import ModelAdapter
from .models.loading import load_tokenizer, model_path
from .models.ssm.selective_scan import chunk_of, segment_of
from .options import flag_name, option_type, option_values
from .progress import note
from .scoring import default_batch_rows, encode, prefix_cache_enabled
from .sweep import batching_for, forward_tokens
from .tasks import get_task

GiB = float(1 << 30)


# ---- accelerators -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """Peak numbers of one accelerator and the fractions of them ganda's eager PyTorch reaches."""

    name: str
    flops: dict[str, float]  # dense matmul peak FLOP/s by dtype
    bandwidth: float  # memory bytes/s
    memory: float  # bytes usable for the model and activations
    util: float  # fraction of peak FLOP/s in large matmuls
    bw_util: float  # fraction of peak bandwidth when streaming weights
    layer_overhead: float  # seconds per decoder-layer call (kernel launches, Python, hooks)
    scan_step: float  # seconds per sequential step of a Mamba-1 PyTorch scan (a token, or a chunk), per layer
    runtime: float  # bytes the runtime holds besides tensors (CUDA context, allocator, libraries)
    note: str = ""
    host: bool = False  # its memory is the host's (results kept on the CPU count against it)
    example_overhead: float = 1.0e-3  # seconds per example per scoring pass (tokenising, Python bookkeeping)
    call_overhead: float = 1.0e-3  # seconds per model call beyond its layers (hooks, engine bookkeeping)
    score_overhead: float = 5.0e-5  # seconds per scored row (reading its log-probabilities back)
    token_overhead: float = 0.0  # seconds per prompt token of each example pass (tokenising)
    ssm_runtime: float = 0.0  # extra runtime bytes when SSM layers run (their PyTorch paths' code and caches)
    act_bandwidth: float = 0.0  # bytes/s of memory-bound activation work (0: the device's bandwidth)
    map_overhead: float = 1.0e-4  # seconds per materialised head map beyond its arithmetic
    ssd_layer_overhead: float = 0.0  # extra seconds per Mamba-2 (SSD) layer call: its chunked PyTorch path's many small ops
    ssd_traffic_scale: float = 1.0  # elements the SSD path moves per element LayerCost.traffic counts (its temporaries)
    library_ssd_scale: float = 1.0  # transformers' PyTorch SSD path (Zamba2, Bamba, Falcon-H1) against ganda's
    vjp_cost: float = 1.0  # forward-equivalents of one input-gradient VJP of a layer (attribution's backward)
    # the heap an experiment's code path grows on its first run (bytes): a host allocator keeps what
    # the many small tensors of a sweep or a backward freed, and smaller activations reuse it
    act_floor: dict[str, float] = field(default_factory=dict)

    def rate(self, dtype: str) -> float:
        return self.flops.get(dtype, self.flops["float32"]) * self.util

    def segment(self, rows: float, E: int, N: int) -> int:
        """Tokens a no-grad chunked Mamba-1 scan of ``rows`` rows holds at once here
        (:func:`ganda.models.ssm.selective_scan.segment_of`: rows × S × E × N within its budget)."""
        return segment_of(max(1, round(rows)), E, N, torch.device("cpu" if self.host else "cuda"))


# GPU rows: data-sheet dense peaks (no sparsity; fp32 without TF32, PyTorch's default). Fitted on one
# H200 (docs/scale.md; benchmarks/replan_gpu.py recomputes the comparison): random-weight
# Llama-3.1-8B and Llamba-8B in bf16, MMLU 5-shot prompts of 747 tokens. util 0.55 is the rate
# whole-row forwards reach (590 TFLOP/s) over the data sheet's 989; activation work runs at ~3.1x
# the card's bandwidth in LayerCost.traffic's units (they count fp32 elements and eager attention's
# T x T matrices, which SDPA never writes out on a GPU); each example costs 7 ms of host time per
# scoring pass (prefix grouping, reading the choices; tokenising runs batched) and each SSD layer
# call 2.1 ms (the chunked PyTorch path's small kernels); one input-gradient VJP of a layer costs 1.6
# forwards (attention's backward kernels); transformers' own SSD path (Zamba2, Bamba, Falcon-H1 without
# mamba_ssm) moves 4x what ganda's chunked SSD does. The H100 shares the H200's chip and the host-side
# costs; the A100 and L40S keep the H100's overheads and the bandwidth ratio at their own stated
# utilisation (not measured).
_GPU = dict(bw_util=0.70, layer_overhead=150e-6, scan_step=40e-6, runtime=1.0 * GiB, example_overhead=7e-3,
            call_overhead=1.0e-3, ssd_layer_overhead=2.1e-3, vjp_cost=1.6, library_ssd_scale=4.0)
_ACT_PER_BW = 3.1  # activation bytes/s per byte/s of data-sheet bandwidth (fitted on the H200)

DEVICES: dict[str, Device] = {
    "h100": Device("NVIDIA H100 SXM5 80 GB", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
                   3.35e12, 80e9, util=0.55, act_bandwidth=_ACT_PER_BW * 3.35e12, **_GPU,
                   note="dense bf16 tensor-core peak; fp32 without TF32 (PyTorch's default); the H200's fit"),
    "h200": Device("NVIDIA H200 141 GB", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
                   4.8e12, 141e9, util=0.55, act_bandwidth=_ACT_PER_BW * 4.8e12, **_GPU,
                   note="dense bf16 tensor-core peak as the H100 SXM; measured bf16 matmul peak 790 TFLOP/s"),
    "a100": Device("NVIDIA A100 SXM4 80 GB", {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
                   2.04e12, 80e9, util=0.45, act_bandwidth=_ACT_PER_BW * 2.04e12, **_GPU,
                   note="dense bf16 tensor-core peak; fp32 without TF32; utilisation not measured"),
    "l40s": Device("NVIDIA L40S 48 GB", {"bfloat16": 362e12, "float16": 362e12, "float32": 91.6e12},
                   0.864e12, 48e9, util=0.40, act_bandwidth=_ACT_PER_BW * 0.864e12, **_GPU,
                   note="dense bf16 tensor-core peak (733 TFLOP/s is with sparsity); utilisation not measured"),
    # Calibrated by benchmarks/bench_plan.py on this repository's CPU machine (one torch thread,
    # process CPU time): effective matmul rates, per-layer-call and per-scan-step costs.
    "cpu": Device("this CPU (1 thread, calibrated)", {"bfloat16": 210e9, "float16": 20e9, "float32": 90e9},
                  20e9, 24e9, util=0.80, bw_util=1.0, layer_overhead=280e-6, scan_step=21e-6, runtime=19 * 2.0**20,
                  note="rates and overheads measured here", host=True, example_overhead=0.0, token_overhead=1.5e-6,
                  call_overhead=0.0, map_overhead=0.14e-3, score_overhead=0.70e-3, act_bandwidth=9.4e9,
                  ssm_runtime=11 * 2.0**20, ssd_layer_overhead=480e-6,
                  act_floor={"eval": 18 * 2.0**20, "sweep": 17 * 2.0**20, "attribution": 39 * 2.0**20}),
}


def device(name: str) -> Device:
    key = name.strip().lower()
    if key not in DEVICES:
        raise GandaError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    return DEVICES[key]


# ---- the model, as costs --------------------------------------------------------------------

@dataclass
class LayerCost:
    params: float  # weights applied to every token (MoE experts at top_k / n_experts)
    heads: int  # ablatable heads in this layer (all mixers)
    attn: list[tuple[int, int]] = field(default_factory=list)  # (heads, head_dim) per attention mixer
    ssd: list[tuple[int, int, int, int]] = field(default_factory=list)  # (H, P, N, chunk) per SSD mixer
    selective: list[tuple[int, int]] = field(default_factory=list)  # (E channels, N) per Mamba-1 mixer
    mlp: int = 0  # widest intermediate activation (MLP or expert) per token
    proj: int = 0  # widest input projection output per token (SSM in_proj, q/k/v)
    d: int = 0  # the residual stream's width
    library_ssd: int = 0  # SSD mixers run by transformers' own PyTorch path (no mamba_ssm), not ganda's

    def flops(self, T: int) -> float:
        """Forward FLOPs of this layer for one row of T tokens."""
        f = 2.0 * self.params * T
        for h, d in self.attn:
            f += 4.0 * h * d * T * T
        for H, P, N, Q in self.ssd:
            Tp = math.ceil(T / Q) * Q
            f += 2.0 * Tp * Q * H * (N + P) + 4.0 * Tp * H * P * N
        for E, N in self.selective:
            f += 9.0 * T * E * N
        return f

    def traffic(self, T: int, ssd_scale: float = 1.0, library_scale: float = 1.0, chunked: bool = False) -> float:
        """Activation elements this layer reads and writes outside its matmuls, for one row: norms,
        residual adds, rotary, activations, masking and softmax, scan arithmetic (memory-bound work).
        ``ssd_scale``: what a device's SSD path really moves per element counted here; the
        ``library_ssd`` mixers move ``library_scale`` times that. ``chunked``: Mamba-1 scans run
        chunked (about 22 passes over the ``T·E·N`` states and decays, the sequential loop 10)."""
        out = 12.0 * T * self.d + 4.0 * T * self.mlp + 2.0 * T * self.proj
        for h, _d in self.attn:
            out += 8.0 * h * T * T
        for k, (H, P, N, Q) in enumerate(self.ssd):
            Tp = math.ceil(T / Q) * Q
            lib = library_scale if k < self.library_ssd else 1.0
            out += ssd_scale * lib * (10.0 * Tp * Q * H + 6.0 * Tp * H * (N + P))
        for E, N in self.selective:
            out += (22.0 if chunked else 10.0) * T * E * N
        return out

    def act_bytes(self, T: int, b: int, chunked: bool = False, segment: Any = None) -> float:
        """Largest transient activations of this layer for one row (bytes; b = element size);
        ``chunked``: Mamba-1 scans run chunked (six float32 ``T·E·N`` tensors, the loop two);
        ``segment(E, N)``: the tokens a no-grad chunked scan holds at once (None: all T)."""
        out = 0.0
        if self.mlp:
            out = max(out, 3.0 * T * self.mlp * b)
        for h, _d in self.attn:
            out = max(out, h * T * T * (4 + b) + 3.0 * T * self.proj * b)
        for H, P, N, Q in self.ssd:
            Tp = math.ceil(T / Q) * Q
            # PyTorch's chunked scan keeps ~9 chunk-square and ~6 per-token float32 temporaries alive
            out = max(out, 9.0 * Tp * Q * H * 4 + 6.0 * Tp * H * (N + P) * 4 + 2.0 * T * self.proj * b)
        for E, N in self.selective:
            held = min(T, segment(E, N)) if chunked and segment is not None else T
            out = max(out, (6.0 * held if chunked else 2.0 * T) * E * N * 4 + 3.0 * T * E * 4 + T * self.proj * b)
        return out


@dataclass
class Profile:
    """A model reduced to what costs: its layers, widths and weights."""

    spec: str
    family: str
    n_params: int
    dtype: str
    bytes_per_param: int
    d_model: int
    vocab: int
    layers: list[LayerCost]
    n_ctx: int | None = None
    prefix_cache: bool = False  # scoring continues from a cached prompt (multi-token choices score suffixes only)

    @property
    def weight_bytes(self) -> float:
        return float(self.n_params * self.bytes_per_param)

    @property
    def heads(self) -> int:
        return sum(layer.heads for layer in self.layers)

    def layer_params(self, layers: Sequence[int]) -> float:
        return sum(self.layers[i].params for i in layers)


def _moe_fraction(adapter: ModelAdapter) -> float:
    cfg = getattr(adapter.model, "config", None)
    k = getattr(cfg, "num_experts_per_tok", None)
    n = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    return float(k) / float(n) if k and n else 1.0


def _linear_width(module: torch.nn.Module, names: Sequence[str]) -> int:
    widths = [getattr(getattr(module, n, None), "out_features", 0) or 0 for n in names]
    return max(widths, default=0)


def profile(adapter: ModelAdapter) -> Profile:
    """The cost profile of a loaded or meta-device model (weights never read, only shapes)."""
    model = adapter.model
    frac = _moe_fraction(adapter)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is None and hasattr(model, "backbone"):
        emb = getattr(model.backbone, "embedding", None) or getattr(model.backbone, "embeddings", None)
    vocab, d_model = (emb.weight.shape if emb is not None else (0, 0))
    mixers_by_layer: dict[int, list[Any]] = {}
    for m in adapter.mixers():
        mixers_by_layer.setdefault(m.layer, []).append(m)
    layers = []
    for i, block in enumerate(adapter.original_layers()):
        params = 0.0
        mlp = 0
        for name, p in block.named_parameters():
            params += p.numel() * (frac if ".experts." in f".{name}" else 1.0)
        for name, mod in block.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in ("gate_proj", "up_proj", "fc1"):
                mlp = max(mlp, mod.out_features)
            elif "experts" in name.split(".")[-1:] and hasattr(mod, "intermediate_dim"):
                mlp = max(mlp, int(mod.intermediate_dim))
        lc = LayerCost(params=params, heads=0, mlp=mlp, d=int(d_model))
        for m in mixers_by_layer.get(i, []):
            lc.heads += m.num_heads
            mod = m.module
            if m.kind == "attn":
                lc.attn.append((m.num_heads, m.head_dim))
                lc.proj = max(lc.proj, _linear_width(mod, ("q_proj", "k_proj", "v_proj")) * 3)
            elif m.head_dim == 1:  # Mamba-1 channels
                lc.selective.append((m.num_heads, int(getattr(mod, "ssm_state_size", 16))))
                lc.proj = max(lc.proj, _linear_width(mod, ("in_proj",)))
            else:
                n_state = int(getattr(mod, "ssm_state_size", 0) or getattr(mod, "d_state", 0) or 64)
                chunk = int(getattr(mod, "chunk_size", 0) or 256)
                lc.ssd.append((m.num_heads, m.head_dim, n_state, chunk))
                lc.library_ssd += type(mod).__module__.startswith("transformers.")
                lc.proj = max(lc.proj, _linear_width(mod, ("in_proj",)))
        layers.append(lc)
    first = next(model.parameters())
    return Profile(spec=adapter.spec, family=adapter.family, n_params=sum(p.numel() for p in model.parameters()),
                   dtype=str(first.dtype).removeprefix("torch."), bytes_per_param=first.element_size(),
                   d_model=int(d_model), vocab=int(vocab), layers=layers, n_ctx=adapter.n_ctx,
                   prefix_cache=prefix_cache_enabled(adapter))


# ---- the workload ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """The prompts an experiment runs on: how many, how long, how their choices are scored."""

    n: int  # examples
    tokens: float  # mean context tokens per example
    choices: int = 4
    choice_tokens: float = 1.0  # mean tokens per choice
    max_tokens: int | None = None  # longest example (activation peak)

    @property
    def single(self) -> bool:
        """One forward of the shared context scores every choice (MMLU letters)."""
        return self.choice_tokens <= 1.0

    @property
    def packed(self) -> float:
        """Tokens of the sweep's packed layout: the context once, then each choice's own tokens."""
        return self.tokens + (0 if self.single else self.choices * (self.choice_tokens - 1) + self.choices)

    @property
    def rows_tokens(self) -> tuple[int, float]:
        """(rows, tokens per row) of the plain scorer's one forward per example."""
        if self.single:
            return 1, self.tokens
        return self.choices, self.tokens + self.choice_tokens

    @property
    def reads(self) -> float:
        """Positions whose log-probabilities an analysis reads per example: each choice's tokens."""
        return self.choices * self.choice_tokens

    @property
    def score_rows(self) -> int:
        """Rows of log-probabilities read back per example: one shared row, or one per choice."""
        return 1 if self.single else self.choices

    @property
    def peak_tokens(self) -> int:
        return int(self.max_tokens or math.ceil(self.tokens))


def workload_from_examples(examples: Sequence[Any], encode: Any | None = None, chars_per_token: float = 4.0
                           ) -> Workload:
    """A workload measured on real task examples: token counts through ``encode(text) -> ids`` when a
    tokenizer is at hand, else characters / ``chars_per_token``."""
    if not examples:
        raise GandaError("no examples to plan for")

    def count(text: str) -> int:
        return len(encode(text)) if encode is not None else max(1, round(len(text) / chars_per_token))

    ctx = [count(ex.prompt) for ex in examples]
    conts = [count(c) for ex in examples for c in ex.choices]
    n_choices = sum(len(ex.choices) for ex in examples) / len(examples)
    return Workload(n=len(examples), tokens=sum(ctx) / len(ctx), choices=round(n_choices),
                    choice_tokens=sum(conts) / max(1, len(conts)), max_tokens=max(ctx) + max(conts, default=1))


# ---- costing ----------------------------------------------------------------------------------

SEQUENTIAL = "sequential"  # transformers' Mamba-1 loop, one step per token: plain forwards without kernels
CHUNKED = "chunked"  # ganda's chunked scan: the PyTorch path of analysis (torch_path)


def scan_steps(kind: str, T: int, rows: float, E: int, N: int, dev: Device) -> float:
    """Sequential steps of one Mamba-1 layer's scan over T tokens: T for the loop; for the chunked
    scan ⌈√S⌉ steps inside chunks and ⌈S/⌈√S⌉⌉ between them per segment of S tokens
    (:meth:`Device.segment`)."""
    if kind != CHUNKED:
        return float(T)
    seg = dev.segment(rows, E, N)

    def one(n: int) -> int:
        q = chunk_of(n)
        return q + -(-n // q)

    full, rest = divmod(T, seg)
    return float(full * one(seg) + (one(rest) if rest else 0))


@dataclass
class Phase:
    """One part of an experiment: ``calls`` forwards of ``rows`` rows through ``layers``."""

    name: str
    calls: float
    rows: float
    tokens: float
    layers: list[int]
    logit_positions: float  # per row
    backward: float = 0.0  # extra forward-equivalents of backward work (input gradients only)
    scan: str | None = "sequential"  # how Mamba-1 layers scan: SEQUENTIAL, CHUNKED, or None (kernels, skipped)
    examples: float = 0.0  # example passes (each pays the device's per-example overhead)
    scored: float = 0.0  # rows whose log-likelihoods are read back (each pays the per-score overhead)
    full_logits: bool = False  # float32 log-softmax over every position of every row (the fallback sweep)
    peak_rows: float = 0.0  # rows of the largest forward where the batches differ in size (0: rows)
    part: float = 1.0  # the share of the listed layers run (the circuit's receiver copies stop at the mixer)

    def flops(self, p: Profile) -> float:
        return self._whole_flops(p) * self.part

    def _whole_flops(self, p: Profile) -> float:
        """The FLOPs of the listed layers run whole (``part`` 1)."""
        T = max(1, round(self.tokens))
        per_row = sum(p.layers[i].flops(T) for i in self.layers) + 2.0 * p.d_model * p.vocab * self.logit_positions
        return self.calls * self.rows * per_row * (1.0 + self.backward)

    @property
    def chunked(self) -> bool:
        return self.scan == CHUNKED

    def seconds(self, p: Profile, dev: Device) -> float:
        T = max(1, round(self.tokens))
        rate = dev.rate(p.dtype)
        per_call = self._whole_flops(p) / max(self.calls, 1e-12) / rate  # whole layers: ``part`` once, below
        weights = (p.layer_params(self.layers) + p.d_model * p.vocab) * p.bytes_per_param
        per_call = max(per_call, weights * (1.0 + self.backward) / (dev.bandwidth * dev.bw_util))
        traffic = sum(p.layers[i].traffic(T, dev.ssd_traffic_scale, dev.library_ssd_scale, self.chunked)
                      for i in self.layers) \
            + 2.0 * self.logit_positions * p.vocab
        per_call += self.rows * traffic * 4.0 * (1.0 + self.backward) / (dev.act_bandwidth or dev.bandwidth * dev.bw_util)
        per_call += len(self.layers) * dev.layer_overhead * (1.0 + self.backward)
        ssd = sum(len(p.layers[i].ssd) + (dev.library_ssd_scale - 1.0) * p.layers[i].library_ssd for i in self.layers)
        per_call += ssd * dev.ssd_layer_overhead * (1.0 + self.backward)
        if self.scan:
            steps = sum(scan_steps(self.scan, T, self.rows, E, N, dev) for i in self.layers
                        for E, N in p.layers[i].selective)
            per_call += steps * dev.scan_step * (1.0 + self.backward)
        return (self.calls * (per_call + dev.call_overhead) + self.examples * dev.example_overhead
                + self.examples * self.tokens * dev.token_overhead + self.scored * dev.score_overhead) * self.part


@dataclass
class Plan:
    """The cost of one experiment on one model, workload and device."""

    model: str
    experiment: str
    device: str
    dtype: str
    n_params: int
    workload: dict[str, Any]
    phases: list[dict[str, Any]]
    flops: float
    memory: dict[str, float]  # bytes: weights, activations, kept, runtime, total
    seconds: float  # on one device
    n_devices: int = 1
    devices_per_replica: int = 1
    seconds_n: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _phase_act(p: Profile, ph: Phase, w: Workload, dev: Device | None = None) -> float:
    """The activation peak of one phase: the residual stream, and the largest of its layers'
    transients and its logits with their float32 log-softmax. A no-grad chunked scan on ``dev``
    holds one segment at a time; with autograd it keeps them all."""
    T = max(1, round(ph.tokens or w.peak_tokens))
    rows = ph.peak_rows or ph.rows
    segment = partial(dev.segment, rows) if ph.chunked and not ph.backward and dev is not None else None
    b = p.bytes_per_param
    layer = max((p.layers[i].act_bytes(T, b, ph.chunked, segment) for i in ph.layers), default=0.0) * rows
    act = 3.0 * rows * T * p.d_model * b + max(layer, rows * ph.logit_positions * p.vocab * (b + 4))
    if ph.full_logits:
        # fp32 logits and their log-softmax at every position of the longest prompt, beside the
        # previous prompt's log-probabilities (freed only when the next replace them), at the mean length
        act = max(act, 3.0 * rows * T * p.d_model * p.bytes_per_param + rows * p.vocab * 4.0 * (2.0 * w.peak_tokens + T))
    return act


Phases = tuple[list[Phase], float, list[str]]  # the forwards, the bytes kept between them, notes


def costed_experiments() -> list[str]:
    """The experiments ``ganda plan`` can cost: every registered one that declares its phases."""
    return [n for n in registry.experiment_names() if registry.experiment(n).phases]


def plan_flags(own: set[str] = frozenset()) -> dict[str, tuple[dict[str, Any], Any]]:
    """Every option the costed experiments' costs read (``costed_options``; by default all), as one
    flag of ``ganda plan`` besides its ``own`` inputs: name -> (its field in each experiment whose
    costs read it, the flag's type). Not given, an option keeps each experiment's own default (rank
    and edges differ in --audit and --active); a name declared with different types (prune's
    --layers, a count; transplant's, a list) is a text flag, read as the chosen experiment declares
    it (``Options.build(..., text=True)``)."""
    fields: dict[str, dict[str, Any]] = {}
    types: dict[str, set[Any]] = {}
    for name in costed_experiments():
        cls = registry.experiment(name)
        if cls.name != name:  # an alias (attribution)
            continue
        hints = typing.get_type_hints(cls.Options)
        for f in cls.Options.fields():
            if (cls.costed_options is None or f.name in cls.costed_options) and f.name not in own:
                fields.setdefault(f.name, {})[name] = f
                types.setdefault(f.name, set()).add(option_type(hints[f.name]))
    return {k: (by, types[k].pop() if len(types[k]) == 1 else str) for k, by in fields.items()}


def plan_flag_values(experiment: str, given: dict[str, Any]) -> dict[str, Any]:
    """The flags given as ``experiment``'s option values (a ``--no-x`` flag given: its option off);
    a flag it does not declare is refused in one line, never dropped."""
    fields = registry.experiment(experiment).Options.fields()
    if stray := [k for k in given if k not in {f.name for f in fields}]:
        by = plan_flags()[stray[0]][0]
        raise GandaError(f"{flag_name(next(iter(by.values())))} is not an option of {experiment} "
                         f"({', '.join(by)} take{'s' if len(by) == 1 else ''} it)")
    return option_values(fields, given)


def _phases(p: Profile, experiment: str, w: Workload, opts: dict[str, Any]) -> Phases:
    """The forwards an experiment runs and the bytes it keeps between them (its registered phases)."""
    names = costed_experiments()
    if experiment not in names:
        raise GandaError(f"unknown experiment {experiment!r}; known: {', '.join(names)}")
    return registry.resolve_target(registry.experiment(experiment).phases)(p, w, opts)


def batches_of(w: Workload, batch_tokens: int) -> tuple[int, int]:
    """(examples per batch, batches) of a gradient pass over ``w``: examples in input order, as many
    to a batch as ``batch_tokens`` padded tokens hold (at least one)."""
    per_batch = max(1, min(w.n, batch_tokens // max(1, round(w.packed))))
    return per_batch, math.ceil(w.n / per_batch)


def eval_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda eval``: every example scored once."""
    return scoring_phases(p, w, "score every example", 1, opts), 0.0, []


def sweep_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """The exhaustive sweep: with layer skipping, one intact pass kept layer by layer and each head
    batch from its layer on; without, whole forwards per head batch."""
    L = list(range(len(p.layers)))
    heads = opts.get("heads_per_layer") or [layer.heads for layer in p.layers]
    bh = int(opts.get("batch_heads") or 16)
    if not opts.get("layer_skip", True):
        total = sum(heads)
        # memory: a batch holds one mixer's heads, and each forward's log-softmax covers every position
        largest = max((min(bh, hk) for hk in heads if hk), default=1)
        phases = [Phase("intact model scored", w.n, 1, w.packed, L, w.reads, examples=w.n, scored=w.n * w.score_rows,
                        full_logits=True),
                  Phase("ablated heads (full forwards)", w.n * math.ceil(total / bh), min(bh, total),
                        w.packed, L, w.reads, scored=w.n * total * w.score_rows, full_logits=True, peak_rows=largest)]
        return phases, 0.0, ["no layer skipping for this family: every head batch runs the whole model"]
    # the intact scores come from the pass that records each layer's input; examples run g to a
    # forward, a batch's heads split so a forward stays within the token budget (sweep.batching),
    # and each head batch reads all its rows back through one LM-head call per block of g examples
    dev = opts.get("_device")
    sizes = [min(bh, hk) for hk in heads if hk for _ in range(math.ceil(hk / bh))]
    shape = batching_for(w.packed, sizes, forward_tokens(gpu=dev is not None and not dev.host))
    g = min(w.n, shape.examples)
    blocks = math.ceil(w.n / g)
    phases = [Phase("intact pass kept layer by layer", blocks, g, w.packed, L, w.reads, examples=w.n, scored=blocks)]
    for k, hk in enumerate(heads):
        if hk:
            b = min(bh, hk)
            split = math.ceil(b / shape.heads_per_forward(round(w.packed), b))
            calls = blocks * math.ceil(hk / bh)
            phases.append(Phase(f"heads of layer {k}", calls * split, b * g / split, w.packed, L[k:], w.reads,
                                scored=calls))
    kept = w.n * w.packed * p.d_model * p.bytes_per_param  # each prompt's residual entering the current layer
    heads_phases = [_Sum("ablated heads, layers k.. only", phases[1:])] if phases[1:] else []  # one line, exact sums
    return phases[:1] + heads_phases, kept, []


def backward_batch_tokens(p: Profile, opts: dict[str, Any], blocks: int) -> int:
    """Padded tokens per batch of a pass with a layer-by-layer backward (``rank``'s attribution,
    ``path``), as the run picks them (:func:`ganda.attribution.engine.default_batch_tokens`): the
    CPU's fixed size, on an accelerator what fits in the memory the weights leave, keeping the
    cotangents of ``blocks`` GradDrop blocks; ``--batch-tokens`` where given."""
    dev = opts.get("_device")
    free = None if dev is None or dev.host else dev.memory - p.weight_bytes - dev.runtime
    state = max((E * N for layer in p.layers for E, N in layer.selective), default=0)
    return int(opts.get("batch_tokens") or batch_tokens_for(len(p.layers), p.d_model, int(p.bytes_per_param), blocks,
                                                            free, state))


def spread_over(n: int, room: dict[int, int]) -> dict[int, int]:
    """``n`` heads spread evenly over the layers of ``room`` (layer -> the heads it holds), none past
    what a layer holds: where the planner puts the heads a ranking verifies, which the estimate
    picks only once it runs. ``n`` is at most every head of ``room``."""
    out = dict.fromkeys(room, 0)
    while n:
        layers = [k for k in room if out[k] < room[k]]
        for j in range(n):
            out[layers[min(len(layers) - 1, int((j + 0.5) * len(layers) / n))]] += 1
        n = sum(max(0, out[k] - room[k]) for k in out)  # past a layer's heads: spread again over the others
        out = {k: min(v, room[k]) for k, v in out.items()}
    return out


def attribution_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda rank``: one no-grad pass and a layer-by-layer backward per batch, then the exact
    check of the top heads, the audit and every head of ``verify_layers``."""
    L = list(range(len(p.layers)))
    method = opts.get("method", RANK_METHOD)
    dev = opts.get("_device")
    block_of = graddrop_blocks(len(L), opts.get("graddrop_blocks", GRADDROP_BLOCKS))  # as attribution cuts them
    batch_tokens = backward_batch_tokens(p, opts, block_of[-1] + 1 if method == "atp*" else 0)
    reps = int(opts.get("ig_steps") or IG_STEPS) + 1 if method == "ig" else 1  # IG: k steps and a clean copy
    per_batch, calls = batches_of(w, batch_tokens // reps)
    width = w.packed  # batches follow the input order, each padded to its longest prompt: in one batch
    if calls == 1 and w.n > 1 and w.max_tokens:  # of unequal prompts that is the longest of all
        width += max(0.0, w.max_tokens - w.choice_tokens - w.tokens)
    depth = len(L)
    blocks = block_of[-1] + 1
    # per layer a recompute and input-gradient VJPs: the plain one and, for AtP*, one per GradDrop
    # block above the layer's own
    above = sum(blocks - 1 - b for b in block_of) / depth
    vjp = dev.vjp_cost if dev is not None else 1.0
    back = 1.0 + vjp * (1.0 + above if method == "atp*" else 1.0)
    phases = [Phase("no-grad pass, residuals kept", calls, per_batch * reps, width, L, w.reads, examples=w.n,
                    scored=w.n * w.score_rows * reps, scan=CHUNKED),
              Phase(f"layer-by-layer backward ({method})", calls, per_batch * reps, width, L, w.reads,
                    backward=back - 1.0, scan=CHUNKED)]
    cotangents = blocks if method == "atp*" else 1
    kept = (depth + cotangents) * per_batch * reps * width * p.d_model * 4
    early = check_layers("--verify-layers", sorted(set(opts.get("verify_layers") or ())), len(L))
    ranked = opts.get("heads_per_layer") or [layer.heads for layer in p.layers]  # --heads: only those are ranked
    per_layer = [ranked[k] if k in early else 0 for k in L]  # every ranked head of those layers
    rest = {k: ranked[k] for k in L if k not in early and ranked[k]}
    # the estimate's top and the activity's overlap (on SmolLM2 KV the top 10 by estimate lie inside
    # the top 30 by activity): planned as the larger of the two lists; plus --widen W's first round
    # (at least one runs; later rounds depend on what the first finds)
    n_top, n_active, widen = (int(opts.get(k, d)) for k, d in (("verify_top", VERIFY_TOP), ("active", ACTIVE),
                                                                ("widen", 0)))
    top = max(n_top, n_active) + widen
    spread = min(sum(rest.values()), top + int(opts.get("audit", AUDIT)))
    for k, n in spread_over(spread, rest).items():  # the top heads and the audit, over the other layers
        per_layer[k] += n
    verify = sum(per_layer)
    sub, _, _ = sweep_phases(p, w, {**opts, "heads_per_layer": per_layer})
    for ph in sub:
        ph.name = f"exact check of {verify} heads: {ph.name}"
    vjps = f"{1 + above:.1f} input-gradient VJPs on average (GradDrop over {blocks} blocks)" if method == "atp*" \
        else f"one VJP, over {reps} copies of each prompt ({reps - 1} IG steps and the clean one)" if reps > 1 \
        else "one VJP"
    also = (f" and the {n_active} most active" if n_active else "") + (f", one round of {widen} more" if widen else "")
    note = (f"{method}: one no-grad pass, then per layer a recompute and {vjps}; then the top "
            f"{n_top}{also} and {opts.get('audit', AUDIT)} audited heads exactly"
            + (f", and every head of layer(s) {', '.join(map(str, early))}" if early else ""))
    return phases + sub, kept, [note]


def prune_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda prune``: one pass with the LM head after every layer; remove-and-restore replays the
    layers after each removed one."""
    L = list(range(len(p.layers)))
    rows, T = w.rows_tokens
    per_row = w.choice_tokens if not w.single else 1.0
    phases = [Phase("pruning curve: one pass, LM head after every layer", w.n, rows, T, L, per_row * len(L),
                    examples=w.n, scored=w.n * w.score_rows * len(L))]
    m = opts.get("remove_restore")
    if m:
        depth = sum(len(L[i + 1:m]) for i in range(m)) / m  # layers after the removed one, on average
        phases.append(Phase(f"remove-and-restore over {m} layers", w.n * m, rows, T, L[: max(1, round(depth))],
                            per_row))
    return phases, 0.0, []


def transplant_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda transplant``: the student scored (``score_donor``: the donor too), then once per
    transplanted layer (``layers``, default every layer) or head (``head``: the heads' ids)."""
    donor = bool(opts.get("score_donor"))
    what, n = ("head", len(opts["head"])) if opts.get("head") else ("layer", len(opts.get("layers") or p.layers))
    phases = [*scoring_phases(p, w, "score the student" + (" and the donor" if donor else ""), 1 + donor, opts),
              *scoring_phases(p, w, f"score each {what} transplanted", n, opts)]
    return phases, p.weight_bytes, ["donor assumed the student's size (its weights are counted once more)"]


def maps_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda attn``/maps: one capture pass, then every head's map materialised (float32 on the host)."""
    L = list(range(len(p.layers)))
    _, T = w.rows_tokens
    which = opts.get("map_layers")
    layers = list(which) if which is not None else L
    R = int(opts.get("rows") or T)
    T_ = int(w.max_tokens or T)
    full = p.family == "transformer"  # attention maps come from a whole eager forward
    phases: list[Phase] = [Phase("capture pass (eager attention, PyTorch SSM path)", w.n, 1, T_,
                                 L if full else L[: max(layers) + 1], T_ if full else 0, scan=CHUNKED)]
    map_flops = 0.0
    map_bytes = 0.0
    for i in layers:
        layer = p.layers[i]
        for H, _P, N, _Q in layer.ssd:
            map_flops += H * R * T_ * (2.0 * N + 6.0)
            map_bytes = max(map_bytes, H * R * T_ * 4.0)
        for E, N in layer.selective:
            map_flops += E * R * T_ * (6.0 * N + 4.0)
            map_bytes = max(map_bytes, E * R * T_ * 4.0)
        for h, _d in layer.attn:
            map_bytes = max(map_bytes, h * R * T_ * 4.0)
    # SSD heads are built one by one; Mamba-1 channels in batches of 64
    n_maps = sum(sum(H for H, *_ in p.layers[i].ssd) + sum(math.ceil(E / 64) for E, _ in p.layers[i].selective)
                 for i in layers)
    phases.append(_MapPhase("materialise maps", w.n, map_flops, layers, n_maps))
    opts["_host"] = map_bytes  # the maps are returned on the CPU: host memory, not the device's
    return phases, 0.0, [f"{R} rows of {T_} columns per head, every head of {len(layers)} layer(s), float32 "
                         "(float64 prefix sums); SSM maps need the PyTorch path (no kernels)"]


GPU_SCORE_TOKENS = 16384  # tokens per scoring forward on a GPU: the suffix batches split by length (PAD_WASTE)


def scoring_phase(p: Profile, w: Workload, name: str, repeat: int, opts: dict[str, Any]) -> Phase:
    """Scoring every example ``repeat`` times as ``evaluate_examples`` does, as one phase
    (:func:`scoring_phases` summed): what an extension's planner adds for its scoring passes."""
    parts = scoring_phases(p, w, name, repeat, opts)
    return parts[0] if len(parts) == 1 else _Sum(name, parts)


def scoring_phases(p: Profile, w: Workload, name: str, repeat: int, opts: dict[str, Any]) -> list[Phase]:
    """Scoring every example ``repeat`` times as ``evaluate_examples`` does: as many examples a
    forward as :func:`ganda.scoring.default_batch_rows` rows hold (one at least); logits only at
    the positions a choice is read from. Choices of several tokens on a model that continues from a cached prefix
    (:func:`ganda.scoring.prefix_cache_enabled`) are scored as the scorer does: each prompt once,
    then the choices' own tokens in batches of suffix rows."""
    dev = opts.get("_device")
    gpu = dev is not None and not dev.host
    L = list(range(len(p.layers)))
    if not w.single and p.prefix_cache and not opts.get("batch_rows"):
        # each example's prompt is its own prefix: one forward for it, one for its choices' rows
        return [Phase(f"{name}: each prompt once", repeat * w.n, 1, w.tokens, L, 1.0, examples=repeat * w.n),
                Phase(f"{name}: the choices after it", repeat * w.n, w.choices, w.choice_tokens, L, w.choice_tokens,
                      scored=repeat * w.n * w.score_rows)]
    rows, T = w.rows_tokens
    batch = opts.get("batch_rows") or default_batch_rows(p.n_params)
    per_call = max(1, min(w.n, batch // rows))
    if not opts.get("batch_rows") and gpu:  # a GPU's suffix batches (scoring.score_budget)
        per_call = max(per_call, min(w.n, GPU_SCORE_TOKENS // max(1, round(rows * T))))
    # logits only where a continuation token is read (the scorer's keep positions)
    reads = 1.0 if w.single else w.choice_tokens
    return [Phase(name, repeat * math.ceil(w.n / per_call), rows * per_call, T, L, reads,
                  examples=repeat * w.n, scored=repeat * w.n * w.score_rows)]


class _MapPhase(Phase):
    """Materialising implicit maps: elementwise-bound float32/float64 work, no weights read."""

    def __init__(self, name: str, calls: float, flops_per_call: float, layers: list[int], n_maps: int) -> None:
        super().__init__(name, calls, 1, 0, layers, 0, scan=None)
        self._flops = flops_per_call
        self.n_maps = n_maps

    def flops(self, p: Profile) -> float:
        return self.calls * self._flops

    def seconds(self, p: Profile, dev: Device) -> float:
        # exp/float64 elementwise work: the float32 rate at a quarter of its matmul efficiency
        return self.flops(p) / (dev.rate("float32") * 0.25) + self.calls * self.n_maps * dev.map_overhead


class _Sum(Phase):
    """Several phases as one line (the per-layer sweep phases, an extension's scoring passes):
    their FLOPs and times still add up exactly."""

    def __init__(self, name: str, parts: list[Phase]) -> None:
        super().__init__(name, sum(q.calls for q in parts), max(q.rows for q in parts), parts[0].tokens,
                         sorted({i for q in parts for i in q.layers}), parts[0].logit_positions,
                         examples=sum(q.examples for q in parts), scored=sum(q.scored for q in parts),
                         full_logits=any(q.full_logits for q in parts),
                         peak_rows=max(q.peak_rows or q.rows for q in parts))
        self.parts = parts

    def flops(self, p: Profile) -> float:
        return sum(q.flops(p) for q in self.parts)

    def seconds(self, p: Profile, dev: Device) -> float:
        return sum(q.seconds(p, dev) for q in self.parts)


def plan(prof: Profile, experiment: str, w: Workload, dev: Device | str = "h100", n_devices: int = 1,
         **opts: Any) -> Plan:
    """Cost ``experiment`` on ``prof`` for workload ``w`` on ``n_devices`` of ``dev``."""
    dev = device(dev) if isinstance(dev, str) else dev
    if n_devices < 1:
        raise GandaError(f"--devices must be at least 1, got {n_devices}")
    if w.n < 1:
        raise GandaError("the workload has no examples")
    opts = {**opts, "_device": dev}
    phases, kept, notes = _phases(prof, experiment, w, opts)
    flops = sum(ph.flops(prof) for ph in phases)
    seconds = sum(ph.seconds(prof, dev) for ph in phases)
    act = max(_phase_act(prof, ph, w, dev) * (2.0 if ph.backward else 1.0) for ph in phases)
    weights = prof.weight_bytes
    runtime = dev.runtime + (dev.ssm_runtime if any(layer.ssd or layer.selective for layer in prof.layers) else 0.0)
    act = max(act, dev.act_floor.get(experiment, 0.0))
    total = weights + act + kept + runtime
    host = float(opts.get("_host", 0.0))
    if dev.host:
        total, host = total + host, 0.0
    per_replica = max(1, math.ceil((total - runtime) / max(1.0, dev.memory - runtime)))
    if per_replica > 1:  # what does not fit is named: the weights, or what one pass holds beside them
        what = "the weights" if weights > dev.memory - runtime else "the activations and kept tensors beside the weights"
        notes.append(f"does not fit one {dev.name} ({what}): {per_replica} devices per copy of the model (device map)")
    replicas = max(1, n_devices // per_replica)
    if n_devices < per_replica:
        notes.append(f"needs {per_replica} devices to hold one pass; with {n_devices} it offloads to CPU/disk")
    rows = [{"phase": ph.name, "forwards": ph.calls, "rows": ph.rows, "tokens": round(ph.tokens, 1),
             "layers": len(ph.layers), "flops": ph.flops(prof), "seconds": ph.seconds(prof, dev)} for ph in phases]
    return Plan(model=prof.spec, experiment=experiment, device=dev.name, dtype=prof.dtype, n_params=prof.n_params,
                workload=asdict(w), phases=rows, flops=flops,
                memory={"weights": weights, "activations": act, "kept": kept, "runtime": runtime, "total": total,
                        "host": host},
                seconds=seconds, n_devices=n_devices, devices_per_replica=per_replica,
                seconds_n=seconds / replicas, notes=notes)


# ---- formatting -------------------------------------------------------------------------------

def human_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def human_bytes(x: float) -> str:
    for unit, size in (("TiB", GiB * 1024), ("GiB", GiB), ("MiB", float(1 << 20))):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x / 1024:.0f} KiB"


def plan_text(pl: Plan) -> str:
    w = pl.workload
    mem = pl.memory
    lines = [f"{pl.experiment} on {pl.model} ({pl.n_params / 1e9:.2f}B parameters, {pl.dtype}), "
             f"{w['n']} examples of ~{w['tokens']:.0f} tokens, on {pl.device}:",
             f"  {pl.flops:.3g} FLOPs; peak memory {human_bytes(mem['total'])} (weights {human_bytes(mem['weights'])}, "
             f"activations {human_bytes(mem['activations'])}, kept {human_bytes(mem['kept'])}, runtime "
             f"{human_bytes(mem['runtime'])})" + (f"; {human_bytes(mem['host'])} of maps in host memory"
                                                   if mem.get("host") else ""),
             f"  time on 1 device {human_seconds(pl.seconds)}"
             + (f"; on {pl.n_devices} devices {human_seconds(pl.seconds_n)}" if pl.n_devices > 1 else "")]
    for r in pl.phases:
        lines.append(f"    {r['phase']}: {r['forwards']:,.0f} forwards x {r['rows']:g} rows x {r['tokens']:g} tokens "
                     f"through {r['layers']} layers, {r['flops']:.3g} FLOPs, {human_seconds(r['seconds'])}")
    lines += [f"  note: {n}" for n in pl.notes]
    return "\n".join(lines)


# ---- a plan's inputs: a model's layout, a task's workload, the paper's runs, a run's announcement ----

# Published token counts are not at hand for a config alone: characters per token of English
# text under a ~128k BPE vocabulary (Llama-3's tokenizer gives 4.1-4.4 on MMLU).
CHARS_PER_TOKEN = 4.2
MEASURED = 200  # examples read to measure a task's prompt lengths


ANNOUNCE_AFTER = 60.0  # seconds: a run estimated to take longer says so before it starts


def _new_chars(examples: list) -> float:
    """The fraction of the prompts' characters not shared with the previous prompt: what is left to
    compute when a shared prefix (MMLU's k-shot exemplars of one subject) is computed once."""
    total = new = 0
    prev = ""
    for ex in examples:
        shared = len(os.path.commonprefix([prev, ex.prompt]))
        total += len(ex.prompt)
        new += len(ex.prompt) - shared
        prev = ex.prompt
    return new / total if total else 1.0


def announce(adapter: Any, examples: list, experiment: str = "eval", shared_prefix: bool = True,
             **opts: Any) -> float | None:
    """Before a long run, one line on stderr with ``ganda plan``'s estimate of its time on this CPU
    (lengths measured on 50 of the examples, a prefix shared with the previous prompt counted once
    when ``shared_prefix``); returns the estimate in seconds. Nothing on a GPU (no calibrated rates)
    or when the run is estimated under :data:`ANNOUNCE_AFTER`."""

    if not examples or adapter.device.type != "cpu":
        return None
    try:
        some = examples[:: max(1, len(examples) // 50)][:50]
        w = workload_from_examples(some, lambda text: encode(adapter, text), CHARS_PER_TOKEN)
        w = replace(w, n=len(examples), tokens=w.tokens * (_new_chars(examples) if shared_prefix else 1.0))
        seconds = plan(profile(adapter), experiment, w, "cpu", 1, layer_skip=adapter.skips_layers(), **opts).seconds
    except Exception:  # noqa: BLE001 - an estimate is a courtesy; a model the planner cannot cost runs anyway
        return None
    if seconds >= ANNOUNCE_AFTER:
        took = f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
        note(f"this run: {len(examples):,} examples, ~{w.tokens:.0f} tokens each to compute: about {took} on one "
             f"CPU core (ganda plan's calibrated rates); --limit N runs fewer")
    return seconds


def model_layout(model: str, dtype: Any) -> tuple[Any, Any]:
    """The model's full-size layout (meta device) and, where the model has one locally, its tokenizer.
    A GGUF file (or an alias of one) has no config to build from: it is loaded."""
    found = None if hub.is_hub_id(model) or model in meta.shipped() else model_path(model)
    if found is not None and found.is_file() and found.suffix.lower() == ".gguf":
        adapter = load_model(model, device="cpu", dtype=dtype)
        return adapter, adapter.tokenizer
    adapter = meta.build(model, dtype)
    tok = load_tokenizer(str(found)) if found is not None and found.is_dir() else None
    if tok is not None:
        tok.model_max_length = 1 << 62  # it counts tokens; a prompt past the model's context is the plan's to say
        adapter.tokenizer = tok
    return adapter, tok


def task_workload(adapter: Any, tok: Any, task: str, n: int, shots: int | None, tokens: int | None,
                  seed: int = 0) -> Workload:
    """``n`` examples of ``task`` as token counts (measured on up to 200 of them), or ``tokens`` each."""
    if tokens is not None:
        return Workload(n=n, tokens=float(tokens), max_tokens=tokens)
    opts: dict[str, Any] = {"shots": shots} if shots is not None else {}
    if "sample" in type(get_task(task)).option_types():  # mmlu: lengths from a sample across subjects
        opts["sample"] = True
    exs = get_task(task, **opts).examples(limit=min(n, MEASURED), seed=seed)
    if not exs:
        raise GandaError(f"task {task!r} gave no examples to measure")
    enc = (lambda text: encode(adapter, text)) if tok is not None else None
    return replace(workload_from_examples(exs, enc, CHARS_PER_TOKEN), n=n)


def heads_per_layer(adapter: Any, heads: str | Sequence[Any] | None) -> list[int] | None:
    """How many of ``heads`` (a head list's text, or canonical head ids) sit in each of the model's
    layers (a sweep's cost per layer)."""
    if heads is None:
        return None
    per_layer = [0] * len(adapter.original_layers())
    for h in expand(heads, adapter) if isinstance(heads, str) else heads:
        per_layer[h.layer] += 1
    return per_layer


def paper_plans(device: str, devices: int, shots: int | None = None) -> list[tuple[str, Any]]:
    """The paper's headline runs as plans (shipped configs, bf16): each experiment's ``paper`` runs."""
    out = []
    classes = list(dict.fromkeys(registry.experiment(n) for n in registry.experiment_names(ordered=False)))
    for cls in classes:
        for run in cls.paper:
            opts = run.workload
            own = {k: v for k, v in opts.items() if k not in ("task", "n", "tokens")}  # the experiment's options
            name = run.experiment or cls.name
            out.append((run.what, model_plan(run.model, name, parse_dtype("bfloat16"), opts.get("task", "mmlu"),
                                             opts["n"], shots, opts.get("tokens"), device, devices,
                                             partial(phase_options, name, flags=own))))
    return out


def model_plan(model: str, experiment: str, dtype: Any, task: str, n: int, shots: int | None, tokens: int | None,
               dev: str, n_devices: int, options: Callable[[ModelAdapter], dict[str, Any]]) -> Plan:
    """The plan of ``experiment`` on ``model``'s full-size layout for ``n`` examples of ``task``: what
    ``ganda plan`` prints. ``options(adapter)``: the experiment's options in the forms its phases
    take (:func:`phase_options`), read once the layout and the workload are known."""
    adapter, tok = model_layout(model, dtype)
    w = task_workload(adapter, tok, task, n, shots, tokens)
    opts = {"layer_skip": adapter.skips_layers(), **options(adapter)}
    return plan(profile(adapter), experiment, w, dev, n_devices, **opts)


def phase_options(experiment: str, adapter: ModelAdapter, flags: dict[str, Any],
                  given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options an experiment's costs read, in the forms its phases take: ``flags`` (typed, as its
    own command's flags) and ``given`` (``--option KEY=VALUE`` text, as ``ganda run`` reads it) built
    and checked as one ``Options``, as every route builds it, so that a rule between two options
    holds whichever way each came; head ids checked in the model as the experiment's run checks them
    (``heads`` as heads per layer, the rest by its ``plan_options``), layer lists as the model's own
    layers."""
    cls = registry.experiment(experiment)
    given = given or {}
    if both := [k for k in flags if k in given]:
        raise GandaError(f"{cls.Options.cli_flag(both[0])} is given both as a flag and as --option {both[0]}; "
                         "give it once")
    built = cls.Options.build({**flags, **given}, cli=flags, text=True)
    opts: dict[str, Any] = {k: getattr(built, k) for k in [*flags, *given]}
    if cls.name == "rank" and built.method == "exact":
        raise GandaError(f"{built.flag('method')} exact is the exhaustive sweep: cost it with -e sweep")
    if "heads" in opts:
        opts["heads_per_layer"] = heads_per_layer(adapter, opts.pop("heads"))
    cls.plan_options(adapter, built, opts)  # what only the experiment knows how to read in the model
    for name in ("verify_layers", "map_layers", "layers"):  # prune's layers is a count, transplant's a list
        if isinstance(opts.get(name), str):
            opts[name] = check_layers(built.flag(name), parse_layers(opts[name]), len(adapter.original_layers()))
    if opts.get("remove_restore") is True:  # prune's costs read the minimal model's size
        opts["remove_restore"] = opts.get("minimal") or len(adapter.original_layers())
    if "graddrop_blocks" in opts:
        opts["graddrop_blocks"] = opts["graddrop_blocks"] or None  # 0: one block per layer
    return opts
