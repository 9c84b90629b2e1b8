"""One multiple-choice example as the model sees it: token rows, a packed layout, read sites.

Every analysis that scores choices by hand (the sweep's engines, attribution, pruning's one-pass
shortcuts, the Ray scorer) starts from :func:`prepare`, which tokenises an example exactly as
:func:`ganda.scoring.score_example` does (lm-eval's ``_encode_pair``, Winogrande's partial
scoring included), so their numbers are the scorer's. A :class:`Prepared` example offers two
layouts of the same tokens:

* **rows** (the scorer's own): one row ``context_i + continuation_i`` per choice, or, when every
  choice is one token after one shared context (MMLU letters), the context alone;
* **packed**: the tokens every row shares run once and each choice's remaining tokens follow,
  under a block mask (:func:`block_mask`: each choice sees the shared prefix and itself) with
  position ids that continue the prefix.

``sites(layout)`` says, per choice, at which ``(row, position)`` the log-probability of each of
its continuation tokens is read, in either layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import GandaError
from .scoring import encode_pairs, example_pairs, norm_chars, pad_rows
from .tasks.base import Example

PACKED, ROWS = "packed", "rows"


@dataclass
class Prepared:
    """One example's tokens in the scorer's row layout and in the packed layout."""

    rows: list[list[int]]  # row i = context_i + continuation_i (the scorer's layout)
    ctx_lens: list[int]
    conts: list[list[int]]  # each choice's continuation ids (the tokens whose log-probs are summed)
    single: bool  # every choice one token after one shared context: the context alone is scored
    n_chars: list[int]  # lm-eval's acc_norm lengths
    gold: int
    # the packed layout
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)  # -1: prefix token; else the choice it belongs to
    prefix: int = 0
    read: list[list[int]] = field(default_factory=list)  # per choice: packed indices whose logits are read

    @property
    def width(self) -> int:
        """The longest row (what the model's context must hold)."""
        return max(len(r) for r in self.rows)

    def input_rows(self, whole: bool = True) -> list[list[int]]:
        """The row layout's token rows: the context alone on the single path, else one row per
        choice (``whole=False`` drops each row's last token, which no read position sees)."""
        if self.single:
            return [self.rows[0][: self.ctx_lens[0]]]
        return [list(r) if whole else r[:-1] for r in self.rows]

    def row_tensors(self, adapter: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scorer's input on the model's device: the context alone (no mask) or right-padded
        rows and their attention mask."""
        if self.single:
            adapter.check_length(self.ctx_lens[0])
            return torch.tensor(self.input_rows(), device=adapter.device), None
        return pad_rows(adapter, self.rows)  # refuses rows longer than the model's context

    def sites(self, layout: str = ROWS) -> list[list[tuple[int, int]]]:
        """Per choice, the ``(row, position)`` whose next-token log-probability scores each of its
        continuation tokens (``layout``: ``"rows"`` or ``"packed"``, whose only row is 0)."""
        out = []
        for ci, cont in enumerate(self.conts):
            if layout == PACKED:
                out.append([(0, k) for k in self.read[ci]])
            else:
                row = 0 if self.single else ci
                first = self.ctx_lens[ci] - 1
                out.append([(row, k) for k in range(first, first + len(cont))])
        return out


def packed_batch(group: list[Prepared], dtype: torch.dtype, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Several examples' packed layouts as one batch: ``[g, W]`` ids, additive ``[g, 1, W, W]``
    block masks and ``[g, W]`` position ids, each right-padded to the longest (one example: its own
    layout, no pad). A pad token sees the shared prefix and the pads before it, and no real token
    sees a pad, so every real position computes what it computes alone up to float rounding."""
    w = max(len(p.tokens) for p in group)
    ids, masks, pos = [], [], []
    for p in group:
        pad = w - len(p.tokens)
        ids.append(p.tokens + p.tokens[-1:] * pad)
        pos.append(p.positions + list(range(p.positions[-1] + 1, p.positions[-1] + 1 + pad)))
        masks.append(block_mask(torch.tensor(p.parent + [len(p.conts)] * pad, device=device), dtype))
    return torch.tensor(ids, device=device), torch.stack(masks)[:, None], torch.tensor(pos, device=device)


def block_mask(parent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The packed layout's additive ``[W, W]`` mask: causal, and a choice's tokens see the shared
    prefix (``parent == -1``) and their own choice only."""
    w = parent.shape[0]
    idx = torch.arange(w, device=parent.device)
    causal = idx[None, :] <= idx[:, None]
    same = (parent[None, :] == -1) | (parent[None, :] == parent[:, None])
    mask = torch.zeros((w, w), dtype=dtype, device=parent.device)
    return mask.masked_fill_(~(causal & same), torch.finfo(dtype).min)


def prepare(adapter: Any, ex: Example) -> Prepared:
    """Tokenise ``ex`` exactly as :func:`ganda.scoring.score_example` does, then pack it."""
    pairs = encode_pairs(adapter, example_pairs(ex))
    for c, t in pairs:
        if not t:
            raise GandaError(f"a choice encodes to no token after the context: {ex.prompt[-40:]!r}")
        if not c:
            raise GandaError("an empty context cannot be scored")
    p = Prepared(
        rows=[list(c) + list(t) for c, t in pairs],
        ctx_lens=[len(c) for c, _ in pairs],
        conts=[list(t) for _, t in pairs],
        single=len({tuple(c) for c, _ in pairs}) == 1 and all(len(t) == 1 for _, t in pairs),
        n_chars=norm_chars(ex),
        gold=ex.gold,
    )
    # the longest prefix shared by every row's inputs (a row's last token is never an input that is read)
    inputs = [r[:-1] for r in p.rows]
    n = min(len(r) for r in inputs)
    pre = 0
    while pre < n and all(r[pre] == inputs[0][pre] for r in inputs):
        pre += 1
    p.prefix = pre
    p.tokens = list(inputs[0][:pre])
    p.positions = list(range(pre))
    p.parent = [-1] * pre
    for i, r in enumerate(inputs):
        start = len(p.tokens)
        p.tokens.extend(r[pre:])
        p.positions.extend(range(pre, len(r)))
        p.parent.extend([i] * (len(r) - pre))
        p.read.append([pos if pos < pre else start + pos - pre for pos in range(p.ctx_lens[i] - 1, len(p.rows[i]) - 1)])
    return p


def prepare_all(adapter: Any, examples: Any) -> list[Prepared]:
    """:func:`prepare` for each example, refusing (before any work) one longer than the model's context."""
    out = [prepare(adapter, ex) for ex in examples]
    for p in out:
        adapter.check_length(p.width)
    return out


__all__ = ["PACKED", "ROWS", "Prepared", "block_mask", "packed_batch", "prepare", "prepare_all"]
