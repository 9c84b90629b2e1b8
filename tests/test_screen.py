"""The answer screen against a brute-force reference, and ``rank --screen`` on tiny models.

Reference: one whole forward of the shared tokens per example and head, the head's ``z`` zeroed at
the last shared position only, log-probabilities of each choice's first token after it."""

from __future__ import annotations

import json

import pytest
import torch
from test_attribution import EXAMPLES, LETTERS, llama

from ganda.attribution import rank_heads
from ganda.attribution.screen import _decision, answer_screen
from ganda.cli import main
from ganda.effects import mean_margin
from ganda.engine import Trace
from ganda.errors import GandaError
from ganda.interventions import head_mask, z_point
from ganda.scoring import encode_examples

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def brute_screen(adapter, examples, margin="mean") -> tuple[float, dict[str, float]]:
    """Per head: clean minus ablated first-token margin, the head zeroed at the last shared token only."""
    decided = [(_decision(p), ex) for (p, _, _), ex in zip(encode_examples(adapter, examples), examples, strict=True)]
    decided = [(d, ex) for d, ex in decided if d is not None]
    golds = [ex.gold for _, ex in decided]

    def firsts(edit):
        out = []
        for (ctx, first), _ in decided:
            with Trace(adapter, edit=edit):
                logits = adapter.forward(torch.tensor([ctx]))
            out.append(torch.log_softmax(logits[0, -1].float(), -1)[first].tolist())
        return out

    clean = mean_margin(firsts({}), golds, margin)
    effects = {}
    for h in adapter.heads():
        mixer = adapter.mixer_of(h)
        mask = head_mask(mixer, [h.head])

        def at_last(x, mask=mask):
            x = x.clone()
            x[:, -1] = x[:, -1] * mask.to(x.dtype)
            return x

        effects[str(h)] = clean - mean_margin(firsts({z_point(mixer): at_last}), golds, margin)
    return clean, effects


@pytest.mark.parametrize("examples", [LETTERS, EXAMPLES], ids=["one-token letters", "multi-token, mixed"])
def test_screen_equals_ablation_at_the_last_shared_token(examples):
    """Every head's screen effect is the brute-force one (rows of several heads, several layers,
    share one cached forward); the effects are not all zero, so the comparison carries weight."""
    ad = llama(layers=3, seed=1)
    clean, ref = brute_screen(ad, examples)
    sc = answer_screen(ad, examples, progress=False, rows=5)  # chunks that split layers and the intact row
    assert sc.clean == pytest.approx(clean, abs=1e-5)
    assert sc.by_head == pytest.approx(ref, abs=1e-4)
    assert max(abs(v) for v in ref.values()) > 1e-2
    assert sc.config["n"] + sc.config["left_out"] == len(examples)
    assert sc.config["left_out"] == (1 if examples is EXAMPLES else 0)  # the Winogrande-style example


def test_decision_extends_past_a_shared_answer_start():
    """Answers that share their first token (a space tokenised apart) are decided one token later."""
    ctx = [5, 6, 7]
    shared, first = _decision([(ctx, [1, 40, 41]), (ctx, [1, 42, 41]), (ctx, [1, 40, 43])])
    assert shared == [5, 6, 7, 1] and first == [40, 42, 40]
    assert _decision([(ctx, [9]), (ctx, [8])]) == (ctx, [9, 8])
    assert _decision([(ctx, [9]), ([5, 6], [8])]) is None


def test_rank_verifies_the_screens_top_heads(tmp_path):
    """``screen=K``: the K heads whose answer-position ablation hurts most are verified whatever their
    estimate rank, with the screen's effects in ranking.json; K = 0 verifies by estimate only."""
    ad = llama(layers=3, seed=1)
    sc = answer_screen(ad, LETTERS, progress=False)
    top = sorted(sc.by_head, key=lambda h: (-sc.by_head[h], h))[:3]
    res = rank_heads(ad, LETTERS, method="atp", verify_top=1, active=0, audit=0, screen=3, out_dir=tmp_path, progress=False)
    by_est = sorted(res.estimate, key=lambda h: (-abs(res.estimate[h]), h))
    assert set(res.verified) == {by_est[0], *top}
    assert res.screen == pytest.approx(sc.by_head, abs=1e-6) and res.config["screen"] == 3
    assert "screen_cpu" in res.seconds
    doc = json.loads((tmp_path / "ranking.json").read_text())
    assert doc["screen"] == pytest.approx(sc.by_head, abs=1e-6)
    plain = rank_heads(ad, LETTERS, method="atp", verify_top=1, active=0, audit=0, progress=False)
    assert plain.verified == [by_est[0]] and not plain.screen


def test_screen_refusals(capsys):
    ad = llama(layers=2, seed=0)
    with pytest.raises(GandaError, match="screen must be at least 0"):
        rank_heads(ad, LETTERS, method="atp", screen=-1, progress=False)
    with pytest.raises(GandaError, match="zero-ablation"):
        rank_heads(ad, LETTERS, method="atp", ablation="mean", screen=2, progress=False)
    with pytest.raises(GandaError, match="one shared context"):
        answer_screen(ad, EXAMPLES[3:], progress=False)
    assert main(["rank", "tiny-nonexistent", "--screen", "-2"]) == 2
    assert "--screen must be at least 0" in capsys.readouterr().err
