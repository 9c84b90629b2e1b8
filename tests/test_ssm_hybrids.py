"""Hybrid specifics: Zamba2 shared-block invocations (ids, per-invocation vs. all-invocation
ablation, even when the block is one Python object), last-row masking equal to zeroing the
softmax row, and Bamba's interleaved ids."""

from __future__ import annotations

import copy

import pytest
import torch
from checks import tiny_model as build

import ganda
from ganda import AblateHeads, HeadId, mask_last_row
from ganda.models.base import eager_attention

T = 12


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


@pytest.fixture()
def ids():
    return torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(5))


def test_zamba2_ids_and_blocks():
    ad = ganda.from_model(build("zamba2"))
    assert ad.layer_kinds(1) == ["attn", "ssm"] and ad.layer_kinds(0) == ["ssm"]
    heads = {str(h) for h in ad.heads()}
    assert {"L1.attnH3", "L1.ssmH7", "L0H7", "L4.attnH0"} <= heads
    assert ad.shared_blocks() == {"block0": [1, 4], "block1": [3]}
    assert [str(h) for h in ad.block_heads(0, [2])] == ["L1.attnH2", "L4.attnH2"]
    assert ganda.heads.expand("L*.attnH2", ad) == sorted(ad.block_heads(0, [2]) + ad.block_heads(1, [2]))


def test_zamba2_one_invocation_vs_all(ids):
    ad = ganda.from_model(build("zamba2"))
    base = ad.forward(ids)
    with AblateHeads("L4.attnH2").apply(ad):
        one = ad.forward(ids)
    with AblateHeads(ad.block_heads(0, [2])).apply(ad):
        both = ad.forward(ids)
    # Zeroing the (tied) weight columns once removes the head from every invocation of block 0.
    o_proj = ad.mixer(1, "attn").out_proj
    assert o_proj.weight is ad.mixer(4, "attn").out_proj.weight
    with torch.no_grad():
        saved = o_proj.weight.detach().clone()
        o_proj.weight[:, 2 * 16:3 * 16] = 0
        cols = ad.forward(ids)
        o_proj.weight.copy_(saved)
    assert (both - cols).abs().max() < 1e-5
    assert not torch.allclose(one, base) and not torch.allclose(one, both)
    # Layer-4 ablation leaves everything before layer 4's output untouched: the first attention
    # invocation (layer 1) sees the same inputs, so the two runs agree up to layer 3.
    captured = {}
    h = ad.model.model.layers[3].register_forward_hook(lambda _m, _a, o: captured.setdefault(len(captured), o))
    ad.forward(ids)
    with AblateHeads("L4.attnH2").apply(ad):
        ad.forward(ids)
    h.remove()
    assert torch.equal(captured[0], captured[1])


def test_zamba2_shared_object_is_gated_per_invocation(ids):
    """If a shared block is literally one module object (older checkpoints/code), hooks still
    target one invocation."""
    model = build("zamba2")
    same = copy.deepcopy(model)
    same.model.layers[4].shared_transformer = same.model.layers[1].shared_transformer
    a, b = ganda.from_model(model), ganda.from_model(same)
    assert torch.allclose(a.forward(ids), b.forward(ids), atol=1e-6)
    for spec in ("L4.attnH2", "L1.attnH0,L4.attnH3"):
        with AblateHeads(spec).apply(a):
            want = a.forward(ids)
        with AblateHeads(spec).apply(b):
            got = b.forward(ids)
        assert torch.allclose(want, got, atol=1e-6), spec
    maps_a = a.attention_maps(ids, [HeadId(4, 1, "attn")])
    maps_b = b.attention_maps(ids, [HeadId(4, 1, "attn")])
    assert torch.allclose(maps_a[HeadId(4, 1, "attn")], maps_b[HeadId(4, 1, "attn")], atol=1e-6)


def test_zamba2_mask_last_row_equals_zeroed_softmax_row(ids, monkeypatch):
    """The paper's experiment: zero the final query's attention row after the softmax."""
    from transformers.models.zamba2 import modeling_zamba2 as mz

    ad = ganda.from_model(build("zamba2"))
    heads = [HeadId(1, 0, "attn"), HeadId(1, 3, "attn"), HeadId(3, 2, "attn"), HeadId(4, 1, "attn")]
    with eager_attention(ad.model):
        base = ad.forward(ids)
        with mask_last_row(heads).apply(ad):
            ours = ad.forward(ids)
        orig = mz.eager_attention_forward
        current = {}

        def patched(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
            kv = mz.repeat_kv(key, module.num_key_value_groups)
            vv = mz.repeat_kv(value, module.num_key_value_groups)
            w = torch.softmax(query @ kv.transpose(2, 3) * scaling + attention_mask, dim=-1)
            for h in heads:
                if h.layer == current["layer"]:
                    w[:, h.head, -1, :] = 0
            return (w @ vv).transpose(1, 2).contiguous(), w

        hooks = [ad.model.model.layers[i].register_forward_pre_hook(
            lambda _m, _a, i=i: current.__setitem__("layer", i)) for i in range(5)]
        monkeypatch.setattr(mz, "eager_attention_forward", patched)
        try:
            theirs = ad.forward(ids)
        finally:
            monkeypatch.setattr(mz, "eager_attention_forward", orig)
            for hk in hooks:
                hk.remove()
    assert (ours - theirs).abs().max() < 1e-5
    assert torch.equal(ours[:, :-1], base[:, :-1]) and not torch.allclose(ours[:, -1], base[:, -1])


def test_bamba_ids_are_plain_per_layer():
    ad = ganda.from_model(build("bamba"))
    assert [m.kind for m in ad.mixers()] == ["ssm", "attn", "ssm", "attn"]
    assert str(ad.canonical(HeadId(1, 3, "attn"))) == "L1H3"
    assert ad.mixer(1).num_heads == 4 and ad.mixer(0).num_heads == 8
    assert ad.map_kind(HeadId(1, 0)) == "softmax" and ad.map_kind(HeadId(0, 0)) == "implicit"


def test_block_syntax_targets_every_invocation(ids):
    from ganda.errors import GandaError
    from ganda.heads import expand

    ad = ganda.from_model(build("zamba2"))
    assert expand("B0H2", ad) == sorted(ad.block_heads(0, [2]))
    assert expand("B0.attnH1-2,B1H*", ad) == sorted(ad.block_heads(0, [1, 2]) + ad.block_heads(1))
    with AblateHeads("B0H2").apply(ad):
        a = ad.forward(ids)
    with AblateHeads(ad.block_heads(0, [2])).apply(ad):
        b = ad.forward(ids)
    assert torch.equal(a, b)
    with pytest.raises(GandaError, match="no shared block 7"):
        expand("B7H0", ad)
    with pytest.raises(GandaError, match="shared blocks: none"):
        expand("B0H0", ganda.from_model(build("bamba")))
