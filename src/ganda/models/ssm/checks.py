"""Invariant checks shared by the tests and the benchmark (the numbers in docs/ssm.md).

* reconstruction: M·x + D·x against the SSD/scan output captured inside the real forward;
* ablation: a head zeroed at the out_proj input against its out_proj columns zeroed;
* last row: masking the query position changes only the last position's logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...heads import HeadId
from ...interventions import AblateHeads, mask_last_row
from ..base import Mixer, ModelAdapter
from .materialize import SSDParams, head_map


def _reference_site(mixer: Mixer) -> tuple[nn.Module, str]:
    """Where the mixer's own SSM output is visible: (module, "pre" input | "out" output)."""
    m = mixer.module
    if hasattr(m, "ssd_output"):  # Llamba: y + D·x before the gate
        return m.ssd_output, "out"
    norm = getattr(m, "norm", None)
    if hasattr(m, "dt_bias") and getattr(m, "mamba_rms_norm", True) and not isinstance(norm, (nn.Identity, type(None))):
        # Mamba-2 family: the gated norm's input is y + D·x
        return norm, "pre"
    # Mamba-1 (gate applied inside the scan) and Falcon-H1 without its norm: (y + D·x)·silu(z).
    return m.out_proj, "pre"


@torch.no_grad()
def reconstruction_error(adapter: ModelAdapter, input_ids: torch.Tensor, layer: int) -> dict[str, float]:
    """Relative errors over the layer: ``full`` (M·x + D·x vs captured y), ``worst_head`` (max over
    heads of the same) and ``ssm`` (M·x alone against y - D·x, inflated by cancellation when D·x dominates) and
    ``ssm_share`` = ‖M·x‖/‖y‖ (how much the check is about M rather than the skip)."""
    mixer = adapter.mixer(layer, "ssm")
    module, where = _reference_site(mixer)
    cap: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor) -> None:
        cap.setdefault("y", t[0].detach().float())

    if where == "pre":
        h = adapter.register_out_proj_pre_hook(mixer, lambda _m, a: grab(a[0])) if module is mixer.out_proj \
            else module.register_forward_pre_hook(lambda _m, a: grab(a[0]))
    else:
        h = module.register_forward_hook(lambda _m, _a, o: grab(o))
    try:
        p = adapter.capture_ssm(input_ids, [layer])[layer]  # type: ignore[attr-defined]
    finally:
        h.remove()
    y = cap["y"].cpu()
    T = y.shape[0]
    recs, refs, skips, worst = [], [], [], 0.0
    for head in range(p.num_heads):
        M = head_map(p, head).cpu()
        rec = _apply_cpu(p, head, M)
        if isinstance(p, SSDParams):
            ref = y.reshape(T, p.num_heads, -1)[:, head]
            skip = p.D[head].float().cpu() * p.x[:, head].float().cpu()
            if module is mixer.out_proj:  # gated, no norm
                g = F.silu(p.z.reshape(T, p.num_heads, -1)[:, head].float().cpu())  # type: ignore[union-attr]
                rec, skip = rec * g, skip * g
        else:
            g = F.silu(p.z[:, head].float().cpu())  # type: ignore[index]
            rec, ref = rec * g, y[:, head]
            skip = p.D[head].float().cpu() * p.x[:, head].float().cpu() * g
        worst = max(worst, float((rec - ref).norm() / ref.norm().clamp_min(1e-30)))
        recs.append(rec.reshape(T, -1))
        refs.append(ref.reshape(T, -1))
        skips.append(skip.reshape(T, -1))
    rec_all, ref_all, skip_all = torch.cat(recs, 1), torch.cat(refs, 1), torch.cat(skips, 1)
    mx = rec_all - skip_all
    return {
        "full": float((rec_all - ref_all).norm() / ref_all.norm()),
        "worst_head": worst,
        "ssm": float((mx - (ref_all - skip_all)).norm() / mx.norm().clamp_min(1e-30)),
        "ssm_share": float(mx.norm() / ref_all.norm()),
    }


def _apply_cpu(p: Any, head: int, M: torch.Tensor) -> torch.Tensor:
    x = p.x[:, head].float().cpu()
    return M @ x + p.D[head].float().cpu() * x


@contextmanager
def zeroed_columns(mixer: Mixer, heads: list[int]) -> Iterator[None]:
    """Zero the out_proj weight columns of ``heads`` (a fresh Parameter on this module only, so a
    tied weight's other users, e.g. other invocations of a Zamba2 block, are untouched)."""
    lin = mixer.out_proj
    orig = lin.weight
    w = orig.detach().clone()
    for h in heads:
        w[:, mixer.head_slice(h)] = 0
    lin.weight = nn.Parameter(w, requires_grad=False)
    try:
        yield
    finally:
        lin.weight = orig


@torch.no_grad()
def ablation_diff(adapter: ModelAdapter, input_ids: torch.Tensor, head: HeadId | str) -> dict[str, float]:
    """``equiv``: |logits(AblateHeads) - logits(zeroed columns)|max; ``effect``: how much ablation moved them."""
    hid = adapter.canonical(HeadId.parse(head) if isinstance(head, str) else head)
    mixer = adapter.mixer_of(hid)
    base = adapter.forward(input_ids)
    with AblateHeads([hid]).apply(adapter):
        hooked = adapter.forward(input_ids)
    with zeroed_columns(mixer, [hid.head]):
        cols = adapter.forward(input_ids)
    return {"equiv": float((hooked - cols).abs().max()), "effect": float((hooked - base).abs().max())}


@torch.no_grad()
def last_row_diff(adapter: ModelAdapter, input_ids: torch.Tensor, heads: list[HeadId] | str) -> dict[str, float]:
    """``before``: max change of logits at positions < T-1 (must be 0); ``last``: change at T-1."""
    base = adapter.forward(input_ids)
    with mask_last_row(heads).apply(adapter):
        masked = adapter.forward(input_ids)
    d = (masked - base).abs()
    return {"before": float(d[:, :-1].max()), "last": float(d[:, -1].max())}
