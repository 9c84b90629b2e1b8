"""The answer screen: every head's exact effect where the answer is read, one token per head.

Zero-ablating a head only at the query position (the last prompt token, which predicts the
answer's first token) leaves every earlier position as it was, so each prompt runs once, as a
cached prefix, and each head then costs one token of one forward::

    prompt[:-1] -> cache          (once per example, intact)
    query token x (1 + heads)     (one row per head, that head's z zeroed; row 0 intact)
    -> log p(first token of each choice) -> margin -> effect = intact - ablated

The number is exact for what it measures: the margin of the choices' first tokens with the head
ablated at the query. That is the part of a head's effect that acts where the answer is read
(an Aggregate head's; on SmolLM2's KV task also the early heads that process the query token), and
it is where a first-order estimate can fail outright (L18H6 on KV6 seed 1: exact drop 0.48, AtP*
-0.06). Heads that act at earlier positions (Gather, induction, previous-token heads) read near zero
here; the gradient estimate covers them. :func:`ganda.attribution.rank_heads` verifies the union of
both lists (``screen=K``).

Cost: a forward of ``1 + heads`` tokens per example against the sweep's ``heads x prompt`` tokens
(about 2% of the exhaustive sweep on SmolLM2 KV, 270 heads). It needs a family that continues from a
cached prefix (:meth:`ModelAdapter.supports_prefix_cache`) and choices that follow one shared context.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..effects import mean_margin
from ..engine import Trace
from ..errors import GandaError
from ..heads import HeadId
from ..interventions import row_ablations
from ..models.base import ModelAdapter, ReadPositions
from ..progress import tqdm
from ..scoring import encode_examples, run_prefix
from ..tasks.base import Example

SCREEN_ROWS = 96  # heads per forward (one query token each, every one over its own copy of the prefix cache)


@dataclass
class Screen:
    """Per-head effects at the query position (``by_head``: intact margin minus ablated, first tokens)."""

    clean: float
    by_head: dict[str, float]
    seconds: float
    cpu_seconds: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"clean": self.clean, "by_head": self.by_head, "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds, "config": self.config}


def _decision(pairs: Sequence[tuple[list[int], list[int]]]) -> tuple[list[int], list[int]] | None:
    """The tokens every choice's row shares (the context and any common start of the answers, e.g. a
    space tokenised apart) and each choice's first token after them: the answer is decided at the
    last shared token. None where the choices do not follow one shared context (Winogrande's
    partial scoring): no single position decides there."""
    ctx = pairs[0][0]
    if not ctx or any(c != ctx for c, _ in pairs):
        return None
    rows = [c + t for c, t in pairs]
    n = len(ctx)
    while all(len(r) > n + 1 for r in rows) and len({r[n] for r in rows}) == 1:
        n += 1
    return rows[0][:n], [r[n] for r in rows]


@torch.no_grad()
def answer_screen(adapter: ModelAdapter, examples: Sequence[Example], heads: Sequence[HeadId] | None = None, *,
                  margin: str = "mean", rows: int = SCREEN_ROWS, progress: bool = True) -> Screen:
    """Every head's effect on the first-token margin when zero-ablated at the query position only
    (module docstring): one cached prompt per example, one query token per head."""
    if not adapter.supports_prefix_cache():
        raise GandaError(f"the answer screen needs a model that continues from a cached prefix; {adapter.spec} does not")
    if not examples:
        raise GandaError("no examples to screen heads on")
    t0, c0 = time.perf_counter(), time.process_time()
    head_list = sorted(adapter.canonical(h) for h in (heads if heads is not None else adapter.heads()))
    variants: list[HeadId | None] = [None, *head_list]
    firsts: list[list[float]] = [[] for _ in variants]  # per variant, per example: the choices' first-token log-probs
    dev = adapter.device
    decided = [(_decision(pairs), ex) for (pairs, _, _), ex in zip(encode_examples(adapter, examples), examples, strict=True)]
    decided = [(d, ex) for d, ex in decided if d is not None]
    if not decided:
        raise GandaError("the answer screen needs examples whose choices follow one shared context; these have none")
    for (ctx, first), _ex in tqdm(decided, desc="answer screen", disable=not progress, leave=False):
        prefix = run_prefix(adapter, ctx[:-1])
        tokens = torch.tensor(first, device=dev)
        for lo in range(0, len(variants), rows):
            chunk = variants[lo: lo + rows]
            b = len(chunk)
            cache = adapter.expand_cache(prefix, b)
            zero = torch.zeros(b, dtype=torch.long, device=dev)
            with Trace(adapter, edit=row_ablations(adapter, chunk)):
                logits = adapter.forward_cached(torch.full((b, 1), ctx[-1], device=dev), cache,
                                                torch.full((b, 1), len(ctx) - 1, device=dev),
                                                keep=zero[:1], read=ReadPositions(zero, zero))
            picked = torch.log_softmax(logits[:, 0].float(), -1)[:, tokens].cpu().tolist()
            for v, row in zip(range(lo, lo + b), picked, strict=True):
                firsts[v].append(row)
            del cache
    golds = [ex.gold for _, ex in decided]
    clean = mean_margin(firsts[0], golds, margin)
    by_head = {str(h): clean - mean_margin(firsts[i + 1], golds, margin) for i, h in enumerate(head_list)}
    return Screen(clean, by_head, time.perf_counter() - t0, time.process_time() - c0,
                  {"margin": margin, "n": len(decided), "left_out": len(examples) - len(decided),
                   "positions": "last shared token", "tokens": "first after it"})
