"""Greedy generation under interventions: cache vs no cache, batching, stops, token caps."""

from __future__ import annotations

import pytest
import torch

from ganda import AblateHeads, RemoveLayers
from ganda.generation import cut_at_stops, evaluate_generation, generate
from ganda.tasks.base import Example, Task

PROMPTS = ["apple:42\nriver:", "The value of the key 'river' is", "A B C D"]


def hf_greedy(adapter, prompt: str, n: int) -> list[int]:
    ids = adapter.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = adapter.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                     pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def test_cut_at_stops():
    assert cut_at_stops("12 The answer is 5.\n\nQ: next", ["Q:", "\n\n"]) == ("12 The answer is 5.", True)
    assert cut_at_stops("no stop here", ["Q:"]) == ("no stop here", False)
    assert cut_at_stops("abc", None) == ("abc", False)
    assert cut_at_stops("xQy", ["", "Q"]) == ("x", True)


def test_cached_matches_uncached_and_hf(tiny):
    assert tiny.supports_kv_cache_generation()
    for p in PROMPTS:
        a = generate(tiny, p, max_new_tokens=10)[0]
        b = generate(tiny, p, max_new_tokens=10, use_cache=False)[0]
        assert a.text == b.text and a.n_tokens == b.n_tokens
        ref = hf_greedy(tiny, p, 10)
        mine = tiny.tokenizer(a.raw, add_special_tokens=False).input_ids
        # compare by text: HF stops at the EOS too, and re-tokenising raw text is stable here
        assert tiny.tokenizer.decode(ref, skip_special_tokens=False) == a.raw, (mine, ref)


def test_batched_equals_single(tiny):
    batched = generate(tiny, PROMPTS, max_new_tokens=8, batch_size=3)
    single = [generate(tiny, p, max_new_tokens=8, batch_size=1)[0] for p in PROMPTS]
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.prompt_tokens for g in batched] == [g.prompt_tokens for g in single]


def test_token_cap_and_stop(tiny):
    g = generate(tiny, PROMPTS[0], max_new_tokens=6)[0]
    assert g.n_tokens <= 6
    if g.finish != "eos":
        assert g.finish == "length" and g.n_tokens == 6
    long = generate(tiny, PROMPTS[0], max_new_tokens=16)[0]
    if len(long.text) >= 3:
        stop = long.text[1:3]  # a stop string the greedy continuation is known to produce
        s = generate(tiny, PROMPTS[0], max_new_tokens=16, stop=[stop])[0]
        assert s.finish == "stop" and stop not in s.text
        assert long.text.startswith(s.text) and len(s.text) <= 1 + long.text.find(stop)
        assert s.n_tokens <= long.n_tokens


def test_per_prompt_stops(tiny):
    gs = generate(tiny, PROMPTS[:2], max_new_tokens=5, stop=[["zzz"], None])
    assert len(gs) == 2
    with pytest.raises(ValueError):
        generate(tiny, PROMPTS[:2], max_new_tokens=5, stop=[["a"]])


def test_interventions_apply_during_generation(tiny):
    p = PROMPTS[1]
    intact = generate(tiny, p, max_new_tokens=10)[0]
    with AblateHeads("L0H*,L1H*,L2H*").apply(tiny):
        a = generate(tiny, p, max_new_tokens=10)[0]
        b = generate(tiny, p, max_new_tokens=10, use_cache=False)[0]
    assert a.text == b.text
    with RemoveLayers([0]).apply(tiny):
        assert not tiny.supports_kv_cache_generation()  # layer list changed: the uncached path is used
        r = generate(tiny, p, max_new_tokens=10)[0]
        ids = tiny.tokenizer(p, add_special_tokens=False).input_ids
        seq = list(ids)
        for _ in range(r.n_tokens):
            seq.append(int(tiny.forward(torch.tensor([seq]))[0, -1].argmax()))
        assert tiny.tokenizer.decode(seq[len(ids):], skip_special_tokens=False) == r.raw
    assert tiny.supports_kv_cache_generation()
    after = generate(tiny, p, max_new_tokens=10)[0]
    assert after.text == intact.text  # everything restored


class _EchoTask(Task):
    name = "echo"
    kind = "generate"
    max_new_tokens = 4

    def examples(self, limit=None, seed=0):
        return [Example(prompt=p, target="", stop=["\n"]) for p in PROMPTS][:limit]

    def score_generation(self, example, generated):
        return len(generated) > 0

    def metrics(self, example, generated):
        return {"nonempty": len(generated) > 0, "never": False}


def test_evaluate_generation(tiny):
    t = _EchoTask()
    res = evaluate_generation(tiny, t, t.examples(), [AblateHeads("L1H0")], progress=False)
    assert res.n == 3 and len(res.predictions) == 3
    assert res.config["metrics"]["never"]["correct"] == 0
    assert res.interventions == [{"type": "ablate_heads", "heads": "L1H0", "ablation": "zero"}]
    assert all(p["n_tokens"] <= 4 for p in res.predictions)
    assert sum(res.config["finish"].values()) == 3


@pytest.mark.slow
def test_smollm2_generation_matches_hf_and_stops(smollm2):
    p = "Q: If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?\nA:"
    g = generate(smollm2, p, max_new_tokens=24)[0]
    ref = hf_greedy(smollm2, p, 24)
    assert smollm2.tokenizer.decode(ref, skip_special_tokens=False).startswith(g.raw)
    s = generate(smollm2, p, max_new_tokens=24, stop=["\n"])[0]
    assert "\n" not in s.text and g.text.startswith(s.text)
