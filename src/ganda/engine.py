"""The forward engine: run a model from layer k with a replaced residual stream, stop after layer
m, and capture or edit named points on the way.

Points carry the layer ids of the model as loaded (those of head ids and layer edits):

=================================  ==============================================  ======================
point                              value                                           shape
=================================  ==============================================  ======================
``L{i}.resid_in``                  the residual stream entering decoder layer i     ``[B, T, d_model]``
``L{i}.resid_out``                 the hidden states layer i returns                ``[B, T, d_model]``
``L{i}.kwargs``                    the keyword arguments the model passes layer i   dict (masks, positions)
``L{i}.call``                      every argument but the hidden states             :class:`LayerCall`
``L{i}.z`` / ``L{i}.{kind}.z``     the input of a mixer's output projection         ``[B, T, heads*head_dim]``
``L{i}.out`` / ``L{i}.{kind}.out`` that projection's output                         ``[B, T, d_model]``
``model.kwargs``                   the keyword arguments of the model's own forward dict (2-D attention mask)
=================================  ==============================================  ======================

Head h of a mixer is the slice ``h * head_dim : (h + 1) * head_dim`` of its ``z``; ``kind``
(``attn``/``ssm``) names the mixer where a layer has two.

* :class:`Trace` hooks points for the duration of a ``with`` block: it keeps the latest value of
  each captured point, passes a point's value through an edit function, and with ``stop`` ends
  the forward once that point is reached (:class:`StopForward`, swallowed when the block exits).
* :func:`run_layers` runs layers ``start..stop`` through the model's own forward: a layer edit
  cuts the layers before ``start`` and ``resid`` enters ``start`` in place of the embeddings. It
  is the one place a forward starts at layer k.
* :class:`LayerCalls` records, in one such pass, what the model gives each running layer (its
  arguments: masks, positions, rotary embeddings) and, where asked, each layer's input; it then
  reruns single layers on new hidden states (batched over copies, with or without autograd), so
  the sweep's layer skipping and attribution's layer-by-layer backward share one replay.
* :func:`logprobs` applies the model's final norm and LM head to residual vectors
  (:meth:`ModelAdapter.unembed`, the one output head every analysis reads through).

Everything goes through the adapter (its layer list, layer edits and output-projection hooks,
which fire per invocation for shared blocks), so every family is served.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import GandaError
from .models.base import ModelAdapter, StopForward, hidden_of

Edit = Callable[[torch.Tensor], torch.Tensor]

_POINT = re.compile(r"^L(\d+)\.(?:(attn|ssm)\.)?(resid_in|resid_out|kwargs|call|z|out)$")


class Trace:
    """Capture and edit named points of every forward run inside the ``with`` block.

    ``capture``: points whose latest value is kept (``trace[name]``; tensors detached and, with
    ``at``, indexed by it, e.g. ``(rows, positions)``; ``detach=False`` keeps them in the autograd
    graph). ``edit``: ``{point: fn}``, the point's value is replaced by ``fn(value)`` (captured
    values are the edited ones). ``stop``: a point after which the forward ends (no LM head runs).
    """

    def __init__(self, adapter: ModelAdapter, capture: Iterable[str] = (), *,
                 edit: Mapping[str, Edit] | None = None, stop: str | None = None, at: Any = None,
                 detach: bool = True) -> None:
        self.adapter = adapter
        self.capture = set(capture)
        self.edit = dict(edit or {})
        self.stop = stop
        self.at = at
        self.detach = detach
        self.values: dict[str, Any] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> Trace:
        try:
            points = [*sorted(self.capture), *self.edit, *([self.stop] if self.stop else [])]
            for name in dict.fromkeys(points):
                self._handles.append(self._hook(name))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.close()
        return exc_type is not None and issubclass(exc_type, StopForward)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __getitem__(self, name: str) -> Any:
        if name not in self.values:
            raise GandaError(f"{name}: nothing captured (the forward did not reach it)")
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def _hook(self, name: str) -> Any:
        if name == "model.kwargs":
            return self.adapter.model.register_forward_pre_hook(self._model_kwargs(name), with_kwargs=True)
        m = _POINT.match(name)
        if not m:
            raise GandaError(f"not a point of the forward engine: {name!r} (e.g. L3.resid_in, L3.attn.z, model.kwargs)")
        layer, kind, what = int(m.group(1)), m.group(2), m.group(3)
        ad = self.adapter
        ad.require_active([layer], name)
        if what in ("z", "out"):
            mixer = ad.mixer(layer, kind)
            if what == "z":
                return ad.register_out_proj_pre_hook(mixer, self._pre_z(name))
            return ad.register_out_proj_hook(mixer, self._post(name))
        if kind is not None:
            raise GandaError(f"{name}: {what} belongs to the layer, not to one mixer (L{layer}.{what})")
        pos = ad.layer_position(layer)
        assert pos is not None  # require_active above
        module = ad.decoder_layers()[pos]
        if what == "resid_out":
            return module.register_forward_hook(self._post(name))
        return module.register_forward_pre_hook(self._pre_layer(name, what), with_kwargs=True)

    def _store(self, name: str, value: Any) -> None:
        if name in self.capture:
            if isinstance(value, torch.Tensor):
                if self.detach:
                    value = value.detach()
                if self.at is not None:
                    value = value[self.at]
            self.values[name] = value
        if name == self.stop:
            raise StopForward

    def _model_kwargs(self, name: str) -> Callable[..., Any]:
        def hook(_m: Any, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._store(name, dict(kwargs))

        return hook

    def _pre_layer(self, name: str, what: str) -> Callable[..., Any]:
        def hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if what == "kwargs":
                self._store(name, {k: v for k, v in kwargs.items() if k != "hidden_states"})
                return None
            if what == "call":
                self._store(name, LayerCall.of(args, kwargs))
                return None
            h = self._edit_and_store(name, args[0] if args else kwargs["hidden_states"])
            if h is None:
                return None
            return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

        return hook

    def _edit_and_store(self, name: str, h: torch.Tensor) -> torch.Tensor | None:
        """Record ``name``'s value after its edit; the edited value, or None when there is no edit
        (the hook then leaves the module's input or output alone)."""
        fn = self.edit.get(name)
        out = fn(h) if fn is not None else h
        self._store(name, out)
        return out if fn is not None else None

    def _post(self, name: str) -> Callable[..., Any]:
        def hook(_m: Any, _args: Any, out: Any) -> Any:
            h = self._edit_and_store(name, hidden_of(out))
            if h is None:
                return None
            return (h, *out[1:]) if isinstance(out, tuple) else h

        return hook

    def _pre_z(self, name: str) -> Callable[..., Any]:
        def hook(_m: Any, args: tuple[Any, ...]) -> Any:
            x = self._edit_and_store(name, args[0])
            return None if x is None else (x, *args[1:])

        return hook


def run_layers(
    adapter: ModelAdapter,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    start: int | None = None,
    stop: int | None = None,
    resid: torch.Tensor | None = None,
    capture: Iterable[str] = (),
    at: Any = None,
) -> dict[str, Any]:
    """Run the running layers ``start..stop`` (layer ids, both included) of the model's own forward.

    ``resid`` ``[B, T, d_model]`` enters layer ``start`` in place of what the layers before it
    would give (they do not run; it is required when ``start`` is not the first running layer).
    With ``stop`` the forward ends after that layer and ``"resid"`` holds its output; without,
    ``"logits"`` holds the model's ``[B, T, V]``. Captured points are returned under their names;
    ``at`` indexes every returned tensor. When no layer lies in ``start..stop`` the residual
    passes through unchanged. ``attention_mask`` may be 2-D or an additive ``[B, 1, T, T]`` mask
    (with ``position_ids``: the packed layout of :mod:`ganda.prepared`).
    """
    active = adapter.active_layers()
    first = active[0] if start is None else start
    if resid is None and first != active[0]:
        raise GandaError(f"running from layer {first} needs the residual stream entering it")
    if stop is not None and stop < first:
        assert resid is not None
        return {"resid": resid[at] if at is not None else resid}
    adapter.require_active([first, *([stop] if stop is not None else [])], "the forward engine")
    edit = {} if resid is None else {f"L{first}.resid_in": lambda h: resid.to(dtype=h.dtype, device=h.device)}
    stop_at = f"L{stop}.resid_out" if stop is not None else None
    names = [*capture, *([stop_at] if stop_at else [])]
    skip = adapter.layer_edit([i for i in active if i >= first], f"run from layer {first}") \
        if first != active[0] else nullcontext()
    logits = None
    with skip, Trace(adapter, names, edit=edit, stop=stop_at, at=at) as tr:
        logits = adapter.forward(input_ids, attention_mask=attention_mask, position_ids=position_ids)
    out = {name: tr[name] for name in names}
    if stop_at is not None:
        out["resid"] = out[stop_at]
    else:
        assert logits is not None
        out["logits"] = logits[at] if at is not None else logits
    return out


def logprobs(adapter: ModelAdapter, resid: torch.Tensor) -> torch.Tensor:
    """fp32 next-token log-probabilities of residual-stream vectors ``[..., d_model]``."""
    return torch.log_softmax(adapter.unembed(resid).float(), -1)


def layer_returns(adapter: ModelAdapter, layer: int) -> int:
    """What decoder layer ``layer`` returns to the model's layer loop: 0 for a bare tensor, else the
    length of its tuple (probed on two tokens), so a stand-in block can return the same."""
    adapter.require_active([layer], f"layer {layer}")
    seen: dict[str, int] = {}

    def hook(_m: Any, _a: Any, out: Any) -> None:
        seen["n"] = len(out) if isinstance(out, tuple) else 0
        raise StopForward

    module = adapter.decoder_layers()[adapter.layer_position(layer) or 0]
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            adapter.forward(torch.zeros((1, 2), dtype=torch.long, device=adapter.device))
    except StopForward:
        pass
    finally:
        handle.remove()
    return seen.get("n", 0)


def _repeat_batch(obj: Any, reps: int, batch: int) -> Any:
    """Repeat every tensor whose leading dim is the batch (``batch`` > 1) ``reps`` times."""
    if reps == 1:
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.ndim >= 2 and obj.shape[0] == batch and batch > 1:
            return obj.repeat(reps, *([1] * (obj.ndim - 1)))
        return obj
    if isinstance(obj, tuple):
        return tuple(_repeat_batch(o, reps, batch) for o in obj)
    if isinstance(obj, list):
        return [_repeat_batch(o, reps, batch) for o in obj]
    if isinstance(obj, dict):
        return {k: _repeat_batch(v, reps, batch) for k, v in obj.items()}
    return obj


_CACHE_ARGS = ("past_key_values", "past_key_value", "cache_params")


@dataclass
class LayerCall:
    """Everything the model's layer loop passes a decoder layer besides its hidden states, with the
    cache switched off (a replayed layer must not read or extend a cache)."""

    args: tuple[Any, ...]  # positional arguments after the hidden states
    kwargs: dict[str, Any]
    by_keyword: bool  # the hidden states were passed as ``hidden_states=``

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerCall:
        kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        for key in _CACHE_ARGS:
            if key in kw:
                kw[key] = None
        kw["use_cache"] = False
        return cls(tuple(args[1:]), kw, not args)

    def __call__(self, module: nn.Module, hidden: torch.Tensor, reps: int = 1, batch: int = 1) -> torch.Tensor:
        args, kw = _repeat_batch(self.args, reps, batch), _repeat_batch(self.kwargs, reps, batch)
        out = module(*args, **kw, hidden_states=hidden) if self.by_keyword else module(hidden, *args, **kw)
        return hidden_of(out)


class LayerCalls:
    """One pass of the model's own forward (:func:`run_layers`, stopped after the last running
    layer: no LM head) records what the model gives each running layer; :meth:`run` then reruns
    one layer on new hidden states, so later passes can start at any layer.

    ``layers``: the running layers' ids in order (:meth:`run` takes a position in it). ``h0`` is
    the first layer's input and ``final`` the last layer's output (the intact model's final
    residual: scoring the intact model needs no second pass). With ``inputs=True``, ``inputs[k]``
    holds the input of the layer at position k (attribution's checkpoints). ``attention_mask`` and
    ``position_ids`` are those of :func:`run_layers`; with ``stop`` (a layer id) the pass and the
    replay end after that layer.
    """

    def __init__(self, adapter: ModelAdapter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, *, inputs: bool = False, stop: int | None = None) -> None:
        self.adapter = adapter
        active = adapter.active_layers()
        self.layers = active if stop is None else [i for i in active if i <= stop]
        self.modules = list(adapter.decoder_layers())[: len(self.layers)]
        ins = [f"L{i}.resid_in" for i in (self.layers if inputs else self.layers[:1])]
        calls = [f"L{i}.call" for i in self.layers]
        got = run_layers(adapter, input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         stop=self.layers[-1], capture=[*ins, *calls])
        self.h0: torch.Tensor = got[ins[0]]  # [B, T, d_model]
        self.final: torch.Tensor | None = got["resid"]
        self.inputs: list[torch.Tensor] | None = [got[n] for n in ins] if inputs else None
        self.calls: list[LayerCall] = [got[n] for n in calls]
        self.batch = self.h0.shape[0]

    def run(self, pos: int, hidden: torch.Tensor, reps: int = 1) -> torch.Tensor:
        """The running layer at position ``pos`` on ``hidden`` (``[reps * B, T, d_model]``: ``reps``
        copies of the recorded batch, stacked along the batch dimension)."""
        return self.calls[pos](self.modules[pos], hidden, reps, self.batch)

    def output(self, pos: int) -> torch.Tensor:
        """What the recorded pass gave out of the layer at ``pos`` (needs ``inputs=True``)."""
        assert self.inputs is not None and self.final is not None
        return self.final if pos == len(self.layers) - 1 else self.inputs[pos + 1]
