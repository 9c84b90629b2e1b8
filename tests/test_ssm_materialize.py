"""The implicit-attention math on its own: rows mode, D on the diagonal, numerics at long
lengths, the ``materialize`` entry point, Mamba-1 channel blocks, unsupported architectures."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from checks import tiny_model as build

import ganda
from ganda import HeadId
from ganda.errors import GandaError
from ganda.models.ssm.materialize import (
    SelectiveParams,
    SSDParams,
    materialize,
    selective_channel_map,
    ssd_head_map,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


def _ssd(T: int, H: int = 4, G: int = 2, N: int = 5, P: int = 3, decay: float = 1.0, seed: int = 0) -> SSDParams:
    g = torch.Generator().manual_seed(seed)
    delta = torch.nn.functional.softplus(torch.randn(T, H, generator=g))
    A = -torch.rand(H, generator=g) * decay
    return SSDParams(x=torch.randn(T, H, P, generator=g), B=torch.randn(T, G, N, generator=g),
                     C=torch.randn(T, G, N, generator=g), log_decay=delta * A, col_scale=delta,
                     D=torch.randn(H, generator=g))


def _recurrence(p: SSDParams, head: int) -> torch.Tensor:
    """S_t = exp(a_t) S_{t-1} + Δ_t x_t B_tᵀ, y_t = S_t C_t (float64, token by token)."""
    g = p.group(head)
    S = torch.zeros(p.x.shape[2], p.B.shape[2], dtype=torch.float64)
    ys = []
    for t in range(p.x.shape[0]):
        w = p.col_scale[t, head].double() if p.col_scale is not None else 1.0
        S = torch.exp(p.log_decay[t, head].double()) * S + w * torch.outer(p.x[t, head].double(), p.B[t, g].double())
        ys.append(S @ p.C[t, g].double())
    return torch.stack(ys)


def test_ssd_map_equals_recurrence():
    p = _ssd(40)
    for head in range(4):
        M = ssd_head_map(p, head)
        y = M.double() @ p.x[:, head].double()
        ref = _recurrence(p, head)
        assert (y - ref).norm() / ref.norm() < 1e-5
        assert torch.all(M.triu(1) == 0)


@pytest.mark.parametrize("T,block", [(30, 64), (150, 64), (37, 4)])
def test_selective_map_equals_scan(T, block, monkeypatch):
    """Blocked evaluation (factorised off-band blocks + entry-wise band) equals the scan."""
    mat = importlib.import_module("ganda.models.ssm.materialize")
    monkeypatch.setattr(mat, "_SEL_BLOCK", block)
    g = torch.Generator().manual_seed(1)
    E, N = 3, 4
    p = SelectiveParams(x=torch.randn(T, E, generator=g), delta=torch.rand(T, E, generator=g),
                        A=-torch.rand(E, N, generator=g) * 3, B=torch.randn(T, N, generator=g),
                        C=torch.randn(T, N, generator=g), D=torch.randn(E, generator=g))
    for d in range(E):
        h = torch.zeros(N, dtype=torch.float64)
        ys = []
        for t in range(T):
            dt = p.delta[t, d].double()
            h = torch.exp(dt * p.A[d].double()) * h + dt * p.B[t].double() * p.x[t, d].double()
            ys.append(h @ p.C[t].double())
        ref = torch.stack(ys)
        M = selective_channel_map(p, d)
        y = M.double() @ p.x[:, d].double()
        assert (y - ref).norm() / ref.norm() < 1e-5
        assert torch.all(M.triu(1) == 0)
        assert torch.allclose(selective_channel_map(p, d, rows=[T - 1, 5]), M[[T - 1, 5]], rtol=1e-6, atol=1e-12)


def test_rows_mode_and_d_on_diagonal():
    p = _ssd(50)
    full = ssd_head_map(p, 1)
    assert torch.allclose(ssd_head_map(p, 1, rows=[-1])[0], full[-1], rtol=1e-6, atol=1e-9)
    assert torch.allclose(ssd_head_map(p, 1, rows=[3, 17]), full[[3, 17]], rtol=1e-6, atol=1e-9)
    with_d = ssd_head_map(p, 1, include_d=True)
    assert torch.allclose(with_d - full, torch.diag(torch.full((50,), float(p.D[1]))))
    with pytest.raises(IndexError):
        ssd_head_map(p, 1, rows=[50])


def test_long_sequences_stay_finite_and_exact():
    """Strong decays over 3,000 steps: masking before exp keeps the upper triangle at 0 (no inf·0),
    and float64 prefix sums keep the far-diagonal decays right."""
    p = _ssd(3000, decay=8.0)
    M = ssd_head_map(p, 0, rows=[0, 1500, 2999])
    assert torch.isfinite(M).all()
    assert torch.all(M[0, 1:] == 0) and torch.all(M[1, 1501:] == 0)
    # entry-wise check near the diagonal, against the direct product of decays
    i, j = 2999, 2990
    direct = (p.C[i, 0] @ p.B[j, 0]).double() * torch.exp(p.log_decay[j + 1:i + 1, 0].double().sum()) * p.col_scale[j, 0]
    assert abs(float(M[2, j]) - float(direct)) <= 1e-5 * abs(float(direct)) + 1e-30


def test_materialize_entry_point():
    ad = ganda.from_model(build("zamba2"))
    ids = torch.randint(0, 60, (1, 9), generator=torch.Generator().manual_seed(0))
    maps = materialize(ad, ids, "L1.ssmH2,L0H1", rows=[-1])
    assert set(maps) == {HeadId(0, 1), HeadId(1, 2, "ssm")} and maps[HeadId(0, 1)].shape == (1, 9)
    full = materialize(ad, ids, [HeadId(1, 2, "ssm")], include_d=False)[HeadId(1, 2, "ssm")]
    assert torch.allclose(full[-1], maps[HeadId(1, 2, "ssm")][0], atol=1e-7)
    with pytest.raises(GandaError, match="not SSM heads"):
        materialize(ad, ids, "L1.attnH0")


def test_mamba1_channel_blocks():
    ad = ganda.from_model(build("mamba"))
    ids = torch.randint(0, 60, (1, 8), generator=torch.Generator().manual_seed(0))
    E = ad.mixer(1).num_heads
    assert ad.mixer(1).head_dim == 1 and E == 32
    blocks = ad.grouped_maps(ids, 1, block=8)
    assert sorted(blocks) == [0, 1, 2, 3]
    per = ad.attention_maps(ids, [HeadId(1, c) for c in range(8, 16)])
    assert torch.allclose(blocks[1], torch.stack(list(per.values())).mean(0), atol=1e-6)
    assert [str(h) for h in ad.channel_heads(1, 8, 3)][:2] == ["L1H24", "L1H25"]


def test_unsupported_architecture_names_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "rwkv"}))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(GandaError) as err:
        ganda.load_model(str(tmp_path), device="cpu")
    msg = str(err.value)
    for name in ("rwkv", "Mamba-2", "Mamba-1", "Falcon-Mamba", "Llamba", "Zamba2", "Bamba"):
        assert name in msg


def test_batched_channel_maps_equal_single_channel(monkeypatch):
    mat = importlib.import_module("ganda.models.ssm.materialize")
    monkeypatch.setattr(mat, "_SEL_SCRATCH", 300)  # force several channel chunks
    g = torch.Generator().manual_seed(4)
    T, E, N = 70, 9, 4
    p = SelectiveParams(x=torch.randn(T, E, generator=g), delta=torch.rand(T, E, generator=g),
                        A=-torch.rand(E, N, generator=g) * 2, B=torch.randn(T, N, generator=g),
                        C=torch.randn(T, N, generator=g), D=torch.randn(E, generator=g))
    chans = [7, 0, 3, 3, 8]
    many = mat.selective_maps(p, chans, rows=[69, 2, 64, 63], include_d=True)
    for k, c in enumerate(chans):
        one = selective_channel_map(p, c, rows=[69, 2, 64, 63], include_d=True)
        assert torch.allclose(many[k], one, rtol=1e-6, atol=1e-10)


def test_analysis_forces_torch_path_and_eval(monkeypatch):
    """A stand-in "kernel" (a wrapper like transformers' kernel dispatch) must not run during
    analysis, and a fused training path that would skip out_proj must not be taken."""
    import functools

    from transformers.models.mamba2 import modeling_mamba2 as mm

    ad = ganda.from_model(build("mamba2"))
    calls = []
    ref_scan = mm.mamba2_chunk_scan

    @functools.wraps(ref_scan)
    def fake_kernel(*a, **k):
        calls.append("scan")
        return ref_scan(*a, **k) * 0  # a "kernel" with different numerics

    @functools.wraps(mm.mamba2_split_conv1d_scan_combined)
    def fake_fused(zxbcdt, *a, **k):
        calls.append("fused")
        return torch.zeros(*zxbcdt.shape[:2], 32)  # bypasses norm and out_proj

    monkeypatch.setattr(mm, "mamba2_chunk_scan", fake_kernel)
    monkeypatch.setattr(mm, "mamba2_split_conv1d_scan_combined", fake_fused)
    ids = torch.randint(0, 60, (1, 9), generator=torch.Generator().manual_seed(0))
    ad.model.train()
    maps = ad.attention_maps(ids, [HeadId(1, 0)])
    assert calls == [] and ad.model.training  # torch path used, training mode restored
    assert mm.mamba2_chunk_scan is fake_kernel  # and the module restored
    ad.model.eval()
    assert torch.isfinite(maps[HeadId(1, 0)]).all() and maps[HeadId(1, 0)].abs().sum() > 0
    ad.forward(ids)
    assert calls and set(calls) == {"scan"}  # plain forward keeps the installed implementation


def test_maps_stop_the_forward_after_the_last_needed_layer():
    from ganda.models.ssm.materialize import head_map

    ad = ganda.from_model(build("zamba2"))
    ids = torch.randint(0, 60, (1, 9), generator=torch.Generator().manual_seed(0))
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda _m, _a, i=i: seen.append(i))
             for i, layer in enumerate(ad.decoder_layers())]
    maps = ad.attention_maps(ids, [HeadId(1, 2, "attn"), HeadId(0, 3)])
    assert seen == [0, 1]  # layers 2-4 never ran
    seen.clear()
    full = ad.capture_ssm(ids, [0])[0]  # checks run to the end
    assert seen == [0, 1, 2, 3, 4]
    for h in hooks:
        h.remove()
    assert torch.allclose(maps[HeadId(0, 3)], head_map(full, 3), atol=1e-7)
