"""Zero, mean and resample ablation (:mod:`ganda.ablation`) and position-class ablation
(:mod:`ganda.sites`): each checked against a computation done by hand through hooks, the sweep
against eval under mean ablation, and every command's ``--ablation`` recorded in its result."""

from __future__ import annotations

import json

import pytest
import torch

from ganda.ablation import reference_donors, reference_means
from ganda.engine import Trace
from ganda.errors import GandaError
from ganda.heads import HeadId
from ganda.interventions import AblateHeads, apply, z_point
from ganda.scoring import encode_examples, evaluate_examples, prompt_sites, score_examples
from ganda.sites import CLASSES, row_classes
from ganda.sweep import run_sweep
from ganda.tasks import get_task

pytestmark = pytest.mark.usefixtures("one_thread")

HEAD = "L1H2"


@pytest.fixture(scope="module")
def kv():
    return get_task("kv", pairs=3).examples(limit=6, seed=0)


def _ctx(adapter, ex) -> list[int]:
    return list(encode_examples(adapter, [ex])[0][0][0][0])


def _lls(res) -> list[list[float]]:
    return [p["loglik"] for p in res.predictions]


def _hand_mean(adapter, examples, head: str) -> torch.Tensor:
    """The mean of the mixer's output-projection input over every context token, each prompt alone."""
    point = z_point(adapter.mixer_of(adapter.canonical(HeadId.parse(head))))
    total, count = 0.0, 0
    for ex in examples:
        with Trace(adapter, [point]) as tr:
            adapter.forward(torch.tensor([_ctx(adapter, ex)]))
        total = total + tr[point][0].float().sum(0)
        count += tr[point].shape[1]
    return total / count


def test_mean_ablation_equals_the_mean_computed_by_hand(tiny, kv):
    mixer = tiny.mixer_of(HeadId.parse(HEAD))
    sl = mixer.head_slice(2)
    mu = _hand_mean(tiny, kv, HEAD)

    def put_mean(x):
        x = x.clone()
        x[..., sl] = mu[sl].to(x.dtype)
        return x

    with Trace(tiny, edit={z_point(mixer): put_mean}):
        hand = evaluate_examples(tiny, kv, progress=False)
    mine = evaluate_examples(tiny, kv, [AblateHeads([HEAD], how="mean", reference=kv)], progress=False)
    for a, b in zip(_lls(mine), _lls(hand), strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    # the library's means are that mean (batched, padded forwards: float rounding only)
    got = reference_means(tiny, kv, [mixer])[(mixer.layer, mixer.kind)]
    assert torch.allclose(got, mu, atol=1e-6)
    # a reference given as precomputed means, or bound to the scored prompts, is the same ablation
    same = evaluate_examples(tiny, kv, [AblateHeads([HEAD], how="mean")], progress=False)
    assert _lls(same) == _lls(mine)
    zero = evaluate_examples(tiny, kv, [AblateHeads([HEAD])], progress=False)
    intact = evaluate_examples(tiny, kv, progress=False)
    assert _lls(mine) != _lls(zero) and _lls(mine) != _lls(intact)
    assert mine.interventions == [{"type": "ablate_heads", "heads": HEAD, "ablation": "mean"}]


def test_resample_takes_another_prompts_slice_aligned_from_the_end(tiny, kv):
    mixer = tiny.mixer_of(HeadId.parse(HEAD))
    point, sl = z_point(mixer), mixer.head_slice(2)
    donors = reference_donors(tiny, kv, [mixer], seed=0)
    picks = [donors.pick(tuple(_ctx(tiny, ex))) for ex in kv]
    assert all(j != i for i, j in enumerate(picks))  # never the prompt itself
    assert len(set(picks)) > 1  # a draw, not one fixed donor
    iv = AblateHeads([HEAD], how="resample", reference=kv, seed=0)
    ex = kv[0]
    with apply(tiny, [iv]), Trace(tiny, [point]) as tr:
        score_examples(tiny, [ex])
    with Trace(tiny, [point]) as clean:
        score_examples(tiny, [ex], prefix_cache=False)
    got, intact = tr[point], clean[point]
    z_d = donors.z[point][picks[0]]
    q, qd = len(_ctx(tiny, ex)) - 1, z_d.shape[0] - 1
    for row in range(got.shape[0]):
        for t in range(q + 1):
            assert torch.equal(got[row, t, sl], z_d[max(0, t - q + qd), sl])
        assert torch.equal(got[row, : q + 1, : sl.start], intact[row, : q + 1, : sl.start])  # other heads untouched
    assert iv.describe() == {"type": "ablate_heads", "heads": HEAD, "ablation": "resample", "seed": 0}
    with pytest.raises(GandaError, match="a reference prompt other than the one scored"):
        evaluate_examples(tiny, kv[:1], [AblateHeads([HEAD], how="resample")], progress=False)


def test_zero_is_the_default_and_a_class_of_positions_is_zeroed_there_only(tiny, kv):
    assert AblateHeads([HEAD]).describe() == {"type": "ablate_heads", "heads": HEAD, "ablation": "zero"}
    # one-token answers: "final" (the query and the answer's own token) is the query row
    mc = get_task("letters").examples(limit=4, seed=0)
    q = evaluate_examples(tiny, mc, [AblateHeads([HEAD], positions="query")], progress=False)
    f = evaluate_examples(tiny, mc, [AblateHeads([HEAD], positions="final")], progress=False)
    for a, b in zip(_lls(q), _lls(f), strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    # zeroing every class alone changes the scores; all four together are the whole ablation
    whole = _lls(evaluate_examples(tiny, kv, [AblateHeads([HEAD])], progress=False))
    parts = [AblateHeads([HEAD], positions=c) for c in CLASSES]
    together = _lls(evaluate_examples(tiny, kv, parts, progress=False))
    for a, b in zip(together, whole, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_position_classes_of_a_kv_prompt(tiny, kv):
    ex = kv[0]
    tok = tiny.tokenizer
    ids = _ctx(tiny, ex)
    sites = prompt_sites(tiny, ex)
    assert len(sites["ends"]) == len(ex.segments)
    assert all(tok.decode([ids[p]]).endswith("\n") for p in sites["ends"])
    assert tok.decode([ids[p] for p in sites["key"]]).strip() == ex.meta["key"]
    q = len(ids) - 1
    masks = row_classes([sites], [(0, q, q + 3)], q + 5, torch.device("cpu"))
    total = sum(m.int() for m in masks.values())
    assert total[0, : q + 3].eq(1).all() and total[0, q + 3:].eq(0).all()  # a partition of the row's positions
    assert masks["final"][0].nonzero().flatten().tolist() == [q, q + 1, q + 2]


def test_sweep_equals_eval_under_mean_ablation(tiny, kv):
    sw = run_sweep(tiny, kv, progress=False, ablation="mean")
    assert sw.config["ablation"] == "mean"
    naive = run_sweep(tiny, kv, progress=False, ablation="mean", naive=True)
    for rec, ref in zip(sw.records, naive.records, strict=True):
        assert rec["pred"] == ref["pred"]
        for a, b in zip(rec["loglik"], ref["loglik"], strict=True):
            assert a == pytest.approx(b, abs=1e-4)
    for rec in sw.records:
        ev = evaluate_examples(tiny, kv, [AblateHeads([rec["head"]], how="mean")], progress=False)
        assert [p["pred"] for p in ev.predictions] == rec["pred"]
        for a, b in zip(_lls(ev), rec["loglik"], strict=True):
            assert a == pytest.approx(b, abs=1e-4)
    zero = run_sweep(tiny, kv, progress=False)
    assert zero.config["ablation"] == "zero"
    assert [r["loglik"] for r in zero.records] != [r["loglik"] for r in sw.records]
    with pytest.raises(GandaError, match="resample is not run by the sweep engine"):
        run_sweep(tiny, kv, progress=False, ablation="resample")


def test_path_ablation_of_the_sender_everywhere_under_mean_is_evals(tiny, kv):
    from ganda.circuit import path_ablation
    from ganda.circuit.ablation import EVERYWHERE

    res = path_ablation(tiny, kv, HEAD, "L2H0", ablation="mean", progress=False)
    ev = evaluate_examples(tiny, kv, [AblateHeads([HEAD], how="mean")], progress=False)
    for a, b in zip(res.logliks[EVERYWHERE], _lls(ev), strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert res.config["ablation"] == "mean"


# ---- the lab model whose G&A heads are known (Gather L2H0, Aggregate L3H0) ---------------------


@pytest.fixture(scope="module")
def lab(lab_checkpoints):
    import ganda

    adapter = ganda.load_model("lab-llama-h1", device="cpu", dtype=torch.float32)
    return adapter, get_task("lab-mmlu", adapter=adapter).examples(limit=24, seed=0)


def test_lab_heads_survive_mean_ablation_and_the_sweep_agrees_with_eval(lab):
    adapter, exs = lab
    heads = [HeadId(2, 0), HeadId(3, 0)]
    sw = run_sweep(adapter, exs, heads=heads, progress=False, ablation="mean")
    zero = run_sweep(adapter, exs, heads=heads, progress=False)
    for rec, z in zip(sw.records, zero.records, strict=True):
        ev = evaluate_examples(adapter, exs, [AblateHeads([rec["head"]], how="mean")], progress=False)
        assert [p["pred"] for p in ev.predictions] == rec["pred"]
        assert ev.accuracy == rec["acc"]
        # the known heads carry the task under either ablation: far below the intact accuracy
        assert sw.baseline["acc"] - rec["acc"] > 0.3 and sw.baseline["acc"] - z["acc"] > 0.3


def test_every_command_records_its_ablation(lab_checkpoints, tmp_path, capsys, monkeypatch):
    from ganda.cli import main

    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> str:
        capsys.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code
        assert rc in (0, None), capsys.readouterr().err
        return capsys.readouterr().out

    out = json.loads(run("eval", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--ablate", "L2H0",
                         "--ablation", "resample", "--json", "-q"))
    assert out["interventions"] == [{"type": "ablate_heads", "heads": "L2H0", "ablation": "resample", "seed": 0}]
    text = run("eval", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--ablate", "L3H0", "--ablate-at",
               "final", "-q")
    assert '"positions": "final"' in text and '"ablation": "zero"' in text
    text = run("sweep", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--heads", "L2H0,L3H0",
               "--ablation", "mean", "--out", "sw", "-q")
    assert "mean-ablated" in text
    assert json.loads((tmp_path / "sw" / "results.jsonl").read_text().splitlines()[0])["config"]["ablation"] == "mean"
    text = run("path", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--from", "L2H0", "--to", "L3H0",
               "--ablation", "mean", "--out", "p", "-q")
    assert "mean-ablation" in text
    assert json.loads((tmp_path / "p" / "result.json").read_text())["summary"]["ablation"] == "mean"
    text = run("rank", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--ablation", "mean", "--out", "r", "-q")
    assert "mean-ablation" in text


def _row(positions: str, margin: float, low: float, ablation: str = "zero", drop: float = 0.0,
         drop_low: float = -0.1) -> dict:
    return {"heads": "L19H1", "ablation": ablation, "positions": positions, "drop": drop, "drop_ci_low": drop_low,
            "margin_drop": margin, "margin_drop_ci_low": low}


def test_the_verdict_and_where_sentences():
    """SmolLM2's L19H1 on KV5 (seed 0, 40 prompts): the effect survives mean ablation and sits at the
    final position; a class whose drop is established but a sliver of the whole is not named."""
    from ganda.acts import verdict, where

    rows = [_row("all", 1.307, 1.110, drop=0.275, drop_low=0.15), _row("all", 1.327, 1.135, "mean", 0.30, 0.15),
            _row("ends", 0.009, 0.001), _row("key", 0.007, 0.003), _row("final", 1.293, 1.103),
            _row("elsewhere", 0.051, 0.013)]
    assert verdict(rows) == ("L19H1's effect survives mean ablation (zero 27.5 points (margin 1.31), "
                             "mean 30.0 points (margin 1.33)).")
    assert where(rows) == ("L19H1 acts at the final position (share of its margin drop, ablated at one class "
                           "alone: ends 1%, key 1%, final 99%, elsewhere 4%).")
    gone = [rows[0], _row("all", 0.02, -0.01, "mean", 0.0, -0.05)]
    assert "does not survive mean ablation" in verdict(gone)
    weak = [_row("all", 0.1, -0.2, drop=0.0, drop_low=-0.1), _row("all", 0.1, -0.2, "mean")]
    assert "not established" in verdict(weak)
