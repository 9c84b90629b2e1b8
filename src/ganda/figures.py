"""Matplotlib figures (Agg backend, no display needed): attention panels, curves, heat maps, bars.

Every function writes one PNG to ``path`` and returns the path, so experiments can draw
themselves into a run directory and the HTML report can inline whatever PNGs it finds.

Colour conventions for attention maps: softmax maps (non-negative, rows sum to 1) use a
sequential colormap from 0; SSM implicit maps (signed, not normalised) use a diverging colormap
centred at 0 with a symmetric range, so the sign of every entry is visible. Either scale stops at
the largest entry outside the first key column (:func:`colour_limit`): a first-token attention
sink near 1 would otherwise turn every other entry dark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import runio

SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib  # heavy (~0.4 s): loaded when the first figure is drawn, not when ganda starts

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110, tight: bool = True) -> Path:
    """Write ``fig`` to ``path`` atomically, marked as ganda's (:func:`ganda.runio.written_by_ganda`),
    and close it: every figure ganda draws is saved here."""
    path = Path(path)
    try:
        fmt = path.suffix[1:].lower() or "png"  # named: matplotlib appends .png to a bare /dev/null
        mark = {"metadata": {"Software": runio.GENERATOR}} if fmt == "png" else {}  # runio.written_by_ganda
        with runio.atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format=fmt, **({"bbox_inches": "tight"} if tight else {}), **mark)
    finally:
        pyplot().close(fig)
    return path


def show_token(tok: str) -> str:
    """A token as a readable tick label (newlines, tabs and leading spaces made visible)."""
    tok = tok.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ")
    return tok.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "·") or "∅"


ROLE_TITLES = {"gather": "Gather", "aggregate": "Aggregate"}
MAX_TICK_LABELS = 64  # more tokens than this: every k-th token labelled, so labels stay >= 7 pt
MAX_COLS = 3  # panels side by side in a figure of several


def _tick_positions(t: int) -> list[int]:
    """Token positions that get a tick label: all of them, or every k-th (the last always)."""
    step = max(1, math.ceil(t / MAX_TICK_LABELS))
    ticks = list(range(0, t, step))
    return ticks if ticks[-1] == t - 1 else [*ticks, t - 1]


def colour_limit(m: np.ndarray, kind: str) -> float:
    """The colour scale's top: the largest entry (softmax) or largest ``|entry|`` (implicit)
    outside the first key column, which a first-token sink would otherwise saturate."""
    body = m[:, 1:] if m.shape[1] > 1 else m
    top = float(np.abs(body).max()) if body.size else 0.0
    if kind != "implicit":
        top = min(1.0, top)
    return top or 1.0


def _grid(n: int, rows: int, cols: int, figsize: tuple[float, float]) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels on a ``rows`` x ``cols`` grid: the grid's cells past the ``n``-th
    are removed, so no empty frame is drawn. Constrained layout keeps a suptitle clear of the
    panels' titles and leaves room for colour bars."""
    fig, axes = pyplot().subplots(rows, cols, figsize=figsize, squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        fig.delaxes(ax)
    return fig, list(axes.flat[:n])


def _attention_panel(fig: Any, ax: Any, m: Any, name: str, kind: str, labels: list[str], rows: list[int] | None,
                     ticks: list[int], bold: bool = False) -> None:
    """One head's map on ``ax``: keys and queries labelled with their tokens, the colour scale of
    :func:`colour_limit`, a clipped first-token sink marked on the colour bar."""
    t = len(labels)
    fs = 7.5 if len(ticks) > 40 else 8.5
    top = colour_limit(m, kind)
    if kind == "implicit":
        im = ax.imshow(m, cmap=DIVERGING, vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
    else:
        im = ax.imshow(m, cmap=SEQUENTIAL, vmin=0.0, vmax=top, aspect="auto", interpolation="nearest")
    row_ids = rows if rows is not None else list(range(m.shape[0]))
    xt = [i for i in ticks if i < m.shape[1]]
    ax.set_xticks(xt)
    ax.set_xticklabels([labels[i] for i in xt], rotation=90, fontsize=fs)
    yt = list(range(m.shape[0])) if m.shape[0] <= MAX_TICK_LABELS else _tick_positions(m.shape[0])
    ax.set_yticks(yt)
    ax.set_yticklabels([labels[row_ids[i]] if 0 <= row_ids[i] < t else str(row_ids[i]) for i in yt], fontsize=fs)
    ax.set_title(f"{name} ({kind})", fontsize=11, fontweight="bold" if bold else None)
    ax.set_xlabel("key (read from)", fontsize=9)
    ax.set_ylabel("query (reading)", fontsize=9)
    clipped = float(np.abs(m).max()) > top * 1.001
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, extend=("both" if kind == "implicit" else "max")
                      if clipped else "neither")
    if clipped:
        cb.set_label(f"scale excludes the first key column (up to {float(np.abs(m).max()):.2f})", fontsize=7)


def attention_panels(
    maps: Mapping[str, Any],
    tokens: Sequence[str],
    kinds: Mapping[str, str] | None = None,
    path: str | Path = "attention.png",
    *,
    rows: Sequence[int] | None = None,
    title: str | None = None,
    roles: Mapping[str, str] | None = None,
) -> Path:
    """One panel per head, in the order of ``maps``: keys (columns) and queries (rows) labelled
    with their tokens (every k-th token past :data:`MAX_TICK_LABELS`, so labels stay readable).

    ``maps`` is head name -> ``[R, T]`` matrix (``R == T`` or the rows listed in ``rows``);
    ``kinds`` is head name -> ``"softmax"`` or ``"implicit"`` (default softmax); ``roles`` is head
    name -> ``"gather"``/``"aggregate"``, named in the panel's title. The colour scale stops at the
    largest entry outside the first key column (:func:`colour_limit`); a first-token attention sink
    above it is drawn clipped, marked on the colour bar's arrow.
    """
    kinds = kinds or {}
    roles = roles or {}
    names = list(maps)
    if not names:
        raise ValueError("attention_panels: no maps given")
    n = len(names)
    nrows = math.ceil(n / MAX_COLS)
    cols = math.ceil(n / nrows)
    t = len(tokens)
    ticks = _tick_positions(t)
    side = max(4.0, min(11.0, 0.13 * len(ticks) + 2.0))
    fig, axes = _grid(n, nrows, cols, (side * cols, side * nrows * 0.92 + 0.5))
    labels = [show_token(x) for x in tokens]
    for ax, name in zip(axes, names, strict=True):
        role = ROLE_TITLES.get(str(roles.get(name, "")).lower(), "")
        _attention_panel(fig, ax, _np(maps[name]), f"{role + ': ' if role else ''}{name}", kinds.get(name, "softmax"),
                         labels, list(rows) if rows is not None else None, ticks, bold=bool(role))
    if title:
        fig.suptitle(title, fontsize=12)
    return save_figure(fig, path)


def curves(
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    path: str | Path,
    *,
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    xlabel: str = "",
    ylabel: str = "accuracy",
    title: str | None = None,
    hlines: Mapping[str, float] | None = None,
    vlines: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = (0.0, 1.0),
    integer_x: bool = False,
    point_labels: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """Line plot of several series over ``x`` with optional CI bands and reference lines.

    ``integer_x``: ticks only at whole numbers (``x`` counts something, such as heads);
    ``point_labels``: a series' points named, e.g. by the head each step adds ("" names none)."""
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for name, ys in series.items():
        yy = _floats(ys)
        (line,) = ax.plot(list(x), yy, marker="o", ms=3.5, label=name)
        if bands and name in bands:
            lo, hi = bands[name]
            ax.fill_between(list(x), list(lo), list(hi), color=line.get_color(), alpha=0.18, lw=0)
        for xv, yv, text in zip(x, yy, (point_labels or {}).get(name, ()), strict=False):
            if text and np.isfinite(yv):
                ax.annotate(text, (xv, yv), fontsize=7, xytext=(3, 4), textcoords="offset points")
    if integer_x:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for i, (name, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, ls="--", lw=1, color=f"C{7 + i % 3}", label=name)
    for i, (name, xv) in enumerate((vlines or {}).items()):
        ax.axvline(xv, ls=":", lw=1.2, color=f"C{3 + i % 3}", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


def heatmap(
    values: Any,
    path: str | Path,
    *,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    xlabel: str = "",
    ylabel: str = "",
    title: str | None = None,
    cmap: str | None = None,
    center: float | None = None,
    colorbar_label: str = "",
) -> Path:
    """A matrix as a heat map (e.g. layers x heads of accuracy drops). ``center`` makes it diverging;
    a map of at most 400 cells has its values written in."""
    m = _np(values)
    h, w = m.shape
    fig, ax = pyplot().subplots(figsize=(max(4.0, 0.45 * w + 2), max(3.0, 0.28 * h + 1.5)))
    if center is not None:
        span = float(np.nanmax(np.abs(m - center))) or 1.0
        im = ax.imshow(m, cmap=cmap or DIVERGING, vmin=center - span, vmax=center + span, aspect="auto")
    else:
        im = ax.imshow(m, cmap=cmap or SEQUENTIAL, aspect="auto")
    ax.set_xticks(range(w))
    ax.set_xticklabels(list(xlabels) if xlabels is not None else [str(i) for i in range(w)], fontsize=7)
    ax.set_yticks(range(h))
    ax.set_yticklabels(list(ylabels) if ylabels is not None else [str(i) for i in range(h)], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if h * w <= 400:
        for i in range(h):
            for j in range(w):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=5.5, color="w")
    cb = fig.colorbar(im, ax=ax)
    if colorbar_label:
        cb.set_label(colorbar_label)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _grouped_bars(
    ax: Any,
    n_groups: int,
    series: Mapping[str, Sequence[float | None]],
    errors: Mapping[str, tuple[Sequence[float | None], Sequence[float | None]]] | None,
    hlines: Mapping[str, float] | None,
) -> np.ndarray:
    """Draw one bar per series in each group (``errors``: (lo, hi) CI bounds) and dashed
    reference lines on ``ax``; returns the group positions."""
    k = max(1, len(series))
    width = 0.8 / k
    x = np.arange(n_groups)
    for i, (name, ys) in enumerate(series.items()):
        yy = _floats(ys)
        yerr = None
        if errors and name in errors:
            lo, hi = (_floats(v) for v in errors[name])
            yerr = np.vstack([np.clip(yy - lo, 0, None), np.clip(hi - yy, 0, None)])
        ax.bar(x + (i - (k - 1) / 2) * width, yy, width, label=name, yerr=yerr, capsize=2)
    for i, (name, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, ls="--", lw=1, color=f"C{7 + i % 3}", label=name)
    return x


def bars(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    path: str | Path,
    *,
    errors: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    ylabel: str = "accuracy",
    title: str | None = None,
    hlines: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = (0.0, 1.0),
    rotate: int = 0,
) -> Path:
    """Grouped bars: one group per label, one bar per series; ``errors`` are (lo, hi) CI bounds.
    The legend stands to the right of the axes, where it covers no bar."""
    k = max(1, len(series))
    fig, ax = pyplot().subplots(figsize=(max(5.0, 0.35 * len(labels) * k + 2) + 2.5, 4.2), layout="constrained")
    x = _grouped_bars(ax, len(labels), series, errors, hlines)
    ax.set_xticks(x)
    ax.set_xticklabels(list(labels), rotation=rotate, ha="right" if rotate else "center", fontsize=8)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # beside the bars
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def panels(
    specs: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Small grouped-bar panels side by side, one per spec (e.g. one per finding of the lab).

    A spec has ``title``, ``groups`` (x labels), ``series`` (name -> values, None for missing),
    and optionally ``errors`` (name -> (lo, hi)), ``hlines`` (name -> y), ``ylim`` ([lo, hi] or
    None for automatic), ``log`` (log y axis) and ``ylabel``."""
    n = max(1, len(specs))
    cols = min(MAX_COLS, n)
    rows = (n + cols - 1) // cols
    fig, axes = _grid(len(specs), rows, cols, (4.6 * cols, 3.6 * rows))
    for ax, spec in zip(axes, specs, strict=True):
        groups = list(spec["groups"])
        x = _grouped_bars(ax, len(groups), spec["series"], spec.get("errors"), spec.get("hlines"))
        ylim = spec.get("ylim", (0.0, 1.18))  # headroom above 1.0 for the legend
        if spec.get("log"):
            ax.set_yscale("log")
            if not ylim:  # the values, their intervals and the reference lines, with room for the legend
                vals = [v for ys in spec["series"].values() for v in _floats(ys) if np.isfinite(v) and v > 0]
                vals += [v for lo_hi in (spec.get("errors") or {}).values() for b in lo_hi for v in _floats(b)
                         if np.isfinite(v) and v > 0]
                vals += [v for v in (spec.get("hlines") or {}).values() if v and v > 0]
                if vals:
                    ylim = (min(vals) / 2, max(vals) * 6)
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_xticks(x)
        ax.set_xticklabels(groups, rotation=20 if max((len(g) for g in groups), default=0) > 8 else 0,
                           ha="right" if max((len(g) for g in groups), default=0) > 8 else "center", fontsize=7)
        ax.set_ylabel(spec.get("ylabel", "accuracy"), fontsize=8)
        ax.set_title(spec.get("title", ""), fontsize=8.5)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper right", ncol=3, framealpha=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
