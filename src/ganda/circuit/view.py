"""The circuit view: heads as nodes placed by layer, verified edges as arrows labelled with their
exact effect and its interval, nodes coloured by their label's first role (:mod:`ganda.labels`: Gather,
Aggregate, induction, previous-token, sink or none).

An arrow's width grows with |effect|; green where removing the edge lowers the gold answer's
margin (the edge supports it), purple where it raises it; dashed where the paired 95% interval
includes 0 (a weak edge). Labels are whatever the caller gives (the shared labeller, through
:func:`ganda.experiments.circuit.circuit_roles`, in ``ganda edges``); a head without one is drawn
white.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..figures import pyplot, save_figure
from ..heads import HeadId

ROLE_COLOURS = {"Gather": "#4C72B0", "Aggregate": "#C44E52", "induction": "#DD8452", "previous-token": "#CCB974",
                "sink": "#8172B3", "none": "#BBBBBB", "unlabelled": "#FFFFFF"}  # ganda.labels.LABELS
SUPPORTS, OPPOSES = "#2A9D3A", "#8E44AD"


def _positions(nodes: Sequence[str]) -> dict[str, tuple[float, float]]:
    """x: the layer; y: the node's place among its layer's nodes (head order), centred on 0."""
    by_layer: dict[int, list[HeadId]] = {}
    for n in nodes:
        h = HeadId.parse(n)
        by_layer.setdefault(h.layer, []).append(h)
    out = {}
    for layer, hs in by_layer.items():
        hs.sort(key=lambda h: (h.kind or "", h.head))
        for i, h in enumerate(hs):
            out[str(h)] = (float(layer), i - (len(hs) - 1) / 2)
    return out


def _arrow(ax: Any, a: tuple[float, float], b: tuple[float, float], e: Mapping[str, Any], k: int, biggest: float,
           patch: Any) -> None:
    """One edge: an arc (skips over several layers bend more, alternately up and down) and its label
    at the arc's middle (matplotlib bends arcs in display space, so the middle is found there)."""
    eff = float(e["exact"])
    lo, hi = e.get("exact_ci_low"), e.get("exact_ci_high")
    weak = lo is not None and hi is not None and lo <= 0 <= hi
    rad = (0.1 + 0.07 * max(0.0, b[0] - a[0] - 1)) * (1 if k % 2 else -1)
    ax.add_patch(patch(a, b, arrowstyle="-|>", mutation_scale=14, connectionstyle=f"arc3,rad={rad}", shrinkA=16,
                       shrinkB=16, lw=1.0 + 5.0 * abs(eff) / biggest, color=SUPPORTS if eff >= 0 else OPPOSES,
                       ls="--" if weak else "-", alpha=0.85, zorder=1))
    (x0, y0), (x1, y1) = ax.transData.transform(a), ax.transData.transform(b)
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    mid = ax.transData.inverted().transform((0.25 * x0 + 0.5 * cx + 0.25 * x1, 0.25 * y0 + 0.5 * cy + 0.25 * y1))
    label = f"{eff:+.2f}" + (f" [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else "")
    ax.text(mid[0], mid[1], label, fontsize=7, ha="center", va="center", zorder=3,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})


def draw_circuit(edges: Sequence[Mapping[str, Any]], path: str | Path, *, roles: Mapping[str, str] | None = None,
                 title: str | None = None, n_layers: int | None = None) -> Path:
    """One PNG of ``edges`` (rows with ``sender``, ``receiver``, ``exact``, ``exact_ci_low``, ``exact_ci_high``)."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    # a node takes the colour of its label's first role (ganda.labels: "induction+sink" is induction)
    roles = {n: (r.split("+")[0] or "unlabelled") for n, r in (roles or {}).items()}
    nodes = list(dict.fromkeys(n for e in edges for n in (str(e["sender"]), str(e["receiver"]))))
    pos = _positions(nodes)
    span = max((abs(y) for _, y in pos.values()), default=1.0)
    layers = [x for x, _ in pos.values()]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * (max(layers, default=0) - min(layers, default=0) + 2)),
                                    max(3.5, 1.1 * (2 * span + 2))))
    lo_x, hi_x = (0, (n_layers or 1) - 1) if n_layers else (min(layers, default=0), max(layers, default=0))
    ax.set_xlim(min(lo_x, min(layers, default=0)) - 0.6, max(hi_x, max(layers, default=0)) + 0.6)
    ax.set_ylim(-span - 1.2, span + 1.2)
    biggest = max((abs(float(e["exact"])) for e in edges), default=1.0) or 1.0
    for k, e in enumerate(edges):
        _arrow(ax, pos[str(e["sender"])], pos[str(e["receiver"])], e, k, biggest, FancyArrowPatch)
    for n, (x, y) in pos.items():
        ax.scatter([x], [y], s=900, c=ROLE_COLOURS.get(roles.get(n, "unlabelled"), "white"), edgecolors="black", zorder=2)
        ax.text(x, y, n, fontsize=7, ha="center", va="center", zorder=4)
    ax.set_yticks([])
    first, last = ax.get_xlim()
    ax.set_xticks(range(int(first + 0.6), int(last - 0.6) + 1, max(1, int(last - first) // 12)))
    ax.set_xlabel("layer")
    shown = set(roles.get(n, "unlabelled") for n in nodes)
    handles = [Line2D([], [], marker="o", ls="", ms=10, mfc=c, mec="black", label=r) for r, c in ROLE_COLOURS.items()
               if r in shown]
    handles += [Line2D([], [], color=SUPPORTS, lw=2, label="edge supports the gold answer"),
                Line2D([], [], color=OPPOSES, lw=2, label="edge opposes it"),
                Line2D([], [], color="grey", lw=2, ls="--", label="95% interval includes 0")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "verified edges: exact drop of the margin [paired 95% CI]", fontsize=9)
    return save_figure(fig, path)


__all__ = ["ROLE_COLOURS", "draw_circuit"]
