"""Shared machinery of the SSM and hybrid adapters: the forced PyTorch path, capture, maps, layers.

Every SSM adapter captures, during one real forward pass, the tensor from which Δ, B, C and x
are computed (usually the ``in_proj`` output), recomputes them in fp32 from the layer's own
weights and hands them to :mod:`.materialize`. Attention heads of hybrids are read from eager
attention in the same pass.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import GandaError
from ...heads import HeadId
from ..base import Mixer, ModelAdapter
from ..placement import weights_on
from .materialize import SelectiveParams, SSDParams, SSMParams, for_math, head_map, selective_maps
from .selective_scan import MAMBA1_MODULES, present, selective_scan

log = logging.getLogger(__name__)

# transformers modules whose module-level kernel functions we swap for their PyTorch references.
_HF_MODULES = (
    *MAMBA1_MODULES,
    "transformers.models.mamba2.modeling_mamba2",
    "transformers.models.zamba2.modeling_zamba2",
    "transformers.models.bamba.modeling_bamba",
    "transformers.models.falcon_h1.modeling_falcon_h1",
    "transformers.models.nemotron_h.modeling_nemotron_h",
)
_KERNEL_FUNCS = (
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "mamba_inner_fn",
    "mamba_selective_scan",
    "mamba_selective_state_update",
    "mamba2_chunk_scan",
    "mamba2_selective_state_update",
    "mamba2_split_conv1d_scan_combined",
)
_warned = False


@contextmanager
def torch_path(model: nn.Module) -> Iterator[None]:
    """Run ``model`` on the pure-PyTorch SSM path, in eval mode, for the duration.

    transformers picks Hub kernels, then ``mamba_ssm``/``causal_conv1d``, then PyTorch, per
    function, at import time; the fused training kernels skip ``norm`` and ``out_proj`` (so their
    hooks never fire) and the others compute with their own numerics. For analysis we unwrap each
    kernelised module-level function to the PyTorch reference it wraps and force eval mode.
    Mamba-1 mixers (Mamba, Falcon-Mamba, Jamba) get ganda's chunked selective scan in place of
    transformers' sequential one (:mod:`.selective_scan`: the same outputs in ~2·√T steps, not T),
    unless a ganda scan is already in place (:func:`.mamba1.scans_continue`).
    """
    global _warned
    patched: list[tuple[Any, str, Any]] = []
    for mod in present(_HF_MODULES):
        for fn_name in _KERNEL_FUNCS:
            fn = getattr(mod, fn_name, None)
            if fn is None or not callable(fn):
                continue
            ref = inspect.unwrap(fn)
            if ref is not fn:
                patched.append((mod, fn_name, fn))
                setattr(mod, fn_name, ref)
        scan = getattr(mod, "mamba_selective_scan", None)
        if mod.__name__ in MAMBA1_MODULES and scan is not None and not getattr(scan, "ganda_scan", False):
            patched.append((mod, "mamba_selective_scan", scan))
            mod.mamba_selective_scan = selective_scan
    was_training = model.training
    model.eval()
    if not _warned:
        log.info("ganda: SSM analysis runs the PyTorch reference path (kernels disabled) so that hooks fire")
        _warned = True
    try:
        yield
    finally:
        for mod, fn_name, fn in reversed(patched):
            setattr(mod, fn_name, fn)
        model.train(was_training)


def causal_conv(x: torch.Tensor, conv: nn.Conv1d, act: str | None) -> torch.Tensor:
    """Depthwise causal conv of ``x`` [T, D] with ``conv``'s weights (fp32), then ``act``."""
    T = x.shape[0]
    w = conv.weight.float()  # [D, 1, K]
    b = conv.bias.float() if conv.bias is not None else None
    y = F.conv1d(x.float().T[None], w, b, padding=w.shape[-1] - 1, groups=w.shape[0])[0, :, :T].T
    if act in ("silu", "swish"):
        y = F.silu(y)
    elif act not in (None, "identity"):
        raise GandaError(f"unsupported SSM conv activation {act!r}")
    return y


class _Gate:
    """True while the decoder layer of one invocation of a shared module is running."""

    def __init__(self) -> None:
        self.on = False


class _Handles:
    """Several hook handles removed as one."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class _Reindexed(nn.Module):
    """A decoder layer moved to another position, told its original index (see set_decoder_layers)."""

    def __init__(self, inner: nn.Module, index: int, arg_pos: int | None, kwarg: str | None) -> None:
        super().__init__()
        self.inner = inner
        self.index = index
        self.arg_pos = arg_pos
        self.kwarg = kwarg

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.kwarg is not None and self.kwarg in kwargs:
            kwargs[self.kwarg] = self.index
        elif self.arg_pos is not None and len(args) > self.arg_pos:
            args = (*args[: self.arg_pos], self.index, *args[self.arg_pos + 1:])
        return self.inner(*args, **kwargs)


def unwrap_layer(layer: nn.Module) -> nn.Module:
    return layer.inner if isinstance(layer, _Reindexed) else layer


class SSMAdapterBase(ModelAdapter):
    """Common parts of SSM and hybrid adapters (subclasses say where things are)."""

    # Set where a decoder layer is called with its own index as an argument (Zamba2): removal
    # then wraps moved layers so they still see their original index.
    layer_index_arg: tuple[int | None, str | None] = (None, None)

    def __init__(self, model: nn.Module, tokenizer: Any, spec: str = "") -> None:
        super().__init__(model, tokenizer, spec)
        self._orig_index = {id(layer): i for i, layer in enumerate(self._original_layers)}

    #: ``config.model_type`` -> human name: what the family is registered for and what it matches
    model_types: ClassVar[dict[str, str]] = {}
    #: the model's attribute whose ``layers`` are the decoder blocks (``model`` in hybrids)
    layers_in: ClassVar[str] = "backbone"
    prefix_cache_kwarg = "cache_params"  # a Mamba cache (hybrids: transformers' ``past_key_values``)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return (getattr(getattr(model, "config", None), "model_type", None) in cls.model_types
                and hasattr(model, cls.layers_in))

    # ---- family hooks -------------------------------------------------------------------
    @staticmethod
    def ssm_mixer(layer: int, module: nn.Module) -> Mixer:
        """The Mixer of one SSM module (default: Mamba-2 SSD heads, ``num_heads`` of ``head_dim``)."""
        return Mixer(layer=layer, kind="ssm", num_heads=module.num_heads, head_dim=module.head_dim,
                     out_proj=module.out_proj, module=module)

    def _build_mixers(self) -> list[Mixer]:
        """Each layer's ``mixer`` module as :meth:`ssm_mixer` counts its heads (hybrids: :meth:`layer_parts`)."""
        return [self.ssm_mixer(i, layer.mixer) for i, layer in enumerate(self._original_layers)]


    def ssm_capture_module(self, mixer: Mixer) -> nn.Module:
        """The module whose *output* the SSM inputs are recomputed from (default: in_proj)."""
        return mixer.module.in_proj

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        """Δ, B, C, x, ... of one layer from the captured tensor of sequence 0 ([T, ...]) (default: a
        Mamba-2 mixer's ``in_proj`` output, :func:`mamba2_params`)."""
        return mamba2_params(mixer.module, captured)[0]

    def _on_layers_changed(self, kept: list[int] | None, layers: list[nn.Module]) -> None:
        """Fix per-position config after truncation/removal.

        ``kept``: original indices (-1 for a foreign layer) or None when the original list is back;
        ``layers``: the new (unwrapped) layer modules in order.
        """

    # ---- layers -------------------------------------------------------------------------
    def decoder_layers(self) -> nn.ModuleList:
        return getattr(self.model, self.layers_in).layers

    def set_decoder_layers(self, layers: nn.ModuleList) -> None:
        owner = getattr(self.model, self.layers_in)
        inner = [unwrap_layer(m) for m in layers]
        kept = [self._orig_index.get(id(m), -1) for m in inner]
        if kept == list(range(len(self._original_layers))):
            owner.layers = self._original_layers
            self._on_layers_changed(None, list(self._original_layers))
            return
        arg_pos, kwarg = self.layer_index_arg
        new = []
        for pos, (m, orig) in enumerate(zip(inner, kept, strict=True)):
            if (arg_pos is not None or kwarg is not None) and orig != pos and orig >= 0:
                new.append(_Reindexed(m, orig, arg_pos, kwarg))
            else:
                new.append(m)
        owner.layers = nn.ModuleList(new)
        self._on_layers_changed(kept, inner)

    # ---- hooks --------------------------------------------------------------------------
    def _shared(self, mixer: Mixer, module: nn.Module) -> bool:
        return any(m is not mixer and (m.module is module or m.out_proj is module) for m in self.mixers())

    def _gated(self, mixer: Mixer, module: nn.Module, register: Callable[[Callable[..., Any]], Any],
               fn: Callable[..., Any]) -> Any:
        """Register ``fn`` on ``module`` so that it fires only inside ``mixer.layer``'s invocation."""
        if not self._shared(mixer, module):
            return register(fn)
        gate = _Gate()
        root = self._original_layers[mixer.layer]

        def on(_m: nn.Module, _a: Any) -> None:
            gate.on = True

        def off(_m: nn.Module, _a: Any, _o: Any) -> None:
            gate.on = False

        def gated(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if gate.on else None

        return _Handles([root.register_forward_pre_hook(on), root.register_forward_hook(off), register(gated)])

    def ssm_output_site(self, mixer: Mixer) -> tuple[nn.Module, str]:
        """Where the mixer's own SSM output ``y + D·x`` is visible in a forward, as (module, ``"pre"``:
        its input | ``"out"``: its output): what the reconstruction check compares ``M·x + D·x`` with.

        Mamba-2 mixers with a gated norm: the norm's input. Mamba-1 (gate applied inside the scan)
        and mixers without a norm: the output projection's input, ``(y + D·x)·silu(z)``."""
        m = mixer.module
        norm = getattr(m, "norm", None)
        gated_norm = getattr(m, "mamba_rms_norm", True) and not isinstance(norm, (nn.Identity, type(None)))
        if hasattr(m, "dt_bias") and gated_norm:
            return norm, "pre"
        return m.out_proj, "pre"

    # ---- capture ------------------------------------------------------------------------
    @torch.no_grad()
    def capture_ssm(self, input_ids: torch.Tensor, layers: Sequence[int]) -> dict[int, SSMParams]:
        """SSM inputs of the given layers for ``input_ids[0]`` from one forward on the PyTorch path,
        run to the end so that other hooks see the whole pass."""
        mixers = [self.mixer(layer, "ssm") for layer in layers]
        raw, _ = self._capture(input_ids, mixers, {}, stop_early=False)
        return {mx.layer: self._ssm_params(mx, raw[mx.layer]) for mx in mixers}

    def _ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        """:meth:`ssm_params` with an offloaded mixer's weights fetched for the call (device maps)."""
        with weights_on(mixer.module):
            return for_math(self.ssm_params(mixer, captured))

    def analysis_path(self) -> AbstractContextManager[Any]:
        return torch_path(self.model)

    @torch.no_grad()
    def implicit_maps(self, input_ids: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None = None,
                      include_d: bool = False) -> dict[HeadId, torch.Tensor]:
        """SSM heads only: M[rows, :] per head (``include_d`` adds D_h on the diagonal)."""
        bad = sorted({str(h) for h in map(self.canonical, heads) if self.mixer_of(h).kind != "ssm"})
        if bad:
            raise GandaError(f"{', '.join(bad)}: not SSM heads (implicit maps are for SSM heads)")
        return self._maps(input_ids, heads, rows, include_d)

    def _ssm_maps(self, mixer: Mixer, captured: torch.Tensor, heads: Sequence[HeadId], rows: Sequence[int] | None,
                  include_d: bool) -> dict[HeadId, torch.Tensor]:
        """The implicit maps of ``heads`` of one mixer from its captured tensor (:meth:`_capture`)."""
        p = self._ssm_params(mixer, captured)
        if isinstance(p, SelectiveParams):  # thousands of one-channel heads: batch them
            return dict(zip(heads, selective_maps(p, [h.head for h in heads], rows, include_d).cpu(), strict=True))
        return {h: head_map(p, h.head, rows, include_d).cpu() for h in heads}


def mamba2_params(mixer_module: nn.Module, proj: torch.Tensor) -> tuple[SSMParams, torch.Tensor]:
    """SSD inputs of a transformers Mamba-2 mixer (Mamba2/Zamba2/Bamba) from its in_proj output.

    Returns the params and the gate z. Splits ``[d_mlp, d_mlp, z, xBC, dt]`` (d_mlp is 0 in
    current checkpoints), recomputes conv+SiLU, Δ = clamp(softplus(dt + dt_bias), limit).
    """
    m = mixer_module
    H, P, G, N = m.num_heads, m.head_dim, m.n_groups, m.ssm_state_size
    E = m.intermediate_size
    conv_dim = E + 2 * G * N
    d_mlp = (proj.shape[-1] - E - conv_dim - H) // 2
    proj = proj.float()
    _, _, z, xBC, dt = proj.split([d_mlp, d_mlp, E, conv_dim, H], dim=-1)
    xBC = causal_conv(xBC, m.conv1d, getattr(m, "activation", "silu"))
    x, B, C = xBC.split([E, G * N, G * N], dim=-1)
    T = x.shape[0]
    delta = F.softplus(dt + m.dt_bias.float())
    lo, hi = getattr(m, "time_step_limit", (0.0, float("inf"))) or (0.0, float("inf"))
    delta = torch.clamp(delta, min=lo, max=hi)
    A = -torch.exp(m.A_log.float())
    p = SSDParams(
        x=x.reshape(T, H, P), B=B.reshape(T, G, N), C=C.reshape(T, G, N),
        log_decay=delta * A[None, :], col_scale=delta, D=m.D.float(), z=z,
    )
    return p, z


class HybridAdapterBase(SSMAdapterBase):
    """Hybrids: every decoder layer runs an attention module, an SSM mixer, or both (attention first).

    :meth:`layer_parts` says which modules a layer holds; the mixers follow: query heads of the
    attention module (Llama-style ``o_proj``, ``config.num_attention_heads``) and the SSM's heads
    as :meth:`ssm_mixer` counts them. Hybrids continue from transformers' cache (``past_key_values``).
    """

    prefix_cache_kwarg = "past_key_values"
    layers_in = "model"

    def layer_parts(self, layer: nn.Module) -> tuple[nn.Module | None, nn.Module | None, int | None]:
        """(attention module or None, SSM module or None, shared block id or None) of one decoder layer:
        its ``self_attn`` and ``mamba`` where it has them (Bamba, Jamba, Falcon-H1), no shared block."""
        return getattr(layer, "self_attn", None), getattr(layer, "mamba", None), None

    def _build_mixers(self) -> list[Mixer]:
        n_heads = self.model.config.num_attention_heads
        out = []
        for i, layer in enumerate(self._original_layers):
            attn, ssm, block = self.layer_parts(layer)
            if attn is not None:
                out.append(Mixer.attention(i, attn, n_heads, None if block is None else f"block{block}"))
            if ssm is not None:
                out.append(self.ssm_mixer(i, ssm))
        return out
