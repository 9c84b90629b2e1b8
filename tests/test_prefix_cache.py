"""Shared-prefix reuse in scoring and generation gives the numbers of the uncached path.

A common token prefix of several requests runs once and every request continues from a copy of
its cached state (attention KV, SSM conv and recurrent states). For every family, on tiny random
models: log-likelihoods within 1e-4 of the uncached path and the same predictions and
generations, intact, under a head ablation and under position-restricted ablations, including
requests with no common prefix; every family takes the cached path (Mamba-1 mixers through a
scan that starts from the cached state). Edited layer lists run uncached.
"""

from __future__ import annotations

import pytest
import torch
from checks import tiny_model
from conftest import make_byte_tokenizer, make_tiny_llama

import ganda
from ganda import AblateHeads, RemoveLayers, generation, scoring
from ganda.generation import generate
from ganda.scoring import PREFIX_MIN, prefix_cache_enabled, prefix_groups, score_examples
from ganda.tasks.base import Example

pytestmark = pytest.mark.usefixtures("one_thread")

HEADER = "The following are multiple choice questions (with answers) about astronomy.\n\n"
EXEMPLAR = "Which option is red apple?\nA. one\nB. two\nC. three\nD. four\nAnswer: A\n\n"


class CharTokenizer:
    """One token per character (ids 1-60): the tiny SSM models have a 64-token vocabulary."""

    pad_token_id = 0
    eos_token_id = None
    bos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False):
        class Out:
            input_ids = [ord(ch) % 60 + 1 for ch in text]

        return Out()

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(96 + i % 26) for i in ids)


def examples() -> list[Example]:
    """Two questions behind one shared few-shot prefix (one-token letters and multi-token
    answers), one question of another header, and one whose very first character differs."""
    q1 = HEADER + EXEMPLAR + "Which is the river?\nA. 7\nB. 42\nAnswer:"
    q2 = HEADER + EXEMPLAR + "Which is the apple?\nA. 42\nB. 7\nAnswer:"
    q3 = "Memorize the following dictionary:\napple:42\nriver:7\nThe value of the key 'river' is"
    q4 = "memorize the following dictionary:\napple:42\nriver:7\nThe value of the key 'apple' is"
    return [Example(q1, [" A", " B"], 0), Example(q2, [" apple tree", " river", " 42"], 1),
            Example(q3, [" 7", " 42", " 7 or 42"], 0), Example(q4, [" A", " B"], 1)]


def adapter_of(family: str) -> ganda.ModelAdapter:
    if family == "llama":
        tok = make_byte_tokenizer()
        return ganda.from_model(make_tiny_llama(len(tok)), tok, spec="tiny-llama")
    return ganda.from_model(tiny_model(family), CharTokenizer(), spec=f"tiny-{family}")


def max_diff(a, b) -> float:
    return max(abs(x - y) for sa, sb in zip(a, b, strict=True) for x, y in zip(sa.loglik, sb.loglik, strict=True))


FAMILIES = ["llama", "mamba2", "zamba2", "bamba", "falcon_h1", "mamba", "falcon_mamba", "jamba", "llamba"]


@pytest.mark.parametrize("family", FAMILIES)
def test_scoring_with_prefix_reuse_matches_the_uncached_path(family, monkeypatch):
    ad = adapter_of(family)
    assert ad.supports_prefix_cache()
    calls = []
    real = scoring.run_prefix
    monkeypatch.setattr(scoring, "run_prefix", lambda a, ids: calls.append(len(ids)) or real(a, ids))
    exs = examples()
    head = ad.heads()[len(ad.heads()) // 2]
    for ivs in ([], [AblateHeads([head])], [AblateHeads([head], positions="query")],
                [AblateHeads([head], positions="context")]):
        with ganda.interventions.apply(ad, ivs):
            want = score_examples(ad, exs, prefix_cache=False)
            got = score_examples(ad, exs, prefix_cache=True)
            one = [scoring.score_example(ad, ex) for ex in exs]  # one example: choices behind its context
        assert max_diff(want, got) < 1e-4, (family, ivs)
        assert max_diff(want, one) < 1e-4, (family, ivs)
        assert [s.pred for s in got] == [s.pred for s in want]
        if not ivs:
            intact = want
        else:  # each ablation acts (the context one through the cached prefix alone): 50 times the paths' 4e-6
            assert max_diff(intact, want) > 2e-4, (family, ivs, max_diff(intact, want))
    # the cached path is taken: the shared 5-line prefix once, each other question's context
    # before its choices once
    assert max(calls) >= len(scoring.encode(ad, HEADER + EXEMPLAR)) - 1 and min(calls) >= PREFIX_MIN


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_with_prefix_reuse_matches_the_uncached_path(family, monkeypatch):
    ad = adapter_of(family)
    calls = []
    real = generation.run_prefix
    monkeypatch.setattr(generation, "run_prefix", lambda a, ids: calls.append(len(ids)) or real(a, ids))
    prompts = [ex.prompt for ex in examples()]
    head = ad.heads()[len(ad.heads()) // 2]
    cases = [[], [AblateHeads([head])]]
    if ad.supports_kv_cache_generation():
        # a query-position ablation acts on each generated token when it is produced, as the
        # KV-cached path does; the uncached path (SSMs) re-runs earlier tokens without it
        cases.append([AblateHeads([head], positions="query")])
    for ivs in cases:
        with ganda.interventions.apply(ad, ivs):
            want = generate(ad, prompts, max_new_tokens=8, prefix_cache=False)
            got = generate(ad, prompts, max_new_tokens=8, prefix_cache=True, batch_size=2)
        assert [g.raw for g in got] == [g.raw for g in want], (family, ivs)
    assert calls and min(calls) >= PREFIX_MIN  # the two prompts behind the shared 5-line prefix


@pytest.mark.parametrize("family", ["mamba", "falcon_mamba", "jamba", "llamba"])
def test_a_suffix_continues_the_cached_state_exactly(family):
    """Mamba-1 scans (transformers starts every multi-token scan at zero) and Llamba's chunked
    SSD continue a cached prefix of any length, the prefix shorter than the conv kernel included;
    transformers' own scan is back in place afterwards."""
    import transformers.models.mamba.modeling_mamba as hf_mamba

    scan = hf_mamba.mamba_selective_scan
    ad = adapter_of(family)
    torch.manual_seed(0)
    ids = torch.randint(1, 60, (1, 24))
    with torch.no_grad():
        whole = ad.forward(ids)
        for plen in (1, 3, 12, 23):
            cache = ad.new_cache()
            head = ad.forward_cached(ids[:, :plen], cache, torch.arange(plen)[None])
            rows = ad.expand_cache(cache, 2)
            tail = ad.forward_cached(ids[:, plen:].expand(2, -1), rows, torch.arange(plen, 24)[None].expand(2, -1))
            assert (head - whole[:, :plen]).abs().max() < 1e-4, (family, plen)
            assert (tail - whole[:, plen:]).abs().max() < 1e-4, (family, plen)
    assert hf_mamba.mamba_selective_scan is scan


def test_prefix_groups_keep_long_prefixes_and_respect_limits():
    a = [1] * 30 + [2, 3]
    b = [1] * 30 + [4, 5]
    c = [1] * 10 + [9] * 22  # shares 10 tokens with a and b: less than half of their 30
    d = [7] * 32  # differs at the first token
    # c and d share no long prefix with another row: they run whole, in one group of their own
    assert prefix_groups([a, b, c, d], [31, 31, 31, 31]) == [(30, [0, 1]), (0, [2, 3])]
    # a limit (the first scored position) caps the cached prefix; under PREFIX_MIN nothing is cached
    assert prefix_groups([a, b], [31, 12]) == [(12, [0, 1])]
    assert prefix_groups([a, b], [31, PREFIX_MIN - 1]) == [(0, [0, 1])]


def test_switch_off_and_layer_edits_fall_back(monkeypatch):
    ad = adapter_of("llama")
    assert prefix_cache_enabled(ad)
    monkeypatch.setenv("GANDA_PREFIX_CACHE", "0")
    assert not prefix_cache_enabled(ad)
    assert prefix_cache_enabled(ad, True)
    monkeypatch.delenv("GANDA_PREFIX_CACHE")
    with RemoveLayers([1]).apply(ad):  # a cache indexes loaded layers: edited lists run whole
        assert not ad.supports_prefix_cache()
        exs = examples()
        assert max_diff(score_examples(ad, exs), score_examples(ad, exs, prefix_cache=False)) == 0.0
    assert ad.supports_prefix_cache()


def test_a_prefix_cache_is_never_reused_across_intervention_sets():
    ad = adapter_of("llama")
    exs = examples()[:2]
    runs = []
    for ivs in ([], [AblateHeads("L1H0,L2H3")], []):
        res = ganda.scoring.evaluate_examples(ad, exs, ivs, progress=False)
        ref = ganda.scoring.evaluate_examples(ad, exs, ivs, progress=False, prefix_cache=False)
        runs.append([p["loglik"] for p in res.predictions])
        assert max(abs(x - y) for p, q in zip(res.predictions, ref.predictions, strict=True)
                   for x, y in zip(p["loglik"], q["loglik"], strict=True)) < 1e-4
    assert runs[0] == runs[2] and runs[0] != runs[1]


def test_a_head_transplant_sees_the_whole_sequence():
    """A donor head's attention is recomputed from the student's input: with a cached prefix it
    would attend over the suffix alone, so the transplant turns the cache off while it is active."""
    from ganda.experiments.transplant import TransplantHead

    student, donor = adapter_of("llama"), adapter_of("llama")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in donor.model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    exs = examples()[:3]
    ivs = [TransplantHead(donor, "L1H0")]
    res = ganda.scoring.evaluate_examples(student, exs, ivs, progress=False)
    ref = ganda.scoring.evaluate_examples(student, exs, ivs, progress=False, prefix_cache=False)
    intact = ganda.scoring.evaluate_examples(student, exs, [], progress=False)
    assert student.supports_prefix_cache()
    assert max(abs(x - y) for p, q in zip(res.predictions, ref.predictions, strict=True)
               for x, y in zip(p["loglik"], q["loglik"], strict=True)) < 1e-4
    assert res.predictions[0]["loglik"] != intact.predictions[0]["loglik"]


def test_expanded_caches_leave_the_prefix_cache_unchanged():
    ad = adapter_of("mamba2")
    cache = scoring.run_prefix(ad, list(range(1, 20)))
    before = [t.clone() for t in cache.layers[0].recurrent_states.values() if t is not None]
    big = ad.expand_cache(cache, 3)
    x = torch.ones((3, 4), dtype=torch.long)
    ad.forward_cached(x, big, (19 + torch.arange(4))[None].expand(3, -1))
    after = [t for t in cache.layers[0].recurrent_states.values() if t is not None]
    assert before and all(torch.equal(p, q) for p, q in zip(before, after, strict=True))


# ---- the real model -------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_mmlu_5shot_with_prefix_reuse_matches_uncached_and_lm_eval(smollm2):
    """Real model, MMLU 5-shot (the subject's header and five exemplars cached once): the same
    predictions as ganda's uncached path and as lm-eval, log-likelihoods within 1e-4."""
    from ganda.evaluation import evaluate
    from ganda.lmeval import mmlu_task, sample_predictions, simple_evaluate
    from ganda.tasks import get_task

    subject, n = "anatomy", 4
    task = get_task("mmlu", shots=5, subjects=[subject])
    on = evaluate(smollm2, task, limit=n, progress=False, prefix_cache=True)
    off = evaluate(smollm2, task, limit=n, progress=False, prefix_cache=False)
    res = simple_evaluate(smollm2, [mmlu_task(subject, shots=5)], None, limit=n, log_samples=True, batch_size=1)
    lm = sample_predictions(res, f"ganda_mmlu_{subject}")
    for other in (off.predictions, lm):
        assert [p["pred"] for p in on.predictions] == [p["pred"] for p in other]
        for a, b in zip(on.predictions, other, strict=True):
            assert a["loglik"] == pytest.approx(b["loglik"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name, opts", [("gsm8k-cot", {"shots": 8}),
                                        ("bbh", {"subtask": "date_understanding", "shots": 3, "cot": True})])
def test_smollm2_cot_generation_with_prefix_reuse_is_unchanged(smollm2, name, opts):
    """Real model, GSM8K 8-shot CoT and BBH 3-shot CoT (the exemplars cached once): the same
    greedy generations as without prefix reuse."""
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task

    task = get_task(name, max_new_tokens=24, **opts)
    on = evaluate(smollm2, task, limit=2, progress=False, prefix_cache=True)
    off = evaluate(smollm2, task, limit=2, progress=False, prefix_cache=False)
    assert [p["generated"] for p in on.predictions] == [p["generated"] for p in off.predictions]
    assert all(p["n_tokens"] > 0 for p in on.predictions)


def test_suffix_batches_bound_padding():
    """Suffixes of similar length share a forward; a much longer one gets its own instead of
    padding the others to its width (on a CPU, padding costs more than batching saves)."""
    lengths = {0: 10, 1: 11, 2: 12, 3: 100, 4: 104}
    assert scoring.suffix_batches(lengths, list(lengths)) == [[0, 1, 2], [3, 4]]
    assert scoring.suffix_batches({0: 5, 1: 5, 2: 5}, [0, 1, 2], max_rows=2) == [[0, 1], [2]]


def test_a_gpu_budget_grows_the_batches_and_keeps_the_scores(monkeypatch):
    """On a GPU the suffix batches take a share of the free memory (:func:`scoring.budget_for`);
    the scores are the CPU budget's (each row depends on its own tokens only), the batches fewer."""
    cpu = scoring.budget_for(32, 4096, 1024, 128256, 2, None)
    h100 = scoring.budget_for(32, 4096, 1024, 128256, 2, 60e9)  # Llama-3.1-8B dims (8 KV heads), 60 GB free
    assert cpu == scoring.CPU_BUDGET
    assert h100.cache_tokens > 8 * cpu.cache_tokens and h100.rows > cpu.rows and h100.logit_rows > cpu.logit_rows
    assert h100.cache_tokens * (2 * 32 * 1024 + 8 * 4096) * 2 <= 0.25 * 60e9 + 1
    assert h100.logit_rows * 128256 * 6 <= 0.1 * 60e9 + 1
    assert scoring.budget_for(32, 4096, 1024, 128256, 2, 1e6) == scoring.CPU_BUDGET
    lengths = {i: 10 + i % 3 for i in range(200)}
    assert len(scoring.suffix_batches(lengths, list(lengths), 700, budget=h100)) < \
        len(scoring.suffix_batches(lengths, list(lengths), 700, budget=cpu)) / 4

    ad = adapter_of("llama")
    exs = examples() * 8
    want = score_examples(ad, exs, prefix_cache=True)
    monkeypatch.setattr(scoring, "score_budget", lambda adapter: scoring.Budget(rows=512, cache_tokens=1 << 16,
                                                                                logit_rows=1 << 14))
    got = score_examples(ad, exs, prefix_cache=True)
    assert max_diff(want, got) < 1e-4 and [s.pred for s in got] == [s.pred for s in want]
