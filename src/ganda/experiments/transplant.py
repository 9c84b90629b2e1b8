"""Section 5.4 of the paper (Fig. 7): replace a student layer (or one student head) with the
corresponding attention layer (or head) of a donor Transformer, and score the student.

**Layer transplant** (:class:`TransplantLayer`). Student decoder block i is replaced by donor block
j (default j = i): the *whole* donor block (norms, attention, MLP), as in the authors' code. The
donor block is wrapped in :class:`DonorBlock`, which gives it what the donor model would have
given it: rotary position embeddings computed by the donor's own ``rotary_emb`` from the positions
(``position_ids`` when the student passes them, else ``0..T-1``) and an additive causal mask
(plus key padding from the 2-D ``attention_mask`` given to the student's forward). It returns what
the student's own block returned (a tensor, or a tuple whose first item is the hidden states), so
the student's layer loop is unchanged. Reversible: the original layer list is put back on exit.
When the student already holds some of the donor block's pieces (a distilled student that kept the
teacher's frozen norms and MLP, like ``lab-distilled``), swapping the whole block swaps in effect
only the pieces that differ: :func:`block_diff` says which (``transplant_sweep`` records it per
layer as ``swapped``).

**Head transplant** (:class:`TransplantHead`), the paper's "replace a single G&A head with an
attention variant". Exact definition: let student head s in layer i have output-projection input
slice ``y_s`` and contribution ``W_out[:, s] @ y_s`` to the residual stream; let donor attention
head d in donor layer j have query/key/value rows ``W_q[d], W_k[kv(d)], W_v[kv(d)]`` (GQA:
kv(d) = d // (heads / kv_heads)) and output columns ``W_o[:, d]``. Under the transplant

    out_proj(y) = W_out @ y  -  W_out[:, s] @ y_s  +  W_o[:, d] @ o_d

where ``o_d = softmax(q k^T * scale + causal mask) v`` with ``q, k, v`` computed from
``donor.input_layernorm(h)``, ``h`` the residual stream entering the student's block i, and RoPE
from the donor's ``rotary_emb`` (and the donor's q/k norms where it has them). I.e. the student
head's slice of ``out_proj``'s input is zeroed and the donor head's output, mapped into the
residual stream by its own o_proj columns, is added to ``out_proj``'s output. The o_proj bias (if
any) is not added (it belongs to the donor layer, not to one head). Everything else in the student
(other heads, the MLP, other layers) is untouched. With donor == student and d == s this is the
identity (tested). Donors are adapters that run a block or one head outside their model
(:meth:`ModelAdapter.run_block`, :meth:`ModelAdapter.head_output`): Llama-layout Transformers
(Llama, SmolLM2, Qwen2/3, Mistral, Gemma 1-3). A donor block keeps what its own model gives it:
the RoPE of its layer type (Gemma-3's local and global bases), its sliding window where it has one,
and (for one head) Gemma-2's attention-logit soft-capping.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..engine import Trace, layer_returns
from ..errors import GandaError
from ..figures import bars
from ..heads import HeadId, expand, require_heads
from ..interventions import Intervention, compress_ranges, parse_layers
from ..models import load_model
from ..models.base import ModelAdapter
from ..progress import tqdm
from ..stats import overlap
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult, Scorer, chance, flat_scores, pct, task_series


def _check_compatible(student: ModelAdapter, donor: ModelAdapter) -> None:
    a, b = student.d_model, donor.d_model
    if a != b:
        raise GandaError(f"student d_model {a} != donor d_model {b}: layers cannot be swapped")


def _additive_mask(t: int, pad: torch.Tensor | None, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[B or 1, 1, T, T]`` additive causal mask, with padded keys masked (diagonal always open)."""
    neg = torch.finfo(dtype).min
    allowed = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]
    if pad is not None and pad.dim() == 2 and pad.shape[-1] == t:
        allowed = allowed & pad.to(device=device, dtype=torch.bool)[:, None, None, :]
        allowed = allowed | torch.eye(t, dtype=torch.bool, device=device)[None, None]
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.full((), neg, dtype=dtype, device=device))


class _PadCapture:
    """The 2-D attention mask given to the student's top-level forward (engine point ``model.kwargs``)."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.trace = Trace(adapter, ["model.kwargs"])

    @property
    def mask(self) -> torch.Tensor | None:
        m = self.trace["model.kwargs"].get("attention_mask") if "model.kwargs" in self.trace else None
        return m if isinstance(m, torch.Tensor) and m.dim() == 2 else None


def _donor_inputs(block: nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any], pad: _PadCapture
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the donor's own model would give its ``block`` where the student's block reads
    ``hidden``: the states in the donor's dtype and device, the positions (the student's
    ``position_ids``, else ``0..T-1``) and the additive causal mask with the student's padding."""
    p = next(block.parameters())
    h = hidden.to(dtype=p.dtype, device=p.device)
    t = h.shape[1]
    pos = kwargs.get("position_ids")
    if not (isinstance(pos, torch.Tensor) and pos.shape[-1] == t):
        pos = torch.arange(t, device=h.device)
    return h, pos if pos.dim() == 2 else pos[None], _additive_mask(t, pad.mask, h.dtype, h.device)


class DonorBlock(nn.Module):
    """A donor decoder block that runs inside a student's layer loop (see module docstring)."""

    def __init__(self, donor: ModelAdapter, layer: int, pad: _PadCapture, returns_tuple: int) -> None:
        super().__init__()
        self.donor = donor
        self.layer = layer
        self.block = donor.original_layers()[layer]  # a child module: .to() and .parameters() see it
        self._pad = pad
        self.returns_tuple = returns_tuple

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        h, pos, mask = _donor_inputs(self.block, hidden_states, kwargs, self._pad)
        out = self.donor.run_block(self.layer, h, pos, mask).to(dtype=hidden_states.dtype, device=hidden_states.device)
        # the student's loop may unpack several values (Bamba: hidden states, attention weights)
        return (out,) + (None,) * (self.returns_tuple - 1) if self.returns_tuple else out


def _same_param(p: torch.Tensor, params: Sequence[torch.Tensor]) -> bool:
    return any(p.shape == q.shape and p.dtype == q.dtype and torch.equal(p, q.to(p.device)) for q in params)


def block_diff(student_block: nn.Module, donor_block: nn.Module) -> dict[str, list[str]]:
    """Which direct children of the donor block the student block already has (every parameter equal
    in value), which are the donor's own, and which of the student's children they replace.

    ``{"identical": [...], "donor_only": [...], "student_only": [...]}`` (donor names for the first
    two, student names for the last); children without parameters are left out.
    """
    s_params = list(student_block.parameters())
    d_params = list(donor_block.parameters())
    identical, donor_only, student_only = [], [], []
    for name, child in donor_block.named_children():
        ps = list(child.parameters())
        if ps:
            (identical if all(_same_param(p, s_params) for p in ps) else donor_only).append(name)
    for name, child in student_block.named_children():
        ps = list(child.parameters())
        if ps and not all(_same_param(p, d_params) for p in ps):
            student_only.append(name)
    return {"identical": identical, "donor_only": donor_only, "student_only": student_only}


def describe_swap(diff: dict[str, list[str]]) -> str:
    """``"self_attn for mamba (input_layernorm, mlp, ... identical)"`` from :func:`block_diff`."""
    text = f"{'+'.join(diff['donor_only']) or 'nothing'} for {'+'.join(diff['student_only']) or 'nothing'}"
    return text + (f" ({', '.join(diff['identical'])} identical)" if diff["identical"] else "")


@dataclass
class TransplantLayer(Intervention):
    """Replace student decoder blocks ``layers`` with donor blocks (``donor_layers``, default same)."""

    donor: ModelAdapter
    layers: Sequence[int]
    donor_layers: Sequence[int] | None = None

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        _check_compatible(adapter, self.donor)
        n = len(adapter.original_layers())
        dl = list(self.donor_layers) if self.donor_layers is not None else list(self.layers)
        if len(dl) != len(self.layers):
            raise GandaError("give one donor layer per student layer")
        n_d = len(self.donor.original_layers())
        for i, j in zip(self.layers, dl, strict=True):
            if not 0 <= i < n:
                raise GandaError(f"student layer {i} out of range, the student has layers 0-{n - 1}")
            if not 0 <= j < n_d:
                raise GandaError(f"donor layer {j} out of range, the donor has layers 0-{n_d - 1}")
        label = f"transplant of layers {compress_ranges(self.layers)} from {self.donor.spec}"
        adapter.require_active(self.layers, label)
        pad = _PadCapture(adapter)
        blocks = {i: DonorBlock(self.donor, j, pad, layer_returns(adapter, i))
                  for i, j in zip(self.layers, dl, strict=True)}
        token = adapter.push_layer_edit(range(n), label, replace=blocks)
        try:
            with pad.trace:
                yield
        finally:
            adapter.pop_layer_edit(token)

    def describe(self) -> dict[str, Any]:
        return {"type": "transplant_layer", "donor": self.donor.spec, "layers": list(self.layers),
                "donor_layers": list(self.donor_layers) if self.donor_layers is not None else list(self.layers)}


@dataclass
class TransplantHead(Intervention):
    """Replace one student head's contribution with one donor attention head's (module docstring)."""

    donor: ModelAdapter
    head: HeadId | str
    donor_head: HeadId | str | None = None

    def _resolve(self, adapter: ModelAdapter) -> tuple[HeadId, HeadId]:
        hs = expand([self.head] if isinstance(self.head, HeadId) else self.head, adapter)
        if len(hs) != 1:
            raise GandaError(f"--head must name exactly one student head, got {len(hs)}")
        s = hs[0]
        d_spec = self.donor_head if self.donor_head is not None else HeadId(s.layer, s.head, s.kind)
        dh = expand([d_spec] if isinstance(d_spec, HeadId) else d_spec, self.donor)
        if len(dh) != 1:
            raise GandaError("--donor-head must name exactly one donor head")
        if self.donor.mixer_of(dh[0]).kind != "attn":
            raise GandaError(f"donor head {dh[0]} is not an attention head")
        return s, dh[0]

    @contextmanager
    def apply(self, adapter: ModelAdapter) -> Iterator[None]:
        _check_compatible(adapter, self.donor)
        s, d = self._resolve(adapter)
        mixer = adapter.mixer_of(s)
        label = f"the transplant of {s} from {self.donor.spec}"
        token = adapter.use_layers([s.layer], label)  # refused where the layer is gone, as later removals
        dblock = self.donor.original_layers()[d.layer]
        pad = _PadCapture(adapter)
        sl = mixer.head_slice(s.head)
        resid, kwargs = f"L{s.layer}.resid_in", f"L{s.layer}.kwargs"
        pending: list[torch.Tensor] = []

        def swap_out(x: torch.Tensor) -> torch.Tensor:  # out_proj input: the student head's slice zeroed
            x = x.clone()
            x[..., sl] = 0
            hh, pos, mask = _donor_inputs(dblock, trace[resid], trace[kwargs], pad)
            pending.append(self.donor.head_output(d.layer, d.head, hh, pos, mask))
            return x

        def add_donor(out: torch.Tensor) -> torch.Tensor:  # out_proj output: plus the donor head's
            return out + pending.pop().to(dtype=out.dtype, device=out.device) if pending else out

        point = f"L{s.layer}.{mixer.kind}"
        trace = Trace(adapter, [resid, kwargs], detach=False, edit={f"{point}.z": swap_out, f"{point}.out": add_donor})
        try:
            with pad.trace, trace, adapter.whole_sequence():  # the donor head attends over the input it is given
                yield
        finally:
            adapter.release_layers(token)

    def describe(self) -> dict[str, Any]:
        return {"type": "transplant_head", "donor": self.donor.spec, "head": str(self.head),
                "donor_head": str(self.donor_head) if self.donor_head is not None else None}


@dataclass
class TransplantResult(ExperimentResult):
    kind: str = "transplant"
    title = "Donor layers transplanted"

    def headline(self) -> str:
        s = self.summary
        if "best_layer" not in s:
            return ""
        t = s.get("task")
        ci = {r["condition"]: (r.get(f"{t}_ci_low"), r.get(f"{t}_ci_high")) for r in self.rows}
        best, base = ci.get(s.get("best"), (None, None)), ci.get("student", (None, None))
        weak = (" (weak: its 95% interval overlaps the baseline's)" if None not in (*best, *base)
                and overlap(best, base) else "")
        return (f"Best transplant: layer **{s['best_layer']}**, {pct(s.get('best_accuracy'))} "
                f"vs baseline {pct(s.get('baseline_accuracy'))}{weak}.")

    def draw(self, out_dir: Path) -> list[Path]:
        rows = [r for r in self.rows if r["condition"] not in ("student", "donor")]
        base = next((r for r in self.rows if r["condition"] == "student"), {})
        donor = next((r for r in self.rows if r["condition"] == "donor"), {})
        labels = [r["condition"] for r in rows]
        series, errors = task_series(rows, self.config.get("tasks"))
        hl = {f"student {t}": base[t] for t in series if base.get(t) is not None}
        hl.update({f"donor {t}": donor[t] for t in series if donor.get(t) is not None})
        if "mmlu" in series or "lab-mmlu" in series:
            hl["MMLU chance"] = chance("mmlu")
        return [bars(labels, series, Path(out_dir) / "transplant.png", errors=errors, hlines=hl,
                     rotate=90 if len(labels) > 10 else 0,
                     title=f"{self.model} with donor {self.config.get('donor')} pieces")]


def transplant_sweep(
    student: ModelAdapter,
    donor: ModelAdapter,
    scorer: Scorer,
    *,
    layers: Sequence[int] | None = None,
    heads: str | None = None,
    donor_head: str | None = None,
    score_donor: bool = False,
) -> TransplantResult:
    """Score the student, then the student with each layer (or each listed head) transplanted."""
    _check_compatible(student, donor)
    rows: list[dict[str, Any]] = [{"condition": "student", **flat_scores(scorer.score([], label="student"))}]
    if score_donor:
        dscorer = replace(scorer, adapter=donor)  # the same tasks and draw, on the donor
        rows.append({"condition": "donor", **flat_scores(dscorer.score([], label="donor"))})
    conditions: list[tuple[str, Intervention]] = []
    if heads:
        for h in expand(heads, student):
            conditions.append((f"head {h}", TransplantHead(donor, h, donor_head)))
    else:
        n = min(len(student.decoder_layers()), len(donor.decoder_layers()))
        for i in layers if layers is not None else range(n):
            conditions.append((f"L{i}", TransplantLayer(donor, [i])))
    for name, iv in tqdm(conditions, desc="transplant", leave=False, disable=not scorer.progress):
        row = {"condition": name, **flat_scores(scorer.score([iv], label=name)), "intervention": iv.describe()}
        if isinstance(iv, TransplantLayer):
            i = iv.layers[0]
            row["swapped"] = describe_swap(block_diff(student.decoder_layers()[i], donor.decoder_layers()[i]))
        rows.append(row)
    task = scorer.tasks[0]
    base = rows[0].get(task)
    swept = [r for r in rows if r["condition"] not in ("student", "donor") and r.get(task) is not None]
    summary: dict[str, Any] = {"task": task, "baseline_accuracy": base}
    swapped = {r["condition"]: r["swapped"] for r in rows if "swapped" in r}
    if swapped:
        summary["swapped"] = swapped
    if swept:
        best = max(swept, key=lambda r: r[task])
        summary.update({"best": best["condition"], "best_accuracy": best[task],
                        "best_gain": best[task] - base if base is not None else None})
        if best["condition"].startswith("L"):
            summary["best_layer"] = int(best["condition"][1:])
    return TransplantResult(
        model=student.spec, rows=rows, summary=summary,
        config={**scorer.config(), "donor": donor.spec, "layers": list(layers) if layers is not None else None,
                "heads": heads, "donor_head": donor_head},
    )


@dataclass
class TransplantOptions(Options):
    donor: str = option("", "Transformer donor with the same d_model", required=True)
    layers: str | None = option(None, "student layers to sweep (default: all)")
    head: str | None = option(None, "transplant single heads instead, e.g. L17H3")
    donor_head: str | None = option(None, "donor head (default: same L/H)")
    score_donor: bool = option(False, "also score the donor itself")

    def check(self) -> None:
        if not self.donor:
            raise GandaError(f"{self.flag('donor')} is required: the donor model")
        require_heads(self.flag("head"), self.head)
        require_heads(self.flag("donor_head"), self.donor_head)
        self.needs("donor_head", "head", "names the donor of")
        if self.head and self.layers:
            raise GandaError(f"{self.flag('layers')} and {self.flag('head')}: give one ({self.flag('head')} transplants "
                             "single heads instead of layers)")
        parse_layers(self.layers) if self.layers else None


class Transplant(ScoredExperiment):
    """Fig. 7: replace each student layer (or one head) with the donor's, score the student (MODEL is the student)."""

    name = "transplant"
    Options = TransplantOptions
    phases = "ganda.plan:transplant_phases"
    default_tasks = "mmlu"

    @classmethod
    def plan_options(cls, adapter: ModelAdapter, options: Options, opts: dict[str, Any]) -> None:
        """``head``: the heads, each transplanted on its own, checked as :func:`transplant_sweep` expands them."""
        if opts.get("head"):
            opts["head"] = expand(opts["head"], adapter)

    def run_tasks(self, adapter: ModelAdapter, scorer: Scorer, options: TransplantOptions, *,  # type: ignore[override]
                  out_dir: Path, run: Any) -> TransplantResult:
        donor = adapter if options.donor == run.model else load_model(options.donor, allow_pickle=run.allow_pickle)
        layers = parse_layers(options.layers) if options.layers else None
        return self.finish(transplant_sweep(adapter, donor, scorer, layers=layers, heads=options.head,
                                            donor_head=options.donor_head, score_donor=options.score_donor), out_dir)
