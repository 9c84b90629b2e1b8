"""The demo's finding: role labels from the shared labeller, the paragraph's words and numbers, and
the ``demo`` result kind that makes ``ganda report`` open with that paragraph."""

from __future__ import annotations

import json
import re

import pytest

from ganda import registry
from ganda.demo import DemoResult, finding, roles
from ganda.patterns import HeadScore
from ganda.report.html import write_report


def _score(head: str, aggregate: float, gather: float) -> HeadScore:
    return HeadScore(head=head, layer=int(head[1:].split("H")[0]), kind="attn", aggregate=aggregate,
                     aggregate_segment=0.0, gather=gather, aggregate_peak=1.0, aggregate_hit=0.0, gather_contrast=1.0)


SUMMARY = {
    "model": "smollm2-135m", "pairs": 5, "n_measure": 40, "n_rank": 16, "n_heads": 270, "verified": 24,
    "baseline_accuracy": 0.525, "baseline_ci_low": 0.373, "baseline_ci_high": 0.673, "chance": 0.2,
    "top_heads": [{"head": "L19H1", "role": "neither"}, {"head": "L16H2", "role": "gather"}],
    "roles_in_top": {"gather": 3, "aggregate": 2, "neither": 5},
    "gather_head": "L16H2", "gather_accuracy": 0.475, "gather_ci_low": 0.33, "gather_ci_high": 0.63,
    "gather_drop": 0.05,
    "gather_drop_ci_low": 0.0, "gather_drop_ci_high": 0.125,
    "top_head": "L19H1", "top_accuracy": 0.45, "top_ci_low": 0.31, "top_ci_high": 0.6, "top_drop": 0.075,
    "top_drop_ci_low": 0.0, "top_drop_ci_high": 0.175, "max_aggregate": 0.036, "max_aggregate_head": "L15H6",
    "aggregate_head": "L17H0", "aggregate_accuracy": 0.55, "aggregate_ci_low": 0.4, "aggregate_ci_high": 0.69,
    "aggregate_drop": -0.025,
    "aggregate_drop_ci_low": -0.075, "aggregate_drop_ci_high": 0.0,
    "both_accuracy": 0.475, "both_ci_low": 0.33, "both_ci_high": 0.63, "both_drop": 0.05, "both_drop_ci_low": -0.05,
    "both_drop_ci_high": 0.15,
    "together": "L19H1,L16H2,L17H0",
    "heads_to_chance": 4, "chance_accuracy": 0.225, "chance_ci_low": 0.123, "chance_ci_high": 0.375,
}


def test_roles_are_the_shared_labellers():
    """The demo names a head Gather or Aggregate by its label (ganda.labels), nothing else."""
    scores = [_score("L0H0", 0.2, 0.1), _score("L1H0", 0.0, 0.9), _score("L2H0", 0.0, 0.0), _score("L3H0", 0.0, 0.0)]
    for s, label in zip(scores, ("Aggregate+sink", "Gather", "induction+sink", None), strict=True):
        s.label = label
    assert roles(scores) == {"L0H0": "aggregate", "L1H0": "gather", "L2H0": "neither", "L3H0": "neither"}


def _profile(head: str, drop_all: float, final: float, ends: float, elsewhere: float) -> list[dict]:
    rows = [{"heads": head, "ablation": "zero", "positions": "all", "drop": drop_all},
            {"heads": head, "ablation": "mean", "positions": "all", "drop": drop_all}]
    return rows + [{"heads": head, "ablation": "zero", "positions": c, "drop": d}
                   for c, d in (("ends", ends), ("key", 0.0), ("final", final), ("elsewhere", elsewhere))]


def test_the_demo_labels_its_profiled_heads_with_where_they_act():
    """Both G&A patterns qualify for L1H0 and L2H0; where each head's ablation hurts (its profile:
    the final position, or a class before it) keeps one, by the labeller's own rule: the demo's
    labels and roles are label_heads' with the same evidence."""
    from ganda.demo import _label_where
    from ganda.labels import label_heads

    std = {h: {"induction": 0.0, "previous_token": 0.0, "sink": 0.1} for h in ("L1H0", "L2H0")}
    profiles = _profile("L1H0", 0.3, 0.25, 0.0, 0.05) + _profile("L2H0", 0.3, 0.0, 0.2, 0.1)
    scores = [_score("L1H0", 0.06, 0.9), _score("L2H0", 0.06, 0.9)]
    role = {}
    _label_where(None, scores, profiles, std, role)
    assert {s.head: s.label for s in scores} == {"L1H0": "Aggregate", "L2H0": "Gather"}
    assert role == roles(scores) == {"L1H0": "aggregate", "L2H0": "gather"}
    evidence = {"L1H0": {"drop_all": 0.3, "drop_query": 0.25, "drop_context": 0.05},
                "L2H0": {"drop_all": 0.3, "drop_query": 0.0, "drop_context": 0.2}}
    fresh = [_score("L1H0", 0.06, 0.9), _score("L2H0", 0.06, 0.9)]
    assert {h: lab.label for h, lab in label_heads(fresh, std, evidence).items()} == {s.head: s.label for s in scores}
    assert "the ablation hurts at the final position" in scores[0].label_reason


def test_finding_states_heads_costs_intervals_and_heads_to_chance():
    text = finding(SUMMARY)
    assert "**53%** [37%, 67%] of 40 prompts (chance 20%)" in text
    assert "**L19H1** (no G&A pattern), **L16H2** (Gather)" in text
    assert "24 of them verified by exact ablation, on 16 other prompts" in text
    assert "Of the heads that matter most (10), 3 show the Gather pattern, 2 the Aggregate pattern and 5 neither" in text
    assert "Ablating the Gather head **L16H2** leaves 48% [33%, 63%]: it costs **5 points** [0, 13]" in text
    assert "the Aggregate head **L17H0** leaves 55% [40%, 69%]: accuracy rises by 2 points (drop [-7, 0])" in text
    assert "Ablating the top causal head **L19H1** leaves 45% [31%, 60%]: it costs **8 points** [0, 18]" in text
    assert "Ablating L19H1, L16H2, L17H0 together leaves 48%" in text and "No head shows" not in text
    assert "reaches chance after **4 heads** (23% [12%, 38%])" in text
    no_agg = {k: v for k, v in SUMMARY.items() if not k.startswith("aggregate")}
    assert "No head shows the Aggregate pattern (the largest aggregate score of all heads is 0.036, L15H6)" in finding(
        {**no_agg, "aggregate_head": None})
    no_chance = {**SUMMARY, "heads_to_chance": None, "curve_heads": 8, "curve_accuracy": 0.4, "curve_ci_low": 0.3,
                 "curve_ci_high": 0.5}
    assert "the top 8 heads in causal order leaves 40% [30%, 50%], still above chance" in finding(no_chance)
    assert finding({}) == ""


def test_finding_lists_heads_whose_ablation_helps_apart_from_the_heads_that_matter():
    helped = {**SUMMARY, "helpful_when_ablated": [{"head": "L3H1", "role": "neither", "exact": -0.4}]}
    text = finding(helped)
    matter = re.search(r"the heads that matter most \(.*?\) are (.*?)\.", text).group(1)
    assert "L3H1" not in matter and "L19H1" in matter
    assert "Ablating **L3H1** raises the margin instead: helpful when ablated" in text
    assert "helpful when ablated" not in finding(SUMMARY)


@pytest.mark.parametrize("base, acc", [(0.525, 0.445), (0.525, 0.45), (0.625, 0.555), (0.285, 0.215), (0.5, 0.505)])
def test_the_points_a_head_costs_are_the_difference_of_the_percentages_shown(base, acc):
    """Each number is rounded once, by one rule, and the drop is computed from the rounded ones: the
    sentence's arithmetic holds (0.525 and 0.45 read 53% and 45%, a cost of 8 points, not 52%, 45%, 8)."""
    text = finding({**SUMMARY, "top_accuracy": acc, "top_drop": base - acc, "baseline_accuracy": base})
    shown = int(re.search(r"on \*\*(\d+)%\*\*", text).group(1))
    top = re.search(r"\*\*L19H1\*\* leaves (\d+)% \[[^]]*\]: (?:it costs \*\*(\d+) points?|accuracy rises by (\d+) "
                    r"points?)", text)
    left, cost = int(top.group(1)), int(top.group(2)) if top.group(2) else -int(top.group(3))
    assert shown - left == cost, text
    assert abs(shown - 100 * base) <= 0.5 + 1e-9 and abs(left - 100 * acc) <= 0.5 + 1e-9


def test_demo_kind_is_registered_and_the_report_opens_with_the_finding(tmp_path):
    assert registry.result_class("demo") is DemoResult
    res = DemoResult(kind="demo", model="smollm2-135m", summary={**SUMMARY, "finding": finding(SUMMARY)})
    (tmp_path / "result.json").write_text(json.dumps(res.to_json()))
    page = write_report([tmp_path], tmp_path / "report.html").read_text()
    assert 'class="headline"' in page and "<b>L16H2</b>" in page and "reaches chance after <b>4 heads</b>" in page
    # a result saved without the paragraph gets it rebuilt from its numbers
    bare = DemoResult.from_json({"kind": "demo", "model": "m", "summary": SUMMARY})
    assert bare.headline() == finding(SUMMARY)


@pytest.mark.integration
def test_ganda_report_renders_a_saved_demo_with_its_finding(tmp_path):
    """``ganda report`` on a demo run directory, in a fresh process that never imported ganda.demo:
    the kind is registered where the built-in kinds are."""
    import subprocess
    import sys

    res = DemoResult(kind="demo", model="smollm2-135m", summary={**SUMMARY, "finding": finding(SUMMARY)})
    (tmp_path / "result.json").write_text(json.dumps(res.to_json()))
    r = subprocess.run([sys.executable, "-m", "ganda", "report", str(tmp_path), "-o", str(tmp_path / "r.html"), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'class="headline"' in page and "reaches chance after <b>4 heads</b>" in page


def _set(k: int, top: str, gather: str | None, together: tuple[float, float]) -> dict:
    return {"set": k, "seeds": {"pattern": 3 * (k - 1), "rank": 3 * (k - 1) + 1, "measure": 3 * (k - 1) + 2},
            "top_head": top, "gather_head": gather, "aggregate_head": "L17H0", "baseline_accuracy": 0.5,
            "conditions": {"together": {"heads": "x", "drop": sum(together) / 2, "drop_ci_low": together[0],
                                         "drop_ci_high": together[1]}}}


def test_a_further_prompt_set_holds_with_the_same_heads_and_every_established_cost():
    from ganda.demo import _holds

    first = _set(1, "L19H1", "L16H2", (0.05, 0.3))
    assert _holds(first, _set(2, "L19H1", "L16H2", (0.02, 0.2))) == {"holds": True, "why_not": []}
    other = _holds(first, _set(3, "L19H1", "L15H5", (-0.05, 0.1)))
    assert other == {"holds": False, "why_not": ["gather head L15H5 (not L16H2)",
                                                  "together ablation cost not established (+2 points [-5, 10])"]}
    # the top head labelled Gather on another set: its cost is found under its role, not "not established";
    # the pair ablation was not run there (one head), which is said as such (Gemma-3-270M's sets 2 and 3)
    top_first = {**first, "conditions": {**first["conditions"], "top": {"heads": "L19H1", "drop": 0.4,
                                                                          "drop_ci_low": 0.25, "drop_ci_high": 0.6}}}
    as_gather = {**_set(2, "L19H1", "L19H1", (0.0, 0.0)),
                 "conditions": {"gather": {"heads": "L19H1", "drop": 0.4, "drop_ci_low": 0.22, "drop_ci_high": 0.57}}}
    assert _holds(top_first, as_gather) == {"holds": False, "why_not": ["gather head L19H1 (not L16H2)",
                                                                         "together ablation not run there"]}
    weak = {**as_gather, "conditions": {"gather": {"heads": "L19H1", "drop": 0.05, "drop_ci_low": -0.05,
                                                   "drop_ci_high": 0.15}}}
    assert "top ablation cost not established (+5 points [-5, 15])" in _holds(top_first, weak)["why_not"]
    # a cost that was not established on the first set is not asked of the others
    assert _holds(_set(1, "L19H1", "L16H2", (0.0, 0.3)), _set(2, "L19H1", "L16H2", (-0.1, 0.1)))["holds"]
    sets = [first, {**_set(2, "L19H1", "L16H2", (0.02, 0.2)), "holds": True, "why_not": []},
            {**_set(3, "L19H1", "L15H5", (-0.05, 0.1)), **other}]
    text = finding({**SUMMARY, "prompt_sets": sets, "holds_on": 1})
    assert text.endswith("Stated on prompt set 1 (seeds 0-2), the finding holds on **1 of 2** further prompt sets: "
                         "set 2 (seeds 3-5): holds; set 3 (seeds 6-8): gather head L15H5 (not L16H2), together "
                         "ablation cost not established (+2 points [-5, 10]). Pooled over the 3 sets (each with "
                         "the heads it picks), ablating the top and Gather heads together costs 10 points [-8, 29] "
                         "(an interval that includes the between-set variation).")
    # drops 17.5, 11 and 2.5 points: mean 10.3; their spread (sd 7.5) exceeds the sets' own errors, so
    # the half-width is t(0.975, 2 df) = 4.30 times sd / sqrt(3) = 4.34 points: 18.7
    assert "prompt set" not in finding(SUMMARY)


@pytest.mark.slow  # a whole demo run (the slow tier holds the demo's runs)
def test_demo_reports_each_prompt_set_and_how_many_repeat_the_finding(tiny_dir, tmp_path):
    """The tiny random Llama on KV (3 pairs) retrieves a little above chance (40% of 20 prompts against
    33%; a model at chance is refused, row ``demo-intact-at-chance`` of tests/test_cli_bad_inputs.py):
    its top causal head (the verified head whose ablation lowers the margin most) is L0H0 on the first
    two sets and L1H1 on the third, and the finding says so (set 2 differs by its Gather label). L1H0,
    whose ablation raises the margin most on the first set, is no top head."""
    import torch

    from ganda.demo import _condition_of, _holds, run_demo

    torch.set_num_threads(1)
    run_demo(str(tiny_dir), tmp_path, pairs=3, n=4, verify_n=20, rank_n=8, prompt_sets=3)
    saved = json.loads((tmp_path / "result.json").read_text())
    s, sets = saved["summary"], saved["summary"]["prompt_sets"]
    assert saved["config"]["prompt_sets"] == 3 and s["baseline_accuracy"] == pytest.approx(0.4)
    assert [list(r["seeds"].values()) for r in sets] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert sets[0]["top_head"] == s["top_head"] == "L0H0" and sets[0]["conditions"]["top"]["drop"] == s["top_drop"]
    assert [r["top_head"] for r in sets] == ["L0H0", "L0H0", "L1H1"]
    tops = [h["exact"] for h in s["top_heads"]]
    assert s["top_heads"][0]["head"] == "L0H0" and tops == sorted(tops, reverse=True) and min(tops) > 0
    assert s["helpful_when_ablated"][0]["head"] == "L1H0" and all(h["exact"] < 0 for h in s["helpful_when_ablated"])
    for r in sets[1:]:
        assert {k: r[k] for k in ("holds", "why_not")} == _holds(sets[0], r)
    # set 2 keeps the top head but the labeller names a Gather head there (L0H0) where set 1 names none
    assert s["holds_on"] == 0 and sets[1]["why_not"] == ["gather head L0H0 (not none)"]
    assert sets[2]["why_not"] == ["top head L1H1 (not L0H0)"]
    assert "the finding holds on **0 of 2** further prompt sets: set 2 (seeds 3-5): gather head L0H0 (not none); " \
           "set 3 (seeds 6-8): top head L1H1" in s["finding"]
    rows = (tmp_path / "prompt_sets.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("set,seed_pattern,seed_rank,seed_measure,top_head")
    pooled = s["pooled"]["top"]  # the top head as each set picks it
    assert rows[-1].startswith("pooled over 3,") and pooled["k"] == 3
    tops = [_condition_of(r, "top")["drop"] for r in sets]  # set 2 files its top head under "gather"
    assert "top" not in sets[1]["conditions"] and tops[1] == sets[1]["conditions"]["gather"]["drop"]
    assert pooled["estimate"] == pytest.approx(sum(tops) / 3, abs=1e-6)  # 6 digits
    assert pooled["ci_low"] <= min(tops)
    # the top head profiled (ganda.acts): zero, mean, resample, then zero at each position class
    prof = [r for r in saved["head_profiles"] if r["heads"] == "L0H0"]
    assert [(r["ablation"], r["positions"]) for r in prof] == [
        ("zero", "all"), ("mean", "all"), ("resample", "all"),
        ("zero", "ends"), ("zero", "key"), ("zero", "final"), ("zero", "elsewhere")]
    assert prof[0]["drop"] == pytest.approx(s["top_drop"])  # the same ablation as the finding's, same prompts
    assert prof[1]["drop"] != prof[0]["drop"] or prof[1]["margin_drop"] != prof[0]["margin_drop"]
    assert s["survives"]["L0H0"].startswith("L0H0's")  # the zero-ablation effect under mean ablation, in words
    assert s["survives"]["L0H0"] in s["finding"] and s["acts_at"]["L0H0"] in s["finding"]
    assert (tmp_path / "ablation_kinds.csv").read_text().splitlines()[0].startswith("heads,ablation,positions")
    assert saved["config"]["ablation"] == "zero"


@pytest.mark.slow  # a whole demo run (the slow tier holds the demo's runs)
def test_demo_under_mean_ablation_ranks_and_ablates_by_mean(tiny_dir, tmp_path):
    import torch

    from ganda.demo import run_demo

    torch.set_num_threads(1)
    run_demo(str(tiny_dir), tmp_path, pairs=3, n=4, verify_n=20, rank_n=8, prompt_sets=1, ablation="mean",
             profile=False, max_heads=2)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["config"]["ablation"] == saved["config"]["rank_ablation"] == "mean"
    assert json.loads((tmp_path / "ranking" / "ranking.json").read_text())["ablation"] == "mean"
    assert "Every ablation here is mean-ablation" in saved["summary"]["finding"]


def test_ganda_demo_is_generated_from_its_options(tmp_path, capsys, monkeypatch):
    """``ganda demo`` is the registered experiment ``demo``'s generated command: its --help lists
    every shown DemoOptions field's flag with its help and default, beside the run's inputs, and a
    bad value is one line and exit 2 before anything is written (Python callers get the same check)."""
    from ganda.cli import main
    from ganda.demo import Demo, DemoOptions, run_demo
    from ganda.errors import GandaError

    assert registry.experiment("demo") is Demo and "demo" in registry.command_experiments()
    assert main(["demo", "--help"]) == 0
    page = " ".join(capsys.readouterr().out.split())
    for f in DemoOptions.fields():
        shown = DemoOptions.cli_flag(f.name) in page
        assert shown != f.metadata["hidden"], f.name
        if shown:
            assert " ".join(f.metadata["help"].split())[:40] in page, f.name
    assert "--no-profile" in page and "--verify-n <int> prompts for the accuracy measurements [default: 40]" in page
    assert "-n, --limit <int> prompts for the pattern scores [default: 8]" in page and "lm-eval" not in page
    for flag in ("-o, --out", "(default: runs/demo)", "--seed", "--allow-pickle", "-q, --quiet", "[default: smollm2-135m]"):
        assert flag in page, flag
    assert "--json" not in page and "--html" not in page and "--task" not in page

    monkeypatch.chdir(tmp_path)
    for argv, line in ((["--top", "0"], "--top must be at least 1, got 0"),
                       (["--ablation", "half"], "--ablation must be one of zero, mean, resample, not 'half'"),
                       (["--prompt-sets", "101"], "--prompt-sets must be at most 100 (each one repeats the whole "
                                                  "measurement), got 101")):
        assert main(["demo", "lab-llama-h1", *argv, "--out", "out"]) == 2
        out, err = capsys.readouterr()
        assert (out, err) == ("", f"ganda: error: {line}\n")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(GandaError, match="^top must be at least 1, got 0$"):
        run_demo("lab-llama-h1", tmp_path / "py", top=0)
    assert DemoOptions.build({}).profile is True and DemoOptions.build({"profile": False}).profile is False
    with pytest.raises(GandaError, match="unknown option 'verify_top'"):  # the ranking's recipe is no option
        DemoOptions.build({"verify_top": 3})
    assert not (tmp_path / "py").exists()
