"""What ``ganda plan`` charges for the circuit's experiments: the passes each one runs, in the
planner's units (:class:`ganda.plan.Phase`: forwards of some rows through some layers).

* ``path``: one recorded intact pass; the sender ablated everywhere from its layer; per part, the
  receiver's layer on the ablated stream and the intact forward from it (all paths: plus the
  layers between sender and receiver once).
* ``edges``: the recorded pass; the layer-by-layer backward (one VJP per layer, as plain AtP);
  per layer with a sender below it the receivers' copies (one copy of the layer per receiver head,
  forward and backward, stopped at the mixer's output projection: charged as the layer's share of
  weights in its mixers' input projections, :func:`mixer_part`); the sender
  writes kept for the whole backward; then the exact check of the top edges by estimate and the
  most active (planned as the larger list: the top by estimate lie mostly inside the top by
  activity), ``audit`` and ``widen``'s first round, at most every edge, each the intact forward
  from its receiver's layer (receivers spread evenly over the layers where they have an edge). ``--senders``
  and ``--receivers`` narrow the writes kept, the copies, the edges and where the checks start;
  last, unless ``--no-roles``, the labels of the heads the figure (``show``), the finding (three)
  and the table (``top``) name, each labelled as every command labels (the intact run and the
  pattern pass once, three positional ablations a head): planned as two heads an edge of the
  longest of those lists, since they hold mostly the same edges (SmolLM2, 4 KV prompts, the
  defaults: 20 planned, 15 labelled).

Every pass runs on the PyTorch path of analysis (``torch_path``): Mamba-1 layers scan chunked.
"""

from __future__ import annotations

from typing import Any

from ..attribution.engine import ACTIVE_EDGES, BATCH_TOKENS, GRADDROP_BLOCKS
from ..errors import GandaError
from ..heads import HeadId
from ..plan import CHUNKED, Phase, Phases, Profile, Workload, backward_batch_tokens, batches_of, scoring_phase


def mixer_part(p: Profile) -> float:
    """The share of a layer's weights that its mixers' input projections hold (q/k/v or ``in_proj``),
    averaged over the layers: what running a layer up to its output projection costs."""
    return max(0.05, min(1.0, sum(layer.proj * layer.d for layer in p.layers) / max(1.0, p.layer_params(
        range(len(p.layers))))))


def _pair(p: Profile, opts: dict[str, Any]) -> tuple[int, int]:
    """The sender's and the receiver's layers (``ganda plan`` checks the pair in the model first,
    as ``ganda path`` does; here a pair the profile's layers cannot hold is one line, never moved)."""
    s, r = (HeadId.parse(str(opts.get(k) or "")).layer for k in ("sender", "receiver"))
    if not 0 <= s < r < len(p.layers):
        raise GandaError(f"path {opts['sender']} -> {opts['receiver']}: the sender's layer must come before the "
                         f"receiver's, both within the model's layers 0..{len(p.layers) - 1}")
    return s, r


def path_phases(p: Profile, w: Workload, opts: dict[str, Any]) -> Phases:
    """``ganda path``: see the module docstring."""
    L = list(range(len(p.layers)))
    s, r = _pair(p, opts)
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
    """``ganda edges``: see the module docstring. ``senders_per_layer``/``receivers_per_layer``: the
    heads the edges join, per layer (``ganda plan`` counts them as the edge pass picks them,
    :func:`ganda.circuit.edges.edge_heads`; default every head)."""
    L = list(range(len(p.layers)))
    every = [layer.heads for layer in p.layers]
    sends, recvs = opts.get("senders_per_layer") or every, opts.get("receivers_per_layer") or every
    below = [sum(sends[:k]) for k in L]  # senders in earlier layers: what a receiver of layer k is copied for
    batch_tokens = int(opts.get("batch_tokens") or edges_batch_tokens(sum(sends), p.d_model))
    per_batch, calls = batches_of(w, batch_tokens)
    copies = sum(n for n, b in zip(recvs, below, strict=True) if b) / max(1, len(L))  # per layer, on average
    phases = [Phase("no-grad pass, residuals and mixer outputs kept", calls, per_batch, w.packed, L, w.reads,
                    examples=w.n, scored=w.n * w.score_rows, scan=CHUNKED),
              Phase("layer-by-layer backward (one VJP per layer)", calls, per_batch, w.packed, L, w.reads, backward=1.0,
                    scan=CHUNKED),
              Phase(f"receiver copies ({copies:.0f} per layer on average), forward and VJP up to the mixer", calls,
                    per_batch * copies, w.packed, L, 0, backward=2.0, scan=CHUNKED, part=mixer_part(p))]
    # --widen W: its first round (at least one runs; later rounds depend on what the first finds)
    edges = sum(n * b for n, b in zip(recvs, below, strict=True))
    top = max(int(opts.get("verify_top", 10)), int(opts.get("active", ACTIVE_EDGES)))
    checks = min(edges, top + int(opts.get("audit", 10)) + int(opts.get("widen", 0)))
    if checks:
        # the intact forward from a receiver's layer on, receivers spread evenly over the layers with an edge
        held = [k for k in L if recvs[k] and below[k]]
        depth = max(1, round(sum(len(L) - k for k in held) / len(held)))
        phases.append(Phase(f"exact check of {checks} edges (the intact forward from each receiver's layer)",
                            calls * checks, per_batch, w.packed, L[len(L) - depth:], w.reads, scan=CHUNKED))
    if opts.get("roles", True):
        named = min(edges, max(int(opts.get("show", 10)), 3, int(opts.get("top", 10))))
        heads = min(2 * named, sum(every))
        if heads:
            phases.append(scoring_phase(p, w, f"labels of about {heads} heads (three ablations each)",
                                        2 + 3 * heads, opts))
    kept = (len(L) + sum(sends)) * per_batch * w.packed * p.d_model * 4
    who = f"{sum(sends)} heads" if sends == recvs else f"{sum(sends)} senders and {sum(recvs)} receivers"
    note = (f"edges: every sender -> receiver pair of {who} from one forward and one backward per batch, "
            f"{copies:.0f} receiver copies per layer; kept: every layer's input and every head's write")
    return phases, kept, [note]


__all__ = ["edges_batch_tokens", "edges_phases", "path_phases"]
