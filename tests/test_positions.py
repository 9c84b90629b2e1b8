"""Position-restricted ablations: the final position ("query"), every position before it
("context"), and the last scored position of a multi-token answer ("last"); roles' split of a
scored row into the final position and what comes before it."""

from __future__ import annotations

import pytest
import torch

from ganda.interventions import AblateHeads, apply, mask_last_row


def _ids(tok, text="Question: which is it?\nA. red hill\nB. old port\nAnswer:"):
    return torch.tensor([tok(text).input_ids])


def test_query_and_context_ablations_add_up_to_the_full_ablation(tiny, byte_tok):
    ids = _ids(byte_tok)
    with apply(tiny, [AblateHeads("L1H2")]):
        full = tiny.forward(ids)
    with apply(tiny, [AblateHeads("L1H2", positions="query"), AblateHeads("L1H2", positions="context")]):
        both = tiny.forward(ids)
    torch.testing.assert_close(both, full, rtol=0, atol=1e-6)
    with apply(tiny, [AblateHeads("L1H2", positions="query")]):
        q = tiny.forward(ids)
    with apply(tiny, [AblateHeads("L1H2", positions="context")]):
        c = tiny.forward(ids)
    intact = tiny.forward(ids)
    # a query-only ablation changes nothing before the final position (causal model)
    torch.testing.assert_close(q[0, :-1], intact[0, :-1], rtol=0, atol=0)
    assert (q[0, -1] - intact[0, -1]).abs().max() > 1e-5
    # a context-only ablation changes the final position too (through attention), but not by
    # zeroing the head there: the final row of the out_proj input keeps the head
    assert (c[0, :-1] - intact[0, :-1]).abs().max() > 1e-5


def test_context_ablation_keeps_the_final_row_of_the_head(tiny, byte_tok):
    from ganda.heads import HeadId

    ids = _ids(byte_tok)
    mixer = tiny.mixer_of(HeadId(1, 2))
    sl = mixer.head_slice(2)
    seen = []

    def grab(_m, args):
        seen.append(args[0].detach().clone())

    with apply(tiny, [AblateHeads("L1H2", positions="context")]):
        h = mixer.out_proj.register_forward_pre_hook(grab)
        tiny.forward(ids)
        h.remove()
    x = seen[0]
    assert x[0, :-1, sl].abs().max() == 0  # zeroed before the final position
    assert x[0, -1, sl].abs().max() > 0  # kept at it
    other = mixer.head_slice(1)
    assert x[0, :, other].abs().min() >= 0 and x[0, :-1, other].abs().max() > 0  # other heads untouched


def test_last_rule_masks_the_position_predicting_the_final_answer_token(tiny, byte_tok):
    from ganda.scoring import score_choices

    ctx, cont = "Answer:", " old port"
    base = score_choices(tiny, ctx, [cont, " red hill"])
    with apply(tiny, [mask_last_row("L*H*", "query")]):
        q = score_choices(tiny, ctx, [cont, " red hill"])
    with apply(tiny, [mask_last_row("L*H*", "last")]):
        last = score_choices(tiny, ctx, [cont, " red hill"])
    assert q.loglik != base.loglik and last.loglik != base.loglik and q.loglik != last.loglik
    # by hand, with plain hooks: zero every head's output at the row that predicts the final byte
    ids = torch.tensor([byte_tok(ctx + cont).input_ids])
    n_ctx = len(byte_tok(ctx).input_ids)
    row = ids.shape[1] - 2

    def zero_row(_m, args):
        x = args[0].clone()
        x[:, row] = 0
        return (x, *args[1:])

    mixers = {id(tiny.mixer_of(h)): tiny.mixer_of(h) for h in tiny.heads()}
    handles = [m.out_proj.register_forward_pre_hook(zero_row) for m in mixers.values()]
    try:
        with torch.no_grad():
            logp = torch.log_softmax(tiny.forward(ids)[0].float(), -1)
    finally:
        for h in handles:
            h.remove()
    ll = sum(float(logp[p - 1, ids[0, p]]) for p in range(n_ctx, ids.shape[1]))
    assert ll == pytest.approx(last.loglik[0], abs=1e-4)


def test_bad_position_rule_is_refused(tiny):
    from ganda.errors import GandaError

    with pytest.raises(GandaError):
        mask_last_row("L0H0", "first")
    with pytest.raises(GandaError), apply(tiny, [AblateHeads("L0H0", positions="middle")]):
        pass


@pytest.mark.usefixtures("lab_checkpoints")
@pytest.mark.parametrize("name,head", [("lab-llama", "L1H1"), ("lab-mamba2", "L0H7"), ("lab-hybrid", "L3H1")])
def test_batched_scoring_equals_one_example_per_forward(name, head):
    """Several examples in one right-padded forward (the default for small models) give the
    one-by-one log-likelihoods, also when an ablation acts only at each row's own final
    position or only before it, and for multi-token choices (one row per choice)."""
    import ganda
    from ganda.scoring import default_batch_rows, evaluate_examples, score_examples
    from ganda.tasks import get_task

    ad = ganda.load_model(name, device="cpu")
    assert default_batch_rows(ad.n_params()) > 1
    mmlu = get_task("lab-mmlu", adapter=ad).examples(limit=24, seed=5)
    kv = get_task("lab-kv", adapter=ad, pairs=3).examples(limit=8, seed=5)
    mixed = [x for pair in zip(mmlu[:8], kv, strict=True) for x in pair] + mmlu[8:]  # rows of both kinds in a batch
    for pos in (None, "query", "context"):
        with apply(ad, [AblateHeads(head, positions=pos)]):
            one = score_examples(ad, mixed, batch_rows=1)
            many = score_examples(ad, mixed, batch_rows=7)  # chunks that split examples' rows unevenly
        for a, b in zip(one, many, strict=True):
            assert a.loglik == pytest.approx(b.loglik, abs=1e-4)
            assert a.pred == b.pred
    # the query-only ablation must act on every row's own final position: it changes the answers
    with apply(ad, [AblateHeads(head, positions="query")]):
        ablated = evaluate_examples(ad, mmlu, progress=False).accuracy
    assert ablated < evaluate_examples(ad, mmlu, progress=False).accuracy


def test_roles_split_a_multi_token_answer_row_into_final_and_before_it():
    """On a task whose answers are two tokens, ``roles``' final-position mode is eval's
    ``--ablate-at final`` (the last prompt token and the answer's own tokens) and its context mode
    ablates only positions before the query: the position of the answer's second token is part of
    the final position, not of the context. lab-llama-h1's L1H0 on lab-knowledge: final 11/12, before
    it 12/12 (the intact model is right on all 12), so its positional role is Aggregate."""
    from ganda.experiments.roles import _mode_runs
    from ganda.models import load_model
    from ganda.scoring import evaluate_examples
    from ganda.tasks import get_task

    adapter = load_model("lab-llama-h1")
    examples = get_task("lab-knowledge", adapter=adapter).examples(limit=12, seed=0)
    assert all(len(adapter.tokenizer(ex.choices[ex.gold]).input_ids) >= 2 for ex in examples)
    runs = _mode_runs(adapter, examples, "L1H0")
    final = evaluate_examples(adapter, examples, [AblateHeads("L1H0", positions="final")], progress=False)
    assert [p["correct"] for p in runs["query"].predictions] == [p["correct"] for p in final.predictions]
    assert (runs["all"].correct, runs["query"].correct, runs["context"].correct) == (9, 11, 12)
