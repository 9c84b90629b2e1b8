"""What "the same result" means in each precision: a bound on log-likelihoods, and prediction
agreement beyond it.

Two computations of one choice log-likelihood that differ only in the order and shape of their
arithmetic (the fast sweep and the naive loop; a cached prefix and whole rows; the GPU and the
CPU; bf16 and fp32) agree within :func:`loglik_bound` of the coarser precision: an absolute part
per scored token plus a part relative to the log-likelihood itself (an unlikely choice sits far
out on the logit scale, where rounding is coarse). Their predictions then agree on every example
whose top choice leads every other by more than the two choices' bounds together; an example
within that is a **tie**, reported by :func:`compare_logliks`, never counted as an agreement or a
disagreement. docs/heads.md, "What exact means in bf16", states the bounds and how they were
measured.

    from ganda.precision import compare_logliks
    cmp = compare_logliks(fast_logliks, naive_logliks, dtype=torch.bfloat16)
    print(cmp.text())  # "12 examples: 11 agree, 1 tie, 0 disagree; max |Δ| 0.031, within the bf16 bound"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .device import parse_dtype
from .effects import predicted

# (absolute per scored token, relative to |log-likelihood|): how far two computations of one
# log-likelihood in this precision may lie apart. bf16 keeps 8 significant bits (unit roundoff
# 2^-8): logits of a trained model reach |z| of 20-30, so rounding them alone moves a log-probability
# by ~0.1, and every layer's output is rounded too; a choice far below the top (log p of -15) sits on
# logits rounded as coarsely as they are large. Measured worst, bf16 against fp32 on the CPU (one
# token per choice): 0.38 at log p -9.9 and 0.31 at -4.2 (lab-llama, lab-mmlu), 0.25 at -3.8
# (lab-mamba2-9k), 1.71 at -14.7 (lab-hybrid-late-7k5: rounding its weights alone moves that one by
# 0.78), 0.67 at -9.0 (SmolLM2-135M, 40 MMLU questions); the bound is 0.25 + |log p| / 8 (the worst
# of these is at 0.82 of it). fp16 keeps 11 bits (8x finer): measured worst 0.065 at -7.5 (lab-mamba2-9k), bound 0.03 + |log p| / 64. fp32: the float
# tolerance every fp32 equivalence test has used.
LOGLIK_BOUND: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 0.0),
    torch.float32: (1e-4, 0.0),
    torch.float16: (0.03, 2.0 ** -6),
    torch.bfloat16: (0.25, 2.0 ** -3),
}


def loglik_bound(dtype: torch.dtype | str, tokens: int = 1, loglik: float = 0.0) -> float:
    """The bound on ``|Δ log-likelihood|`` of a choice of ``tokens`` scored tokens whose
    log-likelihood is ``loglik``, computed in ``dtype`` (``torch.bfloat16``, ``"bf16"``, ...)."""
    absolute, relative = LOGLIK_BOUND[parse_dtype(dtype)]
    return absolute * max(1, int(tokens)) + relative * abs(float(loglik))


def coarser(a: torch.dtype | str, b: torch.dtype | str) -> torch.dtype:
    """Of two precisions, the one with the larger bound (what a comparison between them is held to)."""
    da, db = parse_dtype(a), parse_dtype(b)
    return da if LOGLIK_BOUND[da] >= LOGLIK_BOUND[db] else db


@dataclass
class Agreement:
    """Two runs' choice log-likelihoods compared under a precision's bound (module docstring)."""

    n: int  # examples compared
    dtype: str  # the precision whose bound applies
    max_diff: float  # worst |Δ log-likelihood| over every choice
    max_excess: float  # worst |Δ| / (its choice's bound): at most 1 within the bound
    agree: int  # examples with a clear lead and the same prediction
    ties: list[int] = field(default_factory=list)  # examples whose lead is within the two choices' bounds
    disagree: list[int] = field(default_factory=list)  # a clear lead, a different prediction
    outside: list[tuple[int, int]] = field(default_factory=list)  # (example, choice) beyond its bound
    same_prediction: int = 0  # examples with the same prediction, ties included

    @property
    def within(self) -> bool:
        """Every log-likelihood within its bound."""
        return not self.outside

    @property
    def ok(self) -> bool:
        """Within the bound, and the same prediction wherever the lead is clear."""
        return self.within and not self.disagree

    def text(self) -> str:
        """One line: counts, ties and the worst difference against the bound."""
        where = (f"within the {self.dtype} bound" if self.within
                 else f"{len(self.outside)} choice{'s' if len(self.outside) != 1 else ''} outside the {self.dtype} "
                      f"bound ({self.max_excess:.2g}x)")
        return (f"{self.n} examples: {self.agree} agree, {len(self.ties)} tie{'s' if len(self.ties) != 1 else ''}, "
                f"{len(self.disagree)} disagree; max |Δ| {self.max_diff:.3g}, {where}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(within=self.within, ok=self.ok)
        return out


def _clear(xs: Sequence[float], limits: Sequence[float]) -> bool:
    """Whether the top choice of ``xs`` leads every other by more than the two choices' bounds
    together (the most their difference can move)."""
    t = predicted(xs)
    return all(xs[t] - xs[j] > limits[t] + limits[j] for j in range(len(xs)) if j != t)


def compare_logliks(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    *,
    dtype: torch.dtype | str,
    tokens: Sequence[Sequence[int]] | None = None,
) -> Agreement:
    """Compare two runs' log-likelihoods (per example, per choice) under :func:`loglik_bound` of
    ``dtype`` (the coarser of the two runs' precisions, :func:`coarser`). ``tokens``: each choice's
    scored tokens (default 1). A choice's bound is taken at the larger of its two log-likelihoods'
    magnitudes. An example is a tie when, in either run, the top choice leads another by no more
    than the two choices' bounds together; else its predictions must agree."""
    dt = parse_dtype(dtype)
    if len(a) != len(b):
        raise ValueError(f"{len(a)} examples against {len(b)}")
    res = Agreement(n=len(a), dtype=str(dt).removeprefix("torch."), max_diff=0.0, max_excess=0.0, agree=0)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if len(x) != len(y):
            raise ValueError(f"example {i}: {len(x)} choices against {len(y)}")
        toks = list(tokens[i]) if tokens is not None else [1] * len(x)
        limits = [loglik_bound(dt, k, max(abs(float(u)), abs(float(v)))) for u, v, k in zip(x, y, toks, strict=True)]
        for c, (u, v, lim) in enumerate(zip(x, y, limits, strict=True)):
            d = abs(float(u) - float(v))
            res.max_diff = max(res.max_diff, d)
            res.max_excess = max(res.max_excess, d / lim if lim > 0 else (0.0 if d == 0 else float("inf")))
            if d > lim:
                res.outside.append((i, c))
        same = predicted(x) == predicted(y)
        res.same_prediction += same
        if not (_clear(x, limits) and _clear(y, limits)):
            res.ties.append(i)
        elif same:
            res.agree += 1
        else:
            res.disagree.append(i)
    return res


__all__ = ["LOGLIK_BOUND", "Agreement", "coarser", "compare_logliks", "loglik_bound"]
