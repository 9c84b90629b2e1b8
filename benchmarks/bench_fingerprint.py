"""What a weights fingerprint costs and reads on a full-size model, against the digest it replaced.

A Llama-3.1-8B-shaped model (bf16, 8.0e9 parameters) is built on the device, filled with random
values, and fingerprinted (:func:`ganda.fingerprint.fingerprint`): best of five, with every aten op
recorded to show that none makes more than the sample and that 16 bytes per tensor move to the
host. Then one contiguous region per layer (as long as the strided sample's spacing) is changed
and must change the fingerprint, and the same tensors on CPU and on the device must fingerprint
alike. :func:`ganda.finite.check_weights` (every weight finite) is timed on the same model. On a
Llama-3.2-1B-shaped model the digest that copied every tensor to the host and hashed it is timed
beside the fingerprint.

    .venv/bin/python benchmarks/bench_fingerprint.py            # cuda when present; raw: results/fingerprint.json
    .venv/bin/python benchmarks/bench_fingerprint.py --device cpu --layers 4

On CPU use ``--layers`` to keep the model within memory (8B in bf16 is 16 GB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ganda.fingerprint as fp_mod
from ganda.fingerprint import STRIDED, fingerprint
from ganda.finite import check_weights

RESULTS = Path(__file__).parent / "results" / "fingerprint.json"


def build(cfg: LlamaConfig, device: str) -> torch.nn.Module:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)
    _sync(device)
    return model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int = 5) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


class Made(torch.utils._python_dispatch.TorchDispatchMode):
    """Elements made by every aten op that is not a view (what an op reads is at most what it makes)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.sizes.append(t.numel())
        return out


def old_digest(model: torch.nn.Module) -> str:
    """The digest a model in memory had before: every tensor copied to the host and hashed."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy())
    return h.hexdigest()


def full_size(dev: str, layers: int) -> dict[str, object]:
    """The 8B-shaped model: cost, what is read and moved, what is detected."""
    big = build(LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                            num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False), dev)
    fingerprint(big)
    seconds, before = timed(lambda: fingerprint(big), dev)
    moved: list[int] = []
    real = fp_mod._to_host
    fp_mod._to_host = lambda t: moved.append(t.numel() * t.element_size()) or real(t)
    try:
        with Made() as made:
            fingerprint(big)
    finally:
        fp_mod._to_host = real
    params = dict(big.named_parameters())
    missed = []
    for layer in range(layers):
        for kind in ("self_attn.o_proj", "mlp.down_proj"):
            flat = params[f"model.layers.{layer}.{kind}.weight"].data.view(-1)
            n = flat.numel()
            region = slice(n // 3 + 7, n // 3 + 7 + -(-n // STRIDED))
            old = flat[region].clone()
            with torch.no_grad():
                flat[region] = (old.view(torch.int16) ^ 0x5A5A).view(old.dtype)
            if fingerprint(big) == before:
                missed.append(f"model.layers.{layer}.{kind}.weight")
            with torch.no_grad():
                flat[region] = old
    part = {k: v for k, v in big.state_dict().items() if ".layers.0." in k}
    return {"params": sum(p.numel() for p in big.parameters()), "tensors": len(big.state_dict()),
            "fingerprint_s": seconds, "bytes_to_host": moved, "largest_op_elements": max(made.sizes),
            "elements_made": sum(made.sizes), "changed_regions_missed": missed,
            "restored_is_equal": fingerprint(big) == before,
            "same_on_cpu": fingerprint(part) == fingerprint({k: v.cpu() for k, v in part.items()}),
            "check_weights_s": timed(lambda: check_weights(big, "8b"), dev, reps=3)[0]}


def against_the_old_digest(dev: str) -> dict[str, object]:
    """The 1B-shaped model: the fingerprint against the digest that copied every tensor to the host."""
    small = build(LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                              num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True), dev)
    fingerprint(small)
    return {"params": sum(p.numel() for p in small.parameters()),
            "fingerprint_s": timed(lambda: fingerprint(small), dev)[0],
            "old_digest_s": timed(lambda: old_digest(small), dev, reps=1)[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=32, help="layers of the 8B-shaped model")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    dev = args.device
    res: dict[str, object] = {"device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu",
                              "torch": torch.__version__}
    res["8b"] = full_size(dev, args.layers)
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    res["1b"] = against_the_old_digest(dev)
    print(json.dumps(res, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
