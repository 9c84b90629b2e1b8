"""The paper's models at their real size, without their weights: shipped configs on the meta device,
hub ids through a real hub-layout cache (offline), the cost planner, bf16 on every family, and
models placed partly on disk with accelerate (identical numbers to the model in memory)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
import torch
from checks import (
    FAMILIES,
    _randomise_ssm,
    ablation_diff,
    last_row_diff,
    reconstruction_error,
    tiny_model,
)
from conftest import make_tiny_llama
from transformers import Mamba2Config, Mamba2ForCausalLM

import ganda
from ganda import AblateHeads, HeadId, KeepHeads, KeepLayers, RemoveLayers
from ganda import plan as planner
from ganda.attribution.engine import batch_tokens_for
from ganda.cli import main
from ganda.errors import GandaError
from ganda.experiments.transplant import TransplantHead, TransplantLayer
from ganda.heads import expand
from ganda.interventions import mask_last_row
from ganda.models import hub, meta, placement
from ganda.scoring import evaluate_examples
from ganda.sweep import run_sweep
from ganda.tasks import get_task

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


@pytest.fixture(scope="module")
def shipped():
    """Every shipped config built once on the meta device (bf16)."""
    return {name: meta.build(name) for name in meta.shipped()}


# ---- shipped configs on the meta device -------------------------------------------------------

def _llama_params(c: dict) -> int:
    """Llama parameter count from its config, by hand (no transformers)."""
    d, i, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = d * q + 2 * d * kv + q * d + 3 * d * i + 2 * d
    return v * d * (1 if c["tie_word_embeddings"] else 2) + n * layer + d


def _falcon_mamba_params(c: dict) -> int:
    d, e, n, r, k, v = (c["hidden_size"], c["intermediate_size"], c["state_size"], c["time_step_rank"],
                        c["conv_kernel"], c["vocab_size"])
    layer = d * 2 * e + e * k + e + e * (r + 2 * n) + r * e + e + e * n + e + e * d + d
    return 2 * v * d + c["num_hidden_layers"] * layer + d


def _llamba_params(c: dict) -> int:
    d, s, m = c["d_model"], c["ssm_cfg"], c["mlp_cfg"]
    e, g, n, h = d * s["expand"], s["n_qk_heads"], s["d_state"], s["n_v_heads"]
    conv = e + 2 * g * n
    mixer = d * (2 * e + 2 * g * n + h) + e + conv * 4 + conv + h + e * d
    v = c["vocab_size"] + (-c["vocab_size"]) % c["pad_vocab_size_multiple"]
    layer = mixer + 3 * d * m["intermediate_size"] + 2 * d
    return v * d * (1 if c["tie_embeddings"] else 2) + c["n_layer"] * layer + d


@pytest.mark.parametrize("name, exact, published, tol", [
    ("meta-llama/Llama-3.1-8B", 8_030_261_248, 8.03e9, 0.005e9),
    ("meta-llama/Llama-3.2-1B", 1_235_814_400, 1.24e9, 0.005e9),
    ("tiiuae/falcon-mamba-7b", 7_272_665_088, 7.27e9, 0.005e9),
    ("cartesia-ai/Llamba-8B", 8_841_204_736, None, None),
    ("Zyphra/Zamba2-7B", 7_356_749_648, 7.4e9, 0.05e9),
    ("state-spaces/mamba2-2.7b", 2_702_599_680, 2.7e9, 0.05e9),
    ("tiiuae/Falcon-H1-0.5B-Base", 521_411_104, 0.5e9, 0.05e9),
    ("ai21labs/AI21-Jamba-1.5-Mini", 51_570_323_328, 52e9, 0.5e9),
])
def test_parameter_counts_are_the_published_ones(shipped, name, exact, published, tol):
    n = meta.param_count(shipped[name].model)
    assert n == exact
    if published is not None:  # model cards round: 8.03B, 1.24B, 7.27B, "7B"/7.4B, 2.7B, 0.5B, 52B total
        assert abs(n - published) <= tol, (name, n)
    raw, _ = meta.config_of(name)
    by_hand = {"meta-llama/Llama-3.1-8B": _llama_params, "meta-llama/Llama-3.2-1B": _llama_params,
               "tiiuae/falcon-mamba-7b": _falcon_mamba_params, "cartesia-ai/Llamba-8B": _llamba_params}
    if name in by_hand:
        assert by_hand[name](raw) == n


def test_every_shipped_config_has_a_recorded_source():
    sources = (meta.CONFIG_DIR / "SOURCES.md").read_text()
    for name, file in meta.shipped().items():
        assert f"`{name}`" in sources and file.name in sources, name
        assert json.loads(file.read_text())  # valid JSON


def test_jamba_active_parameters_are_about_twelve_billion(shipped):
    prof = planner.profile(shipped["ai21labs/AI21-Jamba-1.5-Mini"])
    active = sum(layer.params for layer in prof.layers) + 2 * prof.vocab * prof.d_model
    assert 11.5e9 < active < 12.5e9  # AI21: 12B active of 52B


def test_llama_paper_heads_and_gqa(shipped):
    ad = shipped["meta-llama/Llama-3.1-8B"]
    heads = expand("L16H22,L17H24", ad)
    assert [str(h) for h in heads] == ["L16H22", "L17H24"]
    assert meta.kv_head(ad, HeadId(17, 24)) == 6 and meta.kv_head(ad, HeadId(16, 22)) == 5  # 32 queries, 8 KV heads
    mixer = ad.mixer(17)
    assert (mixer.num_heads, mixer.head_dim, mixer.out_proj.in_features) == (32, 128, 4096)
    assert mixer.head_slice(24) == slice(3072, 3200)
    for bad, msg in (("L17H32", "out of range"), ("L32H0", "out of range")):
        with pytest.raises(GandaError, match=msg):
            expand(bad, ad)


def test_llamba_falcon_mamba_and_zamba2_paper_heads(shipped):
    llamba = shipped["cartesia-ai/Llamba-8B"]
    assert [str(h) for h in expand("L16H10,L17H3,L17H9", llamba)] == ["L16H10", "L17H3", "L17H9"]
    assert (llamba.mixer(17).num_heads, llamba.mixer(17).head_dim) == (32, 128)
    fm = shipped["tiiuae/falcon-mamba-7b"]
    assert (fm.mixer(30).num_heads, fm.mixer(30).head_dim) == (8192, 1)  # every inner channel is a head
    assert len(expand("L30H5000-5007", fm)) == 8
    with pytest.raises(GandaError, match="out of range"):
        expand("L30H8192", fm)
    z = shipped["Zyphra/Zamba2-7B"]
    assert z.shared_blocks() == {"block0": [6, 17, 29, 41, 53, 65, 77], "block1": [11, 23, 35, 47, 59, 71]}
    b0 = expand("B0H3", z)
    assert [h.layer for h in b0] == [6, 17, 29, 41, 53, 65, 77] and all(h.kind == "attn" and h.head == 3 for h in b0)
    assert (z.mixer(6, "attn").num_heads, z.mixer(6, "attn").head_dim) == (32, 224)
    assert (z.mixer(5).num_heads, z.mixer(5).head_dim) == (112, 64)
    with pytest.raises(GandaError, match="several mixers"):
        expand("L6H3", z)
    with pytest.raises(GandaError, match="no attn mixer"):
        expand("L5.attnH0", z)


def _hooks(adapter) -> int:
    return sum(len(m.out_proj._forward_pre_hooks) for m in adapter.mixers())


@pytest.mark.parametrize("name", sorted(meta.shipped()))
def test_every_intervention_registers_on_the_meta_model(shipped, name):
    ad = shipped[name]
    n = len(ad.original_layers())
    first = ad.mixers()[-1]
    head = ad.canonical(HeadId(first.layer, first.num_heads - 1, first.kind))
    before = _hooks(ad)
    for iv in (AblateHeads([head]), KeepHeads([head], kind=first.kind), AblateHeads([head], positions="query")):
        with iv.apply(ad):
            assert _hooks(ad) == before + 1
        assert _hooks(ad) == before
    for iv, kept in ((KeepLayers(range(n // 2)), n // 2), (RemoveLayers([1]), n - 1)):
        with iv.apply(ad):
            assert len(ad.decoder_layers()) == kept
        assert ad.decoder_layers() is ad.original_layers()
    attn = [m for m in ad.mixers() if m.kind == "attn"]
    if attn:
        with mask_last_row([ad.canonical(HeadId(attn[0].layer, 0, "attn"))]).apply(ad):
            assert _hooks(ad) == before + 1


def test_transplant_paths_accept_full_size_models(shipped):
    llamba, llama = shipped["cartesia-ai/Llamba-8B"], shipped["meta-llama/Llama-3.1-8B"]
    with TransplantLayer(llama, [17]).apply(llamba):
        assert type(llamba.decoder_layers()[17]).__name__ == "DonorBlock"
    assert llamba.decoder_layers() is llamba.original_layers()
    before = _hooks(llamba)
    with TransplantHead(llama, "L17H3", "L17H24").apply(llamba):
        assert _hooks(llamba) >= before + 1
    assert _hooks(llamba) == before


def test_info_meta_on_shipped_names_and_config_files(capsys, tmp_path):
    assert main(["info", "meta-llama/Llama-3.1-8B", "--meta", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["n_params"], out["n_layers"], out["heads"]) == (8_030_261_248, 32, 1024)
    assert out["mixers"] == [{"layers": "0-31", "n": 32, "kind": "attn", "num_heads": 32, "head_dim": 128,
                              "kv_heads": 8}]
    cfg = tmp_path / "config.json"
    cfg.write_text((meta.CONFIG_DIR / "tiiuae--falcon-mamba-7b.json").read_text())
    assert main(["info", str(cfg), "--meta", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["n_params"], out["n_layers"], out["heads"]) == (7_272_665_088, 64, 64 * 8192)
    assert main(["info", "cartesia-ai/Llamba-8B", "--meta"]) == 0
    assert "8,841,204,736 parameters" in capsys.readouterr().out


def test_info_prints_one_line_per_run_of_identical_layers(capsys, tmp_path, byte_tok):
    """Thirty identical layers are one line, not thirty: the loaded model reads as --meta does."""
    make_tiny_llama(len(byte_tok), layers=30, ctx=128).save_pretrained(tmp_path / "deep", safe_serialization=True)
    assert main(["info", str(tmp_path / "deep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[1].endswith("30 layers, 120 heads (120 attn); context 128 tokens"), lines[1]
    assert lines[2] == "  layers 0-29: attn, 4 heads of 8, 2 KV heads"
    assert main(["info", str(tmp_path / "deep"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mixers"] == [{"layers": "0-29", "n": 30, "kind": "attn", "num_heads": 4, "head_dim": 8,
                              "kv_heads": 2}]
    assert (out["n_layers"], out["heads"], out["n_ctx"]) == (30, 120, 128)


@pytest.mark.parametrize("argv, match", [
    (["info", "missing.json", "--meta"], "no config for 'missing.json'"),
    (["info", "acme/not-cached", "--meta"], "is not in the Hugging Face cache"),
])
def test_info_meta_refusals(argv, match, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ganda: error:") and match in err and len(err.splitlines()) == 1


def test_a_config_transformers_rejects_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4}))
    with pytest.raises(GandaError, match="cannot build a llama model"):
        meta.build(str(bad))
    bad.write_text(json.dumps({"model_type": "rwkv"}))
    with pytest.raises(GandaError, match="unsupported architecture 'rwkv'"):
        meta.build(str(bad))


# ---- hub ids ----------------------------------------------------------------------------------

@pytest.fixture()
def hub_cache(tmp_path, monkeypatch, byte_tok):
    """A real hub-layout cache holding ``acme/tiny-llama`` at one commit, used offline."""
    repo = tmp_path / "models--acme--tiny-llama"
    snap = repo / "snapshots" / COMMIT
    make_tiny_llama(len(byte_tok), ctx=256).save_pretrained(snap)
    byte_tok.save_pretrained(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_hub_id_recognition(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_id("meta-llama/Llama-3.1-8B") and hub.is_hub_id("org/name@v1.0")
    for spec in ("a/b/c", "./a/b", "/abs/path", "name", "org/model.gguf", "org/config.json", "lab-llama"):
        assert not hub.is_hub_id(spec), spec
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert not hub.is_hub_id("org/local")  # an existing directory is a path
    assert hub.split("org/name@abc") == ("org/name", "abc")


def test_load_by_hub_id_offline_records_the_commit(hub_cache):
    ad = ganda.load_model("acme/tiny-llama", device="cpu")
    assert ad.spec == f"acme/tiny-llama@{COMMIT}" and ad.tokenizer is not None
    same = ganda.load_model("acme/tiny-llama", revision=COMMIT, device="cpu")
    ids = torch.randint(0, 300, (1, 9))
    assert torch.equal(ad.forward(ids), same.forward(ids))
    for bad, match in (("acme/other", "acme/other@main is not in the Hugging Face cache"),
                       ("acme/tiny-llama@v2", "HF_HUB_OFFLINE=1 forbids")):
        with pytest.raises(GandaError, match=match):
            ganda.load_model(bad, device="cpu")
    with pytest.raises(GandaError, match="revision='x' is for hub ids"):
        ganda.load_model("lab-llama", revision="x")


def test_eval_by_hub_id_records_the_commit_in_its_result(hub_cache, capsys):
    assert main(["eval", "acme/tiny-llama", "--task", "letters", "-n", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["model"] == f"acme/tiny-llama@{COMMIT}" and res["n"] == 4
    assert main(["info", "acme/tiny-llama", "--meta", "--json"]) == 0  # config alone, from the cache
    assert json.loads(capsys.readouterr().out)["source"] == f"acme/tiny-llama@{COMMIT}"


def test_a_cached_repository_without_safetensors_is_refused(hub_cache):
    snap = hub_cache / "models--acme--pickled" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((hub_cache / "models--acme--tiny-llama" / "snapshots" / COMMIT /
                                       "config.json").read_text())
    (snap / "pytorch_model.bin").write_bytes(b"not loaded")
    (hub_cache / "models--acme--pickled" / "refs").mkdir()
    (hub_cache / "models--acme--pickled" / "refs" / "main").write_text(COMMIT)
    with pytest.raises(GandaError, match="publishes no \\*.safetensors weights"):
        ganda.load_model("acme/pickled", device="cpu")


# ---- the planner ------------------------------------------------------------------------------

def test_plan_counts_flops_and_bytes_by_hand(shipped):
    prof = planner.profile(shipped["meta-llama/Llama-3.1-8B"])
    T, L, d, V = 100, 32, 4096, 128256
    w = planner.Workload(n=1, tokens=T, max_tokens=T)
    pl = planner.plan(prof, "eval", w, "h100")
    nonembed = 8_030_261_248 - 2 * V * d
    # final norm has no matmul; logits only where the choice letters are read (one position)
    by_hand = 2 * (nonembed - d) * T + L * 4 * 32 * 128 * T * T + 2 * d * V
    assert math.isclose(pl.flops, by_hand, rel_tol=1e-3)
    assert pl.memory["weights"] == 2 * 8_030_261_248
    # a sweep with layer skipping: layer k's heads rerun layers k..31 only
    sw = planner.plan(prof, "sweep", w, "h100", layer_skip=True, batch_heads=32)
    per_layer = [prof.layers[k].flops(T) for k in range(L)]
    reads = 2 * d * V * 4  # four choices read at the packed positions
    # the intact scores come from the recording pass; then each layer's heads rerun layers k..
    want = (sum(per_layer) + reads) + sum(32 * (sum(per_layer[k:]) + reads) for k in range(L))
    assert math.isclose(sw.flops, want, rel_tol=1e-6)
    # 532x the FLOPs; one question's eval on a GPU is mostly its 46 ms of host time
    assert sw.seconds > pl.seconds * 10 and sw.flops > pl.flops * 500


def test_plan_prices_graddrop_blocks_ssd_layer_calls_and_host_floors(shipped):
    prof = planner.profile(shipped["meta-llama/Llama-3.1-8B"])
    w = planner.Workload(n=8, tokens=100, max_tokens=100)

    def backward(method, **opts):
        pl = planner.plan(prof, "attribution", w, "h100", method=method, verify_top=0, audit=0, **opts)
        return next(p["flops"] for p in pl.phases if p["phase"].startswith("layer-by-layer backward"))

    v = planner.DEVICES["h100"].vjp_cost  # forwards per input-gradient VJP (attention's backward kernels)
    assert 1.0 <= v <= 3.0 and planner.DEVICES["cpu"].vjp_cost == 1.0
    plain = backward("atp")  # recompute + one VJP
    # per layer: recompute, the plain VJP, one VJP per block above (32 layers: blocks of 6,5,5,6,5,5)
    sizes = [6, 5, 5, 6, 5, 5]
    vjps = sum(n * (1 + (5 - b)) for b, n in enumerate(sizes)) / 32
    assert math.isclose(backward("atp*") / plain, (1 + v * vjps) / (1 + v), rel_tol=1e-9)
    assert math.isclose(backward("atp*", graddrop_blocks=None) / plain, (1 + v * 33 / 2) / (1 + v), rel_tol=1e-9)
    # IG runs k steps and a clean copy of every prompt through AtP's pass
    assert math.isclose(backward("ig", ig_steps=5) / plain, 6, rel_tol=1e-9)
    # a host's allocator keeps a code path's heap: small runs are floored on the CPU, not on a GPU
    small = planner.profile(ganda.from_model(make_tiny_llama(64)))
    w = planner.Workload(n=4, tokens=8, max_tokens=8)
    floor = planner.DEVICES["cpu"].act_floor["sweep"]
    cpu, gpu = planner.plan(small, "sweep", w, "cpu"), planner.plan(small, "sweep", w, "h100")
    assert gpu.memory["activations"] < floor / 25 and cpu.memory["activations"] == floor  # 4 examples a forward
    big = planner.plan(prof, "sweep", w, "cpu")  # 128k-entry logits: far above the floor
    assert big.memory["activations"] == planner.plan(prof, "sweep", w, "h100").memory["activations"] > floor
    # a Mamba-2 layer call costs its chunked path's extra overhead once per layer and forward
    mamba2 = planner.profile(ganda.from_model(Mamba2ForCausalLM(Mamba2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_heads=8, head_dim=8, state_size=8, n_groups=2,
        expand=2, chunk_size=16))))
    cpu_dev = planner.DEVICES["cpu"]
    bare = dataclasses.replace(cpu_dev, ssd_layer_overhead=0.0)
    ev = planner.Workload(n=10, tokens=8, max_tokens=8)
    with_ssd, without = planner.plan(mamba2, "eval", ev, cpu_dev), planner.plan(mamba2, "eval", ev, bare)
    calls = sum(p["forwards"] for p in with_ssd.phases)
    assert math.isclose(with_ssd.seconds - without.seconds, calls * 3 * cpu_dev.ssd_layer_overhead, rel_tol=1e-9)
    assert planner.plan(small, "eval", ev, cpu_dev).seconds == planner.plan(small, "eval", ev, bare).seconds


def test_plan_batches_backward_passes_as_the_run_does(shipped):
    """On a GPU a backward pass's batch is what fits beside the weights (default_batch_tokens):
    GradDrop's cotangents only for AtP*, and path ablation at attribution's default blocks."""
    prof = planner.profile(shipped["meta-llama/Llama-3.1-8B"])
    h100 = planner.DEVICES["h100"]
    free = h100.memory - prof.weight_bytes - h100.runtime
    w = planner.Workload(n=1000, tokens=300, max_tokens=300)

    def rows(experiment, phase, **opts):
        pl = planner.plan(prof, experiment, w, "h100", **opts)
        return next(p["rows"] for p in pl.phases if p["phase"].startswith(phase))

    def fits(blocks):  # the run's rule, default_batch_tokens, for 8B bf16 on an H100
        return batch_tokens_for(32, 4096, 2, blocks, free) // 300

    assert fits(0) > fits(6)  # fewer cotangents kept, more prompts a batch
    assert rows("attribution", "no-grad pass", method="atp") == fits(0) == 218
    assert rows("attribution", "no-grad pass", method="atp*") == fits(6) == 206
    assert rows("path", "intact pass", sender="L1H0", receiver="L3H1") == fits(6)  # not the CPU's 4,096 tokens
    assert rows("path", "intact pass", sender="L1H0", receiver="L3H1", batch_tokens=3000) == 10


def test_plan_holds_the_fallback_sweeps_logits(shipped):
    """The activation term the H200's Llamba-8B sweep peak showed (docs/scale.md): the sweep without
    layer skipping takes an fp32 log-softmax at every position of every row."""
    prof = planner.profile(shipped["cartesia-ai/Llamba-8B"])
    # 8 heads of one layer per forward; the longest of 8 prompts 916 tokens, their mean 484.5: the
    # H200 measured 8.74 GiB above the weights
    sweep = planner.plan(prof, "sweep", planner.Workload(n=8, tokens=484.5, max_tokens=916), "h200",
                         heads_per_layer=[8 if i in (0, 16) else 0 for i in range(32)], batch_heads=16,
                         layer_skip=False)
    assert sweep.memory["activations"] == pytest.approx(8.74 * 2**30, rel=0.05)


def test_plan_verifies_the_larger_of_the_estimates_and_the_activitys_top(shipped):
    """``--active K`` beside ``--verify-top V``: the two lists overlap, so the exact check is planned
    for max(V, K) heads (and the audit): the same check as ``--verify-top`` max(V, K) alone."""
    prof = planner.profile(shipped["meta-llama/Llama-3.1-8B"])
    w = planner.Workload(n=8, tokens=100, max_tokens=100)

    def check(**opts):
        pl = planner.plan(prof, "attribution", w, "h100", method="atp", audit=5, **opts)
        return sum(p["flops"] for p in pl.phases if p["phase"].startswith("exact check"))

    assert check(verify_top=10, active=30) == check(verify_top=30, active=0) > check(verify_top=10, active=0) * 2
    assert check(verify_top=30, active=10) == check(verify_top=30, active=0)
    assert check(verify_top=10, active=30, widen=10) == check(verify_top=40, active=0)  # --widen's first round
    assert check() == check(verify_top=10, active=30)  # the default rule


def test_plan_verifies_only_the_ranked_heads(shipped):
    """``rank --heads``: the exact check picks from the ranked heads only (a ranking of one head
    verifies one), every ranked head of ``--verify-layers``, and never more in a layer than it ranks."""
    prof = planner.profile(shipped["meta-llama/Llama-3.1-8B"])
    w = planner.Workload(n=8, tokens=100, max_tokens=100)

    def verified(**opts):
        pl = planner.plan(prof, "attribution", w, "h100", method="atp", **opts)
        return next(int(p["phase"].split()[3]) for p in pl.phases if p["phase"].startswith("exact check"))

    one = [1] + [0] * 31
    assert verified(heads_per_layer=one) == 1 < verified() == 30
    assert verified(heads_per_layer=[2, 3] + [0] * 30, verify_layers=[1]) == 5  # 3 of layer 1, then the 2 others
    assert planner.spread_over(6, {0: 1, 5: 32, 9: 2}) == {0: 1, 5: 3, 9: 2}  # what a layer cannot hold moves on
    assert sorted(planner.spread_over(30, {k: 32 for k in range(32)}).values()) == [0] * 2 + [1] * 30


def test_plan_takes_every_option_of_the_experiment_whichever_way_it_comes(capsys):
    """Flags, ``--option`` and the commands' short flags build one Options: the same plan each way, a
    required option or a rule's other half given by ``--option`` beside a flag included; the edge
    pass's ``--senders``/``--receivers`` and transplant's ``--layers``/``--head`` change the work."""
    def plan(*argv: str) -> dict:  # lab-llama: 3 layers of 4 heads
        assert main(["plan", "lab-llama", "-t", "lab-mmlu", "-n", "6", "--device", "cpu", "--json", "-q", *argv]) == 0
        return json.loads(capsys.readouterr().out)

    assert plan("-e", "sweep", "--option", "batch_heads=1") == plan("-e", "sweep", "--batch-heads", "1") \
        != plan("-e", "sweep")
    assert plan("-e", "rank", "-k", "1", "-m", "ig", "--active", "0") == \
        plan("-e", "rank", "--verify-top", "1", "--option", "method=ig", "--active", "0") != plan("-e", "rank")
    assert plan("-e", "transplant", "--option", "donor=lab-llama") == plan("-e", "transplant", "--donor", "lab-llama")
    assert plan("-e", "path", "--from", "L0H0", "--option", "receiver=L1H0") == \
        plan("-e", "path", "--from", "L0H0", "--to", "L1H0") != plan("-e", "path", "--from", "L0H0", "--to", "L2H0")
    flops = {k: plan("-e", "transplant", "--donor", "lab-llama", *argv)["flops"] for k, argv in (
        ("every", ()), ("flag", ("--layers", "1")), ("option", ("--option", "layers=1")), ("head", ("--head", "L2H0")),
        ("two", ("--head", "L2H0-1")))}
    assert flops["flag"] == flops["option"] == flops["head"] < flops["two"] < flops["every"]
    assert plan("-e", "prune", "--layers", "2") == plan("-e", "prune", "--option", "layers=2")
    edges = plan("-e", "edges")
    senders = plan("-e", "edges", "--senders", "L0H*,L1H*")  # the heads that send an edge: fewer writes kept
    assert senders["flops"] == edges["flops"] and senders["memory"]["kept"] < edges["memory"]["kept"]
    narrow = plan("-e", "edges", "--receivers", "L2H0")
    assert narrow["flops"] < plan("-e", "edges", "--receivers", "L1H0,L2H0")["flops"] < edges["flops"]
    check = next(p for p in narrow["phases"] if p["phase"].startswith("exact check"))
    assert check["phase"].startswith("exact check of 8 edges") and check["layers"] == 1  # from L2 on
    assert "12 senders and 1 receivers" in narrow["notes"][0]


def test_plan_help_names_every_experiment_of_a_shared_flag():
    """A flag several experiments take names them all, and says one meaning only where they agree."""
    from ganda.commands.plan import build_plan

    helps = {p.name: p.help for p in build_plan().params}
    assert helps["verify_top"].startswith("edges, rank: ")  # neither one's meaning for both
    assert "top edges" not in helps["verify_top"] and "top heads" not in helps["verify_top"]
    assert helps["ablation"].startswith("edges, path, rank, sweep: ") and "senders" not in helps["ablation"]
    assert helps["layers"].startswith("prune, transplant: ")
    assert helps["margin"] == "edges, path, rank: " + ganda.attribution.ranking.MARGIN_HELP


def test_plan_splits_a_model_that_does_not_fit_and_scales_with_devices(shipped):
    prof = planner.profile(shipped["ai21labs/AI21-Jamba-1.5-Mini"])
    w = planner.Workload(n=100, tokens=200, max_tokens=200)
    one = planner.plan(prof, "eval", w, "l40s", n_devices=1)
    eight = planner.plan(prof, "eval", w, "l40s", n_devices=8)
    assert one.devices_per_replica == 3  # ~96 GiB of bf16 weights over 48 GB cards
    assert math.isclose(eight.seconds_n, one.seconds / 2, rel_tol=1e-9)  # 8 cards = 2 copies of 3
    assert any("does not fit" in n and "(the weights)" in n for n in one.notes)
    # on an H200 the weights fit; a million-token prompt's pass does not, and the note says which
    long = planner.plan(prof, "eval", planner.Workload(n=1, tokens=1_000_000, max_tokens=1_000_000), "h200")
    assert long.devices_per_replica > 1
    assert any("(the activations and kept tensors beside the weights)" in n for n in long.notes), long.notes
    assert not any("does not fit" in n for n in planner.plan(prof, "eval", w, "h200").notes)


def test_plan_loads_in_the_precision_a_run_would_and_names_a_bad_one_where_it_came_from(capsys, monkeypatch):
    """No --dtype: GANDA_DTYPE, else fp32 on the CPU and bf16 on an accelerator, as a run loads."""
    def dtype(*argv):
        assert main(["plan", "meta-llama/Llama-3.1-8B", "-e", "eval", "-n", "10", "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out)["dtype"]

    monkeypatch.delenv("GANDA_DTYPE", raising=False)  # the suite pins it
    assert (dtype("--device", "cpu"), dtype("--device", "h100"), dtype("--dtype", "fp32")) == (
        "float32", "bfloat16", "float32")
    monkeypatch.setenv("GANDA_DTYPE", "fp16")
    assert (dtype("--device", "cpu"), dtype("--dtype", "bf16")) == ("float16", "bfloat16")
    monkeypatch.setenv("GANDA_DTYPE", "bogus")
    assert main(["plan", "meta-llama/Llama-3.1-8B", "-e", "eval", "-n", "10"]) == 2
    assert "GANDA_DTYPE='bogus' is not a precision" in capsys.readouterr().err


def test_plan_command_and_the_papers_runs(capsys):
    assert main(["plan", "meta-llama/Llama-3.1-8B", "-e", "sweep", "--task", "mmlu", "-n", "1000", "--json"]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert sweep["experiment"] == "sweep" and sweep["workload"]["n"] == 1000 and sweep["flops"] > 1e17
    assert main(["plan", "--paper", "--json", "--devices", "8"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["experiment"] for r in runs] == ["sweep", "attribution", "maps", "maps"]
    assert runs[1]["seconds"] < runs[0]["seconds"]  # attribution is the cheap way to rank
    assert runs[3]["memory"]["host"] == 8192 * 4096 * 4096 * 4  # one layer's full channel maps, on the host
    flops = {}
    for blocks in ("6", "0"):
        assert main(["plan", "meta-llama/Llama-3.1-8B", "-e", "attribution", "-n", "100", "--method", "atp*",
                     "--graddrop-blocks", blocks, "--json"]) == 0
        phases = json.loads(capsys.readouterr().out)["phases"]
        flops[blocks] = next(ph["flops"] for ph in phases if ph["phase"].startswith("layer-by-layer backward"))
    # per layer a recompute, the plain VJP and one per GradDrop block above: per-layer blocks give
    # a recompute and 1 + 15.5 VJPs, 6 blocks 1 + 2.5625 (the average over 32 layers); a VJP costs
    # the device's vjp_cost forwards
    v = planner.DEVICES["h100"].vjp_cost
    assert flops["0"] / flops["6"] == pytest.approx((1 + v * 16.5) / (1 + v * 3.5625), rel=1e-6)
    # the early-layer rule: every head of layers 0-1 (64 full-depth ablations) on top of the default
    # rule's 30 spread heads (the larger of its top 10 by estimate and its 30 most active)
    assert main(["plan", "meta-llama/Llama-3.1-8B", "-e", "attribution", "-n", "100", "--verify-layers", "0,1",
                 "--json"]) == 0
    early = json.loads(capsys.readouterr().out)
    assert early["flops"] > 2 * flops["6"]
    assert any("exact check of 94 heads" in p["phase"] for p in early["phases"])
    for argv, match in ((["plan", "x.json"], "no config for"), (["plan", "--paper", "--device", "tpu"], "unknown device"),
                        (["plan", "meta-llama/Llama-3.1-8B", "-e", "train"], "--experiment must be one of"),
                        (["plan", "meta-llama/Llama-3.1-8B", "--devices", "0"], "--devices must be at least 1"),
                        (["plan", "meta-llama/Llama-3.1-8B", "-e", "attribution", "--graddrop-blocks", "-2"],
                         "--graddrop-blocks"),
                        (["plan", "meta-llama/Llama-3.1-8B", "-e", "attribution", "--verify-layers", "40"],
                         "outside the model's layers")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and len(err.splitlines()) == 1


# ---- bf16 on every family ---------------------------------------------------------------------

IDS = torch.randint(0, 60, (1, 13), generator=torch.Generator().manual_seed(2))
BF16_RECON = 2e-2  # measured worst 1.1e-2 (Falcon-Mamba): the bf16 mixer's own output is the reference
BF16_MAPS = 3e-2  # measured worst 1.5e-2: bf16 maps against fp32 maps of the same weights


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_ablation_maps_and_last_row(family):
    m32 = tiny_model(family)
    a32, a16 = ganda.from_model(m32), ganda.from_model(copy.deepcopy(m32).to(torch.bfloat16))
    assert next(a16.model.parameters()).dtype == torch.bfloat16
    for m in a16.mixers():
        h = a16.canonical(HeadId(m.layer, m.num_heads - 1, m.kind))
        d = ablation_diff(a16, IDS, h)
        assert d["equiv"] == 0.0 and d["effect"] > 0, (str(h), d)  # exact in bf16 too
        assert last_row_diff(a16, IDS, [a16.canonical(HeadId(m.layer, 1, m.kind))])["before"] == 0.0
        if m.kind == "ssm":
            assert reconstruction_error(a16, IDS, m.layer)["full"] < BF16_RECON
    heads = a16.heads("ssm")[:8]
    M32, M16 = a32.attention_maps(IDS, heads), a16.attention_maps(IDS, heads)
    for h in heads:
        assert M16[h].dtype == torch.float32  # accumulated in fp32 from the bf16 parameters
        assert float((M16[h] - M32[h]).norm() / M32[h].norm()) < BF16_MAPS


def _tiny_mamba2(vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_heads=8,
                                           head_dim=8, state_size=8, n_groups=2, expand=2, chunk_size=16))
    _randomise_ssm(model)
    return model.eval()


@pytest.mark.parametrize("arch", ["llama", "mamba2"])
def test_bf16_sweep_fast_equals_naive(byte_tok, arch):
    model = make_tiny_llama(len(byte_tok)) if arch == "llama" else _tiny_mamba2(len(byte_tok))
    ad = ganda.from_model(model.to(torch.bfloat16), byte_tok)
    exs = get_task("letters").examples(limit=6, seed=0) + get_task("kv", pairs=3).examples(limit=4, seed=0)
    fast, naive = run_sweep(ad, exs, progress=False), run_sweep(ad, exs, naive=True, progress=False)
    assert [r["pred"] for r in fast.records] == [r["pred"] for r in naive.records]
    worst = max(abs(x - y) for a, b in zip(fast.records, naive.records, strict=True)
                for la, lb in zip(a["loglik"], b["loglik"], strict=True) for x, y in zip(la, lb, strict=True))
    assert worst <= 0.05  # measured 0.0 (same bf16 arithmetic); bf16 rounding bound for reordered sums


def test_dtype_from_the_environment_and_the_command_line(tiny_dir, monkeypatch, capsys):
    monkeypatch.setenv("GANDA_DTYPE", "bfloat16")
    assert next(ganda.load_model(str(tiny_dir), device="cpu").model.parameters()).dtype == torch.bfloat16
    monkeypatch.delenv("GANDA_DTYPE")
    assert main(["--dtype", "bf16", "eval", str(tiny_dir), "--task", "letters", "-n", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 3
    assert "GANDA_DTYPE" not in os.environ  # the option holds for one command
    assert main(["--dtype", "int8", "eval", str(tiny_dir)]) == 2
    assert "is not a precision" in capsys.readouterr().err


@pytest.mark.slow
def test_bf16_mmlu_predictions_match_fp32_on_smollm2(smollm2):
    b16 = ganda.load_model("smollm2-135m", device="cpu", dtype=torch.bfloat16)
    # five questions: bf16 matmuls on a CPU without bf16 instructions take 3 s a question
    exs = get_task("mmlu", sample=True).examples(limit=5, seed=0)
    r32 = evaluate_examples(smollm2, exs, progress=False)
    r16 = evaluate_examples(b16, exs, progress=False)
    agree = sum(p["pred"] == q["pred"] for p, q in zip(r32.predictions, r16.predictions, strict=True))
    worst = max(abs(x - y) for p, q in zip(r32.predictions, r16.predictions, strict=True)
                for x, y in zip(p["loglik"], q["loglik"], strict=True))
    assert agree == 5 and worst < 1.0  # measured on 40 questions: 40/40 agree, worst |Δ log-lik| 0.38


# ---- placed on disk ---------------------------------------------------------------------------

def _offloaded(directory: Path, device_map: dict) -> ganda.ModelAdapter:
    return ganda.load_model(str(directory), device="cpu", device_map=device_map, offload_folder=tempfile.mkdtemp())


def test_disk_offload_gives_identical_logits_ablations_maps_and_sweeps(tiny_dir):
    mem = ganda.load_model(str(tiny_dir), device="cpu")
    off = _offloaded(tiny_dir, {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                                "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
                                "lm_head": "cpu"})
    assert off.model.hf_device_map["model.layers.2"] == "disk"
    assert off.mixer(2).out_proj.weight.device.type == "meta"  # really not in memory between forwards
    ids = torch.randint(0, 300, (1, 21))
    with torch.no_grad():
        assert torch.equal(mem.forward(ids), off.forward(ids))
        for h in ("L1H2", "L2H0", "L0H3"):
            with AblateHeads(h).apply(mem):
                a = mem.forward(ids)
            with AblateHeads(h).apply(off):
                b = off.forward(ids)
            assert torch.equal(a, b) and not torch.equal(a, mem.forward(ids))
    heads = [HeadId(2, 1), HeadId(1, 3)]
    ma, mb = mem.attention_maps(ids, heads), off.attention_maps(ids, heads)
    assert all(torch.equal(ma[h], mb[h]) for h in heads)
    exs = get_task("letters").examples(limit=3, seed=0)
    sa, sb = run_sweep(mem, exs, progress=False), run_sweep(off, exs, progress=False)
    assert [r["loglik"] for r in sa.records] == [r["loglik"] for r in sb.records]


def test_disk_offloaded_ssm_maps_match(tmp_path):
    tiny_model("mamba2").save_pretrained(tmp_path)
    mem = ganda.load_model(str(tmp_path), device="cpu")
    off = _offloaded(tmp_path, {"backbone.embeddings": "cpu", "backbone.layers.0": "cpu", "backbone.layers.1": "disk",
                                "backbone.layers.2": "disk", "backbone.norm_f": "cpu", "lm_head": "cpu"})
    ids = IDS
    heads = [HeadId(2, 3), HeadId(1, 0)]
    with torch.no_grad():
        assert torch.equal(mem.forward(ids), off.forward(ids))
        with AblateHeads([heads[0]]).apply(off):
            b = off.forward(ids)
        with AblateHeads([heads[0]]).apply(mem):
            assert torch.equal(mem.forward(ids), b)
    ma, mb = mem.attention_maps(ids, heads), off.attention_maps(ids, heads)
    assert all(torch.equal(ma[h], mb[h]) for h in heads)
    assert off.mixer(2).module.dt_bias.device.type == "meta"  # put back on disk after reading


def test_device_map_refusals(tiny_dir, monkeypatch):
    # a CUDA index this machine lacks: refused whether or not it has CUDA
    absent = (f'{{"model.layers.0": {torch.cuda.device_count() + 3}}}',
              r"CUDA device\(s\)" if torch.cuda.is_available() else "CUDA is not available")
    for bad, match in (("everywhere", "expected auto"), ('{"model.layers.0": "gpu"}', "not a device"),
                       ("{oops", "not valid JSON"), absent):
        with pytest.raises(GandaError, match=match):
            placement.parse_device_map(bad)
    with pytest.raises(GandaError, match="input embeddings are offloaded to disk"):
        _offloaded(tiny_dir, {"model.embed_tokens": "disk", "model.layers": "cpu", "model.norm": "cpu",
                              "model.rotary_emb": "cpu", "lm_head": "cpu"})
    with pytest.raises(GandaError, match="--offload-folder needs --device-map"):
        ganda.load_model(str(tiny_dir), device="cpu", offload_folder="x")
    monkeypatch.setenv("GANDA_DEVICE_MAP", "auto")
    auto = ganda.load_model(str(tiny_dir), device="cpu")
    assert set(auto.model.hf_device_map.values()) == ({0} if torch.cuda.is_available() else {"cpu"})  # accelerate's choice


def test_the_large_cpu_benchmark_runs_on_a_scaled_down_config(tmp_path):
    """benchmarks/bench_large_cpu.py's code path (meta build, bf16 materialisation, ablation, maps,
    planner comparison) on Llama-3.1-8B's config shrunk to ~10M parameters."""
    spec = importlib.util.spec_from_file_location("bench_large_cpu", ROOT / "benchmarks" / "bench_large_cpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(model="meta-llama/Llama-3.1-8B", tokens=64, heads="L16H22,L17H24", threads=1,
                              override=["num_hidden_layers=18", "hidden_size=256", "intermediate_size=512",
                                        "vocab_size=2048", "head_dim=8", "bos_token_id=1", "eos_token_id=2"])
    res = bench.run(args)
    assert res["n_params"] == 2 * 2048 * 256 + 18 * (256 * 256 * 2 + 2 * 256 * 64 + 3 * 256 * 512 + 512) + 256
    assert res["map_shapes"] == {"L16H22": [64, 64], "L17H24": [64, 64]}
    assert all(abs(v - 1.0) < 1e-2 for v in res["map_last_row_sums"].values())  # softmax rows, in bf16
    assert res["ablation_effect_last_logits"] > 0 and res["predicted_forward_s"] > 0


def test_cuda_models_leave_cudnn_attention_out_unless_asked(monkeypatch):
    """cuDNN's SDPA kernel plans every new shape; a model on CUDA takes it out of PyTorch's choices
    (process-wide), a CPU model leaves the flag alone, and GANDA_CUDNN_SDPA=1 keeps it."""
    from ganda.device import CUDNN_SDPA_ENV, shape_free_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert not shape_free_attention(torch.device("cpu")) and torch.backends.cuda.cudnn_sdp_enabled()
        ganda.from_model(make_tiny_llama(64), None)  # on the CPU: nothing changes
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setenv(CUDNN_SDPA_ENV, "1")
        assert not shape_free_attention(torch.device("cuda")) and torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.delenv(CUDNN_SDPA_ENV)
        assert shape_free_attention(torch.device("cuda")) and not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_plan_prices_transformers_ssd_path_apart_from_gandas(shipped):
    """Zamba2's Mamba-2 mixers run transformers' own PyTorch SSD (no mamba_ssm); Llamba's run ganda's
    chunked SSD: only the first pay the device's ``library_ssd_scale``."""
    zamba, llamba = (planner.profile(shipped[s]) for s in ("Zyphra/Zamba2-7B", "cartesia-ai/Llamba-8B"))
    assert sum(lc.library_ssd for lc in zamba.layers) == sum(len(lc.ssd) for lc in zamba.layers) > 0
    assert sum(lc.library_ssd for lc in llamba.layers) == 0 and sum(len(lc.ssd) for lc in llamba.layers) > 0
    w = planner.Workload(n=8, tokens=700, max_tokens=700)
    h200 = planner.DEVICES["h200"]
    assert h200.library_ssd_scale > 1.0
    flat = dataclasses.replace(h200, library_ssd_scale=1.0)
    for prof, moves in ((zamba, True), (llamba, False)):
        scaled, plain = (planner.plan(prof, "eval", w, d).seconds for d in (h200, flat))
        assert (scaled > 1.2 * plain) if moves else scaled == plain


def test_plan_scores_multi_token_choices_as_the_prefix_cache_does(monkeypatch):
    """Choices of several tokens on a model that continues from a cached prompt: each prompt runs
    once and each example's choices as one batch of short rows (what the profiler counts: two
    forwards per example); without the cache, one whole row per choice."""
    ad = ganda.from_model(make_tiny_llama(64))
    w = planner.Workload(n=10, tokens=60.0, choices=5, choice_tokens=3.0, max_tokens=70)
    cached = planner.plan(planner.profile(ad), "eval", w, "cpu")
    assert [(p["forwards"], p["rows"]) for p in cached.phases] == [(10, 1), (10, 5)]
    monkeypatch.setenv("GANDA_PREFIX_CACHE", "0")
    whole = planner.plan(planner.profile(ad), "eval", w, "cpu")
    assert len(whole.phases) == 1 and whole.phases[0]["rows"] >= 5
    assert whole.flops > 3 * cached.flops  # 5 rows of 63 tokens against 60 + 5 x 3 tokens
    single = planner.Workload(n=10, tokens=60.0, choices=4, choice_tokens=1.0)  # MMLU letters: unchanged
    monkeypatch.delenv("GANDA_PREFIX_CACHE")
    assert len(planner.plan(planner.profile(ad), "eval", single, "cpu").phases) == 1
