"""Every analysis on every tiny family, on the device and in the precision under test.

``GANDA_TEST_DEVICE`` (default ``cpu``) and ``GANDA_TEST_DTYPE`` (default ``float32``) choose them;
CI runs this matrix in fp32 with the whole suite and once more in bf16 (``scripts/test.sh``), and
``GANDA_TEST_DTYPE=float16`` or ``GANDA_TEST_DEVICE=cuda`` run it in fp16 or on a GPU. A model in
bf16 on the CPU takes the code path it takes on a GPU (the same dtypes, casts and hooks), so the
CPU run is where precision bugs show. Each cell runs one analysis on the model under test and on
the same weights in fp32 on the CPU, and compares:

* within the precision under test, the two computations ganda treats as one (fast sweep and naive
  loop, cached prefix and whole rows, the pruning shortcuts and real truncated forwards) agree
  within :func:`ganda.precision.loglik_bound` and predict alike wherever the margin is clear;
* against fp32, log-likelihoods agree within the same bound, maps and attribution estimates within
  the tolerances below (attribution's scaled by the model's own conditioning), and greedy
  generation picks, at every step, a token fp32 scores within the two tokens' bounds of its best.

Every cell passes in every dtype: attribution casts the final residual to the LM head's dtype, so
the SSM families (which keep the residual in fp32) run AtP and AtP* in bf16 as the others do.
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch
from checks import last_row_diff, tiny_model
from conftest import TEST_DEVICE, TEST_DTYPE, make_byte_tokenizer, make_tiny_llama

import ganda
from ganda import AblateHeads, HeadId, generation, mask_last_row
from ganda.attribution import attribute
from ganda.device import parse_device, parse_dtype
from ganda.experiments.prune import (
    fast_removal_scores,
    fast_truncation_scores,
    removal_logliks,
    truncation_logliks,
)
from ganda.experiments.transplant import TransplantHead, TransplantLayer
from ganda.interventions import KeepLayers, apply, truncate
from ganda.precision import coarser, compare_logliks, loglik_bound
from ganda.prepared import prepare
from ganda.scoring import encode, encode_pair, example_pairs, score_example, score_examples
from ganda.sweep import run_sweep
from ganda.tasks.base import Example

pytestmark = [pytest.mark.device, pytest.mark.usefixtures("one_thread")]

DEVICE = parse_device(TEST_DEVICE, "GANDA_TEST_DEVICE")
DTYPE = parse_dtype(TEST_DTYPE, "GANDA_TEST_DTYPE")
LOW = DTYPE != torch.float32 or DEVICE.type != "cpu"  # anything but the reference itself
CMP = coarser(DTYPE, torch.float32)  # whose log-likelihood bound holds, against fp32 and within DTYPE

# Tolerances against fp32, as fractions of the largest fp32 value, on top of a multiple of the model's
# own conditioning (``_perturbed``: how far fp32 results move when every weight moves by one unit
# roundoff of DTYPE). The tiny models are random, and the SSM parameters of the hybrids are spread so
# that the invariant checks bite: half a bf16 ulp on the weights moves the tiny Zamba2's AtP by 103%
# of its scale and Falcon-H1's layer-2 SSM map by 220%, which no arithmetic can beat; the other
# families move by a few percent.
#
# Attribution (AtP, and AtP*'s GradDrop magnitudes; AtP* takes its sign from AtP, whose sign is noise
# where AtP is near zero): a bf16 backward rounds every activation gradient to 8 bits. Measured
# worst: 4.4x the conditioning spread (Falcon-H1's AtP, 56% of the scale); beyond 5x the spread, no
# family exceeds 0 in bf16 or fp16.
ATTRIBUTION_COND = 5.0
ATTRIBUTION_TOL = {torch.bfloat16: 0.02, torch.float16: 0.005}.get(DTYPE, 1e-4)
# Maps (softmax, and implicit with and without D) are accumulated in fp32 from the model's own
# activations, which carry its precision. Measured worst beyond 2x the spread: 0.14% of the scale in
# bf16, 0.02% in fp16; 5.1% in bf16 before it (the tiny Zamba2).
MAPS_COND = 2.0
MAPS_TOL = {torch.bfloat16: 0.01, torch.float16: 0.002}.get(DTYPE, 1e-5)

FAMILIES = ["llama", "mamba2", "mamba", "llamba", "zamba2", "bamba", "falcon_h1", "jamba"]
ANALYSES = ["eval", "sweep", "atp", "atp*", "maps", "prune", "transplant", "mask_last_row", "generate"]

def _cells():
    for fam in FAMILIES:
        for an in ANALYSES:
            yield pytest.param(fam, an, id=f"{fam}-{an}")


class CharTok:
    """One token per character (ids 1-60): the tiny SSM models have 61-64 tokens."""

    pad_token_id = 0
    eos_token_id = None
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        class Out:
            input_ids = [ord(ch) % 60 + 1 for ch in text]

        return Out()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(96 + i % 26) for i in ids)


HEADER = "The following are multiple choice questions.\n\nWhich is red?\nA. one\nB. two\nAnswer: A\n\n"
EXAMPLES = [
    Example(HEADER + "Which is the river?\nA. 7\nB. 42\nAnswer:", [" A", " B"], 0),  # one-token letters
    Example(HEADER + "Which is the apple?\nA. 42\nB. 7\nAnswer:", [" apple tree", " river", " 42"], 1),
    Example("key 'river' is", [" 7", " 42", " 7 or 42"], 2),  # no prefix shared with the others
    Example("Tom beat Ann so _ won.", ["Tom", "Ann"], 0,  # Winogrande's partial scoring
            meta={"contexts": ["Tom beat Ann so Tom", "Tom beat Ann so Ann"], "continuation": " won."}),
]


@cache
def _pair(family: str) -> tuple[ganda.ModelAdapter, ganda.ModelAdapter]:
    """(fp32 on the CPU, the same weights on DEVICE in DTYPE)."""
    if family == "llama":
        tok = make_byte_tokenizer()
        model = make_tiny_llama(len(tok))
    else:
        tok = CharTok()
        model = tiny_model(family)
    test = ganda.from_model(model.to(device=DEVICE, dtype=DTYPE), tok, spec=f"tiny-{family}")
    # the very weights under test, in fp32 (bf16 and fp16 values are exact in fp32): what differs is
    # the arithmetic alone (tiny random models are chaotic enough that rounding their weights moves
    # an attribution estimate by 40% of the scale)
    ref = ganda.from_model(copy.deepcopy(test.model).to(device="cpu", dtype=torch.float32), tok, spec=f"tiny-{family}")
    return ref, test


@cache
def _donor(family: str, on_test: bool) -> ganda.ModelAdapter:
    """A random Llama as wide as ``family``'s model: transplant donors are Llama-layout Transformers
    (the paper's teacher), students any family."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ref, _ = _pair(family)
    d = ref.mixers()[0].out_proj.out_features
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    if on_test:
        model = model.to(device=DEVICE, dtype=DTYPE)
    return ganda.from_model(model.eval(), None, spec=f"donor-{family}")


def _tokens(ad: ganda.ModelAdapter) -> list[list[int]]:
    """Scored tokens per example and choice (each one's log-likelihood bound grows with them)."""
    return [[len(encode_pair(ad, c, t)[1]) for c, t in example_pairs(ex)] for ex in EXAMPLES]


def _lls(scores) -> list[list[float]]:
    return [s.loglik for s in scores]


def _assert_agree(a, b, tokens, what: str):
    cmp = compare_logliks(a, b, dtype=CMP, tokens=tokens)
    assert cmp.ok, f"{what}: {cmp.text()}; outside {cmp.outside}, disagree {cmp.disagree}"
    if not LOW:
        assert cmp.ties == [] or cmp.same_prediction == cmp.n, f"{what}: {cmp.text()}"
    return cmp


def _heads(ad: ganda.ModelAdapter) -> list[HeadId]:
    """One head of every mixer (the last, so it is never the one an earlier check used)."""
    return [ad.canonical(HeadId(m.layer, m.num_heads - 1, m.kind)) for m in ad.mixers()]


# ---- the cells -----------------------------------------------------------------------------

def check_eval(ref, test, family):
    toks = _tokens(test)
    cached = _lls(score_examples(test, EXAMPLES, prefix_cache=True))
    rows = _lls(score_examples(test, EXAMPLES, prefix_cache=False))
    _assert_agree(cached, rows, toks, "prefix cache vs whole rows")
    want = _lls(score_examples(ref, EXAMPLES, prefix_cache=False))
    _assert_agree(rows, want, toks, f"{DTYPE} vs fp32")
    head = test.heads()[len(test.heads()) // 2]
    with apply(test, [AblateHeads([head])]):
        ablated = _lls(score_examples(test, EXAMPLES))
    with apply(ref, [AblateHeads([head])]):
        _assert_agree(ablated, _lls(score_examples(ref, EXAMPLES)), toks, "ablated, vs fp32")
    assert ablated != cached  # the ablation acts


def check_sweep(ref, test, family):
    heads = _heads(test)
    fast = run_sweep(test, EXAMPLES, heads=heads, progress=False)
    naive = run_sweep(test, EXAMPLES, heads=heads, naive=True, progress=False)
    want = run_sweep(ref, EXAMPLES, heads=heads, progress=False)
    toks = _tokens(test)
    for a, b, w in zip([fast.baseline, *fast.records], [naive.baseline, *naive.records],
                       [want.baseline, *want.records], strict=True):
        assert a.get("head") == b.get("head") == w.get("head")
        _assert_agree(a["loglik"], b["loglik"], toks, f"fast vs naive, {a.get('head', 'intact')}")
        _assert_agree(a["loglik"], w["loglik"], toks, f"fast vs fp32, {a.get('head', 'intact')}")
    assert any(r["loglik"] != fast.baseline["loglik"] for r in fast.records)  # ablations act


@cache
def _perturbed(family: str) -> ganda.ModelAdapter:
    """The fp32 reference with every weight moved by one unit roundoff of DTYPE (random signs): how
    far a result moves on it is the model's own conditioning, which no arithmetic in DTYPE can beat."""
    ref, _ = _pair(family)
    model = copy.deepcopy(ref.model)
    u = torch.finfo(DTYPE).eps / 2  # unit roundoff: 2^-8 in bf16, 2^-11 in fp16
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + u * torch.randint(0, 2, p.shape, generator=g).mul(2).sub(1).to(p.dtype))
    return ganda.from_model(model, ref.tokenizer, spec=ref.spec)


@cache
def _attribution_noise(family: str, method: str) -> tuple[list[float], list[float]]:
    """How far fp32 AtP and AtP* magnitudes move on :func:`_perturbed` weights."""
    moved = attribute(_perturbed(family), EXAMPLES, method=method, progress=False)
    base = attribute(_pair(family)[0], EXAMPLES, method=method, progress=False)
    return ([abs(x - y) for x, y in zip(moved.atp, base.atp, strict=True)],
            [abs(x - y) for x, y in zip(moved.graddrop or [], base.graddrop or [], strict=True)])


def _check_attribution(ref, test, family, method):
    a = attribute(test, EXAMPLES, method=method, progress=False)
    b = attribute(ref, EXAMPLES, method=method, progress=False)
    assert [str(h) for h in a.heads] == [str(h) for h in b.heads]
    _assert_agree(a.clean_logliks, b.clean_logliks, _tokens(test), f"{method} log-likelihoods vs fp32")
    noise = _attribution_noise(family, method) if LOW else ([0.0] * len(b.atp), [0.0] * len(b.graddrop or []))
    pairs = [("atp", a.atp, b.atp, noise[0])]
    if method == "atp*":  # AtP*'s magnitudes; its sign is AtP's, checked above (a sign of AtP ~ 0 is noise)
        pairs.append(("graddrop", a.graddrop, b.graddrop, noise[1]))
    for name, got, want, spread in pairs:
        scale = max(abs(x) for x in want)
        assert scale > 0, name
        worst = max(abs(x - y) for x, y in zip(got, want, strict=True))
        allowed = ATTRIBUTION_TOL * scale + ATTRIBUTION_COND * max(spread)
        assert worst <= allowed, (name, worst / scale, max(spread) / scale)


def check_atp(ref, test, family):
    _check_attribution(ref, test, family, "atp")


def check_atp_star(ref, test, family):
    _check_attribution(ref, test, family, "atp*")


def _maps(ad, ids, heads):
    """Every head's map, and the SSM heads' implicit maps with D (keys ``("D", head)``)."""
    out = ad.attention_maps(ids.to(ad.device), heads)
    ssm = [h for h in heads if ad.mixer_of(h).kind == "ssm"]
    if ssm:
        out.update({("D", h): m for h, m in ad.implicit_maps(ids.to(ad.device), ssm, include_d=True).items()})
    return out


def check_maps(ref, test, family):
    ids = torch.randint(1, 60, (1, 13), generator=torch.Generator().manual_seed(2))
    heads = [test.canonical(HeadId(m.layer, 0, m.kind)) for m in test.mixers()]
    got, want = _maps(test, ids, heads), _maps(ref, ids, heads)
    moved = _maps(_perturbed(family), ids, heads) if LOW else want
    for h in want:
        g, w = got[h], want[h]
        assert g.dtype == torch.float32 and g.device.type == "cpu" and g.shape == w.shape == (13, 13), h
        assert torch.all(g.triu(1) == 0), h  # causal in every precision
        scale = float(w.abs().max())
        spread = float((moved[h] - w).abs().max())
        err = float((g - w).abs().max())
        assert err <= MAPS_TOL * scale + MAPS_COND * spread, (str(h), err / scale, spread / scale)


def check_prune(ref, test, family):
    n = len(test.decoder_layers())
    ks = list(range(n, 0, -1))
    toks = _tokens(test)
    assert fast_truncation_scores(test, EXAMPLES, ks) is not None  # the shortcut passed its own check
    assert fast_removal_scores(test, EXAMPLES, n) is not None
    fast_t, fast_r, want_t, want_r, slow_t, slow_r = [], [], [], [], [], []
    for ex in EXAMPLES:
        p, q = prepare(test, ex), prepare(ref, ex)
        t, r = truncation_logliks(test, p, ks), removal_logliks(test, p, n)
        fast_t.append([x for k in ks for x in t[k]])
        fast_r.append([x for k in r for x in r[k]])
        tq, rq = truncation_logliks(ref, q, ks), removal_logliks(ref, q, n)
        want_t.append([x for k in ks for x in tq[k]])
        want_r.append([x for k in rq for x in rq[k]])
        with torch.no_grad():
            one = []
            for k in ks:
                with truncate(k).apply(test):
                    one += score_example(test, ex).loglik
            slow_t.append(one)
            one = []
            for key in r:
                keep = range(n) if key is None else [j for j in range(n) if j != key]
                with KeepLayers(list(keep)).apply(test):
                    one += score_example(test, ex).loglik
            slow_r.append(one)
    toks_t = [t * len(ks) for t in toks]
    toks_r = [t * (n + 1) for t in toks]
    _assert_agree(fast_t, slow_t, toks_t, "truncation shortcut vs truncated forwards")
    _assert_agree(fast_r, slow_r, toks_r, "remove-restore shortcut vs forwards without the layer")
    _assert_agree(fast_t, want_t, toks_t, "truncation vs fp32")
    _assert_agree(fast_r, want_r, toks_r, "remove-restore vs fp32")


def check_transplant(ref, test, family):
    toks = _tokens(test)
    first = next(m for m in test.mixers() if m.layer == 1)
    head = str(test.canonical(HeadId(1, 0, first.kind)))
    intact = _lls(score_examples(test, EXAMPLES))
    for make in (lambda d: TransplantLayer(d, [1]), lambda d: TransplantHead(d, head, "L1H0")):
        with apply(test, [make(_donor(family, True))]):
            got = _lls(score_examples(test, EXAMPLES))
        with apply(ref, [make(_donor(family, False))]):
            want = _lls(score_examples(ref, EXAMPLES))
        _assert_agree(got, want, toks, f"{make(_donor(family, False)).describe()} vs fp32")
        assert got != intact  # the donor's layer or head acts
    if family == "llama":  # a donor identical to the student, its own head: nothing changes
        same = ganda.from_model(copy.deepcopy(test.model), test.tokenizer, spec="same")
        with apply(test, [TransplantHead(same, head)]):
            _assert_agree(_lls(score_examples(test, EXAMPLES)), intact, toks, "identity donor")


def check_mask_last_row(ref, test, family):
    ids = torch.randint(1, 60, (1, 13), generator=torch.Generator().manual_seed(2))
    heads = [test.canonical(HeadId(m.layer, 1, m.kind)) for m in test.mixers()]
    d = last_row_diff(test, ids.to(DEVICE), heads)
    assert d["before"] == 0.0 and d["last"] > 0, d  # exact in every precision: earlier rows never see it
    with apply(test, [mask_last_row(heads)]):
        got = _lls(score_examples(test, EXAMPLES))
    with apply(ref, [mask_last_row(heads)]):
        want = _lls(score_examples(ref, EXAMPLES))
    _assert_agree(got, want, _tokens(test), "masked, vs fp32")


def _generated(ad, prompts, monkeypatch, **kw) -> list[list[int]]:
    rows = []
    real = generation._finish
    monkeypatch.setattr(generation, "_finish", lambda a, r: rows.append(list(r.new)) or real(a, r))
    gens = generation.generate(ad, prompts, max_new_tokens=5, **kw)
    monkeypatch.setattr(generation, "_finish", real)
    assert all(g.n_tokens == len(r) >= 1 and g.finish in ("length", "eos") for g, r in zip(gens, rows, strict=True))
    return rows


def check_generate(ref, test, family, monkeypatch):
    prompts = [ex.prompt for ex in EXAMPLES[:3]]
    cached = _generated(test, prompts, monkeypatch)
    whole = _generated(test, prompts, monkeypatch, prefix_cache=False)
    for prompt, new, other in zip(prompts, cached, whole, strict=True):
        ids = encode(ref, prompt)
        # every token greedy picked (with a cached prefix, and without) is one fp32 scores within
        # the two tokens' bounds of its best at that step (each log-probability moves by its bound)
        for seq in (new, other):
            x = torch.tensor([ids + seq])
            with torch.no_grad():
                logp = torch.log_softmax(ref.forward(x)[0].float(), -1)
            for j, tok in enumerate(seq):
                row = logp[len(ids) - 1 + j]
                best, got = float(row.max()), float(row[tok])
                assert best - got <= loglik_bound(CMP, 1, best) + loglik_bound(CMP, 1, got), (family, j, best - got)
        if not LOW:
            assert new == other


CHECKS = {"eval": check_eval, "sweep": check_sweep, "atp": check_atp, "atp*": check_atp_star, "maps": check_maps,
          "prune": check_prune, "transplant": check_transplant, "mask_last_row": check_mask_last_row}


@pytest.mark.parametrize("family, analysis", list(_cells()))
def test_analysis_matches_fp32(family, analysis, monkeypatch):
    ref, test = _pair(family)
    assert next(test.model.parameters()).dtype == DTYPE and test.device.type == DEVICE.type
    if analysis == "generate":
        check_generate(ref, test, family, monkeypatch)
    else:
        CHECKS[analysis](ref, test, family)
