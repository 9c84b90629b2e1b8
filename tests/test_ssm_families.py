"""Invariants of every SSM / hybrid family on tiny random models built here (no downloads).

Reconstruction (M·x + D·x equals the mixer's own SSD/scan output), ablation equivalence (zeroing a
head's out_proj-input slice equals zeroing its out_proj columns), last-row masking, layer
interventions, and maps for ``ganda attn``.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

import ganda
from ganda import HeadId, KeepHeads, KeepLayers, RemoveLayers, truncate
from ganda.models.ssm.checks import ablation_diff, last_row_diff, reconstruction_error
from ganda.models.transformer import eager_attention

T = 13


def _randomise_ssm(model: torch.nn.Module) -> None:
    """Random init leaves Δ tiny (M·x ≈ 0); spread Δ, A and D so the checks bite."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "dt_bias") and isinstance(mod.dt_bias, torch.nn.Parameter):
                mod.dt_bias.copy_(torch.randn(mod.dt_bias.shape, generator=g))
                mod.A_log.copy_(torch.rand(mod.A_log.shape, generator=g) * 2 - 1)
            if hasattr(mod, "dt_proj") and hasattr(mod, "A_log"):
                mod.dt_proj.bias.copy_(torch.randn(mod.dt_proj.bias.shape, generator=g))
            if hasattr(mod, "D") and isinstance(mod.D, torch.nn.Parameter):
                mod.D.copy_(0.3 * torch.randn(mod.D.shape, generator=g))
            if hasattr(mod, "in_proj") and hasattr(mod, "A_log"):  # HF inits in_proj at std 0.02: C·B ≈ 0
                mod.in_proj.weight.copy_(torch.randn(mod.in_proj.weight.shape, generator=g) * 0.3)
                mod.conv1d.weight.copy_(torch.rand(mod.conv1d.weight.shape, generator=g) - 0.5)
            if getattr(mod, "z_bias", None) is not None:
                mod.z_bias.copy_(torch.randn(mod.z_bias.shape, generator=g))


def build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "mamba2":
        from transformers import Mamba2Config, Mamba2ForCausalLM

        cfg = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_heads=8, head_dim=8,
                           state_size=8, n_groups=2, expand=2, chunk_size=4)
        model = Mamba2ForCausalLM(cfg)
    elif family in ("mamba", "falcon_mamba"):
        from transformers import FalconMambaConfig, FalconMambaForCausalLM, MambaConfig, MambaForCausalLM

        C, M = (MambaConfig, MambaForCausalLM) if family == "mamba" else (FalconMambaConfig, FalconMambaForCausalLM)
        model = M(C(vocab_size=64, hidden_size=16, num_hidden_layers=3, state_size=4, expand=2, time_step_rank=4))
    elif family == "llamba":
        from ganda.models.ssm.llamba import LlambaConfig, LlambaForCausalLM

        model = LlambaForCausalLM(LlambaConfig(
            vocab_size=61, d_model=32, n_layer=3, mlp_cfg={"intermediate_size": 48},
            ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "chunk_size": 4}))
    elif family == "zamba2":
        from transformers import Zamba2Config, Zamba2ForCausalLM

        cfg = Zamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                           num_key_value_heads=4, mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8,
                           mamba_ngroups=2, num_mem_blocks=2, chunk_size=4, intermediate_size=64,
                           layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
                           use_shared_attention_adapter=True, adapter_rank=4)
        model = Zamba2ForCausalLM(cfg)
    elif family == "bamba":
        from transformers import BambaConfig, BambaForCausalLM

        cfg = BambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, mamba_n_heads=8, mamba_d_head=8,
                          mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4, attn_layer_indices=[1, 3])
        model = BambaForCausalLM(cfg)
    elif family in ("falcon_h1", "falcon_h1_nonorm"):
        from transformers import FalconH1Config, FalconH1ForCausalLM

        cfg = FalconH1Config(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48, mamba_n_heads=8, mamba_d_head=8,
                             mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4, mamba_d_ssm=64,
                             mamba_rms_norm=family == "falcon_h1", key_multiplier=0.7,
                             ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9], ssm_in_multiplier=1.3,
                             ssm_out_multiplier=0.6, attention_out_multiplier=0.9)
        model = FalconH1ForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(family)
    _randomise_ssm(model)
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls run 100x slower when two OpenMP threads fight a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FAMILIES = ["mamba2", "mamba", "falcon_mamba", "llamba", "zamba2", "bamba", "falcon_h1", "falcon_h1_nonorm"]


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    return ganda.from_model(build(request.param))


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(2))


def test_family_detected(adapter):
    assert adapter.family in {"mamba2", "mamba1", "llamba", "zamba2", "bamba", "falcon_h1"}
    assert adapter.heads("ssm")


def test_reconstruction(adapter, ids):
    for m in adapter.mixers():
        if m.kind == "ssm":
            err = reconstruction_error(adapter, ids, m.layer)
            assert err["full"] < 1e-5 and err["worst_head"] < 1e-5, (m.layer, err)
            assert err["ssm_share"] > 0.05 and err["ssm"] < 1e-5, (m.layer, err)  # the check is about M


def test_ablation_equals_zeroed_columns(adapter, ids):
    for m in adapter.mixers():
        h = adapter.canonical(HeadId(m.layer, m.num_heads - 1, m.kind))
        d = ablation_diff(adapter, ids, h)
        assert d["equiv"] < 1e-5, (str(h), d)
        assert d["effect"] > 0, str(h)


def test_last_row_masking_only_changes_last_position(adapter, ids):
    for m in adapter.mixers():
        h = adapter.canonical(HeadId(m.layer, 1, m.kind))
        d = last_row_diff(adapter, ids, [h])
        assert d["before"] == 0.0 and d["last"] > 0, (str(h), d)


def test_layer_and_head_interventions_run(adapter, ids):
    base = adapter.forward(ids)
    n = len(adapter.decoder_layers())
    first = adapter.mixers()[0]
    for iv in (KeepHeads([adapter.canonical(HeadId(first.layer, 0, first.kind))], kind=first.kind), RemoveLayers([1]),
               KeepLayers([0, n - 1]), truncate(2)):
        with iv.apply(adapter):
            out = adapter.forward(ids)
        assert torch.isfinite(out).all() and not torch.equal(out, base), iv.describe()
    assert torch.equal(adapter.forward(ids), base)  # everything restored


def test_removal_keeps_causality(adapter, ids):
    """After removing a layer, earlier positions still ignore later tokens, with SDPA and with
    eager attention (Bamba picks masks by position; Zamba2 layers look adapters up by index)."""
    other = ids.clone()
    other[0, -1] = (other[0, -1] + 1) % 60
    impls = [nullcontext()]
    if adapter.family in ("zamba2", "bamba", "falcon_h1"):
        impls.append(eager_attention(adapter.model))
    for impl in impls:
        with impl:
            for layers in ([0], [1]):
                with RemoveLayers(layers).apply(adapter):
                    a, b = adapter.forward(ids), adapter.forward(other)
                assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6), layers
                assert not torch.allclose(a[:, -1], b[:, -1])


def test_attention_maps_shapes_and_kinds(adapter, ids):
    heads = [adapter.canonical(HeadId(m.layer, 0, m.kind)) for m in adapter.mixers()]
    maps = adapter.attention_maps(ids, heads)
    rows = adapter.attention_maps(ids, heads, rows=[T - 1])
    for h in heads:
        assert maps[h].shape == (T, T) and maps[h].dtype == torch.float32
        assert torch.allclose(rows[h][0], maps[h][-1], atol=1e-6)
        assert torch.all(maps[h].triu(1) == 0)  # causal
        kind = adapter.map_kind(h)
        assert kind == ("softmax" if adapter.mixer_of(h).kind == "attn" else "implicit")
        if kind == "softmax":
            assert torch.allclose(maps[h].sum(-1), torch.ones(T), atol=1e-5)
