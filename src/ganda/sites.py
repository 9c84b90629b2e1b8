"""Position classes of a prompt: where in it a head's ablation is restricted to.

A head ablated at one class of positions only says where it acts (``AblateHeads(heads,
positions="final")``). The classes split every scored position of a row, each position in
exactly one class, checked in this order:

* ``final``: the last prompt token and the answer's own tokens after it, every position that
  predicts an answer token (where an Aggregate head writes the answer);
* ``key``: the queried key where the question names it (KV: ``river`` in ``The value of the key
  'river' is``; tasks whose examples carry ``meta["key"]``), where an induction head looks the
  key up;
* ``ends``: each segment's last token (KV: each ``key:value`` line's ``\\n``), the summary
  positions a Gather head writes;
* ``elsewhere``: every other position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .models.base import ModelAdapter
from .tasks.base import Example, token_spans

CLASSES = ("ends", "key", "final", "elsewhere")


def prompt_sites(adapter: ModelAdapter, ex: Example) -> dict[str, list[int]]:
    """The ``ends`` and ``key`` positions of ``ex``'s encoded prompt (a BOS shifts them)."""
    from .scoring import encode

    spans: list[tuple[int, int]] = []
    key = ex.meta.get("key") if isinstance(ex.meta, dict) else None
    quoted = f"'{key}'" if key else None
    at = ex.prompt.rfind(quoted) if quoted else -1
    if at >= 0:
        spans.append((at + 1, at + 1 + len(str(key))))
    if not ex.segments and not spans:
        return {"ends": [], "key": []}
    enc = adapter.require_tokenizer()(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
    shift = len(encode(adapter, ex.prompt)) - len(enc.input_ids)
    seg = token_spans(enc.offset_mapping, list(ex.segments)) if ex.segments else []
    ends = sorted({b + shift for _, b in seg})
    keys: list[int] = []
    if spans:
        (a, b), = token_spans(enc.offset_mapping, spans)
        keys = list(range(a + shift, b + shift + 1))
    return {"ends": ends, "key": keys}


def row_classes(sites: Sequence[dict[str, list[int]] | None], rows: Sequence[tuple[int, int, int]],
                width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``[B, width]`` masks of each class for rows ``(item, query position, row length)``
    (``sites[item]``: its prompt's :func:`prompt_sites`; None: no ends and no key)."""
    out = {c: torch.zeros((len(rows), width), dtype=torch.bool) for c in CLASSES}
    for r, (item, q, n) in enumerate(rows):
        out["final"][r, q:n] = True
        s = sites[item] or {}
        for c in ("key", "ends"):
            for p in s.get(c, []):
                if 0 <= p < q and not out["final"][r, p] and not out["key"][r, p]:
                    out[c][r, p] = True
        out["elsewhere"][r, :n] = ~(out["final"][r, :n] | out["key"][r, :n] | out["ends"][r, :n])
    return {c: m.to(device) for c, m in out.items()}


__all__ = ["CLASSES", "prompt_sites", "row_classes"]
