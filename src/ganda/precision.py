"""What "the same result" means in each precision: a bound on log-likelihoods, and prediction
agreement beyond it.

Two computations of one choice log-likelihood that differ only in the order and shape of their
arithmetic (the fast sweep and the naive loop; a cached prefix and whole rows; the GPU and the
CPU; bf16 and fp32) agree within :func:`loglik_bound` of the coarser precision, per scored token.
Their predictions then agree on every example whose top-two margin exceeds twice the bound (each
of the two log-likelihoods may move by the bound); an example within it is a **tie**, reported
by :func:`compare_logliks`, never counted as an agreement or a disagreement. docs/heads.md,
"What exact means in bf16", states the bounds and how they were measured.

    from ganda.precision import compare_logliks
    cmp = compare_logliks(fast_logliks, naive_logliks, dtype=torch.bfloat16)
    print(cmp.text())  # "12 examples: 11 agree, 1 tie (margin <= 1), 0 disagree; max |Δ| 0.031 <= 0.5 per token"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .device import parse_dtype

# Per scored token: how far two computations of one log-likelihood in this precision may lie apart.
# bf16 keeps 8 significant bits (unit roundoff 2^-8 = 3.9e-3): the logits of a trained model reach
# |z| of 20-30, so rounding them alone moves a log-probability by ~0.1, and every layer's output is
# rounded too. Measured worst bf16 against fp32 (the CPU, one token per choice): 0.38 on lab-llama
# lab-mmlu (48 questions) and on SmolLM2-135M MMLU (40 questions; docs/scale.md). fp16 keeps 11
# bits (2^-11, 8x finer): measured worst 0.065 (lab-mamba2 lab-mmlu). fp32: float tolerance of
# reordered sums, the bound every fp32 equivalence test has used.
LOGLIK_BOUND: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.float16: 0.1,
    torch.bfloat16: 0.5,
}


def loglik_bound(dtype: torch.dtype | str, tokens: int = 1) -> float:
    """The bound on ``|Δ log-likelihood|`` of a choice of ``tokens`` scored tokens computed in
    ``dtype`` (``torch.bfloat16``, ``"bf16"``, ...): :data:`LOGLIK_BOUND` per token, summed."""
    dt = parse_dtype(dtype)
    return LOGLIK_BOUND[dt] * max(1, int(tokens))


def coarser(a: torch.dtype | str, b: torch.dtype | str) -> torch.dtype:
    """Of two precisions, the one with the larger bound (what a comparison between them is held to)."""
    da, db = parse_dtype(a), parse_dtype(b)
    return da if LOGLIK_BOUND[da] >= LOGLIK_BOUND[db] else db


@dataclass
class Agreement:
    """Two runs' choice log-likelihoods compared under a per-token bound (see the module docstring)."""

    n: int  # examples compared
    bound: float  # per scored token
    max_diff: float  # worst |Δ log-likelihood| over every choice
    max_excess: float  # worst |Δ| / (its choice's bound): at most 1 within the bound
    agree: int  # examples with a clear margin (> 2x the bound) and the same prediction
    ties: list[int] = field(default_factory=list)  # examples whose top-two margin is within 2x the bound
    disagree: list[int] = field(default_factory=list)  # clear margin, different prediction
    outside: list[tuple[int, int]] = field(default_factory=list)  # (example, choice) beyond the bound
    same_prediction: int = 0  # examples with the same prediction, ties included

    @property
    def within(self) -> bool:
        """Every log-likelihood within its bound."""
        return not self.outside

    @property
    def ok(self) -> bool:
        """Within the bound, and the same prediction wherever the margin is clear."""
        return self.within and not self.disagree

    def text(self) -> str:
        """One line: counts, ties and the worst difference against the bound."""
        return (f"{self.n} examples: {self.agree} agree, {len(self.ties)} tie{'s' if len(self.ties) != 1 else ''} "
                f"(margin <= {2 * self.bound:g}), {len(self.disagree)} disagree; max |Δ| {self.max_diff:.3g}"
                f"{' <= ' if self.within else ' > '}{self.bound:g} per token"
                + (f" ({len(self.outside)} choices outside)" if self.outside else ""))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(within=self.within, ok=self.ok)
        return out


def _argmax(xs: Sequence[float]) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])


def _clear(xs: Sequence[float], limits: Sequence[float]) -> bool:
    """Whether the top choice of ``xs`` leads every other by more than the two choices' bounds
    together (the most their difference can move)."""
    t = _argmax(xs)
    return all(xs[t] - xs[j] > limits[t] + limits[j] for j in range(len(xs)) if j != t)


def compare_logliks(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    *,
    dtype: torch.dtype | str | None = None,
    bound: float | None = None,
    tokens: Sequence[Sequence[int]] | None = None,
) -> Agreement:
    """Compare two runs' log-likelihoods (per example, per choice) under a per-token ``bound``
    (default :func:`loglik_bound` of ``dtype``; one of the two is required). ``tokens``: each
    choice's scored tokens (default 1), which multiplies its bound. An example is a tie when, in
    either run, the top choice leads another by no more than their two bounds together (twice the
    bound for one-token choices); else its predictions must agree."""
    if bound is None:
        if dtype is None:
            raise ValueError("give dtype= or bound=")
        bound = loglik_bound(dtype)
    if len(a) != len(b):
        raise ValueError(f"{len(a)} examples against {len(b)}")
    res = Agreement(n=len(a), bound=float(bound), max_diff=0.0, max_excess=0.0, agree=0)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if len(x) != len(y):
            raise ValueError(f"example {i}: {len(x)} choices against {len(y)}")
        toks = list(tokens[i]) if tokens is not None else [1] * len(x)
        limits = [bound * max(1, int(t)) for t in toks]
        for c, (u, v, lim) in enumerate(zip(x, y, limits, strict=True)):
            d = abs(float(u) - float(v))
            res.max_diff = max(res.max_diff, d)
            res.max_excess = max(res.max_excess, d / lim if lim > 0 else (0.0 if d == 0 else float("inf")))
            if d > lim:
                res.outside.append((i, c))
        same = _argmax(x) == _argmax(y)
        res.same_prediction += same
        if not (_clear(x, limits) and _clear(y, limits)):
            res.ties.append(i)
        elif same:
            res.agree += 1
        else:
            res.disagree.append(i)
    return res


__all__ = ["LOGLIK_BOUND", "Agreement", "coarser", "compare_logliks", "loglik_bound"]
