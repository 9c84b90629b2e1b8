"""Reversible interventions: context managers that always restore the model, even on errors.

Head interventions act at the *input* of a mixer's output projection (``o_proj``/``out_proj``),
reshaped to ``[..., heads, head_dim]``: zeroing head h there removes exactly h's contribution
to the residual stream, which is what the paper does by zeroing h's columns of the projection
(we test the equivalence). Layer interventions swap the decoder-layer list and put the original
back. No weight is ever edited in place. Layer numbers, in layer edits and in head ids alike,
always name the layers of the model as loaded.

Every intervention is a small dataclass that can ``describe()`` itself, so result files record
exactly what was done, and ``apply(adapter, [..])`` stacks several.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .engine import Edit, Trace
from .errors import GandaError
from .heads import HeadId, compress_ranges, expand, format_heads
from .models.base import Mixer, ModelAdapter

CLASS_POSITIONS = ("ends", "key", "final", "elsewhere")  # ganda.sites.CLASSES (a layer above)
POSITIONS = ("query", "last", "context", *CLASS_POSITIONS)


def z_point(mixer: Mixer) -> str:
    """The engine point of a mixer's output-projection input, ``[B, T, heads * head_dim]``."""
    return f"L{mixer.layer}.{mixer.kind}.z"


def head_mask(mixer: Mixer, heads: Iterable[int], keep: bool = False) -> torch.Tensor:
    """``[heads * head_dim]`` of ones with the listed heads' slices zero (``keep``: the other way
    round), in the dtype and on the device of the mixer's output projection."""
    w = mixer.out_proj.weight
    # a disk-offloaded layer's weight sits on the meta device between forwards: build the mask on the CPU
    dev = w.device if w.device.type != "meta" else torch.device("cpu")
    mask = torch.full((mixer.num_heads, mixer.head_dim), 1.0 if not keep else 0.0, dtype=w.dtype, device=dev)
    for h in heads:
        mask[h] = 0.0 if not keep else 1.0
    return mask.reshape(-1)


def row_ablations(adapter: ModelAdapter, heads: Sequence[HeadId | None],
                  means: dict[tuple[int, str], torch.Tensor] | None = None) -> dict[str, Edit]:
    """The edits that zero (``means``: set to its mean, :mod:`ganda.ablation`), in batch row b, head
    ``heads[b]`` (None: nothing), one edit per mixer the heads belong to: a batch of single-head
    ablations in one forward, the heads of one layer (the sweep) or of several (the answer screen);
    empty when every entry is None."""
    owners = [adapter.mixer_of(h) if h is not None else None for h in heads]  # each row's mixer
    edits: dict[str, Edit] = {}
    for mixer in {id(m): m for m in owners if m is not None}.values():
        masks = torch.stack([head_mask(mixer, [h.head] if h is not None and m is mixer else [])
                             for h, m in zip(heads, owners, strict=True)])[:, None]
        edits[z_point(mixer)] = edit_for(adapter, mixer, masks, "zero" if means is None else "mean", means)
    return edits


@contextmanager
def _edit_layers(adapter: ModelAdapter, layers: Any, what: str, edits: dict[str, Any]) -> Iterator[None]:
    """Claim ``layers`` for an intervention (``what`` names it if another layer edit holds them), run
    with ``edits`` on their named points, and release them however the block ends."""
    token = adapter.use_layers(layers, what)
    try:
        with Trace(adapter, edit=edits):
            yield
    finally:
        adapter.release_layers(token)


def _group_by_mixer(adapter: ModelAdapter, heads: Sequence[HeadId]) -> dict[int, tuple[Mixer, list[int]]]:
    groups: dict[int, tuple[Mixer, list[int]]] = {}
    for h in heads:
        mixer = adapter.mixer_of(h)
        groups.setdefault(id(mixer), (mixer, []))[1].append(h.head)
    return groups

# ---- what an ablated slice becomes (ganda.ablation: the rules) -----------------------------------
ABLATIONS = ("zero", "mean", "resample")
#: how ``mean`` and ``resample`` take their data from reference prompts, ``{how: fn(adapter, reference,
#: mixers, seed)}``: running the model on prompts is scoring's work, so :mod:`ganda.scoring` fills this
REFERENCES: dict[str, Callable[..., Any]] = {}


def check_ablation(how: str, flag: str = "--ablation", allowed: Sequence[str] = ABLATIONS) -> None:
    """Refuse (one line) an ablation kind that is not one of ``allowed``."""
    if how not in allowed:
        raise GandaError(f"{flag} must be {' or '.join(allowed)}, not {how!r}")



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



def _positions(adapter: ModelAdapter, x: torch.Tensor, positions: str | None) -> torch.Tensor | None:
    """``[B, T]`` bool: where a position-restricted ablation acts (None: everywhere). ``query`` and
    ``last`` are each row's read position of the forward running (:attr:`ModelAdapter.read_positions`;
    unpadded or left-padded input: each row's last position), ``context`` every position before the
    query (not the answer's own tokens after it, which predict the answer too), a class of
    :mod:`ganda.sites` the positions of that class."""
    if positions is None:
        return None
    read = adapter.read_positions
    if positions in CLASS_POSITIONS:
        if read is None or read.classes is None:
            raise GandaError(f"an ablation at the {positions!r} positions runs on scoring's rows path only "
                             "(eval, demo, extends)")
        return read.classes[positions].to(x.device)
    sel = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    if read is None:
        sel[:, -1] = True
    elif positions == "context":  # positions relative to the forward's chunk (a cached prefix, then its suffix)
        return torch.arange(x.shape[1], device=x.device)[None, :] < read.query.to(x.device)[:, None]
    else:
        idx = (read.last if positions == "last" else read.query).to(x.device)
        # a forward over one chunk of a longer sequence (a cached prefix, then its suffix) gets
        # positions relative to the chunk: a row whose position lies outside it has no query here
        inside = (idx >= 0) & (idx < x.shape[1])
        sel[torch.arange(x.shape[0], device=x.device)[inside], idx[inside]] = True
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



def edit_for(adapter: ModelAdapter, mixer: Mixer, mask: torch.Tensor, how: str = "zero", data: Any = None,
             positions: str | None = None) -> Edit:
    """The edit of ``mixer``'s output-projection input that ablates the columns ``mask`` zeroes
    (:func:`head_mask`'s ``[H*D]``, or ``[B, 1, H*D]``: one mask per batch row, rows repeated
    head-major when the batch is a multiple of it) the ``how`` way (``data``: :func:`reference_data`'s)
    at ``positions`` (None: every position; :class:`AblateHeads`). Every head ablation, single or
    batched, zero, mean or resample, is this edit."""
    cols = mask == 0
    point = z_point(mixer)

    def edit(x: torch.Tensor) -> torch.Tensor:
        c = cols.to(x.device)
        if c.ndim == 3 and x.shape[0] != c.shape[0]:  # head-major rows: row b owns rows b*C .. b*C+C-1
            c = c.repeat_interleave(x.shape[0] // c.shape[0], dim=0)
        sel = c if (where := _positions(adapter, x, positions)) is None else where[..., None] & c
        if how == "zero":
            value = torch.zeros((), dtype=x.dtype, device=x.device)
        elif how == "mean":
            value = data[(mixer.layer, mixer.kind)].to(dtype=x.dtype, device=x.device)
        else:
            value = _donor_values(adapter, x, data, point)
        return torch.where(sel, value, x)

    return edit


def reference_data(adapter: ModelAdapter, iv: Any, mixers: Sequence[Mixer]) -> Any:
    """What an :class:`AblateHeads` of kind ``iv.how`` replaces slices with: its means (given, or
    taken over ``iv.reference``), resample donors, or None (zero)."""
    if iv.how == "zero":
        return None
    if iv.how == "mean" and iv.means is not None:
        missing = [m for m in mixers if (m.layer, m.kind) not in iv.means]
        if missing:
            raise GandaError(f"no reference mean for layer {missing[0].layer} ({missing[0].kind})")
        return iv.means
    if not iv.reference:
        raise GandaError(f"{iv.how} ablation needs reference prompts (AblateHeads(..., reference=examples))")
    if iv.how not in REFERENCES:
        raise GandaError(f"{iv.how} ablation over reference prompts needs ganda.scoring imported (it runs them)")
    return REFERENCES[iv.how](adapter, iv.reference, mixers, iv.seed)



class Intervention:
    """Base class: a reversible change to a model, usable as ``with iv.apply(adapter):``."""

    def apply(self, adapter: ModelAdapter):  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class AblateHeads(Intervention):
    """Ablate heads at the output-projection input (all positions, or only some), their slice
    replaced by zero (``how="zero"``, the default), by its mean over reference prompts
    (``"mean"``) or by its value in another prompt of the same task (``"resample"``); see
    :mod:`ganda.ablation` for the mean and resample rules.

    ``reference``: the prompts the mean is taken over and resample donors come from (the
    commands pass the prompts being scored); ``means``: precomputed means (``{(layer, kind):
    [H*D]}``, what :func:`ganda.ablation.reference_means` returns) instead of a reference;
    ``seed``: the resample donors' draw."""

    heads: Sequence[HeadId | str] | str
    # None: every position; "query": the last prompt token only (it predicts the answer's first
    # token); "last": the last scored position (it predicts the answer's final token);
    # "context": every position before the query (what a Gather head writes, not what an
    # Aggregate head reads at the answer position); a class of ganda.sites ("ends", "key",
    # "final", "elsewhere"): the positions of that class in each scored row
    positions: str | None = None
    how: str = "zero"
    reference: Sequence[Any] | None = field(default=None, repr=False)
    means: dict[tuple[int, str], torch.Tensor] | None = field(default=None, repr=False)
    seed: int = 0

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        if self.positions is not None and self.positions not in POSITIONS:
            raise GandaError(f"positions must be None or one of {', '.join(POSITIONS)}, not {self.positions!r}")
        check_ablation(self.how, "how")
        heads = expand(self.heads, adapter)
        if isinstance(self.heads, str) and not heads:
            raise GandaError(f"no head ids in {self.heads!r} (expected e.g. L17H24 or L3H0-2)")
        for h in heads:  # a head of a removed layer would be ablated by nothing: refuse it
            adapter.require_active([h.layer], str(h))
        groups = _group_by_mixer(adapter, heads).values()
        data = reference_data(adapter, self, [m for m, _ in groups])
        edits = {z_point(m): edit_for(adapter, m, head_mask(m, hs), self.how, data, self.positions) for m, hs in groups}
        rows = int(self.how == "resample" or self.positions in CLASS_POSITIONS)
        adapter.row_needs = getattr(adapter, "row_needs", 0) + rows
        try:
            with _edit_layers(adapter, {h.layer for h in heads}, f"the ablation of {_short(heads)}", edits):
                yield
        finally:
            adapter.row_needs -= rows

    def describe(self) -> dict[str, Any]:
        heads = self.heads if isinstance(self.heads, str) else format_heads(self.heads)  # type: ignore[arg-type]
        d: dict[str, Any] = {"type": "ablate_heads", "heads": heads, "ablation": self.how}
        if self.positions:
            d["positions"] = self.positions
        if self.how == "resample":
            d["seed"] = self.seed
        return d


@dataclass
class KeepHeads(Intervention):
    """In each given layer keep only the listed heads; every other head of that layer is zeroed.

    ``layers`` defaults to the layers the heads are in; a layer listed with no kept head is
    zeroed whole (the paper's "no critical heads retained" configuration).
    """

    heads: Sequence[HeadId | str] | str
    layers: Sequence[int] | None = None
    kind: str | None = None

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        heads = expand(self.heads, adapter)
        if isinstance(self.heads, str) and not heads and self.layers is None:
            raise GandaError(f"no head ids in {self.heads!r} (expected e.g. L17H24 or L3H0-2)")
        layers = sorted(set(self.layers) if self.layers is not None else {h.layer for h in heads})
        for h in heads:
            adapter.require_active([h.layer], str(h))
        plan: list[tuple[Mixer, list[int]]] = []
        used: set[HeadId] = set()
        for layer in layers:
            kind = self.kind
            if kind is None:  # on a two-mixer layer the heads themselves say which mixer
                kinds = {h.kind for h in heads if h.layer == layer and h.kind}
                if len(kinds) > 1:
                    raise GandaError(
                        f"KeepHeads: layer {layer} lists heads of several mixers ({', '.join(sorted(kinds))}); "
                        "use one KeepHeads per mixer kind"
                    )
                kind = next(iter(kinds), None)
            mixer = adapter.mixer(layer, kind)
            kept = [h for h in heads if h.layer == layer and adapter.mixer_of(h) is mixer]
            used.update(kept)
            plan.append((mixer, [h.head for h in kept]))
        ignored = [h for h in heads if h not in used]
        if ignored:  # a listed head outside the kept mixers would silently keep nothing
            where = f"layers {compress_ranges(layers)}" + (f" ({self.kind})" if self.kind else "")
            raise GandaError(f"KeepHeads: {ignored[0]} is not in the mixers it acts on ({where})")
        label = f"keep-heads in layers {compress_ranges(layers)}"
        edits = {z_point(m): edit_for(adapter, m, head_mask(m, kept, keep=True)) for m, kept in plan}
        with _edit_layers(adapter, layers, label, edits):
            yield

    def describe(self) -> dict[str, Any]:
        heads = self.heads if isinstance(self.heads, str) else format_heads(self.heads)  # type: ignore[arg-type]
        return {"type": "keep_heads", "heads": heads, "layers": list(self.layers) if self.layers else None}


@dataclass
class KeepLayers(Intervention):
    """Run only the listed decoder layers (the final norm and LM head are kept).

    ``KeepLayers(range(18))`` is the paper's "minimal model" (truncate to the first 18 layers).
    Layer numbers are those of the model as loaded, and so are head ids inside: layer edits
    compose (nested ``KeepLayers``/``RemoveLayers`` run the intersection of what each keeps) and
    may be exited in any order. A head intervention on a layer that an edit removes is refused
    (``L1H0: layer 1 is removed by remove-layers 1``), never silently ignored.
    """

    layers: Sequence[int]

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        layers = list(self.layers)
        with adapter.layer_edit(layers, f"keep-layers {compress_ranges(layers) or '(none)'}"):
            yield

    def describe(self) -> dict[str, Any]:
        return {"type": "keep_layers", "layers": compress_ranges(self.layers)}


def truncate(k: int) -> KeepLayers:
    """The first ``k`` layers only."""
    return KeepLayers(list(range(k)))


@dataclass
class RemoveLayers(Intervention):
    """Skip the listed decoder layers (the residual stream passes them unchanged).

    Indices are those of the model as loaded, as for :class:`KeepLayers`.
    """

    layers: Sequence[int]

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        label = f"remove-layers {compress_ranges(self.layers)}"
        n = len(adapter.original_layers())
        bad = [i for i in self.layers if not 0 <= i < n]
        if bad:
            raise GandaError(f"{label}: layer {bad[0]} out of range, the model has layers 0-{n - 1}")
        with adapter.layer_edit([i for i in range(n) if i not in set(self.layers)], label):
            yield

    def describe(self) -> dict[str, Any]:
        return {"type": "remove_layers", "layers": compress_ranges(self.layers)}


def mask_last_row(heads: Sequence[HeadId | str] | str, rule: str = "query") -> AblateHeads:
    """Zero the final position's attention row of these heads (the paper's Zamba2 test).

    A row of zeros after the softmax makes that head's output at that position zero, which is
    exactly zeroing the head's slice of the output-projection input there. Which position is
    "final" matters for answers of several tokens:

    * ``rule="query"`` (default): the last prompt token, which predicts the answer's first token
      (for every choice); the stricter test;
    * ``rule="last"``: the last position of the scored input ``context + continuation[:-1]``,
      which predicts the answer's final token: what the authors' Zamba2 code masks
      (``(input_ids != 0).sum(1) - 1`` on lm-eval's inputs).

    For one-token answers (MMLU letters) both are the same position.
    """
    if rule not in ("query", "last"):
        raise GandaError(f"mask-last-row rule must be 'query' or 'last', not {rule!r}")
    return AblateHeads(heads, positions=rule)


@dataclass
class Compose(Intervention):
    items: list[Intervention] = field(default_factory=list)

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        with ExitStack() as stack:
            for iv in self.items:
                stack.enter_context(iv.apply(adapter))
            yield

    def describe(self) -> dict[str, Any]:
        return {"type": "compose", "items": [iv.describe() for iv in self.items]}


def bind_reference(interventions: Iterable[Intervention] | None, examples: Sequence[Any]) -> list[Intervention]:
    """``interventions`` with every mean or resample :class:`AblateHeads` that names no reference
    (and no means) given ``examples``, the prompts being scored, as its reference."""
    out: list[Intervention] = []
    for iv in interventions or []:
        if isinstance(iv, AblateHeads) and iv.how != "zero" and iv.reference is None and iv.means is None:
            iv = replace(iv, reference=list(examples))
        elif isinstance(iv, Compose):
            iv = Compose(bind_reference(iv.items, examples))
        out.append(iv)
    return out


@contextmanager
def apply(adapter: ModelAdapter, interventions: Iterable[Intervention] | None) -> Iterator[None]:
    """Apply several interventions at once (in order) and undo them all on exit."""
    with Compose(list(interventions or [])).apply(adapter):
        yield


def describe_all(interventions: Iterable[Intervention] | None) -> list[dict[str, Any]]:
    return [iv.describe() for iv in interventions or []]


def check_layers(flag: str, layers: Sequence[int], n: int) -> list[int]:
    """``layers`` when each is one of a model's ``n`` layers, else one line naming those that are not."""
    if bad := [i for i in layers if not 0 <= i < n]:
        raise GandaError(f"{flag} {bad} outside the model's layers 0..{n - 1}")
    return list(layers)


def parse_layers(text: str) -> list[int]:
    """``"0-17"`` or ``"0,2,5-7"`` -> list of ints."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isascii():  # int() reads other scripts' digits; a layer list is written in 0-9
            raise GandaError(f"not a layer list: {text!r} (expected e.g. 0-17 or 3,5,7)")
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-"))
                if a > b:
                    raise GandaError(f"empty layer range {part!r} in {text!r} (write the smaller layer first)")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise GandaError(f"not a layer list: {text!r} (expected e.g. 0-17 or 3,5,7)") from None
    if not out:
        raise GandaError(f"not a layer list: {text!r} (expected e.g. 0-17 or 3,5,7)")
    return out


def _short(heads: Sequence[HeadId]) -> str:
    text = format_heads(heads)
    return text if len(heads) <= 4 else f"{format_heads(heads[:3])},... ({len(heads)} heads)"
