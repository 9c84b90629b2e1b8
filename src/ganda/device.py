"""Where and in which precision models run: CPU/fp32 by default, CUDA/bf16 when present.

``GANDA_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) and ``GANDA_DTYPE`` (``float32``,
``bfloat16``, ``float16``, ``float64`` or ``fp32``/``bf16``/``fp16``) override the defaults; a value
that cannot be honoured is refused with one line, never replaced by another device or precision.
"""

from __future__ import annotations

import os

import torch

from .errors import GandaError, env_switch

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64,
}


def parse_device(text: str | torch.device, source: str = "device") -> torch.device:
    """``text`` as a device that exists on this machine (``source`` names it in the error)."""
    try:
        dev = text if isinstance(text, torch.device) else torch.device(str(text).strip())
    except (RuntimeError, TypeError, ValueError):
        raise GandaError(f"{source}={text!r} is not a device (expected cpu, cuda, cuda:1 or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GandaError(f"{source}={text!r} but CUDA is not available on this machine (use cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise GandaError(f"{source}={text!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise GandaError(f"{source}={text!r} but MPS is not available on this machine (use cpu)")
    elif dev.type != "cpu":
        raise GandaError(f"{source}={text!r}: ganda runs on cpu, cuda or mps")
    return dev


def parse_dtype(text: str | torch.dtype, source: str = "dtype") -> torch.dtype:
    """``text`` as a floating-point torch dtype (``source`` names it in the error)."""
    if isinstance(text, torch.dtype):
        if not text.is_floating_point:
            raise GandaError(f"{source}={text} is not a floating-point precision")
        return text
    dtype = DTYPES.get(str(text).strip().lower().removeprefix("torch."))
    if dtype is None:
        raise GandaError(f"{source}={text!r} is not a precision (expected one of: {', '.join(DTYPES)})")
    return dtype


def default_device() -> torch.device:
    """CUDA when available (and not overridden with GANDA_DEVICE), else CPU."""
    forced = os.environ.get("GANDA_DEVICE")
    if forced:
        return parse_device(forced, "GANDA_DEVICE")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (as the paper runs), fp32 on CPU (bf16 matmuls are slow there)."""
    forced = os.environ.get("GANDA_DTYPE")
    if forced:
        return parse_dtype(forced, "GANDA_DTYPE")
    return torch.bfloat16 if device.type == "cuda" else torch.float32


THREADS_ENV = "GANDA_THREADS"
_SAVED_THREADS: list[int] = []


def parse_threads(text: str | int, source: str = "--threads") -> int:
    """``text`` as a number of torch intra-op threads (``source`` names it in the error)."""
    try:
        n = int(str(text).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise GandaError(f"{source}={text!r} is not a number of threads (a whole number, 1 or more)")
    return n


def set_threads(threads: str | int | None = None) -> int:
    """torch's intra-op threads for this command: ``threads`` (``--threads``), else ``GANDA_THREADS``,
    else torch's default (one per core) stays. Returns the count in use.

    Many threads do not collapse beside other jobs only because the command line starts with
    ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep instead of spinning; BENCHMARKS.md, threads).
    :func:`restore_threads` puts the previous count back."""
    if threads is None:
        env = os.environ.get(THREADS_ENV, "").strip()
        if not env:
            return torch.get_num_threads()
        n = parse_threads(env, THREADS_ENV)
    else:
        n = parse_threads(threads)
    _SAVED_THREADS.append(torch.get_num_threads())
    torch.set_num_threads(n)
    return n


def restore_threads() -> None:
    """Undo :func:`set_threads` (for commands run in-process, e.g. by tests)."""
    if _SAVED_THREADS:
        torch.set_num_threads(_SAVED_THREADS[0])
        _SAVED_THREADS.clear()


CUDNN_SDPA_ENV = "GANDA_CUDNN_SDPA"


def shape_free_attention(device: torch.device) -> bool:
    """On CUDA, take cuDNN's kernel out of PyTorch's attention (SDPA) choices, unless
    ``GANDA_CUDNN_SDPA=1``; returns whether it was taken out. cuDNN builds an execution plan for
    every new input shape, forward and backward (a few hundred milliseconds each), and ganda's
    batches take a new shape at almost every call (prompt lengths, suffix buckets, packed choices);
    the flash and memory-efficient kernels PyTorch falls back to need no plan. The switch is
    process-wide (``torch.backends.cuda.enable_cudnn_sdp``), as PyTorch's backend flags are."""
    if device.type != "cuda" or env_switch(CUDNN_SDPA_ENV, False):
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True
