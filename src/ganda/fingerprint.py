"""Fingerprints of model weights: one function for files on disk and for models built in memory.

A resumed run, a Ray worker and the GGUF cache each ask whether a model is still the one that
was measured (or written). :func:`fingerprint` answers for all of them, at a cost that grows with
the number of tensors, not with their size: it reads a fixed sample of every tensor, plus every
tensor's name, shape and dtype.

**Where each tensor is sampled.** A tensor of ``n`` elements is read at ``BLOCKS`` contiguous
blocks of ``BLOCK_BYTES`` bytes each, evenly spaced from its first element to its last (both
ends included; a tensor smaller than that is read whole). In a file the blocks are found from
the file's own header (safetensors offsets, GGUF tensor infos); in memory they are the same
element ranges. A model in memory is also read at every ``ceil(n / STRIDED)``-th element (a
strided view of at most ``STRIDED`` elements), because reading it there is cheap.

**Files** (a ``.safetensors`` or ``.gguf`` file, or a model directory: every file in it that
does not start with ``.``): each file's name, size and modification time; a safetensors or GGUF
header whole; the sampled blocks of every tensor; and any other file up to ``HASHED_WHOLE`` bytes
whole (``config.json``, ``tokenizer.json``, ``lab.json``, ...). Larger files of another kind
(pickle weights) are read at ``FILE_BLOCKS`` blocks spread over the file. About 4 KiB per tensor
is read, so 1 MiB for a 270-tensor model of any width.

**Memory** (an ``nn.Module`` or a mapping of names to tensors): the sample is gathered and
reduced on the tensor's own device to two exact integer sums of the sampled elements' bit
patterns (plain, and weighted by a fixed sequence); only those two numbers per tensor (16 bytes)
move to the host, in one transfer per device. No tensor is ever copied whole; no floating-point
rounding is involved, so the result does not depend on the device, the thread count or the
order of a reduction.

**What it detects**: any change of a name, shape, dtype or (files) size or modification time; a
tensor replaced by another (different values at a sampled element); any change to a contiguous
region of a tensor at least ``1 / (BLOCKS - 1)`` of its bytes long in a file, or at least
``ceil(n / STRIDED)`` elements long in memory (such a region always holds a sampled element); and
any change to a tensor's first or last ``BLOCK_BYTES`` bytes. **What it cannot detect**: a change
confined to elements between the sampled ones (a single element, or a region shorter than the
spacing above, away from the blocks) or a change made on purpose to leave both sums of the
sampled elements unchanged. It is a check against accidents (a replaced checkpoint, a corrupt
copy, a model edited in memory), not against an adversary.

This module imports only the standard library: a model in memory is read with the torch that made
its tensors.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import GandaError

BLOCKS = 8  # contiguous blocks read from every tensor (first and last included)
BLOCK_BYTES = 512  # bytes per block
STRIDED = 4096  # elements of each tensor in memory read as a strided view
HASHED_WHOLE = 64 << 20  # files other than weights up to this size are hashed whole
FILE_BLOCKS = 64  # blocks of BLOCK_BYTES spread over a larger file of unknown layout (pickle weights)
_HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not one


def fingerprint(source: Any) -> str:
    """A short digest of a model's weights (see the module docstring for what it reads and detects).

    ``source``: a file or a model directory (16 hex digits), or a model in memory, an ``nn.Module``
    or a mapping of names to tensors (``mem-`` and 16 hex digits)."""
    if isinstance(source, str | os.PathLike):
        return _digest(_path_entries(Path(source)))
    if hasattr(source, "state_dict"):
        source = source.state_dict()
    if isinstance(source, Mapping):
        return "mem-" + _digest(_tensor_entries(source))
    raise TypeError(f"cannot fingerprint a {type(source).__name__}")


def _digest(entries: list[Any]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:16]


def block_ranges(n: int, block: int, blocks: int = BLOCKS) -> list[tuple[int, int]]:
    """``blocks`` ranges ``(start, stop)`` of ``block`` units each, evenly spaced over ``n`` units,
    the first at 0 and the last ending at ``n`` (one range ``(0, n)`` when they would cover it)."""
    if n <= blocks * block:
        return [(0, n)]
    starts = sorted({(n - block) * k // (blocks - 1) for k in range(blocks)})
    return [(s, s + block) for s in starts]


# ---------------------------------------------------------------------------------------------
# files


def _path_entries(path: Path) -> list[Any]:
    path = path.expanduser()
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file() and not any(
            part.startswith(".") for part in f.relative_to(path).parts))
        return [_file_entry(f, str(f.relative_to(path))) for f in files]
    if path.is_file():
        return [_file_entry(path, path.name)]
    raise GandaError(f"no model at {path}")


def _file_entry(p: Path, rel: str) -> dict[str, Any]:
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            suffix = p.suffix.lower()
            if suffix == ".safetensors" and _safetensors_sample(f, size, h):
                pass
            elif suffix == ".gguf" and _gguf_sample(f, size, h):
                pass
            elif size <= HASHED_WHOLE and suffix not in (".bin", ".pt", ".pth", ".ckpt", ".safetensors", ".gguf"):
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            else:  # unknown layout, or a header that cannot be read: blocks spread over the file
                _read_blocks(f.fileno(), 0, size, h, FILE_BLOCKS)
    except OSError as exc:
        raise GandaError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    return {"name": rel, "size": size, "mtime_ns": st.st_mtime_ns, "sample": h.hexdigest()[:32]}


def _read_blocks(fd: int, begin: int, end: int, h: Any, blocks: int = BLOCKS) -> None:
    """Hash ``blocks`` sampled blocks of the byte range ``[begin, end)``: a tensor's data, or a file's."""
    for start, stop in block_ranges(end - begin, BLOCK_BYTES, blocks):
        h.update(os.pread(fd, stop - start, begin + start))


def safetensors_header(fd: int, size: int) -> tuple[bytes, Any]:
    """A safetensors file's header as stored (its 8-byte length, then the JSON) and as parsed; a
    ValueError saying why for a file too short to have one or whose length does not fit the file."""
    raw = os.pread(fd, 8, 0)
    if len(raw) < 8:
        raise ValueError(f"empty or truncated safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > min(size - 8, _HEADER_LIMIT):
        raise ValueError(f"truncated or not a safetensors file (header of {n} bytes, file of {size})")
    stored = raw + os.pread(fd, n, 8)
    return stored, json.loads(stored[8:])


def _safetensors_sample(f: Any, size: int, h: Any) -> bool:
    """Header whole plus every tensor's blocks; False when the header cannot be read."""
    fd = f.fileno()
    try:
        stored, header = safetensors_header(fd, size)
        spans = sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]))
                       for k, v in header.items() if k != "__metadata__")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False
    h.update(stored)
    base = len(stored)
    for begin, end in spans:
        if base + end <= size and begin <= end:
            _read_blocks(fd, base + begin, base + end, h)
    return True


_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes


def _gguf_string(buf: Any, at: int) -> tuple[bytes, int]:
    (k,) = struct.unpack_from("<Q", buf, at)
    return buf[at + 8: at + 8 + k], at + 8 + k


def _gguf_skip(buf: Any, kind: int, at: int) -> int:
    """The offset after one metadata value of GGUF value type ``kind`` at ``at``."""
    if kind in _GGUF_FIXED:
        return at + _GGUF_FIXED[kind]
    if kind == 8:
        (k,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + k
    if kind == 9:
        item, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item in _GGUF_FIXED:
            return at + count * _GGUF_FIXED[item]
        for _ in range(count):
            at = _gguf_skip(buf, item, at)
        return at
    raise ValueError(f"GGUF value type {kind}")


def _gguf_layout(buf: Any) -> tuple[int, list[int]] | None:
    """Where a GGUF file's tensor data starts and each tensor's offset in it; None for a file
    that is not GGUF version 2 or later. A broken header raises (struct.error, ValueError, ...)."""
    if buf[:4] != b"GGUF" or struct.unpack_from("<I", buf, 4)[0] < 2:
        return None
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    pos, alignment = 24, 32
    for _ in range(n_kv):
        key, pos = _gguf_string(buf, pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if key == b"general.alignment" and kind == 4:
            alignment = struct.unpack_from("<I", buf, pos)[0] or 32
        pos = _gguf_skip(buf, kind, pos)
    offsets = []
    for _ in range(n_tensors):
        _, pos = _gguf_string(buf, pos)
        (dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * dims + 4
        offsets.append(struct.unpack_from("<Q", buf, pos)[0])
        pos += 8
    return pos + (-pos) % alignment, offsets


def _gguf_sample(f: Any, size: int, h: Any) -> bool:
    """Header (metadata and tensor infos) whole plus every tensor's blocks; False when the header
    cannot be parsed (then the file is sampled as one of unknown layout)."""
    if size < 24:
        return False
    try:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return False
    try:
        layout = _gguf_layout(buf)
        if layout is None or layout[0] > size:
            return False
        start, offsets = layout
        h.update(buf[:start])
    except (struct.error, ValueError, IndexError, OverflowError):
        return False
    finally:
        buf.close()
    ends = sorted(set(offsets))
    if not ends:  # no tensors: the header is the whole model
        return True
    bounds = dict(zip(ends, [*ends[1:], size - start], strict=True))
    for off in ends:
        begin, end = start + off, start + bounds[off]
        if begin <= end <= size:
            _read_blocks(f.fileno(), begin, end, h)
    return True


# ---------------------------------------------------------------------------------------------
# memory


def _torch() -> Any:
    """torch, as loaded by whoever made the tensors being fingerprinted (only they reach here)."""
    return sys.modules["torch"]


def _to_host(t: Any) -> list[list[int]]:
    """The one transfer from a device to the host (a ``[tensors, 2]`` integer tensor)."""
    return t.cpu().tolist()


@functools.lru_cache(maxsize=512)
def _sample_index(n: int, block: int, device: Any) -> Any:
    """Flat indices of the in-memory sample of an ``n``-element tensor: the strided view, then the
    blocks (``block`` elements each). Cached per size and device (layers repeat shapes)."""
    torch = _torch()
    step = max(1, math.ceil(n / STRIDED))
    parts = [torch.arange(0, n, step, device=device)]
    parts += [torch.arange(a, b, device=device) for a, b in block_ranges(n, block)]
    return torch.cat(parts)


@functools.lru_cache(maxsize=512)
def _weights(k: int, device: Any) -> Any:
    """A fixed sequence of ``k`` integers in [1, 65521] (the weighted sum's weights)."""
    torch = _torch()
    return (torch.arange(k, dtype=torch.int64, device=device) * 40503 + 12345) % 65521 + 1


def _bits(values: Any) -> Any:
    """The sampled elements' bit patterns as non-negative int64 (8-byte elements as two halves)."""
    torch = _torch()
    size = values.element_size()
    if size == 1:
        return values.view(torch.uint8).to(torch.int64)
    if size == 2:
        return values.view(torch.int16).to(torch.int64) & 0xFFFF
    if size in (4, 8, 16):
        return values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    raise TypeError(f"cannot sample elements of {size} bytes")


def _sample_sums(t: Any) -> Any:
    """``[2]`` int64 on ``t``'s device: the plain and the weighted sum of the sample's bit patterns."""
    torch = _torch()
    n = t.numel()
    idx = _sample_index(n, max(1, BLOCK_BYTES // t.element_size()), t.device)
    if t.is_contiguous():
        values = torch.index_select(t.view(-1), 0, idx)  # (advanced indexing is 50x slower on CPU)
    else:  # gather through the strides: never a contiguous copy of the whole tensor
        values = t[torch.unravel_index(idx, t.shape)]
    bits = _bits(values.reshape(-1))
    return torch.stack([bits.sum(), (bits * _weights(bits.numel(), bits.device)).sum()])


def _tensor_entries(tensors: Mapping[str, Any]) -> list[Any]:
    """Per tensor: name, shape, dtype and the two sums of its sample (bounded: every op on a tensor
    reads at most its sample; at most 14K int64 values, a kilobyte of sums, are made per tensor)."""
    torch = _torch()
    with torch.no_grad():
        entries: list[list[Any]] = []
        pending: dict[str, list[tuple[int, Any]]] = {}
        for name in sorted(tensors):
            t = tensors[name]
            if not isinstance(t, torch.Tensor):
                continue
            t = t.detach()
            entries.append([name, list(t.shape), str(t.dtype).removeprefix("torch."), None])
            if t.numel() == 0 or t.device.type == "meta" or t.is_sparse:
                continue
            pending.setdefault(str(t.device), []).append((len(entries) - 1, _sample_sums(t)))
        for items in pending.values():
            sums = _to_host(torch.stack([s for _, s in items]))
            for (i, _), pair in zip(items, sums, strict=True):
                entries[i][3] = pair
    return entries


__all__ = ["BLOCKS", "BLOCK_BYTES", "STRIDED", "block_ranges", "fingerprint", "safetensors_header"]
