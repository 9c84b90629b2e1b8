"""The forward engine: named points, running from layer k, stopping after layer m, on every family."""

from __future__ import annotations

import pytest
import torch
from checks import tiny_model

import ganda
from ganda.engine import Trace, layer_returns, run_layers
from ganda.errors import GandaError
from ganda.interventions import AblateHeads, RemoveLayers, apply
from ganda.models.base import OutputHead

FAMILIES = ["llama", "mamba2", "mamba", "llamba", "zamba2", "bamba", "falcon_h1", "jamba"]
IDS = torch.randint(1, 60, (2, 11), generator=torch.Generator().manual_seed(3))


def _adapter(family: str):
    if family == "llama":
        from conftest import make_tiny_llama

        return ganda.from_model(make_tiny_llama(64, layers=4), spec="tiny-llama")
    return ganda.from_model(tiny_model(family), spec=family)


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    return _adapter(request.param)


def test_points_have_their_shapes_and_values(adapter):
    d = adapter.mixers()[0].out_proj.out_features
    last = adapter.active_layers()[-1]
    m = adapter.mixers()[-1]
    z = f"L{m.layer}.{m.kind}.z"
    names = ["L0.resid_in", "L1.resid_in", f"L{last}.resid_out", "L1.kwargs", z]
    with torch.no_grad(), Trace(adapter, names) as tr:
        logits = adapter.forward(IDS)
    assert tr["L0.resid_in"].shape == tr["L1.resid_in"].shape == tr[f"L{last}.resid_out"].shape == (2, 11, d)
    assert tr[z].shape == (2, 11, m.num_heads * m.head_dim)
    assert isinstance(tr["L1.kwargs"], dict) and "hidden_states" not in tr["L1.kwargs"]
    # the final residual through the model's own norm and LM head gives its logits
    assert torch.allclose(adapter.unembed(tr[f"L{last}.resid_out"][1]), logits[1], atol=1e-5)


def test_run_from_layer_k_and_stop_after_layer_m(adapter):
    n = len(adapter.original_layers())
    with torch.no_grad():
        full = run_layers(adapter, IDS, capture=[f"L{i}.resid_in" for i in range(n)] + ["L1.resid_out"])
        # from layer 2 with the residual the intact pass gives it: the same logits
        tail = run_layers(adapter, IDS, start=2, resid=full["L2.resid_in"])
        torch.testing.assert_close(tail["logits"], full["logits"], atol=1e-5, rtol=1e-5)
        # stopping after layer 1 returns its output (no LM head), and no layer edit is left behind
        head = run_layers(adapter, IDS, stop=1, at=(torch.tensor([0, 1]), torch.tensor([10, 4])))
        torch.testing.assert_close(head["resid"], full["L1.resid_out"][[0, 1], [10, 4]])
        # from layer 1 to layer 1: layer 1 alone on its own input
        one = run_layers(adapter, IDS, start=1, stop=1, resid=full["L1.resid_in"])
        torch.testing.assert_close(one["resid"], full["L1.resid_out"], atol=1e-5, rtol=1e-5)
    assert adapter.decoder_layers() is adapter.original_layers()


def test_an_edit_of_z_is_a_head_ablation(adapter):
    m = adapter.mixers()[1]
    head = adapter.canonical(ganda.HeadId(m.layer, m.num_heads - 1, m.kind))

    def zero(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[..., m.head_slice(head.head)] = 0
        return x

    with torch.no_grad():
        with Trace(adapter, edit={f"L{m.layer}.{m.kind}.z": zero}):
            edited = adapter.forward(IDS)
        with AblateHeads([head]).apply(adapter):
            ablated = adapter.forward(IDS)
        intact = adapter.forward(IDS)
    assert torch.equal(edited, ablated) and not torch.equal(edited, intact)


def test_stop_ends_the_forward(adapter):
    seen = []
    handle = adapter.original_layers()[-1].register_forward_hook(lambda *a: seen.append(1))
    try:
        with torch.no_grad(), Trace(adapter, ["L0.resid_out"], stop="L0.resid_out") as tr:
            adapter.forward(IDS)
            raise AssertionError("the forward ran past its stop")
    finally:
        handle.remove()
    assert not seen and tr["L0.resid_out"].shape[:2] == (2, 11)


def test_layer_ids_name_the_layers_as_loaded():
    ad = _adapter("llama")
    with torch.no_grad():
        ref = run_layers(ad, IDS, capture=["L2.resid_in", "L3.resid_in"])
        with RemoveLayers([1]).apply(ad):
            got = run_layers(ad, IDS, start=3, resid=ref["L3.resid_in"], stop=3)
            with pytest.raises(GandaError, match="L1.resid_in: layer 1 is removed by remove-layers 1"):
                with Trace(ad, ["L1.resid_in"]):
                    pass
        whole = run_layers(ad, IDS, start=3, resid=ref["L3.resid_in"], stop=3)
    torch.testing.assert_close(got["resid"], whole["resid"])
    assert layer_returns(ad, 0) in (0, 1)
    with pytest.raises(GandaError, match="not a point of the forward engine"):
        Trace(ad, ["L0.residual"]).__enter__()
    with pytest.raises(GandaError, match="needs the residual stream"):
        run_layers(ad, IDS, start=2)


def test_capabilities_have_defaults():
    llama, zamba, mamba = _adapter("llama"), _adapter("zamba2"), _adapter("mamba2")
    assert llama.skips_layers() and llama.packs_choices(64) and llama.supports_kv_cache_generation()
    for ad in (zamba, mamba):
        assert not ad.skips_layers() and not ad.packs_choices(64) and not ad.supports_kv_cache_generation()
        with pytest.raises(GandaError, match="cannot run outside their model"):
            ad.run_block(0, torch.zeros(1, 2, 32), torch.arange(2)[None], torch.zeros(1, 1, 2, 2))
    assert llama.shared_blocks() == {} and mamba.shared_blocks() == {}
    assert zamba.shared_blocks() == {"block0": [1, 4], "block1": [3]}
    with pytest.raises(GandaError, match="no SSM heads"):
        llama.implicit_maps(IDS[:1], llama.heads()[:1])
    assert mamba.implicit_maps(IDS[:1], mamba.heads()[:1])[mamba.heads()[0]].shape == (11, 11)
    assert llama.n_params() == sum(p.numel() for p in llama.model.parameters())


def test_layer_calls_replay_the_models_own_pass(adapter):
    """What the sweep scores the intact model from and attribution recomputes layers from: the
    recorded pass's last layer output equals the layers replayed one by one from ``h0`` (bitwise)
    and the model's own final hidden state, and each recorded input is the previous output."""
    from ganda.engine import LayerCalls

    with torch.no_grad():
        calls = LayerCalls(adapter, IDS, torch.ones_like(IDS), inputs=True)
        x = calls.h0
        for pos in range(len(calls.layers)):
            assert torch.equal(x, calls.inputs[pos])
            x = calls.run(pos, x)
            assert torch.equal(x, calls.output(pos))
        ref = run_layers(adapter, IDS, stop=calls.layers[-1])["resid"]
        two = calls.run(0, calls.h0.repeat(2, 1, 1), reps=2)  # two copies of the batch at once
        short = LayerCalls(adapter, IDS, stop=1)
    assert calls.final is not None and torch.equal(calls.final, x)
    torch.testing.assert_close(calls.final, ref)
    torch.testing.assert_close(two, torch.cat([calls.inputs[1]] * 2))
    assert short.layers == [0, 1] and torch.equal(short.final, calls.inputs[2])
    assert adapter.decoder_layers() is adapter.original_layers()


def test_unembed_is_the_models_output_head(adapter):
    """The one final norm + LM head: differentiable, and the model's own logits from its last
    residual, on every family (Falcon-H1's multiplier, Llamba's tied embedding included)."""
    last = adapter.active_layers()[-1]
    with torch.no_grad(), Trace(adapter, [f"L{last}.resid_out"]) as tr:
        logits = adapter.forward(IDS)
    h = tr[f"L{last}.resid_out"].clone().requires_grad_(True)
    out = adapter.unembed(h)
    torch.testing.assert_close(out.detach(), logits, atol=1e-5, rtol=1e-5)
    out[0, -1].logsumexp(-1).backward()
    assert h.grad is not None and h.grad[0, -1].abs().sum() > 0 and h.grad[1].abs().sum() == 0


def test_the_exact_output_path_is_the_models_own_logits_inside_a_layer_edit(adapter):
    """The fallback of the output head (the model's own forward with the last running layer's output
    replaced, for families whose output arithmetic it cannot copy) gives the model's logits, also
    with a layer removed: the replaced output is the running last block's (Zamba2 wraps a moved
    block anew inside the edit, so a hook placed before it never fires)."""
    head = OutputHead(adapter)
    for edit in ([], [RemoveLayers([1])]):
        with torch.no_grad(), apply(adapter, edit):
            last = adapter.active_layers()[-1]
            with Trace(adapter, [f"L{last}.resid_out"]) as tr:
                logits = adapter.forward(IDS)
            out = head._through_forward(tr[f"L{last}.resid_out"])
        torch.testing.assert_close(out, logits, atol=1e-5, rtol=1e-5)
