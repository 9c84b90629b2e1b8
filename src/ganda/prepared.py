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
from .scoring import common_prefix, encode_examples, pad_rows, right_pad
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
    (pairs, single, n_chars), = encode_examples(adapter, [ex])
    for c, t in pairs:
        if not t:
            raise GandaError(f"a choice encodes to no token after the context: {ex.prompt[-40:]!r}")
        if not c:
            raise GandaError("an empty context cannot be scored")
    p = Prepared(
        rows=[list(c) + list(t) for c, t in pairs],
        ctx_lens=[len(c) for c, _ in pairs],
        conts=[list(t) for _, t in pairs],
        single=single,
        n_chars=n_chars,
        gold=ex.gold,
    )
    # the longest prefix shared by every row's inputs (a row's last token is never an input that is read)
    inputs = [r[:-1] for r in p.rows]
    pre = p.prefix = min(common_prefix(inputs[0], r) for r in inputs)
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


# ---------------------------------------------------------------------------------------------
# batches of prepared examples: the gradient passes' input (attribution, the circuit's edges and
# paths), where the examples of one batch share one forward and each keeps its own read sites


@dataclass
class BatchItem:
    """One example inside a :class:`Batch`: its token rows and, per choice, where its
    log-probabilities are read."""

    index: int  # the example's index in the prompts
    gold: int
    rows: list[list[int]]  # token rows (packed: one)
    positions: list[list[int]] | None  # packed only
    parents: list[list[int]] | None  # packed only: -1 prefix, else choice index
    reads: list[tuple[int, list[int], list[int]]]  # per choice: (row within item, positions, target ids)


@dataclass
class Batch:
    """Several examples' rows as one right-padded forward on the model's device: ids, the attention
    mask (the packed layout's additive block masks, or the rows' 0/1 mask), position ids (packed
    only) and which example each row belongs to."""

    items: list[BatchItem]
    ids: torch.Tensor
    mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    row_example: torch.Tensor  # [rows] index into items
    valid: torch.Tensor  # [rows, W] bool: real (non-pad) positions
    packed: bool

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])


def batch_item(p: Prepared, index: int, packed: bool) -> BatchItem:
    """Example ``index``'s rows and read sites in the packed layout or the row layout."""
    sites = p.sites(PACKED if packed else ROWS)
    reads = [(where[0][0], [k for _, k in where], list(c)) for where, c in zip(sites, p.conts, strict=True)]
    if packed:
        return BatchItem(index, p.gold, [list(p.tokens)], [list(p.positions)], [list(p.parent)], reads)
    return BatchItem(index, p.gold, p.input_rows(whole=False), None, None, reads)


def make_batch(adapter: Any, items: list[BatchItem], packed: bool, dtype: torch.dtype | None = None) -> Batch:
    """``items`` as one batch on the adapter's device. Packed rows get additive block masks in
    ``dtype`` (default: the model's parameters'); a pad position sees only itself, so no row of a
    mask is all masked."""
    if dtype is None:
        dtype = next(adapter.model.parameters()).dtype
    dev = adapter.device
    rows = [r for it in items for r in it.rows]
    row_example = torch.tensor([j for j, it in enumerate(items) for _ in it.rows], device=dev)
    ids, mask = right_pad(adapter, rows)
    w, valid = ids.shape[1], mask.bool()
    if not packed:
        return Batch(items, ids.to(dev), mask.to(dev), None, row_example, valid.to(dev), False)
    pos = torch.zeros((len(rows), w), dtype=torch.long)
    mask = torch.full((len(rows), 1, w, w), torch.finfo(dtype).min, dtype=dtype)
    idx = torch.arange(w)
    for i, it in enumerate(items):
        assert it.positions is not None and it.parents is not None
        n = len(it.rows[0])
        pos[i, :n] = torch.tensor(it.positions[0])
        mask[i, 0, :n, :n] = block_mask(torch.tensor(it.parents[0]), dtype)
        mask[i, 0, idx[n:], idx[n:]] = 0.0  # a pad position sees only itself (no all-masked row)
    return Batch(items, ids.to(dev), mask.to(dev), pos.to(dev), row_example, valid.to(dev), True)


def plan_batches(adapter: Any, examples: Any, batch_tokens: int) -> tuple[list[list[BatchItem]], bool]:
    """The examples prepared and grouped, in order, into batches of at most ``batch_tokens`` padded
    tokens (fixed by the inputs alone, so a resumed run batches as the first did), and whether they
    are packed (every example packs on this model) or in rows."""
    prepared = prepare_all(adapter, examples)
    packed = all(adapter.packs_choices(len(p.tokens)) for p in prepared)
    items = [batch_item(p, i, packed) for i, p in enumerate(prepared)]
    batches: list[list[BatchItem]] = []
    cur: list[BatchItem] = []
    for it in items:
        trial = cur + [it]
        n_rows = sum(len(x.rows) for x in trial)
        width = max(len(r) for x in trial for r in x.rows)
        if cur and n_rows * width > batch_tokens:
            batches.append(cur)
            trial = [it]
        cur = trial
    if cur:
        batches.append(cur)
    return batches, packed


__all__ = ["PACKED", "ROWS", "Batch", "BatchItem", "Prepared", "batch_item", "block_mask", "make_batch",
           "plan_batches", "prepare", "prepare_all"]
