"""Mamba-1's chunked selective scan against transformers' sequential one (tiny models built here).

Outputs, final states and gradients of Mamba-1, Falcon-Mamba and Jamba mixers at 1, 7, 64 and 747
tokens, from a zero and from a given initial state; the number of ATen operations a layer's
forward + backward dispatches; the module-level scans restored afterwards.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from checks import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from ganda.models.ssm.common import torch_path
from ganda.models.ssm.selective_scan import (
    MAMBA1_MODULES,
    chunk_of,
    segment_of,
    selective_scan,
    sequential_scan,
)

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["mamba", "falcon_mamba", "jamba"]
LENGTHS = [1, 7, 64, 747]
TOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the reference's largest magnitude (at least 1)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


def normwise(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """‖a − b‖ / max(‖b‖, floor): a whole tensor's relative error, against at least ``floor``."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def _module_of(model: torch.nn.Module):
    return importlib.import_module(type(model).__module__)


def _first_mixer(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "x_proj"))


def _scan_args(model: torch.nn.Module, T: int) -> tuple[tuple, dict]:
    """The arguments the first Mamba-1 mixer of ``model`` passes to its scan for T random tokens."""
    mod = _module_of(model)
    seen: list[tuple[tuple, dict]] = []

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return sequential_scan(*args, **kwargs)

    ids = torch.randint(0, 60, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad(), torch_path(model):
        mod.mamba_selective_scan = spy  # restored by torch_path
        model(ids)
    return seen[0]


def _run(scan, args, kwargs, h0):
    leaves = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
              else a for a in args]
    kw = {k: v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in kwargs.items()}
    init = None if h0 is None else h0.clone().requires_grad_(True)
    y, state = scan(*leaves, **{**kw, "return_last_state": True, "initial_state": init})
    w = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    ((y * w).sum() + (state * state).sum()).backward()
    grads = [t.grad for t in [*leaves, *kw.values(), init] if isinstance(t, torch.Tensor) and t.grad is not None]
    return y, state, grads


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("initial", [False, True])
def test_scan_equals_the_sequential_scan(family, T, initial):
    """On a real mixer's inputs: the same outputs, final state and gradients (of u, Δ, A, B, C, D,
    z, the Δ bias and the initial state) within 1e-5."""
    model = tiny_model(family)
    args, kwargs = _scan_args(model, T)
    b, E, _ = args[0].shape
    h0 = torch.randn(b, E, args[2].shape[-1], generator=torch.Generator().manual_seed(1)) if initial else None
    y1, s1, g1 = _run(selective_scan, args, kwargs, h0)
    y0, s0, g0 = _run(sequential_scan, args, kwargs, h0)
    assert y1.dtype == y0.dtype and s1.dtype == s0.dtype and y1.shape == y0.shape and s1.shape == s0.shape
    assert close(y1, y0) < TOL and close(s1, s0) < TOL
    assert len(g1) == len(g0) >= 8 + initial
    for a, b_ in zip(g1, g0, strict=True):
        assert close(a, b_) < TOL
    assert s0.abs().max() > 1e-3 and y0.abs().max() > 1e-3  # the comparison is about something


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("T", LENGTHS)
def test_models_on_the_torch_path_match_the_sequential_scan(family, T):
    """Whole models: logits and input-embedding gradients within 1e-5 of the largest entry; every
    weight's gradient within 1e-5 as a whole (‖Δ‖/‖g‖: the sequential scan's own float32 gradients
    of Falcon-Mamba's D lie 2e-5 of the largest entry from a float64 run, so two float32 scans
    cannot agree entry by entry to 1e-5 there). A weight whose gradient is zero in exact arithmetic
    carries only rounding noise (a query projection at T=1, where softmax over one key is constant),
    so each is measured against at least 1e-5 of the model's largest weight gradient."""
    model = tiny_model(family)
    mod = _module_of(model)
    ids = torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(T + 1))

    def run(sequential: bool):
        model.zero_grad()
        with torch_path(model):
            if sequential:
                mod.mamba_selective_scan = sequential_scan
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=emb).logits
            logits.log_softmax(-1)[..., 5].sum().backward()
        return logits.detach(), emb.grad, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    l1, e1, p1 = run(False)
    l0, e0, p0 = run(True)
    assert close(l1, l0) < TOL and close(e1, e0) < TOL
    assert p1.keys() == p0.keys() and any("A_log" in n for n in p0)
    floor = 1e-5 * max(float(g.double().norm()) for g in p0.values())
    for n in p0:
        assert normwise(p1[n], p0[n], floor) < TOL, n


def test_strong_decays_stay_finite_and_exact():
    """Δ·A of -50 per token: exp of a cumulative sum over a chunk would underflow or overflow; the
    segment sums stay in range and the scan still equals the sequential one."""
    g = torch.Generator().manual_seed(3)
    b, E, N, T = 1, 3, 4, 300
    u, C = torch.randn(b, E, T, generator=g), torch.randn(b, N, T, generator=g)
    B = torch.randn(b, N, T, generator=g)
    dt = torch.rand(b, E, T, generator=g) * 5.0
    A = -torch.rand(E, N, generator=g) * 10.0
    h0 = torch.randn(b, E, N, generator=g) * 1e3
    y1, s1 = selective_scan(u, dt, A, B, C, return_last_state=True, initial_state=h0)
    y0, s0 = sequential_scan(u, dt, A, B, C, return_last_state=True, initial_state=h0)
    assert torch.isfinite(y1).all() and torch.isfinite(s1).all()
    assert close(y1, y0) < TOL and close(s1, s0) < TOL


def test_segments_bound_memory_and_chain_the_state(monkeypatch):
    """A budget of a few elements cuts the scan into segments; each continues the previous state."""
    import ganda.models.ssm.selective_scan as ss

    assert chunk_of(1) == 1 and chunk_of(747) == 28 and chunk_of(784) == 28 and chunk_of(785) == 29
    # a 7B layer (8,192 channels, 16 states): 512 tokens of one row per segment on the CPU
    assert segment_of(1, 8192, 16, torch.device("cpu")) == 512
    assert segment_of(4, 8192, 16, torch.device("meta")) == 512
    g = torch.Generator().manual_seed(4)
    u, dt, z = (torch.randn(2, 5, 100, generator=g) for _ in range(3))
    A, B, C = -torch.rand(5, 3, generator=g), torch.randn(2, 3, 100, generator=g), torch.randn(2, 3, 100, generator=g)
    whole = selective_scan(u, dt, A, B, C, z=z, delta_softplus=True, return_last_state=True)
    monkeypatch.setitem(ss.SCAN_ELEMENTS, "cpu", 2 * 5 * 3 * 17)  # 17 tokens per segment
    cut = selective_scan(u, dt, A, B, C, z=z, delta_softplus=True, return_last_state=True)
    assert ss.segment_of(2, 5, 3, u.device) == 17
    assert close(cut[0], whole[0]) < TOL and close(cut[1], whole[1]) < TOL


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _layer_ops(T: int, sequential: bool) -> int:
    """ATen calls of a forward + backward of one Falcon-Mamba layer (hidden 64, state 16)."""
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    torch.manual_seed(0)
    model = FalconMambaForCausalLM(FalconMambaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1,
                                                     state_size=16)).eval()
    layer = model.backbone.layers[0]
    x = torch.randn(1, T, 64, requires_grad=True)
    with torch_path(model):
        if sequential:
            _module_of(model).mamba_selective_scan = sequential_scan
        with _Count() as count:
            out = layer(x)
            (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    return count.n


def test_a_layer_dispatches_a_tenth_of_the_sequential_operations():
    """747 tokens (the mean 5-shot MMLU prompt): at most a tenth of the sequential scan's 24,194
    operations, and the count grows far slower than the prompt."""
    short, long = _layer_ops(128, False), _layer_ops(747, False)
    assert long <= 24_194 // 10
    assert long / short < 0.5 * 747 / 128  # sub-linear: ~2·√T steps
    assert _layer_ops(128, True) > 5 * short  # the reference is the sequential loop (T steps)


def test_torch_path_swaps_and_restores_every_mamba1_scan():
    before = {name: importlib.import_module(name).mamba_selective_scan for name in MAMBA1_MODULES}
    model = tiny_model("mamba")
    with torch_path(model):
        for name in MAMBA1_MODULES:
            assert importlib.import_module(name).mamba_selective_scan is selective_scan
    assert {name: importlib.import_module(name).mamba_selective_scan for name in MAMBA1_MODULES} == before


def test_the_planner_counts_the_chunked_scan_on_the_pytorch_path():
    """Attribution (on the PyTorch path) plans ~2·√T scan steps per segment; the exact checks' plain
    forwards keep transformers' loop (T steps); attribution's GPU batches hold the scan's states."""
    import ganda
    from ganda import plan
    from ganda.attribution import batch_tokens_for

    h100 = plan.DEVICES["h100"]
    assert plan.scan_steps(plan.SEQUENTIAL, 747, 1, 8192, 16, h100) == 747
    assert plan.scan_steps(plan.CHUNKED, 747, 1, 8192, 16, h100) == 28 + 27
    assert plan.scan_steps(plan.CHUNKED, 4096, 1, 8192, 16, h100) == 2 * (46 + 45)  # two segments of 2,048
    assert plan.scan_steps(plan.CHUNKED, 747, 4, 8192, 16, plan.DEVICES["cpu"]) == 5 * (12 + 11) + (11 + 10)
    # Falcon-Mamba-7B's widths on an H100 with 60 GB free: ten d_inner × N float32 states a token
    assert batch_tokens_for(64, 4096, 2, 6, 60e9, state=8192 * 16) == 4989
    assert batch_tokens_for(64, 4096, 2, 6, 60e9) == 38958
    prof = plan.profile(ganda.from_model(tiny_model("falcon_mamba")))
    phases, _, _ = plan._phases(prof, "attribution", plan.Workload(n=4, tokens=747), {"_device": h100})
    assert [ph.scan for ph in phases[:2]] == [plan.CHUNKED, plan.CHUNKED]
    assert phases[2:] and all(ph.scan == plan.SEQUENTIAL for ph in phases[2:])
    maps, _, _ = plan._phases(prof, "maps", plan.Workload(n=1, tokens=747), {"_device": h100})
    assert maps[0].scan == plan.CHUNKED
