"""The paper's experiments on tiny random models: each runs end to end and writes JSON + PNG;
transplants are exact where they must be (identity donor) and local (one head's contribution)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from ganda.experiments import Scorer, draw_result
from ganda.experiments.prune import find_drop
from ganda.heads import HeadId
from ganda.interventions import AblateHeads, KeepHeads
from ganda.models import from_model

CORPUS = (
    "The following are multiple choice questions (with answers) about astronomy.\n"
    "A. one\nB. two\nC. three\nD. four\nAnswer: A B C D\n"
    "Memorize the following dictionary:\napple:42\nriver:7\nThe value of the key 'river' is 7\n"
    "0 1 2 3 4 5 6 7 8 9 the of and to in is that for it as was with be by on not he this are or his"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)
    tok.train_from_iterator([CORPUS] * 4 + [" A B C D"] * 50, trainer=trainer)  # " A" etc. one token
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    return fast


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def tiny_llama(tok, seed: int = 0, layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    return from_model(model, tok, spec=f"tiny-llama-{seed}")


@pytest.fixture(scope="module")
def student(tok):
    return tiny_llama(tok, 0)


@pytest.fixture
def small_knowledge():
    """The ``knowledge`` group with one small member (the real one runs six datasets): the
    experiments' bookkeeping of a group is checked without the cost (the six tasks themselves are
    checked in test_knowledge.py and, through the pruning shortcut, in test_fast_knowledge_equals_slow)."""
    from ganda import registry

    registry.register_group("knowledge", ("letters",))
    yield "letters"
    registry.register_group("knowledge", ("arc_easy", "arc_challenge", "openbookqa", "piqa", "hellaswag", "winogrande"))


def _scorer(adapter, tasks=("mmlu",), limit=3):
    return Scorer(adapter, list(tasks), limit=limit, progress=False, sample=True)  # mmlu: 3 in all, not 3 per subject


def _check_saved(result, out: Path) -> dict:
    result.save(out)
    d = json.loads((out / "result.json").read_text())
    assert d["kind"] == result.kind and d["model"]
    assert list(out.glob("*.png")), "no figure written"
    assert list(out.glob("*.csv"))
    return d


def test_find_drop_rule() -> None:
    pts = [(6, 0.6), (5, 0.58), (4, 0.6), (3, 0.3), (2, 0.28), (1, 0.25)]
    d = find_drop(pts)
    assert d["minimal_layers"] == 4 and d["critical_layer"] == 3 and d["removed_to"] == 3
    assert d["drop"] == pytest.approx(0.3)
    # ties: the drop met first while pruning from the end wins
    assert find_drop([(3, 0.5), (2, 0.4), (1, 0.3)])["minimal_layers"] == 3


def test_paired_drop_and_pool_over_read_the_prompts_and_intervals_they_name() -> None:
    """The drop the demo and roles report for an ablation is the paired bootstrap of the two runs'
    per-prompt correctness; a pooled value reads each set's own interval (``""``: ci_low/ci_high)."""
    from types import SimpleNamespace

    from ganda.experiments.common import paired_drop, pool_over
    from ganda.stats import bootstrap_paired, pool_sets

    def run(correct: list[bool], low: float, high: float) -> SimpleNamespace:
        return SimpleNamespace(accuracy=sum(correct) / len(correct), ci_low=low, ci_high=high,
                               predictions=[{"correct": c} for c in correct])

    base, ablated = run([True] * 7 + [False], 0.5, 0.97), run([True, False, False, True, False, False, True, False],
                                                                0.14, 0.69)
    d = paired_drop(base, ablated, seed=3)
    bs = bootstrap_paired([1.0] * 7 + [0.0], [1.0, 0, 0, 1, 0, 0, 1, 0], seed=3)
    assert d == {"accuracy": 0.375, "ci_low": 0.14, "ci_high": 0.69, "drop": 0.5,
                 "drop_ci_low": bs["diff_ci_low"], "drop_ci_high": bs["diff_ci_high"]}
    assert 0 < d["drop_ci_low"] < 0.5 < d["drop_ci_high"] <= 0.875
    sets = [{"accuracy": 0.6, "ci_low": 0.4, "ci_high": 0.8, "drop": 0.2, "drop_ci_low": 0.1, "drop_ci_high": 0.3},
            {"accuracy": 0.7, "ci_low": 0.5, "ci_high": 0.9, "drop": 0.3, "drop_ci_low": 0.2, "drop_ci_high": 0.4}]
    assert pool_over(sets, "accuracy", (0.0, 1.0), interval="") == pool_sets([0.6, 0.7], [0.4, 0.5], [0.8, 0.9],
                                                                            within=(0.0, 1.0))
    drop = pool_over(sets, "drop", (-1.0, 1.0))
    assert drop == pool_sets([0.2, 0.3], [0.1, 0.2], [0.3, 0.4], within=(-1.0, 1.0))
    assert drop["estimate"] == pytest.approx(0.25) and drop["holds_on"] == 2


def test_prune_and_remove_restore(student, tmp_path: Path, small_knowledge) -> None:
    from ganda.experiments.prune import prune_curve, remove_restore

    scorer = _scorer(student, ("mmlu", "knowledge"))
    res = prune_curve(student, scorer)
    assert [r["layers"] for r in res.rows] == [4, 3, 2, 1]
    member = _scorer(student, (small_knowledge,)).score()[small_knowledge]["accuracy"]  # the group's one member
    assert 1 <= res.summary["minimal_layers"] <= 4 and res.rows[0]["knowledge"] == member
    assert res.rows == prune_curve(student, scorer, fast_path=False).rows  # group shortcut = scorer, per member
    d = _check_saved(res, tmp_path / "prune")
    assert d["summary"]["critical_layer"] == d["summary"]["minimal_layers"] - 1
    assert len(student.decoder_layers()) == 4  # restored
    rr = remove_restore(student, scorer, 3)
    assert [r["removed_layer"] for r in rr.rows] == [None, 0, 1, 2]
    _check_saved(rr, tmp_path / "rr")
    # the report can redraw a result from its JSON alone
    assert draw_result(json.loads((tmp_path / "rr" / "result.json").read_text()), tmp_path / "redraw")


def test_retain(student, tmp_path: Path) -> None:
    from ganda.experiments.retain import retain

    res = retain(student, _scorer(student), "L2H1", "L3H0")
    assert [r["config"] for r in res.rows] == ["intact", "none", "aggregate", "gather", "both"]
    _check_saved(res, tmp_path)
    res2 = retain(student, _scorer(student), "L1H1", "L2H0", keep_layers=[0, 1, 2])
    assert res2.config["keep_layers"] == [0, 1, 2] and not res2.notes


def test_kv_curve(student, tmp_path: Path) -> None:
    from ganda.experiments.kv_curve import kv_curve

    res = kv_curve(student, "L3H0,L2H1", [2, 3], limit=4, progress=False)
    assert [r["pairs"] for r in res.rows] == [2, 3]
    assert all(0 <= r["intact_ci_low"] <= r["intact"] <= r["intact_ci_high"] <= 1 for r in res.rows)
    assert "mean_gap" in res.summary
    _check_saved(res, tmp_path)


def test_mask_last_row(student, tmp_path: Path) -> None:
    from ganda.experiments.mask_last_row import mask_last_row_experiment

    res = mask_last_row_experiment(student, _scorer(student), None, per_layer=True)
    assert res.summary["n_heads_masked"] == 16
    assert [r["condition"] for r in res.rows][:4] == ["intact", "masked", "masked (last)", "masked L0"]
    assert res.summary["rules"] == ["query", "last"]
    # MMLU answers are one token: the last prompt token is the last scored position, same result
    rows = {r["condition"]: r for r in res.rows}
    assert rows["masked"]["mmlu"] == rows["masked (last)"]["mmlu"]
    assert res.summary["mmlu_masked"] == res.summary["mmlu_masked_last"]
    _check_saved(res, tmp_path)
    only = mask_last_row_experiment(student, _scorer(student), None, rules=("last",))
    assert [r["condition"] for r in only.rows] == ["intact", "masked (last)"]


def _ids(tok, text="The value of the key 'river' is 7 and apple:42"):
    return torch.tensor([tok(text).input_ids])


def test_layer_transplant_identity_and_restore(tok, student) -> None:
    from ganda.experiments.transplant import TransplantLayer

    ids = _ids(tok)
    ref = student.forward(ids)
    twin = from_model(copy.deepcopy(student.model), tok, spec="twin")
    layers_before = list(student.decoder_layers())
    for k in range(4):
        with TransplantLayer(twin, [k]).apply(student):
            assert student.decoder_layers()[k] is not layers_before[k]
            out = student.forward(ids)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert list(student.decoder_layers()) == layers_before
    other = tiny_llama(tok, seed=1)
    with TransplantLayer(other, [2]).apply(student):
        changed = student.forward(ids)
    assert not torch.allclose(changed, ref, atol=1e-4)
    torch.testing.assert_close(student.forward(ids), ref)


def test_layer_transplant_padded_batch(tok, student) -> None:
    """Right-padded rows give the same logits on their real tokens as unpadded ones."""
    from ganda.experiments.transplant import TransplantLayer

    other = tiny_llama(tok, seed=1)
    a, b = tok("apple:42 river").input_ids, tok("apple:42\nriver:7\nThe value").input_ids
    ids = torch.full((2, len(b)), tok.pad_token_id)
    ids[0, : len(a)], ids[1] = torch.tensor(a), torch.tensor(b)
    mask = (torch.arange(len(b))[None] < torch.tensor([[len(a)], [len(b)]])).long()
    with TransplantLayer(other, [1]).apply(student):
        batched = student.forward(ids, attention_mask=mask)
        single = student.forward(torch.tensor([a]))
    torch.testing.assert_close(batched[0, : len(a)], single[0], atol=1e-5, rtol=1e-5)


def test_head_transplant_identity(tok, student) -> None:
    from ganda.experiments.transplant import TransplantHead

    ids = _ids(tok)
    ref = student.forward(ids)
    twin = from_model(copy.deepcopy(student.model), tok, spec="twin")
    for head in ("L0H0", "L2H3", "L3H1"):
        with TransplantHead(twin, head).apply(student):
            out = student.forward(ids)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(student.forward(ids), ref)


def _tiny_gemma(family: str, seed: int = 0):
    """A tiny random Gemma-2 or Gemma-3 text model: sliding (window 4) and full layers; Gemma-3's
    with different RoPE bases per layer type, Gemma-2's with attention-logit soft-capping."""
    import transformers

    torch.manual_seed(seed)
    extra = {"attn_logit_softcapping": 2.0} if family == "gemma2" else {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}}
    config, model = {"gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
                     "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}[family]
    cfg = getattr(transformers, config)(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **extra)
    m = getattr(transformers, model)(cfg)
    with torch.no_grad():  # logits well past the cap, where soft-capping changes them
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(20.0)
    return from_model(m, None, spec=f"tiny-{family}-{seed}")


def _loglik(adapter, ids: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(adapter.forward(ids).float(), dim=-1)
    return logp[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_donor_block_and_head_compute_what_they_compute_in_their_model(family) -> None:
    """A Gemma block or head run as a donor gets its own layer type's RoPE, its sliding window and
    (one head) its logit soft-capping: a model's own layers and heads transplanted into a copy of it
    change no log-likelihood."""
    from ganda.experiments.transplant import TransplantHead, TransplantLayer

    student = _tiny_gemma(family)
    twin = from_model(copy.deepcopy(student.model), None, spec="twin")
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))  # 12 > the window
    ref = _loglik(student, ids)
    for k in range(3):
        with TransplantLayer(twin, [k]).apply(student):
            torch.testing.assert_close(_loglik(student, ids), ref, atol=1e-5, rtol=0)
    for head in ("L0H1", "L1H2", "L2H3"):
        with TransplantHead(twin, head).apply(student):
            torch.testing.assert_close(_loglik(student, ids), ref, atol=1e-5, rtol=0)
    with TransplantLayer(_tiny_gemma(family, seed=1), [0]).apply(student):  # another donor does change it
        assert (_loglik(student, ids) - ref).abs().max() > 1e-3


def test_head_transplant_changes_only_that_head(tok, student) -> None:
    """At layer 0 (where student and donor see the same input when they share embeddings) the
    transplant's o_proj output = student's output with the head ablated + the donor head's own
    o_proj contribution (the donor run with only that head kept)."""
    from ganda.experiments.transplant import TransplantHead

    donor = tiny_llama(tok, seed=2)
    donor.model.model.embed_tokens.weight.data.copy_(student.model.model.embed_tokens.weight.data)
    ids = _ids(tok)

    def o_proj_out(adapter, layer, ivs):
        got = {}
        h = adapter.mixer(layer).out_proj.register_forward_hook(lambda m, a, o: got.setdefault("o", o.detach()))
        try:
            from ganda.interventions import apply

            with apply(adapter, ivs):
                adapter.forward(ids)
        finally:
            h.remove()
        return got["o"]

    transplanted = o_proj_out(student, 0, [TransplantHead(donor, "L0H2", "L0H1")])
    ablated = o_proj_out(student, 0, [AblateHeads("L0H2")])
    donor_head = o_proj_out(donor, 0, [KeepHeads("L0H1")])
    torch.testing.assert_close(transplanted - ablated, donor_head, atol=1e-5, rtol=1e-4)
    # other layers' heads are untouched: layer-1 out_proj differs only through its changed input
    assert not torch.allclose(transplanted, o_proj_out(student, 0, []), atol=1e-4)


def test_transplant_into_mamba2_student(tok) -> None:
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from ganda.experiments.transplant import TransplantHead, TransplantLayer

    torch.manual_seed(0)
    cfg = Mamba2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, state_size=8, expand=2,
                       head_dim=8, num_heads=8, n_groups=1, chunk_size=16, pad_token_id=tok.pad_token_id)
    ssm = from_model(Mamba2ForCausalLM(cfg), tok, spec="tiny-mamba2")
    donor = tiny_llama(tok, seed=3, layers=3)
    ids = _ids(tok)
    ref = ssm.forward(ids)
    with TransplantLayer(donor, [1]).apply(ssm):
        out = ssm.forward(ids)
    assert out.shape == ref.shape and not torch.allclose(out, ref, atol=1e-4)
    with TransplantHead(donor, HeadId(1, 3, None), "L1H0").apply(ssm):
        out2 = ssm.forward(ids)
    assert torch.isfinite(out2).all() and not torch.allclose(out2, ref, atol=1e-5)
    torch.testing.assert_close(ssm.forward(ids), ref)


def test_transplant_into_bamba_student_is_exact() -> None:
    """Bamba's layer loop unpacks (hidden, attn_weights): the donor block must fit that, and what
    reaches the student's next layer must be exactly the donor block applied to the embeddings."""
    from checks import tiny_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from ganda.experiments.transplant import TransplantLayer

    student = from_model(tiny_model("bamba"))
    cfg = student.model.config
    torch.manual_seed(0)
    donor = from_model(LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)))
    ids = torch.randint(1, 50, (1, 10), generator=torch.Generator().manual_seed(1))
    base = student.forward(ids)
    seen: dict[str, torch.Tensor] = {}
    hook = student.decoder_layers()[1].register_forward_pre_hook(
        lambda _m, args, kwargs: seen.__setitem__("student", (args[0] if args else kwargs["hidden_states"]).detach()),
        with_kwargs=True)
    try:
        with TransplantLayer(donor, [0], donor_layers=[1]).apply(student):
            out = student.forward(ids)
    finally:
        hook.remove()
    emb = student.model.get_input_embeddings()(ids)
    h2 = donor.decoder_layers()[1].register_forward_hook(
        lambda _m, _a, o: seen.__setitem__("donor", (o[0] if isinstance(o, tuple) else o).detach()))
    try:
        with torch.no_grad():
            backbone = donor.model.model
            pos = torch.arange(ids.shape[1])[None]
            backbone.layers[1](emb, attention_mask=None, position_ids=pos,
                               position_embeddings=backbone.rotary_emb(emb, pos), use_cache=False)
    finally:
        h2.remove()
    torch.testing.assert_close(seen["student"], seen["donor"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, base, atol=1e-4)
    torch.testing.assert_close(student.forward(ids), base)


def test_transplant_sweep(student, tok, tmp_path: Path) -> None:
    from ganda.experiments.transplant import transplant_sweep

    donor = tiny_llama(tok, seed=1)
    res = transplant_sweep(student, donor, _scorer(student), layers=[1, 3], score_donor=True)
    assert [r["condition"] for r in res.rows] == ["student", "donor", "L1", "L3"]
    right = res.rows[1]["mmlu"] * 3
    assert abs(right - round(right)) < 1e-9  # the donor scored on the student's 3 sampled questions
    assert res.summary["best_layer"] in (1, 3)
    _check_saved(res, tmp_path / "layers")
    res_h = transplant_sweep(student, donor, _scorer(student), heads="L2H0-1")
    assert [r["condition"] for r in res_h.rows] == ["student", "head L2H0", "head L2H1"]


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    m = tiny_llama(tok, 0)
    m.model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_cli_commands(model_dir: Path, tmp_path: Path) -> None:
    from ganda.cli import main

    m = str(model_dir)
    common = ["--limit", "2", "--sample", "--task", "mmlu", "--quiet"]
    cmds = {
        "prune": ["prune", m, *common, "--out"],
        "rr": ["prune", m, *common, "--remove-restore", "--minimal", "3", "--out"],
        "retain": ["retain", m, "--gather", "L2H0", "--aggregate", "L3H1", *common, "--out"],
        "kv": ["kv-curve", m, "--heads", "L3H0", "--pairs", "2,4", "--limit", "2", "--quiet", "--out"],
        "mask": ["mask-last-row", m, *common, "--out"],
        "transplant": ["transplant", m, "--donor", m, "--layers", "0,3", *common, "--out"],
        "roles": ["roles", m, "--task", "mmlu", "--control", "none", "--keep-layers", "0-1", "--top", "2",
                  "--max-heads", "1", "--limit", "3", "--sample", "--quiet", "--out"],
    }
    for name, argv in cmds.items():
        out = tmp_path / name
        assert main([*argv, str(out)]) == 0, name
        assert (out / "result.json").exists() and list(out.glob("*.png")) and (out / "report.html").exists(), name
    # a donor equal to the student leaves the score unchanged
    d = json.loads((tmp_path / "transplant" / "result.json").read_text())
    assert {r["mmlu"] for r in d["rows"]} == {d["rows"][0]["mmlu"]}
    roles = json.loads((tmp_path / "roles" / "result.json").read_text())
    assert roles["config"]["keep_layers"] == [0, 1] and {HeadId.parse(h).layer for h in roles["sweep_drops"]} == {0, 1}
    assert main(["retain", m, "--gather", "L3H0", "--aggregate", "L3H1", *common]) == 2
    assert main(["kv-curve", m, "--pairs", "x"]) == 2


def test_fast_pruning_equals_truncation(student) -> None:
    from ganda.experiments.prune import prune_curve

    scorer = _scorer(student, ("mmlu", "letters", "kv3"), limit=4)
    fast = prune_curve(student, scorer)
    assert any("full forwards for: -" in n for n in fast.notes)
    slow = prune_curve(student, scorer, fast_path=False)
    assert fast.rows == slow.rows


def test_fast_truncation_on_mamba2(tok) -> None:
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from ganda.experiments.prune import truncation_logliks
    from ganda.interventions import truncate
    from ganda.prepared import prepare as _prepare
    from ganda.scoring import score_example
    from ganda.tasks import get_task

    torch.manual_seed(0)
    cfg = Mamba2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, state_size=8, expand=2,
                       head_dim=8, num_heads=8, n_groups=1, chunk_size=16, pad_token_id=tok.pad_token_id)
    ssm = from_model(Mamba2ForCausalLM(cfg), tok, spec="tiny-mamba2")
    ex = get_task("kv", pairs=3).examples(limit=1)[0]
    lls = truncation_logliks(ssm, _prepare(ssm, ex), [1, 2, 3])
    for k in (1, 2):
        with truncate(k).apply(ssm):
            ref = score_example(ssm, ex).loglik  # a real truncated forward
        assert lls[k] == pytest.approx(ref, abs=1e-4)


def test_fast_remove_restore_equals_slow(student) -> None:
    from ganda.experiments.prune import fast_removal_scores, remove_restore

    scorer = _scorer(student, ("mmlu", "letters", "kv3"), limit=4)
    assert fast_removal_scores(student, scorer._task_examples("mmlu")[1], 3) is not None
    assert fast_removal_scores(student, scorer._task_examples("kv3")[1], 3) is not None
    assert remove_restore(student, scorer, 3).rows == remove_restore(student, scorer, 3, fast_path=False).rows


def test_fast_knowledge_equals_slow(student) -> None:
    from ganda.experiments.prune import prune_curve

    scorer = Scorer(student, ["knowledge"], limit=2, knowledge_limit=2, progress=False)
    fast = prune_curve(student, scorer, min_layers=3)
    assert any("full forwards for: -" in n for n in fast.notes)
    assert fast.rows == prune_curve(student, scorer, min_layers=3, fast_path=False).rows


@pytest.mark.slow
def test_smollm2_shortcuts_and_transplant_identity(smollm2) -> None:
    """On the real model: one-pass truncation/removal scoring equals real truncated forwards, and
    transplanting a layer or a head from the model into itself changes nothing."""
    from ganda.experiments.prune import removal_logliks, truncation_logliks
    from ganda.experiments.transplant import TransplantHead, TransplantLayer
    from ganda.interventions import KeepLayers, truncate
    from ganda.prepared import prepare as _prepare
    from ganda.scoring import score_example
    from ganda.tasks import get_task

    for ex in (get_task("mmlu").examples(limit=1)[0], get_task("kv", pairs=3).examples(limit=1)[0]):
        p = _prepare(smollm2, ex)
        lls = truncation_logliks(smollm2, p, [30, 18, 5])
        rem = removal_logliks(smollm2, p, 18)
        with torch.no_grad():
            for k in (18, 5):
                with truncate(k).apply(smollm2):
                    assert lls[k] == pytest.approx(score_example(smollm2, ex).loglik, abs=2e-3)
            with KeepLayers([j for j in range(18) if j != 16]).apply(smollm2):
                assert rem[16] == pytest.approx(score_example(smollm2, ex).loglik, abs=2e-3)
    ids = torch.tensor([smollm2.tokenizer("The capital of France is Paris. The capital of Italy is").input_ids])
    with torch.no_grad():
        ref = smollm2.forward(ids)
        with TransplantLayer(smollm2, [7]).apply(smollm2):
            torch.testing.assert_close(smollm2.forward(ids), ref, atol=2e-3, rtol=1e-3)
        with TransplantHead(smollm2, "L7H3").apply(smollm2):
            torch.testing.assert_close(smollm2.forward(ids), ref, atol=2e-3, rtol=1e-3)


def test_head_roles_label_by_where_the_ablation_hurts(student, tmp_path: Path) -> None:
    from ganda.experiments.roles import head_roles
    from ganda.labels import causal_role, label_model
    from ganda.patterns import AUTO, pattern_scores
    from ganda.tasks import get_task

    exs = get_task("kv", pairs=3).examples(limit=12, seed=0)
    ctrl = get_task("kv", pairs=2).examples(limit=8, seed=1)
    res = head_roles(student, exs, control=ctrl, top=5, min_drop=0.0, max_control_drop=2.0, max_heads=3,
                     task_name="kv3", control_name="kv2", progress=False)
    assert len(res.rows) == 5 and res.summary["chance"] == pytest.approx(1 / 3)
    drops = res.extra["sweep_drops"]
    ranked = [r["head"] for r in res.rows]
    assert [drops[h] for h in ranked] == sorted((drops[h] for h in ranked), reverse=True)  # most damaging first
    for r in res.rows:
        assert r["drop_all"] == pytest.approx(res.summary["baseline"] - r["all"])
        assert r["drop_all"] == pytest.approx(drops[r["head"]], abs=1e-9)  # the sweep and AblateHeads agree
        assert r["role"] == causal_role(r, control_drop=r["drop_control"], min_drop=0.0, max_control_drop=2.0)
        assert r["role"] == ("aggregate" if r["drop_query"] > r["drop_context"] else "gather")
    # each row's label is the labeller's for that head, with the same pattern scores and ablation drops
    heads = [HeadId.parse(h) for h in ranked]
    scores = pattern_scores(student, exs, heads, progress=False, summary=AUTO)
    for sc, h in zip(scores, ranked, strict=True):
        sc.head = h
    drops = {r["head"]: {k: r[k] for k in ("drop_all", "drop_query", "drop_context")} for r in res.rows}
    labels = label_model(student, scores, ablations=drops, min_drop=0.0)
    assert {r["head"]: r["label"] for r in res.rows} == {h: lab.label for h, lab in labels.items()}
    cum = res.extra["cumulative"]
    assert [c["n_heads"] for c in cum] == list(range(1, len(cum) + 1)) and len(cum) <= 3
    # a role held by several heads is also scored with all of them ablated at once
    from ganda.interventions import AblateHeads
    from ganda.scoring import evaluate_examples

    # each head's accuracy by gold answer is the split of its own ablation, and adds back up to it
    n_gold = [sum(e.gold == i for e in exs) for i in range(3)]
    for r in res.rows:
        split = evaluate_examples(student, exs, [AblateHeads(r["head"])], progress=False).by_answer()
        assert r["answers"] == {x["answer"]: x["accuracy"] for x in split}
        # kv's choices differ from prompt to prompt: the split is by the asked pair's position, #1 to #3
        assert sum((r["answers"][k] or 0) * n for k, n in zip(("#1", "#2", "#3"), n_gold, strict=True)) == pytest.approx(
            r["all"] * 12)
    for role in ("gather", "aggregate"):
        heads = res.summary[f"{role}_heads"]
        if len(heads) > 1:
            both = evaluate_examples(student, exs, [AblateHeads(heads)], progress=False).accuracy
            assert res.summary[f"{role}_together"] == pytest.approx(both)
            assert f"{role}_together_control_drop" in res.summary
        else:
            assert f"{role}_together" not in res.summary
    # a strict control threshold turns every head that costs the control task into a "knowledge" head
    strict = head_roles(student, exs, control=ctrl, ranked=ranked, top=5, min_drop=0.0, max_control_drop=-1.0,
                        until_chance=False, progress=False)
    assert all(r["role"] == "knowledge" for r in strict.rows) and strict.summary["gather"] is None
    d = _check_saved(res, tmp_path)
    assert d["kind"] == "roles" and (tmp_path / "roles.png").exists() and (tmp_path / "cumulative.png").exists()
    assert (tmp_path / "roles_by_answer.png").exists()


@pytest.mark.parametrize("keep", [[0, 1], [0, 2, 3]])
def test_head_roles_on_a_submodel(student, keep) -> None:
    """The paper finds its heads in the minimal model: every score is the submodel's, only its heads rank."""
    from ganda.errors import GandaError
    from ganda.experiments.roles import head_roles
    from ganda.interventions import KeepLayers
    from ganda.scoring import evaluate_examples
    from ganda.tasks import get_task

    exs = get_task("kv", pairs=3).examples(limit=10, seed=0)
    res = head_roles(student, exs, top=3, min_drop=0.0, until_chance=False, keep_layers=keep, progress=False)
    assert res.config["keep_layers"] == keep
    assert {HeadId.parse(h).layer for h in res.extra["sweep_drops"]} == set(keep)  # prefix: fast sweep; else naive
    sub = evaluate_examples(student, exs, [KeepLayers(keep)], progress=False).accuracy
    full = evaluate_examples(student, exs, progress=False).accuracy
    assert res.summary["baseline"] == pytest.approx(sub)
    for r in res.rows:
        direct = evaluate_examples(student, exs, [KeepLayers(keep), AblateHeads(r["head"])], progress=False).accuracy
        assert r["all"] == pytest.approx(direct)
        assert r["drop_all"] == pytest.approx(res.extra["sweep_drops"][r["head"]], abs=1e-9)
    assert len(student.decoder_layers()) == 4  # the submodel is undone
    assert evaluate_examples(student, exs, progress=False).accuracy == pytest.approx(full)
    with pytest.raises(GandaError, match="does not keep"):
        head_roles(student, exs, ranked=["L1H0"], top=1, until_chance=False, keep_layers=[0, 2], progress=False)
