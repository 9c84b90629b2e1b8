"""Llamba: a tiny checkpoint in the published layout loads through ``ganda.load_model`` and its
logits match an independent sequential (recurrent, float64) implementation of the same math."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import ganda
from ganda.errors import GandaError
from ganda.models.ssm.llamba import LlambaConfig, LlambaForCausalLM, save_llamba, ssd_chunked

CFG = dict(vocab_size=61, d_model=32, n_layer=2, mlp_cfg={"intermediate_size": 48, "bias": False, "act_fn": "silu"},
           ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "expand": 1, "chunk_size": 4,
                    "activation": "identity", "bias": False})


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


def _tiny() -> LlambaForCausalLM:
    torch.manual_seed(0)
    model = LlambaForCausalLM(LlambaConfig(**CFG))
    with torch.no_grad():
        for b in model.backbone.layers:
            b.mixer.z_bias.normal_()
            b.mixer.D.normal_()
            b.input_layernorm.weight.uniform_(0.5, 1.5)
    return model.eval()


def _rms(h: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return w * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def reference_logits(sd: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Token-by-token recurrence h_t = exp(-softplus(a_t)) h_{t-1} + x_t B_tᵀ, y_t = h_t C_t + D x_t."""
    sd = {k: v.double() for k, v in sd.items()}
    s = CFG["ssm_cfg"]
    E, G, N, H = CFG["d_model"], s["n_qk_heads"], s["d_state"], s["n_v_heads"]
    P, T = E // H, ids.shape[1]
    h = sd["backbone.embedding.weight"][ids[0]]
    for i in range(CFG["n_layer"]):
        p = f"backbone.layers.{i}."
        u = _rms(h, sd[p + "input_layernorm.weight"])
        proj = u @ sd[p + "mixer.in_proj.weight"].T
        xBC, z, a = proj[:, : E + 2 * G * N], proj[:, E + 2 * G * N: 2 * E + 2 * G * N], proj[:, 2 * E + 2 * G * N:]
        w, bias = sd[p + "mixer.conv1d.weight"][:, 0], sd[p + "mixer.conv1d.bias"]
        K = w.shape[1]
        conv = torch.stack([bias + sum(w[:, k] * xBC[t - (K - 1) + k] for k in range(K) if t - (K - 1) + k >= 0)
                            for t in range(T)])
        x, B, C = conv[:, :E].reshape(T, H, P), conv[:, E:E + G * N].reshape(T, G, N), conv[:, E + G * N:].reshape(T, G, N)
        y = torch.zeros(T, H, P, dtype=torch.float64)
        for hd in range(H):
            g = hd // (H // G)
            S = torch.zeros(P, N, dtype=torch.float64)
            for t in range(T):
                S = torch.exp(-F.softplus(a[t, hd])) * S + torch.outer(x[t, hd], B[t, g])
                y[t, hd] = S @ C[t, g] + sd[p + "mixer.D"][hd] * x[t, hd]
        gated = y.reshape(T, E) * F.silu(z + sd[p + "mixer.z_bias"])
        h = h + gated @ sd[p + "mixer.out_proj.weight"].T
        v = _rms(h, sd[p + "post_attention_layernorm.weight"])
        mlp = F.silu(v @ sd[p + "mlp.gate_proj.weight"].T) * (v @ sd[p + "mlp.up_proj.weight"].T)
        h = h + mlp @ sd[p + "mlp.down_proj.weight"].T
    h = _rms(h, sd["backbone.final_layernorm.weight"])
    return (h @ sd["lm_head.weight"].T)[None]


@pytest.mark.parametrize("with_model_type", [True, False])
def test_published_layout_loads_and_matches_reference(tmp_path, with_model_type):
    model = _tiny()
    save_llamba(model, tmp_path, with_model_type=with_model_type)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert ("model_type" in raw) == with_model_type and "ssm_cfg" in raw
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    assert "backbone.layers.0.mixer.in_proj.weight" in sd and "backbone.layers.0.mixer.z_bias" in sd
    assert sd["lm_head.weight"].shape[0] == 64  # vocab padded to a multiple of 8, as published
    adapter = ganda.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    assert adapter.family == "llamba"
    assert [m.num_heads for m in adapter.mixers()] == [4, 4]
    ids = torch.randint(0, 61, (1, 11), generator=torch.Generator().manual_seed(3))
    got = adapter.forward(ids).double()
    want = reference_logits(sd, ids)
    assert (got - want).abs().max() / want.abs().max() < 1e-5


def test_chunked_ssd_independent_of_chunk_size():
    g = torch.Generator().manual_seed(0)
    x, B, C = torch.randn(1, 10, 2, 3, generator=g), torch.randn(1, 10, 2, 4, generator=g), torch.randn(1, 10, 2, 4, generator=g)
    a = -torch.rand(1, 10, 2, generator=g)
    ys = [ssd_chunked(x, a, B, C, q) for q in (1, 3, 4, 16)]
    for y in ys[1:]:
        assert torch.allclose(y, ys[0], atol=1e-5)


def test_bad_checkpoint_is_refused(tmp_path):
    model = _tiny()
    save_llamba(model, tmp_path)
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.pop("backbone.layers.1.mixer.D")
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(GandaError, match=r"lacks 1 tensor\(s\) the model needs: backbone\.layers\.1\.mixer\.D$"):
        ganda.load_model(str(tmp_path), device="cpu")


def test_config_without_model_type_that_is_not_llamba(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(GandaError, match="unsupported architecture.*Llamba"):
        ganda.load_model(str(tmp_path), device="cpu")


def test_right_padding_is_accepted_left_padding_refused():
    adapter = ganda.from_model(_tiny())
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    out = adapter.forward(ids, attention_mask=mask)
    assert torch.allclose(out[1, :4], adapter.forward(ids[1:, :4])[0], atol=1e-5)
    with pytest.raises(GandaError, match="right padding"):
        adapter.forward(ids, attention_mask=mask.flip(1))


def test_prefix_cache_holds_its_last_conv_inputs_only():
    """After a cached forward of T tokens each layer's conv state is its own ``d_conv - 1`` columns
    (a slice of the whole input would keep ``[rows, channels, T + d_conv - 1]`` allocated as long as
    the cache), and continuing from it gives the whole sequence's logits."""
    adapter = ganda.from_model(_tiny())
    ids = torch.randint(0, 61, (1, 40), generator=torch.Generator().manual_seed(3))
    cache = adapter.new_cache()
    adapter.forward_cached(ids[:, :30], cache, torch.arange(30)[None])
    for state in cache.conv:
        assert state.shape[-1] == 3  # d_conv - 1
        assert state.untyped_storage().nbytes() == state.numel() * state.element_size()
    tail = adapter.forward_cached(ids[:, 30:], cache, torch.arange(30, 40)[None])
    assert torch.allclose(tail, adapter.forward(ids)[:, 30:], atol=1e-5)
