"""What an ablated head's slice becomes: zero, its mean, or another prompt's value.

Every command that ablates heads takes ``--ablation zero|mean|resample`` and runs it through
:class:`ganda.interventions.AblateHeads` (the sweep's batched rows through :func:`row_edit`,
the same operation), at the output-projection input of the head's mixer:

* **zero** (the default): the slice is set to 0, which removes the head's write to the residual
  stream exactly.
* **mean**: the slice is set to ``μ_h``, its mean over *every token of every reference prompt*,
  one vector per head, the same at every position. The reference prompts are the prompts being
  scored (their contexts as scoring encodes them, each run alone with the other interventions of
  the run active, the ablation itself not). A position-independent mean does not depend on how
  prompts of different lengths line up, so the layer-skipping sweep, the packed and prefix-cached
  scoring paths, path ablation and ``rank``'s attribution all give the same number for it (a
  per-position mean would need an alignment, and differ between aligned-from-start and
  aligned-from-end prompts).
* **resample**: the slice takes its value in another prompt of the same task at the same
  position: for each scored prompt a donor is drawn among the reference prompts with a different
  context (seeded, from the prompt's tokens, so the draw does not depend on batching), run alone,
  and aligned *from the end of the prompt*: the query token takes the donor's query token's value
  and position ``t`` the donor's ``t - (q - q_donor)``; positions before the donor's first token
  take its first token's value, the answer's tokens after the query the donor's query value.
  A donor is needed per scored row, so resample runs on the rows path of scoring (``eval``,
  ``demo``, ``extends``); the sweep, path and edge commands refuse it in one line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .engine import Edit, Trace
from .errors import GandaError
from .models.base import Mixer, ModelAdapter, ReadPositions
from .tasks.base import Example

ABLATIONS = ("zero", "mean", "resample")
REFERENCE_ROWS = 16  # reference prompts per forward


def check_ablation(how: str, flag: str = "--ablation", allowed: Sequence[str] = ABLATIONS) -> None:
    """Refuse (one line) an ablation kind that is not one of ``allowed``."""
    if how not in allowed:
        raise GandaError(f"{flag} must be {' or '.join(allowed)}, not {how!r}")


def check_batched_ablation(how: str, flag: str = "--ablation", what: str = "this command") -> None:
    """Refuse (one line) an ablation a batched engine cannot run exactly: zero and mean only
    (resample needs a donor per scored row, which batched rows do not keep)."""
    if how == "resample":
        raise GandaError(f"{flag} resample is not run by {what} (it needs a donor per scored row); use zero or "
                         "mean, or eval --ablate HEAD --ablation resample")
    check_ablation(how, flag, ("zero", "mean"))


def context_ids(adapter: ModelAdapter, examples: Sequence[Example]) -> list[list[int]]:
    """Each prompt's tokens as scoring runs its context (the first choice's; a prompt without
    choices as :func:`ganda.scoring.encode` gives it)."""
    from .scoring import encode, encode_examples

    mc = {i: ex for i, ex in enumerate(examples) if ex.choices}
    enc = dict(zip(mc, encode_examples(adapter, list(mc.values())), strict=True))
    return [list(enc[i][0][0][0]) if i in enc else encode(adapter, ex.prompt) for i, ex in enumerate(examples)]


def _batches(adapter: ModelAdapter, seqs: list[list[int]]) -> Any:
    """Right-padded forwards of ``seqs``, ``REFERENCE_ROWS`` at a time: ``(first index, ids, mask)``."""
    from .scoring import pad_rows

    for k in range(0, len(seqs), REFERENCE_ROWS):
        ids, mask = pad_rows(adapter, seqs[k:k + REFERENCE_ROWS])
        yield k, ids, mask


@torch.no_grad()
def reference_means(adapter: ModelAdapter, reference: Sequence[Example], mixers: Sequence[Mixer]
                    ) -> dict[tuple[int, str], torch.Tensor]:
    """``μ`` per mixer (``{(layer, kind): [H*D]}``, fp32): its output-projection input averaged over
    every token of every reference prompt, each prompt's context run alone."""
    from .interventions import z_point

    if not reference:
        raise GandaError("mean ablation needs reference prompts")
    points = {z_point(m): (m.layer, m.kind) for m in mixers}
    sums: dict[str, torch.Tensor] = {}
    count = 0
    for _, ids, mask in _batches(adapter, context_ids(adapter, reference)):
        with adapter.reading(ReadPositions.of_mask(mask)), Trace(adapter, points) as tr:
            adapter.forward(ids, attention_mask=mask)
        for p in points:
            s = (tr[p].float() * mask[..., None]).sum((0, 1))
            sums[p] = sums[p] + s if p in sums else s
        count += int(mask.sum())
    return {key: sums[p] / count for p, key in points.items()}


@dataclass
class Donors:
    """Resample donors: every reference prompt's context tokens and each mixer's output-projection
    input on it (``[T_j, H*D]``), and the seed of the draw."""

    keys: list[tuple[int, ...]]
    z: dict[str, list[torch.Tensor]]
    seed: int = 0
    _picked: dict[tuple[int, ...], int] = field(default_factory=dict)

    def pick(self, key: tuple[int, ...]) -> int:
        """The donor of a prompt with context tokens ``key``: a seeded draw among the reference
        prompts whose context differs, decided by the tokens and the seed alone."""
        if key not in self._picked:
            others = [j for j, k in enumerate(self.keys) if k != key]
            if not others:
                raise GandaError("resample ablation needs a reference prompt other than the one scored")
            h = hashlib.sha256(f"{self.seed}:{','.join(map(str, key))}".encode()).digest()
            self._picked[key] = others[int.from_bytes(h[:8], "big") % len(others)]
        return self._picked[key]


@torch.no_grad()
def reference_donors(adapter: ModelAdapter, reference: Sequence[Example], mixers: Sequence[Mixer], seed: int) -> Donors:
    from .interventions import z_point

    seqs = context_ids(adapter, reference)
    points = [z_point(m) for m in mixers]
    z: dict[str, list[torch.Tensor]] = {p: [] for p in points}
    for k, ids, mask in _batches(adapter, seqs):
        with adapter.reading(ReadPositions.of_mask(mask)), Trace(adapter, points) as tr:
            adapter.forward(ids, attention_mask=mask)
        for p in points:
            z[p] += [tr[p][r, : len(seqs[k + r])].clone() for r in range(ids.shape[0])]
    return Donors([tuple(s) for s in seqs], z, seed)


def reference_data(adapter: ModelAdapter, iv: Any, mixers: Sequence[Mixer]) -> Any:
    """What an :class:`~ganda.interventions.AblateHeads` of kind ``iv.how`` replaces slices with:
    its means (given, or taken over ``iv.reference``), resample donors, or None (zero)."""
    if iv.how == "zero":
        return None
    if iv.how == "mean" and iv.means is not None:
        missing = [m for m in mixers if (m.layer, m.kind) not in iv.means]
        if missing:
            raise GandaError(f"no reference mean for layer {missing[0].layer} ({missing[0].kind})")
        return iv.means
    if not iv.reference:
        raise GandaError(f"{iv.how} ablation needs reference prompts (AblateHeads(..., reference=examples))")
    if iv.how == "mean":
        return reference_means(adapter, iv.reference, mixers)
    return reference_donors(adapter, iv.reference, mixers, iv.seed)


def _positions(adapter: ModelAdapter, x: torch.Tensor, positions: str | None) -> torch.Tensor | None:
    """``[B, T]`` bool: where a position-restricted ablation acts (None: everywhere)."""
    from .interventions import CLASS_POSITIONS, _read_rows

    if positions is None:
        return None
    if positions in CLASS_POSITIONS:
        read = adapter.read_positions
        if read is None or read.classes is None:
            raise GandaError(f"an ablation at the {positions!r} positions runs on scoring's rows path only "
                             "(eval, demo, extends)")
        return read.classes[positions].to(x.device)
    sel = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    rows, idx = _read_rows(adapter, x, "query" if positions == "context" else positions)
    sel[rows, idx] = True
    return ~sel if positions == "context" else sel


def _donor_values(adapter: ModelAdapter, x: torch.Tensor, donors: Donors, point: str) -> torch.Tensor:
    """Each row's donor value ``[B, T, H*D]``, aligned from the end of the prompt."""
    read = adapter.read_positions
    if read is None or read.ids is None:
        raise GandaError("resample ablation runs on scoring's rows path only (eval, demo, extends)")
    out = torch.empty_like(x)
    t = torch.arange(x.shape[1], device=x.device)
    for b in range(x.shape[0]):
        q = int(read.query[b])
        j = donors.pick(tuple(read.ids[b, : q + 1].tolist()))
        z = donors.z[point][j].to(device=x.device, dtype=x.dtype)
        qd = z.shape[0] - 1
        out[b] = z[(t - q + qd).clamp(0, qd)]
    return out


def edit_for(adapter: ModelAdapter, mixer: Mixer, heads: Sequence[int], how: str, data: Any,
             positions: str | None) -> Edit:
    """The edit of ``mixer``'s output-projection input that ablates ``heads`` the ``how`` way
    (``data``: :func:`reference_data`'s) at ``positions``."""
    from .interventions import head_mask, z_point

    cols = head_mask(mixer, heads) == 0
    point = z_point(mixer)

    def edit(x: torch.Tensor) -> torch.Tensor:
        c = cols.to(x.device)
        sel = c if (where := _positions(adapter, x, positions)) is None else where[..., None] & c
        if how == "zero":
            value = torch.zeros((), dtype=x.dtype, device=x.device)
        elif how == "mean":
            value = data[(mixer.layer, mixer.kind)].to(dtype=x.dtype, device=x.device)
        else:
            value = _donor_values(adapter, x, data, point)
        return torch.where(sel, value, x)

    return edit


def row_edit(cols: torch.Tensor, mean: torch.Tensor) -> Edit:
    """The sweep's batched mean ablation: batch row b's columns ``cols[b]`` (``[B, 1, H*D]`` bool,
    head-major rows repeated when the batch is a multiple of it) set to ``mean``, as
    :func:`edit_for` sets them."""
    def edit(x: torch.Tensor) -> torch.Tensor:
        c = cols.to(x.device)
        if x.shape[0] != c.shape[0]:
            c = c.repeat_interleave(x.shape[0] // c.shape[0], dim=0)
        return torch.where(c, mean.to(dtype=x.dtype, device=x.device), x)

    return edit


__all__ = ["ABLATIONS", "Donors", "check_ablation", "check_batched_ablation", "context_ids", "edit_for", "reference_data", "reference_donors",
           "reference_means", "row_edit"]
