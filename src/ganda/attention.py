"""Attention maps for drawing: tokens plus per-head matrices from the adapter (any family)."""

from __future__ import annotations

from pathlib import Path

import torch

from .figures import attention_panels
from .heads import expand
from .models.base import ModelAdapter
from .scoring import encode


def prompt_maps(
    adapter: ModelAdapter, prompt: str, heads: str | list, last_rows: int | None = None
) -> tuple[list[str], dict[str, torch.Tensor], dict[str, str], list[int] | None]:
    """Tokens, ``{head: matrix}``, ``{head: "softmax"|"implicit"}`` and the drawn rows."""
    hs = expand(heads, adapter)
    ids = encode(adapter, prompt)
    adapter.check_length(len(ids))
    rows = list(range(len(ids) - last_rows, len(ids))) if last_rows else None
    maps = adapter.attention_maps(torch.tensor([ids]), hs, rows=rows)
    tokens = adapter.tokenizer.convert_ids_to_tokens(ids)
    return tokens, {str(h): m for h, m in maps.items()}, {str(h): adapter.map_kind(h) for h in hs}, rows


def draw_attention(
    adapter: ModelAdapter, prompt: str, heads: str | list, out: str | Path, last_rows: int | None = None,
    title: str | None = None,
) -> Path:
    """One PNG, one panel per head (softmax: sequential [0,1]; SSM implicit: signed, diverging)."""
    tokens, maps, kinds, rows = prompt_maps(adapter, prompt, heads, last_rows)
    return attention_panels(maps, tokens, kinds, out, rows=rows, title=title or adapter.spec)
