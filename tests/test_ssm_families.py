"""Invariants of every SSM / hybrid family on tiny random models built here (no downloads).

Reconstruction (M·x + D·x equals the mixer's own SSD/scan output), ablation equivalence (zeroing a
head's out_proj-input slice equals zeroing its out_proj columns), last-row masking, layer
interventions, and maps for ``ganda attn``.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from checks import FAMILIES, ablation_diff, last_row_diff, reconstruction_error
from checks import tiny_model as build

import ganda
from ganda import HeadId, KeepHeads, KeepLayers, RemoveLayers, truncate
from ganda.models.base import eager_attention

T = 13


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread




@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    return ganda.from_model(build(request.param))


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(2))


def test_family_detected(adapter):
    assert adapter.family in {"mamba2", "mamba1", "llamba", "zamba2", "bamba", "falcon_h1", "jamba"}
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
    if adapter.family in ("zamba2", "bamba", "falcon_h1", "jamba"):
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


@pytest.mark.parametrize("family", ["mamba2", "mamba", "falcon_mamba", "zamba2", "bamba", "falcon_h1", "jamba"])
def test_loads_from_local_directory(family, tmp_path, ids):
    """``ganda.load_model(dir)`` (save_pretrained layout) gives the right adapter and the same logits."""
    import ganda.models.ssm  # noqa: F401  (registration; see the fresh-process test below)

    model = build(family)
    model.save_pretrained(tmp_path)
    ad = ganda.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    assert type(ad).__name__ == type(ganda.from_model(model)).__name__
    assert torch.allclose(ad.forward(ids), model(input_ids=ids, use_cache=False).logits, atol=1e-5)


@pytest.mark.integration
def test_fresh_process_loads_ssm_directory(tmp_path):
    import subprocess
    import sys

    build("mamba2").save_pretrained(tmp_path)
    code = f"import ganda; print(ganda.load_model({str(tmp_path)!r}, device='cpu').family)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("mamba2"), out.stderr[-500:]


def test_keep_heads_takes_the_mixer_from_the_head_names():
    """On Falcon-H1 every layer has an attention and an SSM mixer: ``KeepHeads("L0.ssmH0")``
    must keep that SSM head (not fail for want of ``kind=``) and equal the explicit form."""
    ad = ganda.from_model(build("falcon_h1"))
    ids = torch.randint(1, 60, (1, 12), generator=torch.Generator().manual_seed(0))
    base = ad.forward(ids)
    with KeepHeads("L0.ssmH0").apply(ad):
        inferred = ad.forward(ids)
    with KeepHeads("L0.ssmH0", kind="ssm").apply(ad):
        explicit = ad.forward(ids)
    with KeepHeads("L0.attnH0").apply(ad):
        attn_kept = ad.forward(ids)
    assert torch.equal(inferred, explicit) and not torch.allclose(inferred, base)
    assert not torch.allclose(inferred, attn_kept)
    with pytest.raises(ganda.GandaError, match="several mixers"):
        with KeepHeads(["L0.ssmH0", "L0.attnH1"]).apply(ad):
            pass
    assert torch.equal(ad.forward(ids), base)
