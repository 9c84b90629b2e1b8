"""Figures read back as matplotlib objects (ticks, point names, legend entries), not as pixels: a
head count has whole-number ticks and its points name their heads, a difference of two accuracies
is said in points, and a legend lists only what the figure shows."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.figure
import pytest

from ganda.attribution.ranking import RankResult
from ganda.experiments.cumulative import curve_figure
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
    curve_figure(CURVE, base, 0.2, tmp_path / "ablation_curve.png", series="kv accuracy",
                 xlabel="heads ablated (cumulative, causal order)", title="How many heads must go")
    ticks, names = _ticks_and_names(drawn[-1])
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert names == ["L2H0", "L3H1", "L1H0"]


def test_the_roles_cumulative_curve_counts_heads_in_whole_numbers_and_names_its_points(drawn, tmp_path):
    res = RolesResult(model="m", config={"task": "lab-mmlu"}, summary={"baseline": 0.8, "baseline_ci_low": 0.6,
                      "baseline_ci_high": 0.9, "chance": 0.25}, extra={"cumulative": CURVE})
    res.draw(tmp_path)
    fig = next(f for f in drawn if f.axes[0].get_xlabel().startswith("heads ablated"))
    ticks, names = _ticks_and_names(fig)
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert names == ["L2H0", "L3H1", "L1H0"]
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]  # the curve's interval, from the intact model's
    assert band.min() == pytest.approx(0.15) and band.max() == pytest.approx(0.9)


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


def _renderer(fig):
    """``fig`` laid out and drawn on an Agg canvas (a closed figure keeps no canvas of its own)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def _shows_something(ax) -> bool:
    return bool(ax.images or ax.collections or ax.lines or ax.patches or ax.texts)


@pytest.mark.parametrize("n_heads", [4, 5])
def test_attention_panels_keep_the_suptitle_clear_of_the_panel_titles_and_draw_no_empty_panel(
        drawn, tmp_path, n_heads):
    import torch

    from ganda.figures import attention_panels

    t = 12
    m = torch.softmax(torch.randn(t, t), -1)
    maps = {f"L{i}H0": m for i in range(n_heads)}
    attention_panels(maps, [f"w{i}" for i in range(t)], {}, tmp_path / "ga_heads.png",
                     title="lab-llama-h1: the top causal heads", roles={"L0H0": "gather", "L1H0": "aggregate"})
    fig = drawn[-1]
    r = _renderer(fig)
    titled = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in titled][:2] == ["Gather: L0H0 (softmax)", "Aggregate: L1H0 (softmax)"]
    assert len(titled) == n_heads and all(_shows_something(ax) for ax in fig.axes)
    assert fig.get_suptitle() == "lab-llama-h1: the top causal heads"
    top = fig._suptitle.get_window_extent(r)
    assert not any(top.overlaps(ax.title.get_window_extent(r)) for ax in titled)
    assert top.y0 > max(ax.get_tightbbox(r).y1 for ax in fig.axes)  # above every panel, its labels included


def test_the_roles_bar_chart_legend_covers_no_bar(drawn, tmp_path):
    rows = [{"head": f"L{i}H0", "role": "gather" if i % 2 else "aggregate", "all": 0.95 - 0.1 * i,
             "query": 0.9, "context": 0.97, "control": 0.96} for i in range(6)]
    res = RolesResult(model="m", config={"task": "lab-mmlu", "control": "lab-knowledge"}, rows=rows,
                      summary={"baseline": 0.98, "chance": 0.25})
    res.draw(tmp_path)
    fig = next(f for f in drawn if f.axes[0].get_title().startswith("Where each head matters"))
    r = _renderer(fig)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "lab-mmlu intact", "chance", "lab-mmlu, ablated at all", "lab-mmlu, ablated at query",
        "lab-mmlu, ablated at context", "lab-knowledge, ablated at all"]
    box = legend.get_window_extent(r)
    assert len(ax.patches) == 4 * len(rows)
    assert not any(box.overlaps(bar.get_window_extent(r)) for bar in ax.patches)


def _roles(model: str, baseline: float, alls: list[float]):
    from ganda.experiments import ExperimentResult

    return ExperimentResult(kind="roles", model=model, summary={"baseline": baseline}, rows=[{"all": a} for a in alls])


@pytest.mark.parametrize("kv_models, legend", [
    (("lab-kv-llama", "lab-kv-mamba2"), ["lab-llama-h1 (KV: lab-kv-llama)", "lab-mamba2-9k (KV: lab-kv-mamba2)"]),
    (("lab-llama-h1", "lab-mamba2-9k"), ["lab-llama-h1", "lab-mamba2-9k"])])
def test_the_lab_report_panel_3_legend_names_the_models_its_bars_were_measured_on(drawn, tmp_path, kv_models, legend):
    from ganda.experiments import ExperimentResult
    from ganda_lab.programme import LabFindingsResult, findings_panels

    tkv, skv = kv_models
    kv = ExperimentResult(kind="kv_curve", model=tkv, summary={"pairs": [2, 8], "at_max_pairs": {tkv: 0.9, skv: 0.4}})
    st = {"models": {"transformer": {"model": "stale-t"}, "ssm": {"model": "stale-s"}}, "kv": kv,
          "roles_transformer": _roles("lab-llama-h1", 0.95, [0.3, 0.6]), "roles_ssm": _roles("lab-mamba2-9k", 0.9, [0.7])}
    LabFindingsResult(extra={"panels": findings_panels(st, [])}).draw(tmp_path)
    (ax,) = [ax for ax in drawn[-1].axes if ax.get_title().startswith("3.")]
    assert [t.get_text() for t in ax.get_legend().get_texts()][-2:] == legend
    assert [t.get_text() for t in ax.get_xticklabels()] == ["intact", "best head ablated", "KV 8 pairs"]


def test_the_lab_report_names_models_given_as_paths_by_their_directory(drawn, tmp_path):
    """Models trained into long directories are named by the directory alone: a whole path in a
    legend squeezes panel 3's axes to nothing (matplotlib's constrained-layout warning)."""
    import warnings

    from ganda.experiments import ExperimentResult
    from ganda_lab.programme import LabFindingsResult, findings_panels

    work = "/tmp/a/rather/long/directory/of/one/user/training/lab/work"
    kv = ExperimentResult(kind="kv_curve", model=f"{work}/kv_transformer",
                          summary={"pairs": [2, 8], "at_max_pairs": {f"{work}/kv_transformer": 0.9, f"{work}/kv_ssm": 0.4}})
    st = {"models": {}, "kv": kv, "roles_transformer": _roles(f"{work}/transformer", 0.95, [0.3, 0.6]),
          "roles_ssm": _roles(f"{work}/ssm", 0.9, [0.7])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collapsed layout is an error here
        LabFindingsResult(extra={"panels": findings_panels(st, [])}).draw(tmp_path)
    (ax,) = [ax for ax in drawn[-1].axes if ax.get_title().startswith("3.")]
    assert [t.get_text() for t in ax.get_legend().get_texts()][-2:] == ["transformer (KV: kv_transformer)",
                                                                        "ssm (KV: kv_ssm)"]


def test_the_verify_heat_map_shows_the_exact_effect_of_every_verified_head_by_layer_and_head(drawn, tmp_path):
    from ganda.attribution.ranking import RankResult

    rank = _ranking(["L1H0"])
    rank.verify_heatmap(tmp_path / "verify_heatmap.png")
    ax = drawn[-1].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["L0", "L1"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["H0", "H1"]
    assert sorted(t.get_text() for t in ax.texts) == ["-0.18", "0.12", "0.45"]  # L1H1 was not verified: blank
    assert ax.get_title() == "Exact effect of the 3 verified heads of 4 (blank: not verified)"
    again = RankResult.from_json({**rank.to_json(), "config": rank.config})
    assert (again.exact, again.verified, again.audited) == (rank.exact, ["L0H0", "L0H1"], ["L1H0"])
