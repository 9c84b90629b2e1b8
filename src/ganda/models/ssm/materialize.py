"""Exact implicit attention of SSM heads (the matrix M with y = M·x + D·x).

Two parametrisations cover every family ganda supports:

* :class:`SSDParams` (Mamba-2, Zamba2/Bamba Mamba-2 layers, Discrete Mamba-2 / Llamba): one scalar
  decay per head and step, ``M[i,j] = (C_i·B_j) · exp(Σ_{k=j+1..i} a_k) · w_j`` where ``a = Δ·A_h``
  and ``w = Δ`` for Mamba-2, ``a = -softplus(A_log)`` and ``w = 1`` for Discrete Mamba-2.
* :class:`SelectiveParams` (Mamba-1 / Falcon-Mamba): one decay per channel *and* state dim,
  ``M^d[i,j] = Σ_n C_i[n] B_j[n] Δ_j[d] exp(Σ_{k=j+1..i} Δ_k[d] A[d,n])``.

Why this layout: the exponent is a difference of prefix sums, computed in float64 (a float32
cumsum over thousands of steps loses the digits that the difference needs), masked to ``-inf``
above the diagonal *before* ``exp`` (the upper triangle has positive exponents that overflow), and
only the requested rows are built, so one head at 4,096 tokens is 64 MB and the last row alone
costs O(L·N). The result is float32 on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...heads import HeadId, expand

if TYPE_CHECKING:
    from ..base import ModelAdapter

# Rows per block for SSD maps (float64 scratch ~block·T); column block for Mamba-1 maps and
# the channel batch that keeps their [T, channels, N] scratch bounded.
_SSD_ROW_BLOCK = 512
_SEL_BLOCK = 64
_SEL_SCRATCH = 1 << 22  # float64 elements of per-chunk scratch ([T, channels, N])


@dataclass
class SSDParams:
    """One Mamba-2-style layer's SSM inputs for one sequence (all float32, CPU or device).

    x: [T, H, P]; B, C: [T, G, N] (head h reads group ``h // (H // G)``); log_decay: [T, H]
    (``a_t``, the log of the per-step decay, ≤ 0); col_scale: [T, H] or None (Δ_j for Mamba-2,
    None for Discrete Mamba-2); D: [H].
    """

    x: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    log_decay: torch.Tensor
    col_scale: torch.Tensor | None
    D: torch.Tensor
    z: torch.Tensor | None = None  # the gate ([T, H·P]); kept for reconstruction checks

    @property
    def num_heads(self) -> int:
        return self.x.shape[1]

    def group(self, head: int) -> int:
        return head // (self.num_heads // self.B.shape[1])


@dataclass
class SelectiveParams:
    """One Mamba-1 layer's SSM inputs for one sequence.

    x, delta: [T, E]; A: [E, N] (negative); B, C: [T, N]; D: [E].
    """

    x: torch.Tensor
    delta: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    z: torch.Tensor | None = None  # the gate ([T, E]); y_gated = (M·x + D·x) · silu(z)

    @property
    def num_heads(self) -> int:
        return self.x.shape[1]


SSMParams = SSDParams | SelectiveParams


def for_math(p: SSMParams) -> SSMParams:
    """The params on a device that has float64 (MPS has none: fall back to the CPU)."""
    if p.x.device.type != "mps":
        return p
    fields = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(p).items()}
    return type(p)(**fields)


def _rows(rows: Sequence[int] | torch.Tensor | None, T: int) -> torch.Tensor:
    if rows is None:
        return torch.arange(T)
    r = torch.as_tensor(list(rows) if not isinstance(rows, torch.Tensor) else rows, dtype=torch.long)
    r = torch.where(r < 0, r + T, r)
    if r.numel() and (int(r.min()) < 0 or int(r.max()) >= T):
        raise IndexError(f"rows out of range for a sequence of {T} tokens")
    return r


def ssd_head_map(p: SSDParams, head: int, rows: Sequence[int] | torch.Tensor | None = None,
                 include_d: bool = False) -> torch.Tensor:
    """``M_h[rows, :]`` for one SSD head: [len(rows), T] float32."""
    T = p.x.shape[0]
    dev = p.x.device
    r = _rows(rows, T).to(dev)
    g = p.group(head)
    Bg = p.B[:, g].float()  # [T, N]
    Cr = p.C[r, g].float()  # [R, N]
    cs = torch.cumsum(p.log_decay[:, head].double(), 0)  # [T], float64 prefix sums
    w = p.col_scale[:, head].float() if p.col_scale is not None else None
    cols = torch.arange(T, device=dev)
    out = torch.empty(len(r), T, dtype=torch.float32, device=dev)
    for s in range(0, len(r), _SSD_ROW_BLOCK):
        rb = r[s:s + _SSD_ROW_BLOCK]
        causal = cols[None, :] <= rb[:, None]
        expo = torch.where(causal, cs[rb][:, None] - cs[None, :], torch.tensor(float("-inf"), dtype=torch.float64, device=dev))
        block = (Cr[s:s + _SSD_ROW_BLOCK] @ Bg.T) * torch.exp(expo).float()
        if w is not None:
            block = block * w[None, :]
        out[s:s + _SSD_ROW_BLOCK] = block
    if include_d:
        out[torch.arange(len(r), device=dev), r] += p.D[head].float()
    return out


def selective_channel_map(p: SelectiveParams, channel: int, rows: Sequence[int] | torch.Tensor | None = None,
                          include_d: bool = False) -> torch.Tensor:
    """``α^d[rows, :]`` for one Mamba-1 channel: [len(rows), T] float32."""
    return selective_maps(p, [channel], rows, include_d)[0]


def selective_maps(p: SelectiveParams, channels: Sequence[int], rows: Sequence[int] | torch.Tensor | None = None,
                   include_d: bool = False) -> torch.Tensor:
    """``α^d[rows, :]`` for several Mamba-1 channels at once: [len(channels), len(rows), T] float32.

    The decay differs per state dim n, so a naive map is L²·N exponentials per channel. Columns
    are taken in blocks J ending at ``ref``; for rows r ≥ ref, ``exp(cs_r − cs_j) =
    exp(cs_r − cs_ref) · exp(cs_ref − cs_j)`` with both exponents ≤ 0 (no overflow), which turns
    the block into one product over n; only the band where J holds r itself is exponentiated
    entry-wise. Channels are batched (a Mamba-1 layer has thousands of one-channel "heads").
    """
    T, N = p.B.shape
    dev = p.x.device
    r = _rows(rows, T).to(dev)
    chans = torch.as_tensor(list(channels), dtype=torch.long, device=dev)
    out = torch.zeros(len(chans), len(r), T, dtype=torch.float32, device=dev)
    C = p.C.double()[r]  # [R, N]
    Bd = p.B.double()
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64, device=dev)
    step = max(1, _SEL_SCRATCH // (T * N))
    Q = _SEL_BLOCK
    for c0 in range(0, len(chans), step):
        cc = chans[c0:c0 + step]
        o = out[c0:c0 + step]
        delta = p.delta[:, cc].double().T.contiguous()  # [c, T]
        # [c, N, T]: the prefix sum runs along the contiguous axis (float64, non-increasing)
        cs = torch.cumsum(delta[:, None, :] * p.A[cc].double()[:, :, None], dim=-1)
        Bw = (Bd.T[None] * delta[:, None, :]).float()  # B̄_j = Δ_j B_j (Euler, as HF and CUDA), [c, N, T]
        csr = cs[:, :, r]  # [c, N, R]
        for j0 in range(0, T, Q):
            j1 = min(T, j0 + Q)
            ref = j1 - 1
            after = r >= ref  # rows that see the whole block
            if bool(after.any()):
                # both exponents ≤ 0; the factors are computed in float64 and multiplied in float32
                left = (C[after].T[None] * torch.exp(csr[:, :, after] - cs[:, :, ref:ref + 1])).float()  # [c, N, R']
                right = Bw[:, :, j0:j1] * torch.exp(cs[:, :, ref:ref + 1] - cs[:, :, j0:j1]).float()  # [c, N, J]
                o[:, after, j0:j1] = left.transpose(1, 2) @ right
            band = (r >= j0) & (r < ref)  # rows inside the block: causal part only
            if bool(band.any()):
                rb, cols = r[band], torch.arange(j0, j1, device=dev)
                causal = (cols[None, :] <= rb[:, None])[None, None]  # [1, 1, Rb, J]
                expo = torch.where(causal, csr[:, :, band][..., None] - cs[:, :, None, j0:j1], neg_inf)  # [c, N, Rb, J]
                w = torch.exp(expo) * Bw[:, :, None, j0:j1].double() * C[band].T[None, :, :, None]
                o[:, band, j0:j1] = w.sum(1).float()
    if include_d:
        idx = torch.arange(len(r), device=dev)
        out[:, idx, r] += p.D[chans].float()[:, None]
    return out


def head_map(p: SSMParams, head: int, rows: Sequence[int] | torch.Tensor | None = None,
             include_d: bool = False) -> torch.Tensor:
    if isinstance(p, SSDParams):
        return ssd_head_map(p, head, rows, include_d)
    return selective_channel_map(p, head, rows, include_d)


def group_channels(maps: dict[int, torch.Tensor], block: int, reduce: str = "mean") -> dict[int, torch.Tensor]:
    """Mamba-1 readability helper: combine per-channel maps into blocks of ``block`` channels.

    Key k of the result is the block ``[k·block, (k+1)·block)``; ``reduce`` is ``mean`` or
    ``absmean`` (signed maps cancel under a plain mean).
    """
    out: dict[int, list[torch.Tensor]] = {}
    for ch, m in maps.items():
        out.setdefault(ch // block, []).append(m.abs() if reduce == "absmean" else m)
    return {k: torch.stack(v).mean(0) for k, v in sorted(out.items())}


def materialize(adapter: ModelAdapter, input_ids: torch.Tensor, heads: Sequence[HeadId | str] | str,
                rows: Sequence[int] | None = None, include_d: bool = False) -> dict[HeadId, torch.Tensor]:
    """Implicit attention of SSM heads: ``{head: M[rows or all, :]}``, float32 on CPU.

    Runs one forward pass with the PyTorch SSM path forced (kernels can skip the hooked modules),
    captures each requested layer's SSM inputs and builds only the requested heads and rows.
    ``include_d`` adds the skip D_h on the diagonal (the paper's plots do; the default keeps
    y = M·x + D·x with D separate).
    """
    return adapter.implicit_maps(input_ids, expand(heads, adapter), rows, include_d)
