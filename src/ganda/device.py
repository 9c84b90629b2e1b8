"""Where and in which precision models run: CPU/fp32 by default, CUDA/bf16 when present."""

from __future__ import annotations

import os

import torch


def default_device() -> torch.device:
    """CUDA when available (and not disabled with GANDA_DEVICE=cpu), else CPU."""
    forced = os.environ.get("GANDA_DEVICE")
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (as the paper runs), fp32 on CPU (bf16 matmuls are slow there)."""
    forced = os.environ.get("GANDA_DTYPE")
    if forced:
        return getattr(torch, forced)
    return torch.bfloat16 if device.type == "cuda" else torch.float32
