"""How a head reads its layer's input and how it writes into the residual stream: what a path
ablation needs to know of a family, and the only place that knows it.

**Reading.** A head's output depends on the residual stream entering its layer through a few
named *parts*; each is the output of one module, or a channel range of one, computed from that
input alone:

* an attention head: its query, key and value (``q``/``k``/``v``: the outputs of ``q_proj``,
  ``k_proj``, ``v_proj``; GQA's key and value are the KV head's, shared by its query heads);
* a Mamba-2-style SSM head (Mamba-2, Bamba, Zamba2 and Falcon-H1 Mamba layers, Llamba's Discrete
  Mamba-2): ``x``, ``B``, ``C``, ``dt`` (Δ's pre-activation; Llamba's decay ``a``) and ``gate``,
  channel ranges of ``in_proj``'s output. The causal convolution after ``in_proj`` is depthwise
  and every later step reads its own channels, so taking some channels from one input and the
  rest from another is exactly "these parts see that input".

Taking every part from one input is the same as running the mixer on it (tested). Mixers whose
parts are not separable this way are refused: Zamba2's shared attention adds per-invocation
LoRA adapters to its projections, Mamba-1 (and Jamba's Mamba layers) computes Δ, B and C from the
convolved x.

**Writing.** :func:`residual_write_scale` is the factor by which a mixer's output projection
enters the residual stream (1 for Llama, Mamba and most hybrids, Falcon-H1's output multipliers),
or None where it does not enter it linearly (Zamba2's shared attention block writes through its
own MLP and a per-invocation projection).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import GandaError
from .base import Mixer, ModelAdapter

ATTN_PARTS = ("q", "k", "v")
SSM_PARTS = ("x", "B", "C", "dt", "gate")


@dataclass(frozen=True)
class Site:
    """One module output (``channels``: a range of its last dimension; None: all of it)."""

    module: nn.Module
    channels: slice | None = None


def input_parts(adapter: ModelAdapter, mixer: Mixer) -> dict[str, list[Site]]:
    """The parts of ``mixer``'s input (module docstring), in their canonical order; refused (one
    line) for a mixer whose parts cannot be taken separately."""
    m = mixer.module
    if mixer.kind == "attn":
        if any(len(getattr(m, f"linear_{p}_adapter_list", None) or ()) for p in "qkv"):
            raise GandaError(f"layer {mixer.layer}: this attention adds per-invocation adapters to its query, key "
                             "and value; its parts cannot be taken separately (use the part 'together')")
        if not all(isinstance(getattr(m, f"{p}_proj", None), nn.Linear) for p in "qkv"):
            raise GandaError(f"layer {mixer.layer}: no q_proj/k_proj/v_proj in its attention module")
        return {p: [Site(getattr(m, f"{p}_proj"))] for p in ATTN_PARTS}
    return _ssm_parts(mixer)


def _ssm_parts(mixer: Mixer) -> dict[str, list[Site]]:
    m = mixer.module
    proj = getattr(m, "in_proj", None)
    if not isinstance(proj, nn.Linear) or mixer.head_dim == 1:
        raise GandaError(f"layer {mixer.layer}: Mamba-1 heads compute Δ, B and C from their convolved x; "
                         "their parts cannot be taken separately (use the part 'together')")
    if hasattr(m, "n_v_heads"):  # Llamba's Discrete Mamba-2: [x, B, C | z | a]
        E, GN, H = m.d_inner, m.n_qk_heads * m.d_state, m.n_v_heads
        offsets = {"x": 0, "B": E, "C": E + GN, "gate": E + 2 * GN, "dt": 2 * E + 2 * GN}
        sizes = {"x": E, "B": GN, "C": GN, "gate": E, "dt": H}
    elif all(hasattr(m, a) for a in ("intermediate_size", "n_groups", "ssm_state_size", "num_heads")):
        # transformers' Mamba-2 mixers: [2 · d_mlp | gate | x, B, C | dt] (d_mlp is 0 in current checkpoints)
        E, GN, H = m.intermediate_size, m.n_groups * m.ssm_state_size, m.num_heads
        lead = proj.out_features - (2 * E + 2 * GN + H)
        offsets = {"gate": lead, "x": lead + E, "B": lead + 2 * E, "C": lead + 2 * E + GN, "dt": lead + 2 * E + 2 * GN}
        sizes = {"x": E, "B": GN, "C": GN, "gate": E, "dt": H}
    else:
        raise GandaError(f"layer {mixer.layer}: {type(m).__name__} is not a Mamba-2-style mixer; "
                         "its parts cannot be taken separately (use the part 'together')")
    if offsets["dt"] + sizes["dt"] != proj.out_features:
        raise GandaError(f"layer {mixer.layer}: in_proj gives {proj.out_features} channels, not the Mamba-2 layout")
    return {p: [Site(proj, slice(offsets[p], offsets[p] + sizes[p]))] for p in SSM_PARTS}


def part_names(mixer: Mixer) -> tuple[str, ...]:
    """The names of a mixer's parts (attention: q, k, v; SSM: x, B, C, dt, gate)."""
    return ATTN_PARTS if mixer.kind == "attn" else SSM_PARTS


def residual_write_scale(adapter: ModelAdapter, mixer: Mixer) -> float | None:
    """The factor by which ``mixer``'s output projection is added to the residual stream, or None
    where it is not added to it linearly (module docstring)."""
    if mixer.kind == "attn" and mixer.shared_key is not None:
        return None  # Zamba2: the shared block's MLP and per-invocation linear sit between
    layer = adapter.original_layers()[mixer.layer]  # as loaded, whatever a layer edit moved
    name = "attn_out_multiplier" if mixer.kind == "attn" else "ssm_out_multiplier"
    return float(getattr(layer, name, 1.0))


__all__ = ["ATTN_PARTS", "SSM_PARTS", "Site", "input_parts", "part_names", "residual_write_scale"]
