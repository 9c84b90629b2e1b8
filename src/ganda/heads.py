"""Head ids and head sets.

Grammar (0-based, like the paper's ``L17H24``)::

    head     := "L" layer [ "." kind ] "H" heads
    layer    := INT | "*"              # "*" = every running layer that has this mixer kind
    kind     := "attn" | "ssm"          # needed only where a layer has more than one mixer
    heads    := INT | INT "-" INT | "*" # one head, an inclusive range, or every head
    headset  := ( head | block ) ( "," ( head | block ) )*
    block    := "B" INT [ ".attn" ] "H" heads   # every invocation of shared block INT (Zamba2)

Examples: ``L17H24``, ``L3H0-2``, ``L5H*``, ``L6.attnH3``, ``L*.attnH3``, ``B0H3`` (head 3 of
shared block 0 at every depth where it runs; ``L6.attnH3`` is the invocation at layer 6 only).
A pattern with ``*`` or a range expands against a model (:func:`expand`), which also
validates indices so a typo like ``L99H0`` fails with a clear message. Layer numbers are those of
the model as loaded, whatever layer edits are active; ``L*`` and ``B{k}`` cover only the layers
that run (a layer removed by ``KeepLayers``/``RemoveLayers`` has nothing to ablate).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import GandaError

if TYPE_CHECKING:
    from .models.base import ModelAdapter

KINDS = ("attn", "ssm")
# ASCII digits only: \d would also read L٣H0 (an Arabic-Indic three) as L3H0
_PAT = re.compile(r"^L(\d+|\*)(?:\.(attn|ssm))?H(\d+|\*|\d+-\d+)$", re.ASCII)
_BLOCK = re.compile(r"^B(\d+)(?:\.attn)?H(\d+|\*|\d+-\d+)$", re.ASCII)


@dataclass(frozen=True, order=True)
class HeadId:
    """One head: decoder layer index, head index, and the mixer kind when the layer has several."""

    layer: int
    head: int
    kind: str | None = None

    def __str__(self) -> str:
        kind = f".{self.kind}" if self.kind else ""
        return f"L{self.layer}{kind}H{self.head}"

    @classmethod
    def parse(cls, text: str) -> HeadId:
        """Parse exactly one head (no wildcards or ranges)."""
        m = _PAT.match(text.strip())
        if not m or "*" in text or "-" in m.group(3):
            raise GandaError(f"not a head id: {text!r} (expected e.g. L17H24 or L6.attnH3)")
        return cls(int(m.group(1)), int(m.group(3)), m.group(2))


def split_spec(spec: str | Iterable[str] | None) -> list[str]:
    """Split a comma-separated head list (or pass a list through)."""
    if spec is None:
        return []
    if isinstance(spec, str):
        parts = spec.split(",")
    else:
        parts = [p for s in spec for p in str(s).split(",")]
    return [p.strip() for p in parts if p.strip()]


def expand(spec: str | Iterable[str | HeadId] | None, adapter: ModelAdapter) -> list[HeadId]:
    """Expand a head-set spec against a model, validating every index.

    Returns canonical ids (kind filled in only where the layer has more than one mixer),
    sorted and de-duplicated.
    """
    if spec is None:
        return []
    items: list[str | HeadId] = [spec] if isinstance(spec, str) else list(spec)
    out: set[HeadId] = set()
    for item in items:
        if isinstance(item, HeadId):
            out.add(adapter.canonical(item))
            continue
        for part in split_spec(item):
            out.update(_expand_one(part, adapter))
    return sorted(out)


def _expand_block(part: str, block: str, heads: str, adapter: ModelAdapter) -> list[HeadId]:
    """``B{k}H..``: the heads in every invocation of a shared attention block."""
    blocks = adapter.shared_blocks()
    layers = blocks.get(f"block{block}")
    if not layers:
        have = ", ".join(k.replace("block", "B") for k in blocks) or "none"
        raise GandaError(f"{part}: no shared block {block} (this model's shared blocks: {have})")
    running = [layer for layer in layers if adapter.is_active(layer)]
    if not running:
        adapter.require_active(layers, part)
    layers = running
    return [h for layer in layers for h in _expand_one(f"L{layer}.attnH{heads}", adapter)]


def _expand_one(part: str, adapter: ModelAdapter) -> list[HeadId]:
    mb = _BLOCK.match(part)
    if mb:
        return _expand_block(part, mb.group(1), mb.group(2), adapter)
    m = _PAT.match(part)
    if not m:
        raise GandaError(f"not a head id: {part!r} (expected e.g. L17H24, L3H0-2, L5H*, L6.attnH3)")
    layer_s, kind, head_s = m.groups()
    n_layers = adapter.num_layers
    if layer_s == "*":
        layers = [mx.layer for mx in adapter.mixers() if (kind is None or mx.kind == kind) and adapter.is_active(mx.layer)]
        layers = sorted(set(layers))
    else:
        layer = int(layer_s)
        if layer >= n_layers:
            raise GandaError(f"{part}: layer {layer} out of range, the model has layers 0-{n_layers - 1}")
        layers = [layer]
    out: list[HeadId] = []
    for layer in layers:
        mixer = adapter.mixer(layer, kind)
        n = mixer.num_heads
        if head_s == "*":
            heads: Sequence[int] = range(n)
        elif "-" in head_s:
            a, b = (int(x) for x in head_s.split("-"))
            if a > b:
                raise GandaError(f"{part}: empty head range {a}-{b}")
            heads = range(a, b + 1)
        else:
            heads = [int(head_s)]
        for h in heads:
            if h >= n:
                raise GandaError(
                    f"{part}: head {h} out of range, layer {layer} ({mixer.kind}) has heads 0-{n - 1}"
                )
            out.append(adapter.canonical(HeadId(layer, h, mixer.kind)))
    return out


def running_heads(adapter: ModelAdapter, heads: Iterable[HeadId] | None, user: str) -> list[HeadId]:
    """The heads a measurement takes, canonical and in order: ``heads``, each refused in one line
    where a layer edit removes its layer, else every head of the running layers (a submodel's own)."""
    heads = heads if heads is not None else adapter.heads(running=True)
    out = sorted({adapter.canonical(h) for h in heads})
    adapter.require_active({h.layer for h in out}, user)
    return out


def format_heads(heads: Iterable[HeadId]) -> str:
    """Comma-separated, the inverse of :func:`expand` for explicit ids."""
    return ",".join(str(h) for h in heads)


def require_heads(flag: str, spec: str | None) -> None:
    """A head list that names no head (``--heads ","``) is refused: read as "none" it would record
    an empty intervention, read as "all" it would run every head."""
    if spec is not None and not split_spec(spec):
        raise GandaError(f"{flag}: no head ids in {spec!r} (expected e.g. L17H24, L3H0-2 or 'L16H*')")


def compress_ranges(xs: Iterable[int]) -> str:
    """Layer or head numbers as ranges: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    xs = sorted(set(xs))
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)
