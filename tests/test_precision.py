"""What "the same result" means per precision (docs/heads.md, "What exact means in bf16"): the
bounds, the comparison's agreements, ties and disagreements, and the two pairs of computations ganda
treats as one (fast sweep and naive loop, prefix cache and whole rows) on a trained lab model in
fp32 (identical) and bf16 (within the bound, the same prediction wherever the margin is clear)."""

from __future__ import annotations

import pytest
import torch

from ganda.errors import GandaError
from ganda.precision import LOGLIK_BOUND, coarser, compare_logliks, loglik_bound

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bounds_by_precision_scored_tokens_and_log_likelihood():
    assert LOGLIK_BOUND[torch.bfloat16] == (0.25, 0.125)
    assert loglik_bound("bf16") == loglik_bound(torch.bfloat16) == 0.25
    assert loglik_bound("bf16", tokens=2, loglik=-8.0) == pytest.approx(0.5 + 1.0)  # per token, and |log p| / 8
    assert loglik_bound("float16", tokens=3, loglik=-6.4) == pytest.approx(0.09 + 0.1)
    assert loglik_bound(torch.float32, loglik=-50.0) == 1e-4 < loglik_bound("fp16") < loglik_bound("bf16")
    assert coarser("float32", "bfloat16") == coarser(torch.bfloat16, torch.float16) == torch.bfloat16
    with pytest.raises(GandaError, match="is not a precision"):
        loglik_bound("int8")


def test_ties_are_reported_apart_from_agreements_and_disagreements():
    # bf16 bounds: 0.25 + |log p| / 8, i.e. 0.375 at -1, 0.625 at -3
    a = [[-1.0, -3.0], [-1.0, -1.6], [-1.0, -3.0], [-2.0, -2.1, -9.0]]
    b = [[-1.2, -3.1], [-1.3, -1.2], [-3.0, -1.0], [-2.0, -2.05, -9.0]]
    cmp = compare_logliks(a, b, dtype="bf16")
    assert cmp.agree == 1  # a lead of 2 and 1.9 over bounds of 0.4 + 0.64: clear, the same prediction
    assert cmp.ties == [1, 3]  # a lead within the two choices' bounds (in either run): not a verdict
    assert cmp.disagree == [2]  # a clear lead, the other prediction
    assert cmp.outside == [(2, 0), (2, 1)] and not cmp.within and not cmp.ok
    assert cmp.same_prediction == 2 and cmp.max_diff == pytest.approx(2.0)
    assert cmp.max_excess == pytest.approx(2.0 / 0.625)
    assert cmp.text() == ("4 examples: 1 agree, 2 ties, 1 disagree; max |Δ| 2, 2 choices outside the bfloat16 bound "
                          "(3.2x)")
    first = compare_logliks(a[:2], b[:2], dtype="bf16")
    assert first.ok and first.ties == [1] and first.text().endswith("within the bfloat16 bound")
    # a tie is judged in either run: here only the second run's lead is small
    assert compare_logliks([[-1.0, -3.0]], [[-1.0, -1.5]], dtype="bf16").ties == [0]
    # fp32: float tolerance, whatever the log-likelihood
    assert compare_logliks([[-40.0, -50.0]], [[-40.0002, -50.0]], dtype="float32").outside == [(0, 0)]


def test_the_bound_grows_with_each_choices_scored_tokens():
    a, b = [[-4.0, -1.0]], [[-4.9, -1.1]]  # the first choice has 2 tokens: 0.9 <= 0.5 + 4.9 / 8
    assert compare_logliks(a, b, dtype="bf16", tokens=[[2, 1]]).within
    assert compare_logliks(a, b, dtype="bf16").outside == [(0, 0)]  # as one token: 0.9 > 0.25 + 0.61
    # a 3-token runner-up at -3 can move by 1.125, the leader at -1 by 0.375: a lead of 1.4 is a tie
    assert compare_logliks([[-1.0, -2.4]], [[-1.0, -2.4]], dtype="bf16", tokens=[[1, 3]]).ties == [0]
    assert compare_logliks([[-1.0, -3.0]], [[-1.0, -3.0]], dtype="bf16", tokens=[[1, 3]]).agree == 1
    with pytest.raises(ValueError, match="choices"):
        compare_logliks([[-1.0]], [[-1.0, -2.0]], dtype="bf16")


@pytest.fixture(scope="module")
def lab_examples():
    import ganda
    from ganda.tasks import get_task

    ad = ganda.load_model("lab-llama-h1", device="cpu", dtype=torch.float32)
    return get_task("lab-mmlu", adapter=ad).examples(limit=24, seed=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fast_sweep_and_prefix_cache_agree_within_the_bound(dtype, lab_examples):
    """A trained model (clear margins, unlike random weights): in fp32 the identity ganda has always
    had; in bf16 every log-likelihood within the bound and the same prediction wherever the margin
    is clear, on most questions."""
    import ganda
    from ganda.scoring import score_examples
    from ganda.sweep import run_sweep

    ad = ganda.load_model("lab-llama-h1", device="cpu", dtype=dtype)
    heads = ad.heads()
    fast = run_sweep(ad, lab_examples, heads=heads, progress=False)
    naive = run_sweep(ad, lab_examples, heads=heads, naive=True, progress=False)
    a = [ll for r in [fast.baseline, *fast.records] for ll in r["loglik"]]
    b = [ll for r in [naive.baseline, *naive.records] for ll in r["loglik"]]
    cached = [s.loglik for s in score_examples(ad, lab_examples, prefix_cache=True)]
    rows = [s.loglik for s in score_examples(ad, lab_examples, prefix_cache=False)]
    for x, y in ((a, b), (cached, rows)):
        cmp = compare_logliks(x, y, dtype=dtype)
        assert cmp.ok, cmp.text()
        assert cmp.agree >= 0.75 * cmp.n, cmp.text()  # a trained model's margins are mostly clear
        if dtype == torch.float32:
            assert cmp.max_diff <= 1e-4 and cmp.same_prediction == cmp.n, cmp.text()
    if dtype == torch.bfloat16:  # bf16 against the fp32 model: the same bound holds
        ref = ganda.load_model("lab-llama-h1", device="cpu", dtype=torch.float32)
        want = [s.loglik for s in score_examples(ref, lab_examples, prefix_cache=False)]
        cmp = compare_logliks(rows, want, dtype=dtype)
        assert cmp.ok and cmp.max_diff > 0, cmp.text()  # bf16 rounds: not the fp32 numbers
