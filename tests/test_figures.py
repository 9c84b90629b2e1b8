"""Figures read back as matplotlib objects (ticks, point names, legend entries), not as pixels: a
head count has whole-number ticks and its points name their heads, a difference of two accuracies
is said in points, and a legend lists only what the figure shows."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.figure
import pytest

from ganda.attribution.ranking import RankResult
from ganda.demo import _curve_png
from ganda.experiments.kv_curve import KVCurveResult
from ganda.experiments.roles import RolesResult

CURVE = [{"n_heads": 1, "added": "L2H0", "accuracy": 0.6, "ci_low": 0.4, "ci_high": 0.8},
         {"n_heads": 2, "added": "L3H1", "accuracy": 0.45, "ci_low": 0.3, "ci_high": 0.6},
         {"n_heads": 3, "added": "L1H0", "accuracy": 0.3, "ci_low": 0.15, "ci_high": 0.45}]


@pytest.fixture
def drawn(monkeypatch):
    """Every figure ganda saves, kept for reading back after it is written and closed."""
    figures = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


def _ticks_and_names(fig) -> tuple[list[float], list[str]]:
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = sorted(ax.get_xlim())
    return [t for t in ax.get_xticks() if lo <= t <= hi], [t.get_text() for t in ax.texts]


def test_the_demo_ablation_curve_counts_heads_in_whole_numbers_and_names_its_points(drawn, tmp_path):
    base = SimpleNamespace(accuracy=0.8, ci_low=0.6, ci_high=0.9)
    _curve_png(CURVE, base, 0.2, tmp_path / "ablation_curve.png")
    ticks, names = _ticks_and_names(drawn[-1])
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert names == ["L2H0", "L3H1", "L1H0"]


def test_the_roles_cumulative_curve_counts_heads_in_whole_numbers_and_names_its_points(drawn, tmp_path):
    res = RolesResult(model="m", config={"task": "lab-mmlu"}, summary={"baseline": 0.8, "chance": 0.25},
                      extra={"cumulative": CURVE})
    res.draw(tmp_path)
    fig = next(f for f in drawn if f.axes[0].get_xlabel().startswith("heads ablated"))
    ticks, names = _ticks_and_names(fig)
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert names == ["L2H0", "L3H1", "L1H0"]


def test_the_kv_curve_headline_says_points_for_a_difference_of_accuracies():
    res = KVCurveResult(model="m", summary={"mean_gap": 0.125, "fall": {"m": 0.3}, "at_max_pairs": {"m": 0.4}})
    lines = res.headline().splitlines()
    assert lines == ["Mean accuracy lost by ablating the heads: **12.5 points**.",
                     "m: loses **30.0 points** from the fewest to the most pairs (at the most: 40.0%)."]


def _ranking(audited: list[str]) -> RankResult:
    heads = ["L0H0", "L0H1", "L1H0", "L1H1"]
    est = {"L0H0": 0.5, "L0H1": 0.1, "L1H0": -0.2, "L1H1": 0.05}
    exact = {"L0H0": 0.45, "L0H1": 0.12, **{h: est[h] * 0.9 for h in audited}}
    return RankResult(method="atp*", ablation="zero", margin="mean", heads=heads, estimate=est, exact=exact,
                      verified=["L0H0", "L0H1"], audited=audited, clean=1.0, bound=None,
                      config={"model": "m", "task": "kv", "n": 4})


@pytest.mark.parametrize("audited, legend", [([], ["top by estimate"]),
                                             (["L1H0"], ["top by estimate", "random audit"])])
def test_the_attribution_scatter_legend_lists_only_the_groups_it_shows(drawn, tmp_path, audited, legend):
    _ranking(audited).scatter(tmp_path / "scatter.png")
    assert [t.get_text() for t in drawn[-1].axes[0].get_legend().get_texts()] == legend
