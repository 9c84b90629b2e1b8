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

CLASSES = ("ends", "key", "final", "elsewhere")


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


__all__ = ["CLASSES", "row_classes"]
