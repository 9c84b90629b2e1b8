"""Models are loaded strictly and safely, and layer numbers always name the layers as loaded.

Covers: head ids and layer indices under layer edits (any order, any family), strict tensor
loading (missing / unexpected / wrongly shaped), no code from a model directory, one-line errors
for damaged files and bad settings, and the GGUF cache (concurrent builders, stale temporaries,
damaged entries). Every model here is a tiny real architecture built in code.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import tiny_model
from conftest import make_byte_tokenizer, make_tiny_llama

import ganda
from ganda import AblateHeads, GandaError, HeadId, KeepHeads, KeepLayers, RemoveLayers
from ganda.heads import expand
from ganda.interventions import parse_layers
from ganda.models import load_model
from ganda.models.loading import CACHE_MANIFEST

IDS = torch.tensor([[5, 17, 42, 8, 99, 23, 61, 7, 30, 12]])


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


def fresh_llama(layers: int = 4) -> ganda.ModelAdapter:
    ad = ganda.from_model(make_tiny_llama(128, layers=layers), None, spec="tiny")
    PRISTINE[id(ad)] = copy.deepcopy(ad.model)  # before any hook or layer edit
    return ad


PRISTINE: dict[int, torch.nn.Module] = {}


def by_hand(adapter: ganda.ModelAdapter, keep: list[int], zero: list[tuple[int, str | None, int]] = ()) -> torch.Tensor:
    """Logits of a pristine copy with only layers ``keep`` and the out_proj columns of ``zero`` heads
    set to 0: the reference that ablation by hooks must equal (no ganda intervention involved)."""
    ref = ganda.from_model(copy.deepcopy(PRISTINE[id(adapter)]))
    with torch.no_grad():
        for layer, kind, head in zero:
            mixer = ref.mixer(layer, kind)
            mixer.out_proj.weight[:, mixer.head_slice(head)] = 0
    layers = ref.original_layers()
    ref.set_decoder_layers(torch.nn.ModuleList([layers[i] for i in keep]))
    return ref.forward(IDS)


# ---- head ids and layer edits -----------------------------------------------------------

def test_head_ids_name_loaded_layers_when_first_used_inside_a_layer_edit():
    ad = fresh_llama()  # no head lookup yet: the first one happens inside RemoveLayers
    with RemoveLayers([1]).apply(ad), AblateHeads("L3H0").apply(ad):
        got = ad.forward(IDS)
    assert torch.allclose(got, by_hand(ad, [0, 2, 3], [(3, None, 0)]), atol=1e-6)
    assert not torch.allclose(got, by_hand(ad, [0, 2, 3], [(2, None, 0)]), atol=1e-4)
    layers = ad.original_layers()
    assert [m.layer for m in ad.mixers()] == [0, 1, 2, 3]
    assert all(m.module is layers[m.layer].self_attn for m in ad.mixers())
    assert ad.decoder_layers() is layers


def test_ablating_a_removed_layer_is_refused_in_either_order():
    ad = fresh_llama()
    with RemoveLayers([1]).apply(ad):
        with pytest.raises(GandaError, match=r"^L1H0: layer 1 is removed by remove-layers 1$"):
            with AblateHeads("L1H0").apply(ad):
                pass
        with pytest.raises(GandaError, match="layer 1 is removed"):
            with KeepHeads("L1H0").apply(ad):
                pass
    with AblateHeads("L2H1").apply(ad):
        with pytest.raises(GandaError, match="layer 2 would be removed while the ablation of L2H1 acts on it"):
            with KeepLayers([0, 1, 3]).apply(ad):
                pass
        assert len(ad.decoder_layers()) == 4
    assert not any(m.out_proj._forward_pre_hooks for m in ad.mixers())


def test_nested_layer_edits_index_loaded_layers_and_intersect():
    ad = fresh_llama()
    with RemoveLayers([0]).apply(ad), RemoveLayers([3]).apply(ad):  # 3 is a loaded index, not a position
        assert ad.active_layers() == [1, 2]
        got = ad.forward(IDS)
        with AblateHeads("L2H3").apply(ad):
            ablated = ad.forward(IDS)
    assert torch.allclose(got, by_hand(ad, [1, 2]), atol=1e-6)
    assert torch.allclose(ablated, by_hand(ad, [1, 2], [(2, None, 3)]), atol=1e-6)
    with KeepLayers([0, 1, 2]).apply(ad), KeepLayers([1, 2, 3]).apply(ad):
        assert torch.allclose(ad.forward(IDS), by_hand(ad, [1, 2]), atol=1e-6)
        with pytest.raises(GandaError, match="cannot remove every layer"):
            with KeepLayers([0, 3]).apply(ad):
                pass
    with RemoveLayers([0]).apply(ad), pytest.raises(GandaError, match="layer 4 out of range.*0-3"):
        with RemoveLayers([4]).apply(ad):
            pass
    assert ad.decoder_layers() is ad.original_layers()


def test_layer_edits_and_ablations_exit_in_any_order():
    ad = fresh_llama()
    intact = ad.forward(IDS)
    keep = KeepLayers([0, 2, 3]).apply(ad)
    ablate = AblateHeads("L2H1").apply(ad)
    keep.__enter__()
    ablate.__enter__()
    assert torch.allclose(ad.forward(IDS), by_hand(ad, [0, 2, 3], [(2, None, 1)]), atol=1e-6)
    keep.__exit__(None, None, None)  # the layer edit ends first; the ablation stays
    assert ad.decoder_layers() is ad.original_layers()
    assert torch.allclose(ad.forward(IDS), by_hand(ad, [0, 1, 2, 3], [(2, None, 1)]), atol=1e-6)
    ablate.__exit__(None, None, None)
    assert torch.equal(ad.forward(IDS), intact)

    a, b = RemoveLayers([1]).apply(ad), RemoveLayers([2]).apply(ad)
    a.__enter__()
    b.__enter__()
    assert ad.active_layers() == [0, 3]
    a.__exit__(None, None, None)
    assert ad.active_layers() == [0, 1, 3]
    assert torch.allclose(ad.forward(IDS), by_hand(ad, [0, 1, 3]), atol=1e-6)
    b.__exit__(None, None, None)
    assert ad.decoder_layers() is ad.original_layers() and torch.equal(ad.forward(IDS), intact)


def test_stand_in_blocks_compose_with_layer_edits():
    """``push_layer_edit(replace=...)`` (how a block transplant should enter) composes with removal."""
    ad = fresh_llama()
    layers = ad.original_layers()
    stand_in = copy.deepcopy(layers[3])
    with torch.no_grad():
        stand_in.self_attn.o_proj.weight.mul_(-1.0)
    swap = ad.push_layer_edit(range(4), "swap 1", replace={1: stand_in})
    with RemoveLayers([2]).apply(ad):
        assert list(ad.decoder_layers()) == [layers[0], stand_in, layers[3]]
        got = ad.forward(IDS)
    ad.pop_layer_edit(swap)
    assert ad.decoder_layers() is layers
    ref = ganda.from_model(copy.deepcopy(PRISTINE[id(ad)]))
    ref_layers = ref.original_layers()
    ref.set_decoder_layers(torch.nn.ModuleList([ref_layers[0], copy.deepcopy(stand_in), ref_layers[3]]))
    assert torch.allclose(got, ref.forward(IDS), atol=1e-6)
    with pytest.raises(GandaError, match="the layer list was replaced outside ganda's layer edits"):
        ad.set_decoder_layers(torch.nn.ModuleList([layers[0]]))
        try:
            with RemoveLayers([1]).apply(ad):
                pass
        finally:
            ad.set_decoder_layers(layers)


def test_wildcards_and_shared_blocks_cover_the_running_layers():
    ad = fresh_llama()
    with KeepLayers([0, 2]).apply(ad):
        assert [str(h) for h in expand("L*H0", ad)] == ["L0H0", "L2H0"]
        with pytest.raises(GandaError, match="layer 3 is removed by keep-layers 0,2"):
            with AblateHeads("L3H*").apply(ad):
                pass
    zamba = ganda.from_model(tiny_model("zamba2"))  # block0 runs at layers 1 and 4
    with RemoveLayers([1]).apply(zamba):
        assert [str(h) for h in expand("B0H2", zamba)] == ["L4.attnH2"]
    with RemoveLayers([3]).apply(zamba), pytest.raises(GandaError, match="B1H0: layer 3 is removed"):
        expand("B1H0", zamba)


FAMILIES = ["mamba2", "mamba", "llamba", "zamba2", "bamba", "falcon_h1", "jamba"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_names_loaded_layers_under_layer_edits(family):
    model = tiny_model(family)
    outside = ganda.from_model(copy.deepcopy(model))
    ad = ganda.from_model(model)
    n = len(ad.original_layers())
    with RemoveLayers([0]).apply(ad):  # first head lookup inside the edit
        assert ad.heads() == outside.heads()
        last = [m for m in ad.mixers() if m.layer == n - 1 and m.shared_key is None][0]
        head = ad.canonical(HeadId(n - 1, 1, last.kind))
        with AblateHeads([head]).apply(ad):
            got = ad.forward(IDS % 60)
    # reference: the same weights with that head's out_proj columns zeroed, layer 0 removed
    ref_model = copy.deepcopy(model)
    ref = ganda.from_model(ref_model)
    mixer = ref.mixer(head.layer, head.kind)
    with torch.no_grad():
        mixer.out_proj.weight[:, mixer.head_slice(head.head)] = 0
    with RemoveLayers([0]).apply(ref):
        want = ref.forward(IDS % 60)
    assert torch.allclose(got, want, atol=1e-5), family
    assert [(m.layer, m.kind) for m in ad.mixers()] == [(m.layer, m.kind) for m in outside.mixers()]
    for m in ad.mixers():  # each mixer lives in the loaded layer its id names
        assert any(sub is m.module for sub in ad.original_layers()[m.layer].modules()), (family, m.layer)
    assert ad.decoder_layers() is ad.original_layers()


def test_cli_reproduction_on_a_lab_model(tmp_path, capfd):
    from ganda.cli import main

    args = ["eval", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "20", "--json"]
    assert main([*args, "--remove-layers", "1", "--ablate", "L1H0"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["ganda: error: L1H0: layer 1 is removed by remove-layers 1"]
    pred = tmp_path / "pred.jsonl"
    assert main([*args, "--remove-layers", "0", "--ablate", "L3H0", "--predictions", str(pred)]) == 0
    cli = json.loads(capfd.readouterr().out)
    # the same run by hand: layer 0 dropped from the list, layer 3's only head zeroed in the weights
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task, task_for_model

    ad = load_model("lab-llama-h1", device="cpu")
    ref = ganda.from_model(copy.deepcopy(ad.model), ad.tokenizer, spec="lab-llama-h1")
    with torch.no_grad():
        ref.mixer(3).out_proj.weight.zero_()  # one head per layer: L3H0 is all of o_proj's input
    layers = ref.original_layers()
    ref.set_decoder_layers(torch.nn.ModuleList([layers[1], layers[2], layers[3]]))
    task = task_for_model("lab-mmlu", get_task("lab-mmlu"), ref)
    want = evaluate(ref, task, [], limit=20, progress=False)
    assert cli["accuracy"] == pytest.approx(want.accuracy)
    got_preds = [json.loads(line)["pred"] for line in pred.read_text().splitlines()]
    assert got_preds == [p["pred"] for p in want.predictions]


def test_layer_lists_and_head_lists_that_name_nothing_are_refused():
    with pytest.raises(GandaError, match="empty layer range '3-1'"):
        parse_layers("3-1")
    with pytest.raises(GandaError, match="not a layer list"):
        parse_layers(",")
    assert parse_layers("0-2,5") == [0, 1, 2, 5]
    ad = fresh_llama()
    with pytest.raises(GandaError, match="no head ids in ','"):
        with AblateHeads(",").apply(ad):
            pass


def test_keep_heads_refuses_heads_it_would_ignore():
    ad = fresh_llama()
    with pytest.raises(GandaError, match=r"KeepHeads: L3H0 is not in the mixers it acts on \(layers 1\)"):
        with KeepHeads("L3H0", layers=[1]).apply(ad):
            pass
    with pytest.raises(GandaError, match="no head ids in ','"):
        with KeepHeads(",").apply(ad):
            pass
    hybrid = ganda.from_model(tiny_model("falcon_h1"))  # every layer: attention and SSM side by side
    with pytest.raises(GandaError, match=r"L1\.ssmH0 is not in the mixers it acts on \(layers 1 \(attn\)\)"):
        with KeepHeads("L1.ssmH0", layers=[1], kind="attn").apply(hybrid):
            pass
    assert not any(m.out_proj._forward_pre_hooks for m in hybrid.mixers())


def test_head_layout_must_tile_the_output_projection():
    model = make_tiny_llama(128)
    model.config.num_attention_heads = 3  # 3 heads of 8 would leave o_proj's last 8 inputs unassigned
    ad = ganda.from_model(model)
    with pytest.raises(GandaError, match="layer 0 \\(attn\\): 3 heads of 8 do not tile the 32 inputs"):
        ad.mixers()


# ---- strict loading ---------------------------------------------------------------------

@pytest.fixture()
def llama_dir(tmp_path):
    d = tmp_path / "llama"
    tok = make_byte_tokenizer()
    make_tiny_llama(len(tok), layers=4, ctx=128).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def rewrite(d: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "model.safetensors"))
    save_file(fn(dict(state)), str(d / "model.safetensors"), metadata={"format": "pt"})


def test_intact_directory_loads_with_its_weights(llama_dir):
    from safetensors.torch import load_file

    ad = load_model(str(llama_dir), device="cpu")
    state = load_file(str(llama_dir / "model.safetensors"))
    assert all(torch.equal(v, ad.model.state_dict()[k]) for k, v in state.items())


def test_missing_tensors_are_refused(llama_dir):
    rewrite(llama_dir, lambda s: {k: v for k, v in s.items() if ".layers.3." not in k})
    with pytest.raises(GandaError, match=r"lacks 9 tensor\(s\) the model needs: model\.layers\.3\.input_layernorm"):
        load_model(str(llama_dir), device="cpu")


def test_unexpected_tensors_are_refused(llama_dir):
    rewrite(llama_dir, lambda s: {**s, "model.layers.9.mlp.up_proj.weight": torch.zeros(64, 32)})
    with pytest.raises(GandaError, match="does not use: model.layers.9.mlp.up_proj.weight"):
        load_model(str(llama_dir), device="cpu")


def test_wrongly_shaped_tensors_are_refused(llama_dir):
    rewrite(llama_dir, lambda s: {**s, "model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 32)})
    with pytest.raises(GandaError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight is \(8, 32\), "
                                         r"the config needs \(32, 32\)"):
        load_model(str(llama_dir), device="cpu")


def test_legitimately_absent_or_stale_tensors_load(tmp_path):
    """A tied output embedding is not stored; old checkpoints carry rotary inv_freq buffers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    rewrite(tmp_path, lambda s: {**s, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)})
    ad = load_model(str(tmp_path), device="cpu")
    assert ad.model.lm_head.weight is ad.model.model.embed_tokens.weight


@pytest.mark.parametrize("damage, message", [
    ("truncate", "truncated safetensors file"),
    ("empty", "empty or truncated safetensors file (0 bytes)"),
    ("garbage", "truncated or not a safetensors file"),
    ("config_list", "is not a model config (expected a JSON object, got list)"),
    ("config_bare", "config.json describes a model of 6,738,415,616 parameters"),
    ("no_files", "is not a Hugging Face model directory (no config.json)"),
])
def test_damaged_directories_are_one_clear_error(llama_dir, damage, message):
    st = llama_dir / "model.safetensors"
    if damage == "truncate":
        st.write_bytes(st.read_bytes()[:-1000])
    elif damage == "empty":
        st.write_bytes(b"")
    elif damage == "garbage":
        st.write_bytes(b"\xff" * 4096)
    elif damage == "config_list":
        (llama_dir / "config.json").write_text("[1, 2]")
    elif damage == "config_bare":  # transformers would build a 7B Llama from the defaults
        (llama_dir / "config.json").write_text('{"model_type": "llama"}')
    else:
        for f in llama_dir.iterdir():
            f.unlink()
    with pytest.raises(GandaError) as info:
        load_model(str(llama_dir), device="cpu")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_llamba_loader_is_strict_about_shapes(tmp_path):
    from ganda.models.ssm.llamba import save_llamba

    model = tiny_model("llamba")
    save_llamba(model, tmp_path)
    rewrite(tmp_path, lambda s: {**s, "backbone.layers.1.mixer.D": torch.ones(7)})
    with pytest.raises(GandaError, match=r"backbone\.layers\.1\.mixer\.D is \(7,\), the config needs \(4,\)"):
        load_model(str(tmp_path), device="cpu")


# ---- no code from a model directory -----------------------------------------------------

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n" \
       "from transformers import PreTrainedTokenizerFast, PretrainedConfig\n" \
       "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n" \
       "class EvilConfig(PretrainedConfig):\n    model_type = 'evilnet'\n"


@pytest.fixture()
def stdin_yes(monkeypatch):
    """A stdin that would answer "y" to transformers' "run the custom code?" prompt."""
    fake = io.StringIO("y\ny\n")
    monkeypatch.setattr(sys, "stdin", fake)
    return fake


@pytest.mark.parametrize("where", ["tokenizer_config", "config"])
def test_code_in_a_model_directory_never_runs(llama_dir, tmp_path, capfd, stdin_yes, where):
    marker = tmp_path / "MARKER"
    (llama_dir / "evil.py").write_text(EVIL.format(marker=str(marker)))
    if where == "tokenizer_config":
        tc = json.loads((llama_dir / "tokenizer_config.json").read_text())
        tc.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
        (llama_dir / "tokenizer_config.json").write_text(json.dumps(tc))
        expect = "the tokenizer needs custom code from the model directory (auto_map), which ganda never runs"
    else:
        tc = json.loads((llama_dir / "tokenizer_config.json").read_text())
        tc.pop("tokenizer_class")  # transformers then looks for the tokenizer in config.json
        (llama_dir / "tokenizer_config.json").write_text(json.dumps(tc))
        cfg = json.loads((llama_dir / "config.json").read_text())
        cfg.update(model_type="evilnet", auto_map={"AutoConfig": "evil.EvilConfig",
                                                   "AutoTokenizer": ["evil.EvilTokenizer", None]})
        (llama_dir / "config.json").write_text(json.dumps(cfg))
        expect = "unsupported architecture 'evilnet'"
    capfd.readouterr()
    with pytest.raises(GandaError) as info:
        load_model(str(llama_dir), device="cpu")
    assert expect in str(info.value)
    assert not marker.exists()
    assert stdin_yes.tell() == 0  # nothing asked
    assert capfd.readouterr().out == ""


def test_auto_map_beside_a_known_architecture_uses_the_builtin_class(llama_dir, tmp_path, capfd, stdin_yes):
    marker = tmp_path / "MARKER"
    (llama_dir / "evil.py").write_text(EVIL.format(marker=str(marker)))
    cfg = json.loads((llama_dir / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (llama_dir / "config.json").write_text(json.dumps(cfg))
    capfd.readouterr()
    ad = load_model(str(llama_dir), device="cpu")
    assert type(ad.model).__name__ == "LlamaForCausalLM"
    assert not marker.exists() and stdin_yes.tell() == 0 and capfd.readouterr().out == ""


# ---- device and precision ---------------------------------------------------------------

@pytest.mark.parametrize("var, value, message", [
    ("GANDA_DEVICE", "cuda:99", "GANDA_DEVICE='cuda:99' but"),
    ("GANDA_DEVICE", "gpu", "GANDA_DEVICE='gpu' is not a device"),
    ("GANDA_DTYPE", "float77", "GANDA_DTYPE='float77' is not a precision"),
    ("GANDA_DTYPE", "Tensor", "GANDA_DTYPE='Tensor' is not a precision"),
    ("GANDA_DTYPE", "int8", "GANDA_DTYPE='int8' is not a precision"),
])
def test_bad_device_or_precision_is_refused_before_loading(llama_dir, monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(GandaError, match=message.replace("(", r"\(")):
        load_model(str(llama_dir))


def test_cuda_without_cuda_is_refused(llama_dir, monkeypatch):
    monkeypatch.setenv("GANDA_DEVICE", "cuda")
    if torch.cuda.is_available():
        assert load_model(str(llama_dir)).device.type == "cuda"
    else:
        with pytest.raises(GandaError, match="GANDA_DEVICE='cuda' but CUDA is not available"):
            load_model(str(llama_dir))


def test_precision_names(llama_dir, monkeypatch):
    monkeypatch.setenv("GANDA_DEVICE", "cpu")
    monkeypatch.setenv("GANDA_DTYPE", "bf16")
    assert next(load_model(str(llama_dir)).model.parameters()).dtype == torch.bfloat16


# ---- GGUF: strict, one-line errors, the cache -------------------------------------------

def write_tiny_gguf(path: Path, layers: int = 2, seed: int = 0, drop: tuple[str, ...] = (), width: int = 32) -> None:
    """A tiny Llama GGUF (fp32 tensors, the byte-level BPE tokenizer of conftest) via gguf.GGUFWriter."""
    import gguf

    tj = json.loads(make_byte_tokenizer().backend_tokenizer.to_str())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    V, D, F, H, KV = len(tokens), width, 2 * width, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_rope_dimension_count(D // H)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * V)
    w.add_token_merges(merges)
    for add in (w.add_eos_token_id, w.add_bos_token_id, w.add_pad_token_id):
        add(vocab["<eos>"])
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int) -> None:
        if name not in drop:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    tensor("token_embd.weight", V, D)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", D)
        tensor(f"blk.{i}.ffn_norm.weight", D)
        tensor(f"blk.{i}.attn_q.weight", D, D)
        tensor(f"blk.{i}.attn_k.weight", KV * D // H, D)
        tensor(f"blk.{i}.attn_v.weight", KV * D // H, D)
        tensor(f"blk.{i}.attn_output.weight", D, D)
        tensor(f"blk.{i}.ffn_gate.weight", F, D)
        tensor(f"blk.{i}.ffn_up.weight", F, D)
        tensor(f"blk.{i}.ffn_down.weight", D, F)
    tensor("output_norm.weight", D)
    tensor("output.weight", V, D)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture()
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path)
    return path


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "gguf").iterdir())


def test_gguf_loads_and_its_cached_copy_is_the_same_model(gguf_file, tmp_path):
    first = load_model(str(gguf_file), device="cpu")
    entry, lock = entries(tmp_path / "cache")
    assert lock.name == entry.name + ".lock"
    manifest = json.loads((entry / CACHE_MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["size"] == (entry / "model.safetensors").stat().st_size
    second = load_model(str(gguf_file), device="cpu")
    x = torch.tensor([first.tokenizer("the apple A B").input_ids])
    assert torch.equal(first.forward(x), second.forward(x))


def test_a_gguf_is_parsed_once_a_load_and_loads_as_transformers_loads_it(gguf_file, monkeypatch):
    """transformers opens a reader for the config, the weights and the tokenizer; a load parses the
    file once and gives transformers' own weights and tokens."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parsed: list[str] = []
    real = gguf.GGUFReader

    class Counted(real):
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    ours = load_model(str(gguf_file), device="cpu", use_cache=False)
    assert len(parsed) == 1
    plain = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32)
    assert len(parsed) >= 3  # transformers alone: the config, then the config and weights again
    assert gguf.GGUFReader is Counted  # the loader's reader is put back
    want = plain.state_dict()
    assert all(torch.equal(t, want[k]) for k, t in ours.model.state_dict().items())
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    assert ours.tokenizer("the apple A B").input_ids == tok("the apple A B").input_ids


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_cache_entry_is_logged_and_rebuilt(gguf_file, tmp_path, caplog, damage):
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = load_model(str(gguf_file), device="cpu").forward(x)
    (entry, _lock) = entries(tmp_path / "cache")
    st = entry / "model.safetensors"
    data = bytearray(st.read_bytes())
    if damage == "truncate":
        st.write_bytes(bytes(data[: len(data) // 2]))
    else:  # same size, one value changed: only the checksum can tell
        data[-100] ^= 0xFF
        st.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ganda.models.loading"):
        got = load_model(str(gguf_file), device="cpu").forward(x)
    rebuilt = [r for r in caplog.records if "damaged" in r.getMessage() and "rebuilding" in r.getMessage()]
    assert len(rebuilt) == 1
    assert torch.equal(got, want)
    assert [p.name for p in entries(tmp_path / "cache")] == [entry.name, entry.name + ".lock"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ganda.models.loading"):
        load_model(str(gguf_file), device="cpu")
    assert not caplog.records  # whole again


@pytest.mark.parametrize("damage", ["tensor", "tokenizer"])
def test_damage_anywhere_in_a_cache_entry_is_detected(tmp_path, monkeypatch, caplog, damage):
    """Every tensor of the entry is sampled and its tokenizer files are read whole: a region between
    17 evenly spaced 64 KiB blocks of the weights (what sampling the file as a whole reads), or a
    broken ``tokenizer.json``, is found, logged and rebuilt."""
    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "src" / "wide.gguf"
    gguf.parent.mkdir()
    write_tiny_gguf(gguf, width=512)
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    first = load_model(str(gguf), device="cpu")
    want, want_ids = first.forward(x), first.tokenizer("the apple").input_ids
    (entry, _lock) = entries(tmp_path / "cache")
    if damage == "tensor":
        st = entry / "model.safetensors"
        raw = st.read_bytes()
        size, block = len(raw), 1 << 16
        whole_file_blocks = [((size - block) * k // 16, (size - block) * k // 16 + block) for k in range(17)]
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        name = max((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])
        begin, end = (8 + n + o for o in header[name]["data_offsets"])
        length = -(-(end - begin) // 7)  # 1/(BLOCKS - 1) of the tensor
        start = next(s for s in range(begin, end - length, 4096)
                     if all(s + length <= a or s >= b for a, b in whole_file_blocks))
        damaged = raw[:start] + bytes(length) + raw[start + length :]
        st.write_bytes(damaged)
        assert len(damaged) == size
    else:
        (entry / "tokenizer.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="ganda.models.loading"):
        again = load_model(str(gguf), device="cpu")
    rebuilt = [r for r in caplog.records if "damaged" in r.getMessage() and "rebuilding" in r.getMessage()]
    assert len(rebuilt) == 1, [r.getMessage() for r in caplog.records]
    assert torch.equal(again.forward(x), want)
    assert again.tokenizer is not None and again.tokenizer("the apple").input_ids == want_ids


def test_gguf_replaced_at_the_same_path_is_not_served_from_the_cache(gguf_file, tmp_path):
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    old = load_model(str(gguf_file), device="cpu").forward(x)
    (old_entry, _lock) = entries(tmp_path / "cache")
    st = gguf_file.stat()
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)  # same shapes, so the same size
    os.replace(other, gguf_file)
    os.utime(gguf_file, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime, as a copy may keep
    assert gguf_file.stat().st_size == st.st_size
    new = load_model(str(gguf_file), device="cpu").forward(x)
    assert not torch.allclose(new, old, atol=1e-3)
    assert torch.equal(new, load_model(str(gguf_file), device="cpu", use_cache=False).forward(x))
    names = [p.name for p in entries(tmp_path / "cache")]
    assert old_entry.name not in names and len(names) == 2  # the new entry and its lock


@pytest.mark.integration
def test_stale_temporaries_are_cleaned_and_live_ones_kept(gguf_file, tmp_path):
    root = tmp_path / "cache" / "gguf"
    root.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    host = socket.gethostname().replace("-", "_")
    dead_tmp = root / f"x-0123.tmp-{host}-{dead}-deadbeef"
    live_tmp = root / f"y-0123.tmp-{host}-{os.getpid()}-0badf00d"
    other_recent = root / "z-0123.tmp-elsewhere-12345-00c0ffee"
    legacy_old = root / "w-0123.tmp"
    for p in (dead_tmp, live_tmp, other_recent, legacy_old):
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"x" * 100)
    two_hours_ago = time.time() - 7200
    os.utime(legacy_old, (two_hours_ago, two_hours_ago))
    load_model(str(gguf_file), device="cpu")
    left = {p.name for p in root.iterdir()}
    assert dead_tmp.name not in left and legacy_old.name not in left
    assert {live_tmp.name, other_recent.name} <= left


RACER = """
import sys, time, pathlib
from ganda.models import loading
start, log = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
real = loading._dequantise
def slow(path):
    with open(log, "a") as f:
        f.write("dequantise\\n")
    time.sleep(2.0)  # keep the window open so that the other process arrives while this one builds
    return real(path)
loading._dequantise = slow
while not start.exists():
    time.sleep(0.01)
ad = loading.load_model(sys.argv[1], device="cpu")
import torch
print(float(ad.forward(torch.tensor([[3, 1, 4, 1, 5, 9]])).sum()))
"""


@pytest.mark.integration
def test_two_processes_racing_on_a_cold_cache_build_it_once(gguf_file, tmp_path):
    start, log = tmp_path / "go", tmp_path / "dequantised.log"
    env = {**os.environ, "GANDA_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(gguf_file), str(start), str(log)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    time.sleep(4.0)  # both imported and waiting at the start line
    start.touch()
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert outs[0][0] == outs[1][0]  # the same logits
    assert log.read_text().splitlines() == ["dequantise"]  # the second waited and reused the entry
    (entry, lock) = entries(tmp_path / "cache")
    assert lock.name == entry.name + ".lock" and (entry / CACHE_MANIFEST).exists()


def test_gguf_missing_tensor_and_truncation_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache"))
    missing = tmp_path / "missing.gguf"
    write_tiny_gguf(missing, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(GandaError, match=r"lacks 1 tensor\(s\) the model needs: model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(missing), device="cpu")
    whole = tmp_path / "whole.gguf"
    write_tiny_gguf(whole)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(GandaError) as info:
        load_model(str(cut), device="cpu")
    assert str(info.value).startswith(f"{cut}: cannot load this GGUF file") and "\n" not in str(info.value)
    assert not (tmp_path / "cache" / "gguf").exists() or not any(
        p.is_dir() for p in (tmp_path / "cache" / "gguf").iterdir())


def test_gguf_beside_a_custom_tokenizer_runs_no_code(gguf_file, tmp_path, capfd, stdin_yes):
    marker = tmp_path / "MARKER"
    (gguf_file.parent / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (gguf_file.parent / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    capfd.readouterr()
    try:
        ad = load_model(str(gguf_file), device="cpu")
        assert ad.tokenizer is not None  # the GGUF's own tokenizer
    except GandaError as exc:
        assert "custom code" in str(exc)
    assert not marker.exists() and stdin_yes.tell() == 0 and capfd.readouterr().out == ""


@pytest.mark.parametrize("args, message", [
    (["--remove-layers", "1", "--ablate", "L1H0"], "L1H0: layer 1 is removed by remove-layers 1"),
    (["--keep-layers", "3-1"], "empty layer range '3-1'"),
])
def test_cli_layer_errors_are_one_line(capfd, args, message):
    from ganda.cli import main

    assert main(["eval", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "5", "--json", *args]) == 2
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith(f"ganda: error: {message}")


def test_cli_damaged_model_is_one_line(llama_dir, capfd, monkeypatch):
    from ganda.cli import main

    monkeypatch.setenv("GANDA_DEVICE", "cpu")
    st = llama_dir / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    assert main(["eval", str(llama_dir), "--task", "kv", "--limit", "2", "--json"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "truncated safetensors file" in err
    assert "Traceback" not in err
