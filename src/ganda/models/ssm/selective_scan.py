"""Mamba-1's selective scan in chunks: the sequential scan's outputs and final state in about 2·√T steps.

The recurrence, per channel d and state n (Mamba-1, Falcon-Mamba and Jamba mixers):

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + Δ_t·B_t·u_t,     y_t = h_t·C_t  (+ D·u_t, then · silu(z_t))

transformers' PyTorch path runs it one token at a time: T steps of a few operations each, forward
and backward (24,194 ATen calls for one layer at 747 tokens), so a GPU is bound by kernel launches.
Here a segment of T tokens is cut into ⌈T/Q⌉ chunks of Q = ⌈√T⌉ tokens and scanned in three parts:

1. inside every chunk at once, the state from zero and its read-out ``h·C``: Q steps, each on all
   chunks (``[b, E, chunks, N]``, laid out so that a step's slice is contiguous);
2. between chunks a short sequential pass carries the state: ``H_c = exp(S_c) ⊙ H_{c-1} + local end of c``
   (``S_c`` the chunk's summed log-decay);
3. every position adds the read-out of its chunk's carried-in state decayed to it,
   ``C_t·(exp(S_t) ⊙ H_{c-1})``, ``S_t`` the cumulative sum of log-decays Δ·A ≤ 0 from the chunk's
   start through t.

Every exponent is a sum of log-decays over positions, so it is ≤ 0: nothing overflows whatever
Δ·A is (no ``exp`` of a positive cumulative sum, no division by a decay), and no gradient is a
difference of two large sums: outputs, final states and gradients stay within 3e-7 of a float64
run, as the sequential scan's do. SSD's masked ``Q × Q`` form
(:func:`ganda.models.ssm.llamba.ssd_chunked`) does not carry over: Mamba-1's decay differs per
channel *and* state, so its intra-chunk matrix would hold ``b·T·Q·E·N`` elements (11 GB for one
747-token row of a 7B layer at Q = 28) where this scan holds a few ``b·T·E·N`` tensors, as the
sequential scan does (autograd keeps 4.6 of them, the sequential scan 3.4). A no-grad scan peaks
at about six; long inputs are scanned in segments (:func:`segment_of`) to bound that. Outputs are
read out in float32 and cast to the input's dtype (transformers rounds the state to it first).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

# transformers modules whose Mamba-1 mixers call the module-level ``mamba_selective_scan``
MAMBA1_MODULES = (
    "transformers.models.mamba.modeling_mamba",
    "transformers.models.falcon_mamba.modeling_falcon_mamba",
    "transformers.models.jamba.modeling_jamba",
)


def present(names: Iterable[str]) -> Iterator[ModuleType]:
    """The transformers modules of ``names`` that this transformers version has, imported."""
    for name in names:
        try:
            yield importlib.import_module(name)
        except Exception:  # noqa: BLE001 - family absent from this transformers version
            continue


# elements of one [batch, segment, d_inner, state] float32 tensor; a no-grad scan keeps about six alive
SCAN_ELEMENTS = {"cpu": 1 << 26, "accelerator": 1 << 28}


def segment_of(batch: int, width: int, state: int, device: torch.device) -> int:
    """Tokens scanned at once: ``batch × segment × width × state`` within :data:`SCAN_ELEMENTS`
    (256 MiB of float32 on the CPU, 1 GiB on an accelerator; a 7B layer, 8,192 × 16: 512 tokens
    of one row on the CPU, 2,048 on a GPU)."""
    budget = SCAN_ELEMENTS["cpu" if device.type == "cpu" else "accelerator"]
    return max(1, budget // max(1, batch * width * state))


def chunk_of(length: int) -> int:
    """Q = ⌈√T⌉: the chunk length with the fewest steps (Q inside chunks + T/Q between them)."""
    return math.isqrt(max(1, length) - 1) + 1


def _scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
          h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """y ``[b, E, T]`` (u's dtype) and the state after the last position (float32) of one segment;
    u, dt ``[b, E, T]``, A ``[E, N]``, B, C ``[b, N, T]``, h0 ``[b, E, N]`` or None (zero)."""
    b, E, T = u.shape
    N = A.shape[-1]
    Q = chunk_of(T)
    nc = -(-T // Q)
    pad = nc * Q - T
    if pad:  # Δ = 0 and u = 0: decay 1 and no input, the state passes the padded positions unchanged
        u, dt, B, C = (F.pad(t, (0, pad)) for t in (u, dt, B, C))
    f = torch.promote_types(torch.promote_types(A.dtype, dt.dtype), torch.float32)  # float64 where Δ or A is

    def steps_first(t: torch.Tensor) -> torch.Tensor:  # [b, X, T] -> [Q, b, X, chunks]: a step's slice is contiguous
        return t.reshape(*t.shape[:2], nc, Q).permute(3, 0, 1, 2)

    dtq = steps_first(dt)
    la = dtq[..., None] * A[:, None, :]  # [Q, b, E, chunks, N]: the log-decay Δ·A ≤ 0
    x = (dtq * steps_first(u.to(f)))[..., None] * steps_first(B.to(f)).transpose(2, 3)[:, :, None]  # Δ·u·B
    Cq = steps_first(C.to(f)).transpose(2, 3)  # [Q, b, chunks, N]
    dA, decay = la.exp(), la.cumsum(0).exp()  # decay: from the chunk's start through each position
    del la
    h, ys = None, []  # 1. inside every chunk at once, from zero
    for a_q, x_q, c_q in zip(dA.unbind(0), x.unbind(0), Cq.unbind(0), strict=True):
        h = x_q.clone() if h is None else a_q * h + x_q  # a clone: a view would keep all of x saved
        ys.append((h * c_q[:, None]).sum(-1))
    del x
    assert h is not None
    carry = h.new_zeros(b, E, N) if h0 is None else h0.to(torch.promote_types(h0.dtype, h.dtype))
    starts = []  # 2. between chunks
    for whole, end in zip(decay[-1].unbind(2), h.unbind(2), strict=True):
        starts.append(carry)
        carry = whole * carry + end
    # 3. every position: the state carried into its chunk, decayed to it, read by C
    y = torch.stack(ys) + (decay * Cq[:, :, None] * torch.stack(starts, 2)).sum(-1)  # [Q, b, E, chunks]
    return y.permute(1, 2, 3, 0).reshape(b, E, nc * Q)[..., :T].to(u.dtype), carry


def selective_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, initial_state: torch.Tensor | None = None, **_: Any) -> Any:
    """transformers' ``mamba_selective_scan`` (same arguments and results), chunked, with the state
    starting at ``initial_state`` ``[b, E, N]`` (None: zero); segments of :func:`segment_of` tokens."""
    batch, inner, T = hidden_states.shape
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    seg = segment_of(batch, inner, A.shape[-1], hidden_states.device)
    ys, state = [], initial_state
    for s in range(0, T, seg):
        y, state = _scan(hidden_states[..., s:s + seg], dt[..., s:s + seg], A, B[..., s:s + seg],
                         C[..., s:s + seg], state)
        ys.append(y)
    y = ys[0] if len(ys) == 1 else torch.cat(ys, -1)
    if D is not None:
        y = y + hidden_states * D[None, :, None]
    if z is not None:
        y = y * F.silu(z)
    return (y, state) if return_last_state else y


def sequential_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                    delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                    return_last_state: bool = False, initial_state: torch.Tensor | None = None, **_: Any) -> Any:
    """The reference: transformers' sequential loop (the same operations in the same order), with
    the state starting at ``initial_state``. What :func:`selective_scan` is tested against."""
    batch, inner, seq_len = hidden_states.shape
    dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)
    dA = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    dBu = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()
    state = initial_state
    if state is None:
        state = torch.zeros(batch, inner, A.shape[-1], dtype=dtype, device=hidden_states.device)
    outs = []
    for t in range(seq_len):
        state = dA[:, :, t] * state + dBu[:, :, t]
        outs.append(torch.matmul(state.to(dtype), C[:, t, :].unsqueeze(-1))[:, :, 0])
    y = torch.stack(outs, dim=-1)
    if D is not None:
        y = y + hidden_states * D[None, :, None]
    if z is not None:
        y = y * F.silu(z)
    return (y, state) if return_last_state else y


def starting_from(scan: Callable[..., Any], start: Any) -> Callable[..., Any]:
    """``scan`` with transformers' signature whose state starts at ``start.state`` (read at each call)."""

    def mamba_selective_scan(*args: Any, **kwargs: Any) -> Any:
        return scan(*args, initial_state=start.state, **kwargs)

    mamba_selective_scan.ganda_scan = True  # type: ignore[attr-defined]
    return mamba_selective_scan


selective_scan.ganda_scan = True  # type: ignore[attr-defined]
