"""Integrated gradients (``method="ig"``) against exact ablations on tiny real-architecture models.

Checked: completeness (the scores of every head sum to the drop of the margin when every head is
ablated at once, zero- and mean-ablation, closer with more steps), one
ranked head's IG is its exact ablation effect in the limit, one step at α is dm/dα (attention and
SSM heads) and one step at α = 1 is AtP, a batch that
runs out of memory and a resumed journal give the same numbers, and ``ganda rank --method ig``.
"""

from __future__ import annotations

import json

import pytest
import torch
from checks import tiny_model
from test_attribution import EXAMPLES, LETTERS, CharTok, exact_drops, llama

import ganda
from ganda.attribution import attribute, ig_alphas, rank_heads
from ganda.cli import main
from ganda.effects import mean_margin
from ganda.engine import Trace
from ganda.interventions import AblateHeads, z_point
from ganda.scoring import score_examples
from ganda.tasks.base import Example

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread

SSM_EXAMPLES = [Example(prompt="abc defg hij kl x", choices=[" a", " bq", " c"], gold=1),
                Example(prompt="zzz yy q", choices=[" k", " l", " mm"], gold=2)]


def all_ablated_drop(adapter, examples, ablation="zero", means=None):
    """m(clean) − m(every head ablated at once), through the scoring path."""
    golds = [ex.gold for ex in examples]
    clean = mean_margin([s.loglik for s in score_examples(adapter, examples)], golds)
    iv = AblateHeads(adapter.heads()) if ablation == "zero" else AblateHeads(adapter.heads(), how="mean", means=means)
    with iv.apply(adapter):
        ablated = mean_margin([s.loglik for s in score_examples(adapter, examples)], golds)
    return clean - ablated


def test_midpoint_steps():
    assert ig_alphas(1) == [0.5]
    assert ig_alphas(4) == [0.125, 0.375, 0.625, 0.875]


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_completeness_every_head_sums_to_ablating_every_head(ablation):
    """Σ_h IG(h) is the midpoint rule's integral of dm/dα: the error shrinks like 1/k²."""
    ad = llama(layers=3)
    coarse = attribute(ad, LETTERS, method="ig", ablation=ablation, ig_steps=2, progress=False)
    fine = attribute(ad, LETTERS, method="ig", ablation=ablation, ig_steps=16, progress=False)
    want = all_ablated_drop(ad, LETTERS, ablation, fine.means)
    err_coarse, err_fine = abs(sum(coarse.estimate) - want), abs(sum(fine.estimate) - want)
    assert err_fine < 2e-3 * max(1.0, abs(want)) and err_fine < err_coarse / 8
    assert fine.ig == fine.estimate and fine.config["ig_steps"] == 16
    # the clean copy is the intact model: its log-likelihoods and AtP are method "atp"'s
    atp = attribute(ad, LETTERS, method="atp", ablation=ablation, progress=False)
    assert fine.clean == pytest.approx(atp.clean, abs=1e-6)
    assert fine.atp == pytest.approx(atp.atp, abs=1e-6)


def scaled_metric(adapter, examples, alpha):
    """The metric with every head's ``z`` scaled by ``alpha`` at every layer at once (IG's path)."""
    golds = [ex.gold for ex in examples]
    edits = {z_point(m): (lambda x: alpha * x) for m in adapter.mixers()}
    with Trace(adapter, edit=edits):
        return mean_margin([s.loglik for s in score_examples(adapter, examples)], golds)


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_one_step_is_the_derivative_along_the_path(family, monkeypatch):
    """The identity completeness rests on: at one step α, Σ_h of the heads' products is dm/dα
    (central difference in float64), for attention and SSM heads alike."""
    from ganda.attribution import engine

    if family == "llama":
        ad = llama(layers=3)
        exs = LETTERS
    else:
        ad, exs = ganda.from_model(tiny_model(family), CharTok(), spec=family), SSM_EXAMPLES
    ad.model.double()
    monkeypatch.setattr(engine, "ig_alphas", lambda steps: [0.3])
    att = attribute(ad, exs, method="ig", ig_steps=1, progress=False)
    eps = 3e-3  # log-probabilities are float32 (logprobs): a smaller step is noise, a larger one curvature
    slope = (scaled_metric(ad, exs, 0.3 + eps) - scaled_metric(ad, exs, 0.3 - eps)) / (2 * eps)
    assert sum(att.estimate) == pytest.approx(slope, rel=2e-3, abs=1e-5)


def test_one_ranked_head_is_its_exact_effect_in_the_limit():
    """Ranking a single head puts only that head on the path: IG is then its exact ablation effect,
    where AtP (one tangent at the clean point) is off."""
    ad = llama(layers=3)
    _, exact = exact_drops(ad, LETTERS)
    atp = attribute(ad, LETTERS, method="atp", progress=False).by_head()
    h = max(exact, key=lambda k: abs(exact[k]))
    one = ganda.HeadId.parse(h)
    ig = attribute(ad, LETTERS, method="ig", ig_steps=32, heads=[one], progress=False).by_head()[h]
    assert abs(ig - exact[h]) < 1e-3 * abs(exact[h]) + 1e-6
    assert abs(atp[h] - exact[h]) > 10 * abs(ig - exact[h])


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_one_step_at_alpha_one_is_atp(ablation, monkeypatch):
    from ganda.attribution import engine

    ad = llama(layers=3, seed=2)
    atp = attribute(ad, EXAMPLES, method="atp", ablation=ablation, progress=False)
    monkeypatch.setattr(engine, "ig_alphas", lambda steps: [1.0])
    ig = attribute(ad, EXAMPLES, method="ig", ablation=ablation, ig_steps=1, progress=False)
    assert ig.estimate == pytest.approx(atp.estimate, abs=1e-6, rel=1e-5)
    assert torch.allclose(ig.per_example_ig, atp.per_example, atol=1e-6)


def test_out_of_memory_halves_and_resume_give_the_same_numbers(tmp_path, monkeypatch):
    from ganda.attribution import engine

    ad = llama(layers=2, seed=5)
    whole = attribute(ad, EXAMPLES, method="ig", ig_steps=3, out_dir=tmp_path / "a", progress=False)
    again = attribute(ad, EXAMPLES, method="ig", ig_steps=3, out_dir=tmp_path / "a", progress=False)  # the journal's
    assert again.estimate == pytest.approx(whole.estimate, abs=1e-7) and again.atp == pytest.approx(whole.atp, abs=1e-7)
    real = engine.AttributionEngine.run

    def run(self, batch):
        if len(batch.items) > self.reps:  # more than one prompt's copies
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(self, batch)

    monkeypatch.setattr(engine.AttributionEngine, "run", run)
    split = attribute(ad, EXAMPLES, method="ig", ig_steps=3, progress=False)
    assert split.estimate == pytest.approx(whole.estimate, abs=1e-5)
    assert torch.allclose(split.per_example_ig, whole.per_example_ig, atol=1e-5)
    with pytest.raises(ganda.GandaError, match="holds a different attribution"):
        attribute(ad, EXAMPLES, method="ig", ig_steps=4, out_dir=tmp_path / "a", progress=False)


def test_rank_heads_with_ig_and_the_command_line(tiny_dir, tmp_path, capsys):
    ad = llama(layers=3, seed=1)
    res = rank_heads(ad, EXAMPLES, method="ig", ig_steps=4, verify_top=12, active=0, audit=0, progress=False)
    assert res.method == "ig" and res.config["ig_steps"] == 4 and len(res.exact) == 12
    rows = {r["head"]: r for r in res.rows()}
    assert all(r["atp"] is not None and r["sign_flip"] == (r["estimate"] * r["exact"] < 0) for r in rows.values())
    from ganda.experiments.builtin import Rank
    assert Rank().job_summary(res)["sign_flips"] == len(res.sign_flips())
    rc = main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "3", "--method", "ig",
               "--ig-steps", "2", "--verify-top", "3", "--active", "0", "--audit", "0", "--out", str(tmp_path / "rank"), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["method"] == "ig" and len(data["ranking"]) == 12 and isinstance(data["sign_flips"], list)
    saved = json.loads((tmp_path / "rank" / "ranking.json").read_text())["config"]
    assert saved["ig_steps"] == 2
    rc = main(["rank", str(tiny_dir), "--limit", "2", "--method", "ig", "--ig-steps", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--ig-steps" in err[0]
