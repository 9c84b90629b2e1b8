"""Invariant checks of the SSM and hybrid adapters, shared by the tests and the benchmark (the
numbers in docs/ssm.md), and the tiny random models of every family they run on.

Test and benchmark support, not part of the package: the tests import it as ``checks`` (pytest
puts ``tests/`` on the path) and the benchmarks after putting ``tests/`` on theirs.

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
from transformers import (
    BambaConfig,
    BambaForCausalLM,
    FalconH1Config,
    FalconH1ForCausalLM,
    FalconMambaConfig,
    FalconMambaForCausalLM,
    JambaConfig,
    JambaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    Zamba2Config,
    Zamba2ForCausalLM,
)

from ganda.heads import HeadId
from ganda.interventions import AblateHeads, mask_last_row
from ganda.models.base import Mixer, ModelAdapter
from ganda.models.loading import from_model
from ganda.models.ssm.common import SSMAdapterBase
from ganda.models.ssm.llamba import LlambaConfig, LlambaForCausalLM
from ganda.models.ssm.materialize import SSDParams, head_map


@torch.no_grad()
def reconstruction_error(adapter: SSMAdapterBase, input_ids: torch.Tensor, layer: int) -> dict[str, float]:
    """Relative errors over the layer: ``full`` (M·x + D·x vs captured y), ``worst_head`` (max over
    heads of the same) and ``ssm`` (M·x alone against y - D·x, inflated by cancellation when D·x dominates) and
    ``ssm_share`` = ‖M·x‖/‖y‖ (how much the check is about M rather than the skip)."""
    mixer = adapter.mixer(layer, "ssm")
    module, where = adapter.ssm_output_site(mixer)
    cap: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor) -> None:
        cap.setdefault("y", t[0].detach().float())

    if where == "pre":
        h = adapter.register_out_proj_pre_hook(mixer, lambda _m, a: grab(a[0])) if module is mixer.out_proj \
            else module.register_forward_pre_hook(lambda _m, a: grab(a[0]))
    else:
        h = module.register_forward_hook(lambda _m, _a, o: grab(o))
    try:
        p = adapter.capture_ssm(input_ids, [layer])[layer]
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


FAMILIES = [
    "mamba2", "mamba", "falcon_mamba", "llamba", "zamba2", "bamba", "falcon_h1", "falcon_h1_nonorm", "jamba",
]


def _randomise_ssm(model: nn.Module) -> None:
    """Random init leaves Δ tiny (M·x ≈ 0); spread Δ, A and D so the checks bite."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "dt_bias") and isinstance(mod.dt_bias, torch.nn.Parameter):
                mod.dt_bias.copy_(torch.randn(mod.dt_bias.shape, generator=g))
                mod.A_log.copy_(torch.rand(mod.A_log.shape, generator=g) * 2 - 1)
            if hasattr(mod, "dt_proj") and hasattr(mod, "A_log"):
                mod.dt_proj.bias.copy_(torch.randn(mod.dt_proj.bias.shape, generator=g))
            if hasattr(mod, "D") and isinstance(mod.D, torch.nn.Parameter):
                mod.D.copy_(0.3 * torch.randn(mod.D.shape, generator=g))
            if hasattr(mod, "in_proj") and hasattr(mod, "A_log"):  # HF inits in_proj at std 0.02: C·B ≈ 0
                mod.in_proj.weight.copy_(torch.randn(mod.in_proj.weight.shape, generator=g) * 0.3)
                mod.conv1d.weight.copy_(torch.rand(mod.conv1d.weight.shape, generator=g) - 0.5)
            if getattr(mod, "z_bias", None) is not None:
                mod.z_bias.copy_(torch.randn(mod.z_bias.shape, generator=g))


def tiny_model(family: str) -> nn.Module:
    """A few-layer random model of ``family`` (real architecture classes), SSM params spread out."""
    torch.manual_seed(0)
    if family == "mamba2":
        cfg = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_heads=8, head_dim=8,
                           state_size=8, n_groups=2, expand=2, chunk_size=4)
        model = Mamba2ForCausalLM(cfg)
    elif family in ("mamba", "falcon_mamba"):
        C, M = (MambaConfig, MambaForCausalLM) if family == "mamba" else (FalconMambaConfig, FalconMambaForCausalLM)
        model = M(C(vocab_size=64, hidden_size=16, num_hidden_layers=3, state_size=4, expand=2, time_step_rank=4))
    elif family == "llamba":
        model = LlambaForCausalLM(LlambaConfig(
            vocab_size=61, d_model=32, n_layer=3, mlp_cfg={"intermediate_size": 48},
            ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "chunk_size": 4}))
    elif family == "zamba2":
        cfg = Zamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                           num_key_value_heads=4, mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8,
                           mamba_ngroups=2, num_mem_blocks=2, chunk_size=4, intermediate_size=64,
                           layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
                           use_shared_attention_adapter=True, adapter_rank=4)
        model = Zamba2ForCausalLM(cfg)
    elif family == "bamba":
        cfg = BambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, mamba_n_heads=8, mamba_d_head=8,
                          mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4, attn_layer_indices=[1, 3])
        model = BambaForCausalLM(cfg)
    elif family in ("falcon_h1", "falcon_h1_nonorm"):
        cfg = FalconH1Config(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48, mamba_n_heads=8, mamba_d_head=8,
                             mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4, mamba_d_ssm=64,
                             mamba_rms_norm=family == "falcon_h1", key_multiplier=0.7,
                             ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9], ssm_in_multiplier=1.3,
                             ssm_out_multiplier=0.6, attention_out_multiplier=0.9)
        model = FalconH1ForCausalLM(cfg)
    elif family == "jamba":
        cfg = JambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=32, num_experts=2, num_experts_per_tok=1,
                          expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                          mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)
        model = JambaForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    _randomise_ssm(model)
    return model.eval()


@torch.no_grad()
def invariant_rows(families: list[str] | None = None, T: int = 13) -> list[dict[str, Any]]:
    """The three invariants, worst case over every mixer of each tiny family (for docs/benchmarks)."""
    ids = torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(2))
    rows = []
    for fam in families or FAMILIES:
        ad = from_model(tiny_model(fam))
        rec = [reconstruction_error(ad, ids, m.layer) for m in ad.mixers() if m.kind == "ssm"]
        abl = [ablation_diff(ad, ids, ad.canonical(HeadId(m.layer, m.num_heads - 1, m.kind))) for m in ad.mixers()]
        last = [last_row_diff(ad, ids, [ad.canonical(HeadId(m.layer, 1, m.kind))]) for m in ad.mixers()]
        rows.append({
            "family": fam, "class": type(ad.model).__name__,
            "mixers": ", ".join(sorted({m.kind for m in ad.mixers()})),
            "recon_full": max(r["full"] for r in rec), "recon_worst_head": max(r["worst_head"] for r in rec),
            "recon_ssm": max(r["ssm"] for r in rec), "ssm_share": min(r["ssm_share"] for r in rec),
            "ablation_equiv": max(a["equiv"] for a in abl), "ablation_effect": min(a["effect"] for a in abl),
            "lastrow_before": max(x["before"] for x in last), "lastrow_last": min(x["last"] for x in last),
        })
    return rows
