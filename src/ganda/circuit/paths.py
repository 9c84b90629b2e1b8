"""Exact path ablation: a sender head's contribution removed only along the path into a receiver head.

A *pair* is a sender head S in layer ``s`` and a receiver head R in a later layer ``r > s``. The
receiver reads the residual stream entering its layer, ``x_r``; a path ablation replaces what R
reads by ``x'_r``, recomputes R's output ``z'_R`` from it, and puts ``z'_R`` in place of R's slice
of its mixer's output-projection input in the intact forward. Every other reader (the other
heads of R's mixer, the MLPs, every other layer) sees the intact stream; the layers after ``r``
run on whatever R's new output makes of it. Two sets of paths are offered:

* ``paths="all"`` (the default): every path from S into R. ``x'_r`` is the stream entering layer
  ``r`` when the model runs from layer ``s`` with S zero-ablated, so S's effect through the layers
  between them (their heads and MLPs, and the MLP of S's own layer) reaches R too. Two residual
  streams run from S's layer on: the intact one, read by everything but R, and the ablated one,
  read by R alone. This is what "ablate S as seen by R" means, and it works for every family.
* ``paths="direct"``: the edge S → R alone, what edge attribution scores (EAP). ``x'_r = x_r -
  c·W_O[:, S] z_S``: S's own write into the residual stream (``c`` the factor by which its
  mixer's output enters the stream, :func:`ganda.models.components.residual_write_scale`)
  removed from R's input only; S's effect through anything in between stays. Refused where a
  mixer does not write into the stream linearly (Zamba2's shared attention).

**What R reads.** R's mixer is run whole on ``x'_r`` and only R's slice is kept. For an attention
head that is exactly R reading ``x'_r`` through its own query, key and value (GQA: its KV head's).
An SSM head of a Mamba-2 mixer whose gated RMSNorm spans several heads is normalised together
with them, so its slice also moves with its group's other heads reading ``x'_r``; in a layer
that runs attention before its SSM (Zamba2), the SSM reads ``x'_r`` through that attention too.

**Parts** (``parts``): ``together`` takes every input of R's mixer from ``x'_r``; a part takes
only that one (attention: ``q``, ``k``, ``v``; Mamba-2 and Llamba SSM heads: ``x``, ``B``, ``C``,
``dt``, ``gate``; several joined by ``+``, e.g. ``k+v``), every other from the intact ``x_r``
(:mod:`ganda.models.components`). Every part of a mixer at once equals ``together`` (tested).

Each batch of prompts is recorded once (:class:`ganda.engine.LayerCalls`: every layer's input
and call); a path ablation then replays R's layer and the layers after it only, with the pairs
of one receiver layer stacked along the batch. Read-outs are the sweep's log-likelihoods and
margin (:func:`ganda.attribution.engine.batch_metric`), in the same layouts as attribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..ablation import edit_for
from ..attribution.engine import batch_metric
from ..engine import Edit, LayerCall, LayerCalls, Trace
from ..errors import GandaError
from ..heads import HeadId
from ..interventions import head_mask, z_point
from ..models.base import Mixer, ModelAdapter
from ..models.components import Site, input_parts, part_names, residual_write_scale
from ..prepared import Batch

PATHS = ("all", "direct")
TOGETHER = "together"

LogLiks = list[list[float]]  # per item: each choice's log-likelihood


def parse_pair(adapter: ModelAdapter, sender: HeadId | str, receiver: HeadId | str) -> tuple[HeadId, HeadId]:
    """Both heads checked against the model (one line each) and the receiver in a later layer."""
    s = adapter.canonical(sender if isinstance(sender, HeadId) else HeadId.parse(sender))
    r = adapter.canonical(receiver if isinstance(receiver, HeadId) else HeadId.parse(receiver))
    if r.layer <= s.layer:
        raise GandaError(f"receiver {r} is not in a later layer than sender {s}: a path runs from an earlier "
                         "layer's head into a later layer's")
    adapter.require_active([s.layer, r.layer], f"the path {s} -> {r}")
    return s, r


def check_paths(adapter: ModelAdapter, paths: str, senders: Sequence[HeadId] = ()) -> None:
    """Refuse an unknown ``paths`` and, for direct paths, a sender that does not write linearly."""
    if paths not in PATHS:
        raise GandaError(f"paths must be one of {', '.join(PATHS)}, not {paths!r}")
    if paths == "direct":
        for s in senders:
            if residual_write_scale(adapter, adapter.mixer_of(s)) is None:
                raise GandaError(f"{s}: its mixer does not write into the residual stream linearly, so it has no "
                                 "direct path (use paths 'all')")


def sender_write(adapter: ModelAdapter, sender: HeadId, z: torch.Tensor,
                 means: dict[tuple[int, str], torch.Tensor] | None = None) -> torch.Tensor:
    """The sender's write into the residual stream, ``c · W_O[:, S] z_S`` (fp32), from its mixer's
    output-projection input ``z``; with ``means`` (mean ablation) what the write differs from its
    mean's by, ``c · W_O[:, S] (z_S - μ_S)``: what a direct path removes."""
    mixer = adapter.mixer_of(sender)
    scale = residual_write_scale(adapter, mixer)
    if scale is None:
        raise GandaError(f"{sender} has no direct write into the residual stream")
    sl = mixer.head_slice(sender.head)
    zs = z[..., sl].float()
    if means is not None:
        zs = zs - means[(mixer.layer, mixer.kind)][sl].to(zs.device)
    return scale * F.linear(zs, mixer.out_proj.weight[:, sl].float())


def check_parts(adapter: ModelAdapter, receiver: HeadId, parts: Sequence[str]) -> list[str]:
    """The parts asked for, each one of the receiver's (or ``together``); refused in one line."""
    parts = [p.strip() for p in parts if p.strip()]
    if not parts:
        raise GandaError("no parts given (together, or e.g. q,k,v for attention, x,B,C,dt,gate for SSM heads)")
    mixer = adapter.mixer_of(receiver)
    names = part_names(mixer)
    for p in parts:
        for one in ([] if p == TOGETHER else p.split("+")):
            if one not in names:
                raise GandaError(f"{receiver} has no part {one!r}; its parts: {TOGETHER}, {', '.join(names)} "
                                 "(several at once joined by +, e.g. q+k)")
    if any(p != TOGETHER for p in parts):
        input_parts(adapter, mixer)  # refuses a mixer whose parts cannot be taken separately
    return list(dict.fromkeys(parts))


def _expand(obj: Any, reps: int) -> Any:
    """Every tensor of a one-row layer call repeated ``reps`` times along its batch dimension."""
    if isinstance(obj, torch.Tensor):
        return obj.expand(reps, *obj.shape[1:]) if obj.ndim >= 2 and obj.shape[0] == 1 else obj
    if isinstance(obj, tuple | list):
        return type(obj)(_expand(o, reps) for o in obj)
    if isinstance(obj, dict):
        return {k: _expand(v, reps) for k, v in obj.items()}
    return obj


def run_layer(calls: LayerCalls, pos: int, hidden: torch.Tensor) -> torch.Tensor:
    """The layer at ``pos`` on ``hidden``: copies of the recorded batch stacked along the batch (a
    one-row batch's arguments are repeated too, which :meth:`LayerCalls.run` leaves to broadcasting)."""
    reps = hidden.shape[0] // calls.batch
    if reps > 1 and calls.batch == 1:
        c = calls.calls[pos]
        return LayerCall(_expand(c.args, reps), _expand(c.kwargs, reps), c.by_keyword)(calls.modules[pos], hidden)
    return calls.run(pos, hidden, reps)


@dataclass
class Variant:
    """One path ablation of a pair: the receiver and the parts it takes from the ablated stream."""

    receiver: HeadId
    part: str = TOGETHER


class PathBatch:
    """One batch of prompts recorded once; path ablations of any pairs replay only what they change."""

    def __init__(self, adapter: ModelAdapter, batch: Batch, margin: str = "mean",
                 means: dict[tuple[int, str], torch.Tensor] | None = None) -> None:
        self.adapter, self.batch, self.margin = adapter, batch, margin
        self.means = means  # mean ablation of senders (ganda.ablation); None: zero
        with torch.no_grad(), adapter.analysis_path():
            self.calls = LayerCalls(adapter, batch.ids, batch.mask, batch.position_ids, inputs=True)
        self.pos = {layer: i for i, layer in enumerate(self.calls.layers)}
        assert self.calls.final is not None
        self.clean: list[LogLiks] = self.read(self.calls.final)
        self._writes: dict[HeadId, torch.Tensor] = {}
        self._clean_sites: dict[int, dict[int, torch.Tensor]] = {}

    @property
    def rows(self) -> int:
        return self.calls.batch

    def input(self, layer: int) -> torch.Tensor:
        assert self.calls.inputs is not None
        return self.calls.inputs[self.pos[layer]]

    def read(self, final: torch.Tensor) -> list[LogLiks]:
        """Per copy stacked in ``final`` ``[C·B, W, d]``: each item's choice log-likelihoods."""
        B = self.rows
        return [batch_metric(self.adapter, self.batch, final[c * B:(c + 1) * B], self.margin)[1]
                for c in range(final.shape[0] // B)]

    @torch.no_grad()
    def run_from(self, layer: int, hidden: torch.Tensor, edit: dict[str, Edit] | None = None,
                 stop: int | None = None, keep: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Layers ``layer..stop`` (default: the last) on ``hidden`` under ``edit``: their output and
        the inputs of the layers in ``keep``."""
        last = self.calls.layers[-1] if stop is None else stop
        kept: dict[int, torch.Tensor] = {}
        with self.adapter.analysis_path(), Trace(self.adapter, edit=edit or {}):
            h = hidden
            for pos in range(self.pos[layer], self.pos[last] + 1):
                if self.calls.layers[pos] in keep:
                    kept[self.calls.layers[pos]] = h
                h = run_layer(self.calls, pos, h)
        return h, kept

    def z_of(self, head: HeadId) -> torch.Tensor:
        """The intact forward's output-projection input of ``head``'s mixer ``[B, W, H·D]``."""
        mixer = self.adapter.mixer_of(head)
        return self.receiver_z(mixer.layer, self.input(mixer.layer), mixer, TOGETHER)

    def write(self, sender: HeadId) -> torch.Tensor:
        """The sender's write into the residual stream (:func:`sender_write`) ``[B, W, d]``."""
        if sender not in self._writes:
            self._writes[sender] = sender_write(self.adapter, sender, self.z_of(sender), self.means)
        return self._writes[sender]

    def sender_everywhere(self, sender: HeadId) -> list[LogLiks]:
        """Log-likelihoods with the sender ablated at every position (the whole forward from its layer)."""
        return self.read(self._sender_ablated(sender)[0])

    def _sender_ablated(self, sender: HeadId, stop: int | None = None, keep: Sequence[int] = ()
                        ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """:meth:`run_from` the sender's layer with the sender ablated at its mixer's output-projection
        input (zero, or its mean)."""
        mixer = self.adapter.mixer_of(sender)
        how = "zero" if self.means is None else "mean"
        edit = {z_point(mixer): edit_for(self.adapter, mixer, head_mask(mixer, [sender.head]), how, self.means)}
        return self.run_from(sender.layer, self.input(sender.layer), edit, stop=stop, keep=keep)

    def ablated_inputs(self, sender: HeadId, paths: str, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """What the receivers of ``layers`` read: the stream with S removed along the chosen paths."""
        if paths == "direct":
            w = self.write(sender)
            return {r: (self.input(r).float() - w).to(self.input(r).dtype) for r in layers}
        top = max(layers)
        h, kept = self._sender_ablated(sender, stop=self.calls.layers[self.pos[top] - 1], keep=layers)
        kept[top] = h
        return kept

    def receiver_z(self, layer: int, x_new: torch.Tensor, mixer: Mixer, part: str) -> torch.Tensor:
        """``mixer``'s output-projection input when its layer reads ``x_new`` through ``part``
        (``together``: every input; else that part, or the parts joined by ``+``, the others from
        the intact input); the layer stops there."""
        point = z_point(mixer)
        hooks: list[Any] = []
        if part != TOGETHER:
            sites = input_parts(self.adapter, mixer)
            clean = self._site_outputs(layer, mixer, sites)
            taken = set(part.split("+"))
            for name, ss in sites.items():
                if name not in taken:
                    hooks += [s.module.register_forward_hook(_replace(s, clean[id(s.module)])) for s in ss]
        try:
            with torch.no_grad(), self.adapter.analysis_path(), Trace(self.adapter, [point], stop=point) as tr:
                run_layer(self.calls, self.pos[layer], x_new)
        finally:
            for h in hooks:
                h.remove()
        return tr[point]

    def _site_outputs(self, layer: int, mixer: Mixer, sites: dict[str, list[Site]]) -> dict[int, torch.Tensor]:
        """Every site module's output in the intact forward of ``layer``, by module id (cached)."""
        key = id(mixer)
        if key not in self._clean_sites:
            got: dict[int, torch.Tensor] = {}
            modules = {id(s.module): s.module for ss in sites.values() for s in ss}
            hooks = [m.register_forward_hook(_grab(got, k)) for k, m in modules.items()]
            try:
                with torch.no_grad(), self.adapter.analysis_path():
                    run_layer(self.calls, self.pos[layer], self.input(layer))
            finally:
                for h in hooks:
                    h.remove()
            self._clean_sites[key] = got
        return self._clean_sites[key]

    def splice(self, layer: int, z_new: Sequence[tuple[HeadId, torch.Tensor]]) -> list[LogLiks]:
        """The intact forward from ``layer`` with, in copy c, head ``z_new[c][0]``'s slice of its
        mixer's output-projection input replaced by the same slice of ``z_new[c][1]``."""
        C, B = len(z_new), self.rows
        by_point: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for c, (head, z) in enumerate(z_new):
            mixer = self.adapter.mixer_of(head)
            point = z_point(mixer)
            if point not in by_point:
                shape = (C * B, *z.shape[1:])
                by_point[point] = (z.new_zeros(shape), torch.zeros(C, z.shape[-1], dtype=torch.bool, device=z.device))
            vals, take = by_point[point]
            sl = mixer.head_slice(head.head)
            vals[c * B:(c + 1) * B, ..., sl] = z[..., sl]
            take[c, sl] = True
        edits = {p: _take_edit(vals, take, B) for p, (vals, take) in by_point.items()}
        x = self.input(layer)
        final, _ = self.run_from(layer, x.repeat(C, *([1] * (x.ndim - 1))), edits)
        return self.read(final)

    def ablate(self, sender: HeadId, variants: Sequence[Variant], paths: str = "all",
               max_copies: int = 16) -> list[LogLiks]:
        """Log-likelihoods of each variant (receiver and part) of the paths from ``sender``."""
        layers = sorted({v.receiver.layer for v in variants})
        streams = self.ablated_inputs(sender, paths, layers)
        out: list[list[LogLiks] | None] = [None] * len(variants)
        for layer in layers:
            idx = [i for i, v in enumerate(variants) if v.receiver.layer == layer]
            z_cache: dict[tuple[int, str], torch.Tensor] = {}
            pieces = []
            for i in idx:
                mixer = self.adapter.mixer_of(variants[i].receiver)
                key = (id(mixer), variants[i].part)
                if key not in z_cache:
                    z_cache[key] = self.receiver_z(layer, streams[layer], mixer, variants[i].part)
                pieces.append((variants[i].receiver, z_cache[key]))
            for j in range(0, len(idx), max_copies):
                for i, ll in zip(idx[j:j + max_copies], self.splice(layer, pieces[j:j + max_copies]), strict=True):
                    out[i] = ll
        return [o for o in out if o is not None]


def _grab(store: dict[int, torch.Tensor], key: int) -> Callable[..., None]:
    def hook(_m: Any, _a: Any, out: torch.Tensor) -> None:
        store[key] = out.detach()
    return hook


def _replace(site: Site, clean: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A forward hook that puts the intact output back on ``site``'s channels."""
    def hook(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:
        if site.channels is None:
            return clean.to(out.dtype)
        out = out.clone()
        out[..., site.channels] = clean[..., site.channels].to(out.dtype)
        return out
    return hook


def _take_edit(vals: torch.Tensor, take: torch.Tensor, rows: int) -> Edit:
    """A ``z`` edit taking, in copy c's rows, the channels ``take[c]`` from ``vals``."""
    def edit(x: torch.Tensor) -> torch.Tensor:
        m = take.repeat_interleave(rows, dim=0)[:, None, :]
        return torch.where(m.to(x.device), vals.to(device=x.device, dtype=x.dtype), x)
    return edit


__all__ = ["PATHS", "TOGETHER", "PathBatch", "Variant", "check_parts", "check_paths", "parse_pair", "run_layer",
           "sender_write"]
