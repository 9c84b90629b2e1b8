"""Llamba (cartesia-ai/Llamba-*, goombalab/Llamba-8B-untied-unaligned): Discrete Mamba-2 + Llama MLP.

transformers has no class for it, so this is a self-contained PyTorch implementation that loads
the published layout (``config.json`` with ``d_model``/``n_layer``/``ssm_cfg``/``mlp_cfg`` and
safetensors keyed ``backbone.layers.{i}.mixer.{in_proj,conv1d,z_bias,D,out_proj}``,
``backbone.layers.{i}.{input_layernorm,post_attention_layernorm,mlp.*}``, ``backbone.embedding``,
``backbone.final_layernorm``, ``lm_head``). The reference code calls a Triton kernel with
``x/softplus(a)``, ``dt = softplus(a)``, ``A = -1``; algebraically that is the recurrence

    h_t = exp(-softplus(a_t)) · h_{t-1} + B_t x_tᵀ,    y_t = C_t·h_t + D x_t

which we evaluate with a chunked SSD in fp32 (no division by softplus, so no round trip error).
Heads are the ``n_v_heads`` value heads (32 for Llamba-8B); head h reads B/C group
``h // (n_v_heads / n_qk_heads)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ...errors import GandaError
from ...registry import unsupported
from ..base import Mixer
from ..loading import check_loading_info, read_config
from .common import SSMAdapterBase
from .materialize import SSDParams, SSMParams

_SSM_DEFAULTS: dict[str, Any] = {
    "d_state": 64, "n_v_heads": 32, "n_qk_heads": 32, "expand": 1, "chunk_size": 128,
    "activation": "identity", "bias": False, "d_conv": 4, "conv_bias": True,
}
_MLP_DEFAULTS: dict[str, Any] = {"intermediate_size": 14336, "bias": False, "act_fn": "silu"}


class LlambaConfig:
    """The published Llamba config (cartesia-pytorch ``LlambaConfig`` fields)."""

    model_type = "llamba"

    def __init__(self, vocab_size: int, d_model: int, n_layer: int = 32, tie_embeddings: bool = False,
                 pad_vocab_size_multiple: int = 8, lm_head_bias: bool = False, norm_epsilon: float = 1e-5,
                 resid_dropout: float = 0.0, mlp_cfg: dict[str, Any] | None = None,
                 ssm_cfg: dict[str, Any] | None = None, **extra: Any) -> None:
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.hidden_size = d_model
        self.n_layer = n_layer
        self.num_hidden_layers = n_layer
        self.tie_embeddings = tie_embeddings
        self.pad_vocab_size_multiple = pad_vocab_size_multiple
        self.lm_head_bias = lm_head_bias
        self.norm_epsilon = norm_epsilon
        self.resid_dropout = resid_dropout
        self.mlp_cfg = {**_MLP_DEFAULTS, **(mlp_cfg or {})}
        self.ssm_cfg = {**_SSM_DEFAULTS, **(ssm_cfg or {})}
        self.extra = {k: v for k, v in extra.items() if k != "model_type"}

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return self.vocab_size + (-self.vocab_size) % m if m else self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type, "vocab_size": self.vocab_size, "d_model": self.d_model,
            "n_layer": self.n_layer, "tie_embeddings": self.tie_embeddings,
            "pad_vocab_size_multiple": self.pad_vocab_size_multiple, "lm_head_bias": self.lm_head_bias,
            "norm_epsilon": self.norm_epsilon, "resid_dropout": self.resid_dropout,
            "mlp_cfg": dict(self.mlp_cfg), "ssm_cfg": dict(self.ssm_cfg),
        }

    @staticmethod
    def looks_like(raw: dict[str, Any]) -> bool:
        """True for a Llamba config.json (with or without ``model_type``)."""
        return raw.get("model_type") in (None, "llamba") and {"d_model", "n_layer", "ssm_cfg"} <= raw.keys()


def ssd_chunked(x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int,
                h0: torch.Tensor | None = None, final: list[torch.Tensor] | None = None) -> torch.Tensor:
    """y_t = Σ_{j≤t} (C_t·B_j) exp(Σ_{k=j+1..t} a_k) x_j, chunked; fp32.

    x: [b, T, H, P]; log_a: [b, T, H]; B, C: [b, T, H, N] (already per head). Intra-chunk terms are
    an explicit masked product, inter-chunk terms a short recurrence over chunk states. ``h0``
    ``[b, H, P, N]``: the state before position 0 (a cached prefix; None: zero), which adds
    ``C_t·h0·exp(Σ_{k≤t} a_k)``; ``final``: a list that receives the state after the last position.
    """
    b, T, H, P = x.shape
    N = B.shape[-1]
    pad = (-T) % chunk
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        log_a = F.pad(log_a, (0, 0, 0, pad))
    nc = (T + pad) // chunk
    x, B, C = (t.reshape(b, nc, chunk, H, -1) for t in (x, B, C))
    acs = torch.cumsum(log_a.reshape(b, nc, chunk, H), dim=2)
    causal = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=x.device))
    seg = acs[:, :, :, None, :] - acs[:, :, None, :, :]  # [b, nc, i, j, H]
    seg = seg.masked_fill(~causal[None, None, :, :, None], float("-inf"))
    scores = torch.einsum("bcihn,bcjhn->bcijh", C, B) * torch.exp(seg)
    y = torch.einsum("bcijh,bcjhp->bcihp", scores, x)
    to_end = torch.exp(acs[:, :, -1:, :] - acs)  # [b, nc, Q, H]
    states = torch.einsum("bcjh,bcjhn,bcjhp->bchpn", to_end, B, x)
    h = x.new_zeros(b, H, P, N) if h0 is None else h0.to(x.dtype)
    for c in range(nc):
        if c or h0 is not None:
            y[:, c] += torch.einsum("bihn,bhpn->bihp", C[:, c], h) * torch.exp(acs[:, c])[..., None]
        h = torch.exp(acs[:, c, -1])[:, :, None, None] * h + states[:, c]
    if final is not None:  # right pads (zero x, B and decay 1) leave the state unchanged
        final.append(h)
    return y.reshape(b, nc * chunk, H, P)[:, :T]


class LlambaCache:
    """The state of a Llamba after a sequence, per layer: the last ``d_conv - 1`` conv inputs and
    the fp32 SSM state ``[b, H, P, N]``. :class:`LlambaForCausalLM` continues from it
    (``cache_params``) exactly as if the cached tokens were prepended to its input."""

    def __init__(self, n_layer: int) -> None:
        self.conv: list[torch.Tensor | None] = [None] * n_layer
        self.ssm: list[torch.Tensor | None] = [None] * n_layer

    def reorder_cache(self, rows: torch.Tensor) -> None:
        """Keep (and repeat) the batch rows ``rows`` of every state."""
        for states in (self.conv, self.ssm):
            for i, t in enumerate(states):
                if t is not None:
                    states[i] = t.index_select(0, rows.to(t.device))


class DiscreteMamba2(nn.Module):
    """The Discrete Mamba-2 mixer (phi-mamba / Llamba), PyTorch only."""

    def __init__(self, d_model: int, d_state: int = 64, n_qk_heads: int = 32, n_v_heads: int = 32, d_conv: int = 4,
                 expand: int = 1, activation: str = "identity", bias: bool = False, conv_bias: bool = True,
                 chunk_size: int = 128, layer_idx: int | None = None, d_inner: int | None = None, **_: Any) -> None:
        super().__init__()
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner = d_inner or expand * d_model
        self.n_qk_heads, self.n_v_heads = n_qk_heads, n_v_heads
        self.num_heads = n_v_heads
        self.head_dim = self.d_inner // n_v_heads
        if n_v_heads % n_qk_heads or self.d_inner % n_v_heads:
            raise GandaError("Llamba: n_v_heads must be a multiple of n_qk_heads and divide d_inner")
        self.activation, self.chunk_size, self.layer_idx = activation, chunk_size, layer_idx
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * n_qk_heads * d_state + n_v_heads, bias=bias)
        self.z_bias = nn.Parameter(torch.zeros(self.d_inner)) if not bias else None
        conv_dim = self.d_inner + 2 * n_qk_heads * d_state
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1, bias=conv_bias)
        self.D = nn.Parameter(torch.ones(n_v_heads))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)
        # Hook point: y + D·x per head, before the gate ([b, T, H, P]); used by reconstruction checks.
        self.ssd_output = nn.Identity()

    def split(self, proj: torch.Tensor, cache: LlambaCache | None = None) -> tuple[torch.Tensor, ...]:
        """(x [.., T, Hv, P], B, C [.., T, Hqk, N], z [.., T, d_inner], a_raw [.., T, Hv]) from in_proj output,
        in its dtype (fp32 for the implicit maps, :meth:`LlambaAdapter.ssm_params`).

        ``cache``: the conv continues from the cached inputs of the previous positions and the
        last ``d_conv - 1`` inputs are cached in their place."""
        E, G, N = self.d_inner, self.n_qk_heads, self.d_state
        xBC, z, a_raw = proj.split([E + 2 * G * N, E, self.n_v_heads], dim=-1)
        T = proj.shape[-2]
        w = self.conv1d.weight.to(proj.dtype)
        bias = self.conv1d.bias.to(proj.dtype) if self.conv1d.bias is not None else None
        raw = xBC.transpose(-1, -2)
        prev = cache.conv[self.layer_idx] if cache is not None else None
        if prev is None:
            xBC = F.conv1d(raw, w, bias, padding=self.d_conv - 1, groups=w.shape[0])[..., :T]
        else:  # the cached inputs stand where the zero padding would
            xBC = F.conv1d(torch.cat([prev, raw], -1), w, bias, groups=w.shape[0])
        if cache is not None:
            if prev is None:
                prev = raw.new_zeros(*raw.shape[:-1], self.d_conv - 1)
            # a copy: a slice would keep the whole [.., channels, T] input allocated as long as the cache
            cache.conv[self.layer_idx] = torch.cat([prev, raw], -1)[..., T:].clone()
        xBC = xBC.transpose(-1, -2)
        if self.activation in ("silu", "swish"):
            xBC = F.silu(xBC)
        x, B, C = xBC.split([E, G * N, G * N], dim=-1)
        lead = x.shape[:-1]
        return (x.reshape(*lead, self.n_v_heads, self.head_dim), B.reshape(*lead, G, N), C.reshape(*lead, G, N),
                z, a_raw)

    def forward(self, u: torch.Tensor, cache: LlambaCache | None = None, **_: Any) -> torch.Tensor:
        """``cache``: continue the sequence it holds (conv inputs and SSM state) and update it."""
        dtype = u.dtype
        x, B, C, z, a_raw = self.split(self.in_proj(u), cache)
        rep = self.n_v_heads // self.n_qk_heads
        B = B.float().repeat_interleave(rep, dim=2)
        C = C.float().repeat_interleave(rep, dim=2)
        log_a = -F.softplus(a_raw.float())
        final: list[torch.Tensor] = []
        h0 = cache.ssm[self.layer_idx] if cache is not None else None
        y = ssd_chunked(x.float(), log_a, B, C, self.chunk_size, h0, final if cache is not None else None)
        if cache is not None:
            cache.ssm[self.layer_idx] = final[0]
        y = self.ssd_output(y + self.D.float()[:, None] * x.float())
        y = y.reshape(*y.shape[:-2], self.d_inner)
        zb = z.float() + (self.z_bias.float() if self.z_bias is not None else 0.0)
        return self.out_proj((y * F.silu(zb)).to(dtype))


class LlambaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LlambaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, act_fn: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        from transformers.activations import ACT2FN  # heavy (~1 s): loaded when a Llamba is built

        self.act_fn = ACT2FN[act_fn]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlambaBlock(nn.Module):
    def __init__(self, config: LlambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.mixer = DiscreteMamba2(config.d_model, layer_idx=layer_idx, **config.ssm_cfg)
        self.input_layernorm = LlambaRMSNorm(config.d_model, eps=1e-5)
        self.post_attention_layernorm = LlambaRMSNorm(config.d_model, eps=1e-5)
        self.mlp = LlambaMLP(config.d_model, **config.mlp_cfg)

    def forward(self, hidden_states: torch.Tensor, cache: LlambaCache | None = None, **_: Any) -> torch.Tensor:
        h = hidden_states + self.mixer(self.input_layernorm(hidden_states), cache=cache).to(hidden_states.dtype)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlambaBackbone(nn.Module):
    def __init__(self, config: LlambaConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.layers = nn.ModuleList([LlambaBlock(config, i) for i in range(config.n_layer)])
        self.final_layernorm = LlambaRMSNorm(config.d_model, eps=config.norm_epsilon)

    def forward(self, input_ids: torch.Tensor, cache: LlambaCache | None = None) -> torch.Tensor:
        h = self.embedding(input_ids)
        for layer in self.layers:
            h = layer(h) if cache is None else layer(h, cache=cache)
        return self.final_layernorm(h)


class LlambaForCausalLM(nn.Module):
    """Llamba language model; ``forward(input_ids).logits`` like a transformers causal LM."""

    def __init__(self, config: LlambaConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = LlambaBackbone(config)
        self.lm_head = None if config.tie_embeddings else nn.Linear(
            config.d_model, config.padded_vocab_size, bias=config.lm_head_bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                use_cache: bool = False, cache_params: LlambaCache | None = None,
                logits_to_keep: torch.Tensor | int | None = None, **_: Any) -> Any:
        """``cache_params``: continue the sequence it holds (updated in place); ``logits_to_keep``:
        the only positions whose logits are returned."""
        if attention_mask is not None and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
            # Right padding is harmless (causal: real positions never see later pads); left is not.
            raise GandaError("Llamba supports right padding only (a recurrent state would carry the left pads)")
        h = self.backbone(input_ids, cache_params)
        if isinstance(logits_to_keep, torch.Tensor):
            h = h[:, logits_to_keep]
        elif logits_to_keep:  # transformers' convention: an int keeps the last positions, 0 all
            h = h[:, -logits_to_keep:]
        w = self.backbone.embedding.weight if self.lm_head is None else self.lm_head.weight
        bias = None if self.lm_head is None else self.lm_head.bias
        from transformers.modeling_outputs import CausalLMOutput  # heavy: loaded once a Llamba runs

        return CausalLMOutput(logits=F.linear(h, w, bias).float())


def load_llamba(path: str | Path) -> LlambaForCausalLM:
    """Build a Llamba from a local directory in the published layout (config.json + *.safetensors)."""
    path = Path(path)
    raw = read_config(path / "config.json")
    if not LlambaConfig.looks_like(raw):
        raise GandaError(f"{path}/config.json is not a Llamba config (needs d_model, n_layer, ssm_cfg)")
    config = LlambaConfig(**raw)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise GandaError(f"{path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    with torch.device("meta"):
        model = LlambaForCausalLM(config)
    want = model.state_dict()
    check_loading_info(model, {  # refused as transformers' own checkpoints are, in the same words
        "missing_keys": sorted(want.keys() - state.keys()), "unexpected_keys": sorted(state.keys() - want.keys()),
        "mismatched_keys": [(k, v.shape, want[k].shape) for k, v in state.items() if k in want and v.shape != want[k].shape],
    }, path)
    model.load_state_dict(state, strict=True, assign=True)
    return model


def save_llamba(model: LlambaForCausalLM, path: str | Path, with_model_type: bool = True) -> None:
    """Write ``model`` in the published layout (used by tests to make tiny checkpoints)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    if not with_model_type:
        cfg.pop("model_type")
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))


def load_unlabelled(path: str | Path) -> nn.Module:
    """Loader for config.json files without ``model_type``: Llamba's published configs omit it."""
    raw = read_config(Path(path) / "config.json")
    if LlambaConfig.looks_like(raw):
        return load_llamba(path)
    raise unsupported(None)


class LlambaAdapter(SSMAdapterBase):
    family = "llamba"
    model_types = {"llamba": "Llamba (Discrete Mamba-2)"}  # LlambaConfig.model_type

    def new_cache(self) -> LlambaCache:
        return LlambaCache(len(self._original_layers))

    def ssm_output_site(self, mixer: Mixer) -> tuple[nn.Module, str]:
        return mixer.module.ssd_output, "out"  # y + D·x before the gate

    def ssm_params(self, mixer: Mixer, captured: torch.Tensor) -> SSMParams:
        m: DiscreteMamba2 = mixer.module
        x, B, C, z, a_raw = m.split(captured.float())  # the forward's own split and conv, in fp32
        zb = z + (m.z_bias.float() if m.z_bias is not None else 0.0)
        return SSDParams(x=x, B=B, C=C, log_decay=-F.softplus(a_raw), col_scale=None, D=m.D.float(), z=zb)
