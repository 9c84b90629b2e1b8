"""Gemma-3-270M (the optional ``gemma3-270m`` alias: 18 layers x 4 heads, sliding and full attention,
a 262k vocabulary), the second real model, through every analysis ganda states results with:
loading, evaluation, ablation (the sweep against the naive loop), attention maps and a transplant
with a Gemma-3 donor. Its KV heads are those RESULTS.md names (induction and previous-token heads)."""

from __future__ import annotations

import copy

import pytest
import torch

from ganda import AblateHeads, HeadId
from ganda.experiments.transplant import TransplantHead, TransplantLayer
from ganda.models import from_model
from ganda.scoring import evaluate_examples
from ganda.sweep import run_sweep
from ganda.tasks import get_task

pytestmark = pytest.mark.slow

CAUSAL = HeadId(11, 2)  # the largest KV drop of RESULTS.md's Gemma section


@pytest.fixture(scope="module")
def kv3():
    return get_task("kv", pairs=3).examples(limit=10, seed=7)


def test_gemma_loads_as_a_transformer_with_its_shape(gemma):
    assert type(gemma.model).__name__ == "Gemma3ForCausalLM" and gemma.family == "transformer"
    assert len(gemma.decoder_layers()) == 18 and len(gemma.heads()) == 72 and gemma.tokenizer is not None
    kinds = list(gemma.model.config.layer_types)
    assert kinds.count("full_attention") == 3 and kinds[5] == "full_attention"  # every sixth layer is global


def test_gemma_retrieves_keys_above_chance_and_a_causal_head_costs_it(gemma, kv3):
    intact = evaluate_examples(gemma, kv3, progress=False, task_name="kv3")
    ablated = evaluate_examples(gemma, kv3, [AblateHeads([CAUSAL])], progress=False, task_name="kv3")
    assert intact.accuracy >= 0.6  # chance is 1/3
    assert ablated.accuracy < intact.accuracy
    margin = [p["loglik"][p["gold"]] - max(v for j, v in enumerate(p["loglik"]) if j != p["gold"])
              for p in intact.predictions]
    margin_ablated = [p["loglik"][p["gold"]] - max(v for j, v in enumerate(p["loglik"]) if j != p["gold"])
                      for p in ablated.predictions]
    assert sum(margin) / len(margin) - sum(margin_ablated) / len(margin_ablated) > 0.5


def test_gemma_sweep_equals_the_naive_loop(gemma, kv3):
    """The fast sweep (layer skipping, packed choices) against one ablated forward per head, on a
    sliding-window layer, the causal global layer and the last one."""
    heads = [HeadId(4, 1), CAUSAL, HeadId(17, 0)]
    fast = run_sweep(gemma, kv3[:3], heads=heads, progress=False)
    naive = run_sweep(gemma, kv3[:3], heads=heads, naive=True, progress=False)
    for a, b in zip([fast.baseline, *fast.records], [naive.baseline, *naive.records], strict=True):
        torch.testing.assert_close(torch.tensor(a["loglik"]), torch.tensor(b["loglik"]), atol=2e-4, rtol=0)
        assert a["acc"] == b["acc"]


def test_gemma_attention_maps_are_causal_softmax_rows(gemma, kv3):
    ids = gemma.tokenizer(kv3[0].prompt, add_special_tokens=True, return_tensors="pt").input_ids
    maps = gemma.attention_maps(ids, [CAUSAL, HeadId(5, 1)])
    for m in maps.values():
        assert m.shape == (ids.shape[1], ids.shape[1]) and torch.isfinite(m).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(ids.shape[1]), atol=1e-4, rtol=0)
        assert float(m.triu(1).abs().max()) == 0.0


def test_gemma_transplant_of_its_own_layers_and_head_changes_nothing(gemma, kv3):
    """A Gemma-3 donor's block runs with its own layer type's RoPE and window: the model's own layers
    (sliding 4, global 11) and head transplanted from a copy of it leave every log-likelihood as it was."""
    twin = from_model(copy.deepcopy(gemma.model), gemma.tokenizer, spec="gemma-twin")
    ref = evaluate_examples(gemma, kv3[:2], progress=False, task_name="kv3")
    for iv in (TransplantLayer(twin, [4, 11]), TransplantHead(twin, str(CAUSAL))):
        with iv.apply(gemma):
            got = evaluate_examples(gemma, kv3[:2], progress=False, task_name="kv3")
        for a, b in zip(got.predictions, ref.predictions, strict=True):
            torch.testing.assert_close(torch.tensor(a["loglik"]), torch.tensor(b["loglik"]), atol=1e-4, rtol=0)
