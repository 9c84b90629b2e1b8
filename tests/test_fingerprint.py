"""One fingerprint for weights on disk and in memory (:mod:`ganda.fingerprint`): what it reads, what
it detects, and that it costs the same for a 1B-parameter model as for a tiny one."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from ganda import fingerprint as fp_mod
from ganda.fingerprint import BLOCKS, STRIDED, fingerprint
from ganda_lab import CHECKPOINTS

MODEL = "lab-llama-h1"


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(CHECKPOINTS / MODEL, dst)
    return dst


def _tensor_span(file: Path, name: str) -> tuple[int, int]:
    """Byte range ``[begin, end)`` of tensor ``name`` in a safetensors file."""
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def _overwrite_keeping_size_and_mtime(file: Path, start: int, data: bytes) -> None:
    st = file.stat()
    with open(file, "r+b") as f:
        f.seek(start)
        f.write(data)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file.stat().st_size == st.st_size and file.stat().st_mtime_ns == st.st_mtime_ns


# ---- files ------------------------------------------------------------------------------------

def test_every_tensor_of_a_file_is_sampled_whatever_its_size_and_mtime(tmp_path):
    """A contiguous region of 1/(BLOCKS - 1) of any tensor, overwritten in place with the file's size and
    mtime kept (``cp -p``, ``rsync -a`` and ``tar`` keep both), changes the fingerprint."""
    model = _copy(tmp_path)
    weights = model / "model.safetensors"
    header = json.loads(weights.read_bytes()[8 : 8 + int.from_bytes(weights.read_bytes()[:8], "little")])
    names = sorted(k for k in header if k != "__metadata__")
    assert len(names) > 20
    for name in names:
        before = fingerprint(model)
        begin, end = _tensor_span(weights, name)
        size = end - begin
        length = max(1, -(-size // (BLOCKS - 1)))  # a region as long as the spacing of the blocks
        start = begin + (size - length) // 2  # in the middle of the tensor
        old = weights.read_bytes()[start : start + length]
        _overwrite_keeping_size_and_mtime(weights, start, bytes((b + 1) % 256 for b in old))
        assert fingerprint(model) != before, name


def test_tokenizer_and_config_files_are_read_whole(tmp_path):
    model = _copy(tmp_path)
    for name in ("tokenizer.json", "config.json", "lab.json"):
        before = fingerprint(model)
        f = model / name
        text = f.read_bytes()
        mid = len(text) // 2
        _overwrite_keeping_size_and_mtime(f, mid, b"X" if text[mid : mid + 1] != b"X" else b"Y")
        assert fingerprint(model) != before, name


def test_gguf_tensors_are_found_from_its_header(tmp_path):
    """A GGUF's tensor infos give each tensor's place: a region in the middle of any one is seen."""
    import hashlib

    from test_hardening_models import write_tiny_gguf

    gguf = tmp_path / "m.gguf"
    write_tiny_gguf(gguf, width=128)
    with open(gguf, "rb") as f:
        assert fp_mod._gguf_sample(f, gguf.stat().st_size, hashlib.sha256())  # parsed, not sampled blindly
    raw = gguf.read_bytes()
    before = fingerprint(gguf)
    size = len(raw)
    for frac in (0.3, 0.55, 0.8):  # inside the tensors (the header is the first few kilobytes)
        start = int(size * frac)
        _overwrite_keeping_size_and_mtime(gguf, start, bytes(b ^ 0xFF for b in raw[start : start + size // 40]))
        assert fingerprint(gguf) != before, frac
        _overwrite_keeping_size_and_mtime(gguf, start, raw[start : start + size // 40])
        assert fingerprint(gguf) == before


def test_reads_a_fixed_number_of_bytes_per_tensor(tmp_path, monkeypatch):
    """The cost of a file's fingerprint follows its number of tensors, not their size."""
    from safetensors.torch import save_file

    reads: list[int] = []
    real = os.pread

    def counting(fd, n, offset):
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(fp_mod.os, "pread", counting)
    sizes = {}
    for width in (64, 1024):
        f = tmp_path / f"w{width}.safetensors"
        save_file({f"t{i}": torch.randn(width, width) for i in range(3)}, str(f))
        reads.clear()
        fingerprint(f)
        sizes[width] = sum(reads)
    assert f.stat().st_size > 12 << 20
    assert sizes[1024] <= 3 * BLOCKS * fp_mod.BLOCK_BYTES + 4096  # header + blocks, not 12 MiB


def test_one_function_serves_files_runs_and_models_in_memory(tmp_path):
    from ganda.models import from_model, load_model
    from ganda.sweep import weights_fingerprint

    model = _copy(tmp_path)
    ad = load_model(str(model), device="cpu")
    assert weights_fingerprint(ad) == fingerprint(model)
    mem = from_model(ad.model, ad.tokenizer, spec="in-memory")
    assert weights_fingerprint(mem) == fingerprint(ad.model) == fingerprint(ad.model.state_dict())
    assert weights_fingerprint(mem).startswith("mem-")


# ---- memory: a 1B-parameter model, read on its device ----------------------------------------

@pytest.fixture(scope="module")
def billion():
    """TinyLlama-1.1B's shape in bf16 (1.1e9 parameters, 2.2 GB), built without initialising it:
    the weights are whatever the fresh memory holds, which is all a fingerprint needs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model = model.to_empty(device="cpu")
    assert sum(p.numel() for p in model.parameters()) > 1.0e9
    yield model
    del model


class _Reads(torch.utils._python_dispatch.TorchDispatchMode):
    """Every aten op the fingerprint runs, with how many elements it makes (views make none)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.made.append((str(func), t.numel()))
        return out


def test_a_billion_parameters_in_memory_cost_a_fixed_sample(billion, monkeypatch):
    fingerprint(billion)  # first touch: the fresh memory is mapped, as a loaded model's already is
    best = min(_timed(billion) for _ in range(3))
    assert best < 0.2, f"{best:.3f} s"

    moved: list[int] = []
    real = fp_mod._to_host
    monkeypatch.setattr(fp_mod, "_to_host", lambda t: moved.append(t.numel() * t.element_size()) or real(t))
    with _Reads() as reads:
        fingerprint(billion)
    n_tensors = len(billion.state_dict())
    largest = max(p.numel() for p in billion.parameters())
    biggest_op = max(n for _, n in reads.made)
    assert biggest_op <= 2 * (STRIDED + BLOCKS * fp_mod.BLOCK_BYTES), biggest_op  # never a copy of a tensor
    assert biggest_op < largest / 10_000
    assert sum(n for _, n in reads.made) < 40_000 * n_tensors  # a fixed amount per tensor
    assert moved == [16 * n_tensors]  # one transfer to the host: two int64 sums per tensor
    assert 16 * n_tensors < 8 << 10


def _timed(model) -> float:
    t0 = time.perf_counter()
    fingerprint(model)
    return time.perf_counter() - t0


@pytest.mark.parametrize("change", ["whole tensor", "contiguous region"])
def test_one_changed_tensor_in_any_layer_is_detected(billion, change):
    params = dict(billion.named_parameters())
    before = fingerprint(billion)
    kinds = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    for layer in range(billion.config.num_hidden_layers):
        name = f"model.layers.{layer}.{kinds[layer % len(kinds)]}.weight"  # every kind of tensor, every layer
        p = params[name]
        flat = p.data.view(-1)
        if change == "whole tensor":
            region = slice(0, flat.numel())
        else:  # as long as the strided sample's spacing, at an offset no block starts at
            n = flat.numel()
            length = -(-n // STRIDED)
            start = n // 3 + 7
            region = slice(start, start + length)
        old = flat[region].clone()
        with torch.no_grad():  # every value's bits changed (fresh memory may hold NaN, which arithmetic keeps)
            flat[region] = (old.view(torch.int16) ^ 0x5A5A).view(old.dtype)
        try:
            assert fingerprint(billion) != before, (name, change)
        finally:
            with torch.no_grad():
                flat[region] = old
    assert fingerprint(billion) == before


def test_a_model_on_the_meta_device_fingerprints_by_layout():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        a = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
        b = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert fingerprint(a) == fingerprint(a) != fingerprint(b)


def test_non_contiguous_and_odd_dtypes_are_sampled_without_a_copy():
    base = torch.randn(64, 96)
    for t in (base.t(), base[:, ::2], base.to(torch.float64), base > 0, base.to(torch.int8), torch.tensor(3.0)):
        a = fingerprint({"w": t})
        changed = t.clone()
        first = (0,) * t.dim()
        changed[first] = changed[first] + 1 if t.dtype != torch.bool else ~changed[first]
        assert fingerprint({"w": changed}) != a, t.dtype
        assert fingerprint({"w": t.clone()}) == a


# ---- runs -------------------------------------------------------------------------------------

def test_attribution_fingerprints_only_what_it_writes(monkeypatch, tmp_path):
    """No run directory, no fingerprint: ``attribute`` and ``rank_heads`` without ``out_dir`` never
    read the weights for one."""
    import ganda.attribution.engine as engine
    import ganda.sweep as sweep
    from ganda.attribution import attribute, rank_heads
    from ganda.models import load_model
    from ganda.tasks import get_task

    calls: list[str] = []

    def counted(adapter):
        calls.append(adapter.spec)
        return "counted"

    monkeypatch.setattr(engine, "weights_fingerprint", counted)
    monkeypatch.setattr(sweep, "weights_fingerprint", counted)  # the verification's sweep
    ad = load_model(MODEL, device="cpu")
    exs = get_task("lab-mmlu", adapter=ad).examples(limit=2)
    attribute(ad, exs, progress=False)
    rank_heads(ad, exs, ablation="mean", verify_top=1, active=0, audit=0, progress=False)
    assert calls == []
    attribute(ad, exs, progress=False, out_dir=tmp_path / "a")
    assert calls == [ad.spec]
