"""What ``ganda plan`` charges for the circuit's experiments: the passes each one runs, in the
planner's units (:class:`ganda.plan.Phase`: forwards of some rows through some layers).

* ``path``: one recorded intact pass; the sender ablated everywhere from its layer; per part, the
  receiver's layer on the ablated stream and the intact forward from it (all paths: plus the
  layers between sender and receiver once).
* ``edges``: the recorded pass; the layer-by-layer backward (one VJP per layer, as plain AtP);
  per layer the receivers' copies (one copy of the layer per receiver head, forward and backward,
  stopped at the mixer's output projection: charged as the layer's share of weights in its
  mixers' input projections, :func:`mixer_part`); the sender
  writes kept for the whole backward; then the exact check of the top edges by estimate and the
  most active (planned as the larger list: the top by estimate lie mostly inside the top by
  activity), ``audit`` and ``widen``'s first round, at most every edge, each the intact forward
  from its receiver's layer (receivers spread evenly over the layers).

Every pass runs on the PyTorch path of analysis (``torch_path``): Mamba-1 layers scan chunked.
"""

from __future__ import annotations

from typing import Any

from ..attribution.engine import ACTIVE_EDGES, BATCH_TOKENS, GRADDROP_BLOCKS
from ..heads import HeadId
from ..plan import CHUNKED, Phase, Phases, Profile, Workload, backward_batch_tokens, batches_of


def mixer_part(p: Profile) -> float:
    """The share of a layer's weights that its mixers' input projections hold (q/k/v or ``in_proj``),
    averaged over the layers: what running a layer up to its output projection costs."""
    return max(0.05, min(1.0, sum(layer.proj * layer.d for layer in p.layers) / max(1.0, p.layer_params(
        range(len(p.layers))))))


def _layer(text: Any, default: int) -> int:
    try:
        return HeadId.parse(str(text)).layer
    except Exception:  # noqa: BLE001 - the planner costs a missing or malformed head at a default layer
        return default


def path_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda path``: see the module docstring."""
    L = list(range(len(p.layers)))
    s = min(max(0, _layer(opts.get("sender"), 0)), len(L) - 1)
    r = min(max(s, _layer(opts.get("receiver"), len(L) - 1)), len(L) - 1)
    parts = max(1, len([x for x in str(opts.get("parts") or "together").split(",") if x.strip()]))
    per_batch, calls = batches_of(w, backward_batch_tokens(p, opts, GRADDROP_BLOCKS))  # path_ablation's default
    phases = [Phase("intact pass, every layer's input kept", calls, per_batch, w.packed, L, w.reads, examples=w.n,
                    scored=w.n * w.score_rows, scan=CHUNKED),
              Phase("sender ablated everywhere", calls, per_batch, w.packed, L[s:], w.reads, scan=CHUNKED)]
    if opts.get("paths", "all") == "all" and r > s + 1:
        phases.append(Phase("ablated stream from the sender to the receiver", calls, per_batch, w.packed, L[s:r], 0,
                            scan=CHUNKED))
    phases.append(Phase(f"{parts} path ablation(s) from the receiver's layer on", calls * parts, per_batch, w.packed,
                        L[r:], w.reads, scan=CHUNKED))
    kept = len(L) * per_batch * w.packed * p.d_model * 4
    return phases, kept, [f"path ablation L{s} -> L{r}: the receiver's layer and the {len(L) - r - 1} after it "
                          f"per part ({parts})"]


def edges_batch_tokens(n_senders: int, d_model: int, budget: float = 1 << 30) -> int:
    """Padded tokens per batch of the edge pass: every sender's write ``[tokens, d_model]`` (fp32)
    is kept for the whole backward, within ``budget`` bytes, at most attribution's CPU batch."""
    return int(max(64, min(BATCH_TOKENS, budget // max(1, n_senders * d_model * 4))))


def edges_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda edges``: see the module docstring."""
    L = list(range(len(p.layers)))
    heads = p.heads
    batch_tokens = int(opts.get("batch_tokens") or edges_batch_tokens(heads, p.d_model))
    per_batch, calls = batches_of(w, batch_tokens)
    copies = sum(layer.heads for layer in p.layers[1:]) / max(1, len(L))  # receiver copies per layer, on average
    phases = [Phase("no-grad pass, residuals and mixer outputs kept", calls, per_batch, w.packed, L, w.reads,
                    examples=w.n, scored=w.n * w.score_rows, scan=CHUNKED),
              Phase("layer-by-layer backward (one VJP per layer)", calls, per_batch, w.packed, L, w.reads, backward=1.0,
                    scan=CHUNKED),
              Phase(f"receiver copies ({copies:.0f} per layer on average), forward and VJP up to the mixer", calls,
                    per_batch * copies, w.packed, L, 0, backward=2.0, scan=CHUNKED, part=mixer_part(p))]
    # --widen W: its first round (at least one runs; later rounds depend on what the first finds)
    edges = sum(layer.heads * sum(q.heads for q in p.layers[:k]) for k, layer in enumerate(p.layers))
    top = max(int(opts.get("verify_top", 10)), int(opts.get("active", ACTIVE_EDGES)))
    checks = min(edges, top + int(opts.get("audit", 10)) + int(opts.get("widen", 0)))
    if checks:
        depth = max(1, round(len(L) / 2))
        phases.append(Phase(f"exact check of {checks} edges (the intact forward from each receiver's layer)",
                            calls * checks, per_batch, w.packed, L[len(L) - depth:], w.reads, scan=CHUNKED))
    kept = (len(L) + heads) * per_batch * w.packed * p.d_model * 4
    note = (f"edges: every sender -> receiver pair of {heads} heads from one forward and one backward per batch, "
            f"{copies:.0f} receiver copies per layer; kept: every layer's input and every head's write")
    return phases, kept, [note]


__all__ = ["edges_batch_tokens", "edges_phases", "path_phases"]
