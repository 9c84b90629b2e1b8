"""Attention maps for drawing: tokens plus per-head matrices from the adapter (any family).

:func:`draw_attention` writes the PNG (for papers) and, beside it, the same maps as JSON
(``<name>.json``, format :data:`ATTENTION_FORMAT`) with the tokens, the segments and the gold
segment, which the HTML report turns into an interactive view.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from . import runio
from .figures import attention_panels
from .heads import expand
from .models.base import ModelAdapter
from .patterns import prompt_positions
from .scoring import encode
from .tasks.base import Example

ATTENTION_FORMAT = "ganda-attention/1"


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


def segment_tokens(adapter: ModelAdapter, example: Example) -> list[list[int]]:
    """The example's segments as inclusive token spans ``[first, last]`` of its encoded prompt
    (a BOS token added by :func:`~ganda.scoring.encode` shifts them)."""
    if not example.segments:
        return []
    return [list(span) for span in prompt_positions(adapter, example)[1]]  # the spans pattern scores read


def attention_record(
    tokens: list[str], maps: dict[str, Any], kinds: dict[str, str], rows: list[int] | None = None, *,
    segments: list[list[int]] | None = None, gold_segment: int | None = None, label: str = "prompt 0",
    roles: dict[str, str] | None = None, decimals: int = 5,
) -> dict[str, Any]:
    """One prompt's maps as JSON: tokens, segments (token spans), gold segment, and per head its
    kind (``softmax``/``implicit``), optional role and ``[R, T]`` matrix rounded to ``decimals``."""
    heads = {}
    for name, m in maps.items():
        arr = m.detach().float().cpu().tolist() if hasattr(m, "detach") else [list(map(float, r)) for r in m]
        heads[name] = {"kind": kinds.get(name, "softmax"), "role": (roles or {}).get(name),
                       "map": [[round(float(v), decimals) for v in r] for r in arr]}
    return {"label": label, "tokens": list(tokens), "rows": rows, "segments": segments or [],
            "gold_segment": gold_segment, "heads": heads}


def save_attention_json(path: str | Path, model: str, prompts: list[dict[str, Any]]) -> Path:
    """Write ``{"format", "model", "prompts": [attention_record, ...]}`` to ``path``."""
    doc = {"format": ATTENTION_FORMAT, "model": model, "prompts": prompts}
    runio.write_text(Path(path), json.dumps(runio.rounded(doc), separators=(",", ":")))  # floats as every result's
    return Path(path)


def sidecar(out: str | Path) -> Path | None:
    """Where :func:`draw_attention` writes the maps as JSON beside ``out`` (None when ``out`` is a
    device or a pipe, which has no "beside")."""
    out = Path(out)
    if out.exists() and not out.is_file():
        return None
    return out.with_suffix(".json")


def draw_attention(
    adapter: ModelAdapter, prompt: str | Example, heads: str | list, out: str | Path, last_rows: int | None = None,
    title: str | None = None, roles: dict[str, str] | None = None, marks: dict[str, Any] | None = None,
) -> Path:
    """One PNG, one panel per head (softmax: sequential [0,1]; SSM implicit: signed, diverging),
    and the same maps as ``<out>.json`` for the report's interactive view (not when ``out`` is a
    device such as ``/dev/null``: nothing is written beside it). An :class:`Example` also records
    its segments and gold segment; ``roles`` names heads' roles (``gather``, ...); ``marks``
    (``marks``, ``mark_label``, ``mark_values``) the prompt positions the view outlines."""
    example = prompt if isinstance(prompt, Example) else None
    text = example.prompt if example is not None else str(prompt)
    tokens, maps, kinds, rows = prompt_maps(adapter, text, heads, last_rows)
    if not isinstance(heads, str):  # panels in the caller's order (``expand`` sorts by layer)
        order = [str(h) for item in heads for h in expand([item], adapter)]
        maps = {h: maps[h] for h in dict.fromkeys(order)}
        roles = {str(expand([k], adapter)[0]): v for k, v in (roles or {}).items()}
    path = attention_panels(maps, tokens, kinds, out, rows=rows, title=title or adapter.spec, roles=roles)
    if not sidecar(path):
        return path
    record = attention_record(
        tokens, maps, kinds, rows, segments=segment_tokens(adapter, example) if example is not None else None,
        gold_segment=example.gold_segment if example is not None else None, roles=roles)
    save_attention_json(sidecar(path), adapter.spec, [{**record, **(marks or {})}])
    return path
