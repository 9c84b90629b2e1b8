"""The fast sweep engine equals the naive ablation loop, and a killed sweep resumes exactly."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from ganda import sweep
from ganda.errors import GandaError
from ganda.heads import HeadId
from ganda.interventions import AblateHeads, KeepLayers, RemoveLayers
from ganda.models.transformer import TransformerAdapter
from ganda.prepared import prepare
from ganda.scoring import evaluate_examples
from ganda.sweep import load_result, run_sweep

# Shared by the test process and the subprocess that gets killed (so both build the same model).
SETUP = textwrap.dedent(
    """
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import ganda
    from ganda.tasks.base import Example


    class CharTok:
        pad_token_id = 0
        bos_token_id = None

        def __call__(self, text, add_special_tokens=False):
            return SimpleNamespace(input_ids=[1 + (ord(c) % 60) for c in text])


    def tiny_adapter():
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        model = LlamaForCausalLM(cfg)
        return ganda.from_model(model, CharTok(), spec="tiny-llama")


    def tiny_examples():
        return [
            # multi-token choices after one shared context (the KV-task shape)
            Example(prompt="ab:13\\ncd:57\\nef:20\\nkey cd is", choices=[" 13", " 57", " 20"], gold=1),
            # single-token choices (the MMLU-letter shape)
            Example(prompt="Q: which?\\nA. x\\nB. y\\nAnswer:", choices=["A", "B"], gold=0),
            # a context ending in a space (moves into the continuation), choices of different lengths
            Example(prompt="The sky is ", choices=["blue", "green and wide", "red"], gold=0),
            # Winogrande partial scoring: several contexts, one continuation
            Example(prompt="Tom beat Ann so _ won.", choices=["Tom", "Ann"], gold=0,
                    meta={"contexts": ["Tom beat Ann so Tom", "Tom beat Ann so Ann"], "continuation": " won."}),
        ]
    """
)
pytestmark = pytest.mark.usefixtures("one_thread")

_ns: dict = {}
exec(SETUP, _ns)
tiny_adapter, tiny_examples = _ns["tiny_adapter"], _ns["tiny_examples"]


@pytest.fixture(scope="module")
def adapter():
    return tiny_adapter()


def _assert_same(a, b, tol=1e-4):
    assert [r["head"] for r in a.records] == [r["head"] for r in b.records]
    for ra, rb in zip([a.baseline, *a.records], [b.baseline, *b.records], strict=True):
        assert ra["pred"] == rb["pred"], ra.get("head")
        assert ra["pred_norm"] == rb["pred_norm"], ra.get("head")
        assert ra["acc"] == rb["acc"]
        for la, lb in zip(ra["loglik"], rb["loglik"], strict=True):
            assert la == pytest.approx(lb, abs=tol), ra.get("head")


def test_packing_layout(adapter):
    p = prepare(adapter, tiny_examples()[0])
    assert not p.single and p.prefix > 0
    # every read position's token context equals the naive row's
    for i, read in enumerate(p.read):
        assert len(read) == len(p.conts[i])
    p1 = prepare(adapter, tiny_examples()[1])
    assert p1.single and p1.tokens == p1.rows[0][: p1.ctx_lens[0]]


def test_fast_equals_naive(adapter):
    exs = tiny_examples()
    fast = run_sweep(adapter, exs, progress=False)
    naive = run_sweep(adapter, exs, progress=False, naive=True)
    assert len(fast.records) == 12
    _assert_same(fast, naive)
    # and the naive loop is literally AblateHeads + evaluate_examples for ordinary examples
    ordinary = exs[:3]
    res = evaluate_examples(adapter, ordinary, [AblateHeads(["L1H2"])], progress=False)
    rec = next(r for r in fast.records if r["head"] == "L1H2")
    for pr, ll in zip(res.predictions, rec["loglik"][:3], strict=True):
        assert pr["loglik"] == pytest.approx(ll, abs=1e-4)
        assert pr["pred"] == max(range(len(ll)), key=lambda i: ll[i])


def test_fast_rows_mode_and_batches(adapter, monkeypatch):
    """Unpacked rows (models with a short sliding window) and one-head batches agree too."""
    exs = tiny_examples()
    naive = run_sweep(adapter, exs, progress=False, naive=True)
    monkeypatch.setattr(TransformerAdapter, "packs_choices", lambda self, w: False)
    rows = run_sweep(adapter, exs, progress=False, batch_heads=3)
    _assert_same(rows, naive)


def test_fallback_engine_equals_naive(adapter, monkeypatch):
    monkeypatch.setattr(TransformerAdapter, "skips_layers", lambda self: False)
    exs = tiny_examples()
    _assert_same(run_sweep(adapter, exs, progress=False), run_sweep(adapter, exs, progress=False, naive=True))


@pytest.mark.parametrize("runner", [True, False])
def test_sweep_inside_layer_edits_equals_naive(runner, monkeypatch):
    """Head ids name the layers as loaded: inside ``RemoveLayers([1])`` layer 2 runs second, and the
    fast engine must ablate (and skip to) layer 2, not the layer at position 2."""
    if not runner:
        monkeypatch.setattr(TransformerAdapter, "skips_layers", lambda self: False)
    ad = tiny_adapter()
    exs = tiny_examples()
    with RemoveLayers([1]).apply(ad):
        fast = run_sweep(ad, exs, progress=False)
        naive = run_sweep(ad, exs, progress=False, naive=True)
        assert [r["layer"] for r in fast.records] == [0] * 4 + [2] * 4  # the running layers' heads
        _assert_same(fast, naive)
        with pytest.raises(GandaError, match="sweep: layer 1 is removed by remove-layers 1"):
            run_sweep(ad, exs, heads=[HeadId(1, 0)], progress=False)
    with KeepLayers([0, 2]).apply(ad):  # the same model reached through another edit
        again = run_sweep(ad, exs, progress=False)
    assert [r["loglik"] for r in again.records] == [r["loglik"] for r in fast.records]
    assert len(ad.decoder_layers()) == 3


def test_outputs_and_mismatch(adapter, tmp_path):
    exs = tiny_examples()
    res = run_sweep(adapter, exs, out_dir=tmp_path, progress=False, config={"task": {"task": "tiny"}})
    for name in ("results.jsonl", "results.csv", "heatmap.png", "progress.jsonl"):
        assert (tmp_path / name).exists()
    again = load_result(tmp_path)
    assert again.records == res.records
    assert res.matrix().shape == (3, 4)
    assert len(res.top(3)) == 3
    with pytest.raises(GandaError, match="different sweep"):
        run_sweep(adapter, exs[:2], out_dir=tmp_path, progress=False, config={"task": {"task": "tiny"}})
    # a finished sweep resumed computes nothing and gives the same result
    assert run_sweep(adapter, exs, out_dir=tmp_path, progress=False, config={"task": {"task": "tiny"}}).records == res.records


def test_each_heads_drops_have_their_paired_interval_in_the_csv_and_its_rows(adapter, tmp_path):
    """A head's accuracy and margin drops come with the paired bootstrap interval over prompts that
    paired_difference gives that head alone, seeded by the run's seed, in results.csv and results.load."""
    import csv

    from ganda.stats import paired_difference

    res = run_sweep(adapter, tiny_examples(), out_dir=tmp_path, progress=False, config={"task": {"task": "tiny"},
                                                                                       "seed": 3})
    cis = res.intervals()
    assert set(cis) == {r["head"] for r in res.records}
    with open(tmp_path / "results.csv", newline="") as f:
        csv_rows = {r["head"]: r for r in csv.DictReader(f)}
    assert csv_rows["none"]["drop_ci_low"] == ""
    widths = []
    for r in res.records:
        for metric, name in (("acc", "drop"), ("acc_norm", "drop_norm"), ("margin", "margin_drop")):
            want = paired_difference(res.per_prompt(res.baseline, metric), res.per_prompt(r, metric), seed=3, name=name)
            got = cis[r["head"]]
            assert [got[f"{name}_ci_low"], got[f"{name}_ci_high"]] == pytest.approx(
                [want[f"{name}_ci_low"], want[f"{name}_ci_high"]], abs=1e-12), (r["head"], name)
            assert want[name] == pytest.approx(res.drop(r, metric), abs=1e-12)
            assert float(csv_rows[r["head"]][f"{name}_ci_high"]) == pytest.approx(got[f"{name}_ci_high"])
            widths.append(got[f"{name}_ci_high"] - got[f"{name}_ci_low"])
        assert res.row(r)["drop_ci_low"] == cis[r["head"]]["drop_ci_low"]
    assert max(widths) > 0.05  # some drop is uncertain on four prompts


@pytest.mark.integration
def test_kill_and_resume(adapter, tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    script = tmp_path / "run.py"
    script.write_text(
        SETUP
        + textwrap.dedent(
            f"""
            import time
            from ganda.sweep import run_sweep
            run_sweep(tiny_adapter(), tiny_examples(), out_dir={str(killed)!r}, progress=False, batch_heads=2,
                      on_head=lambda rec: time.sleep(0.4))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    progress = killed / "progress.jsonl"
    deadline = time.time() + 120
    heads_done = 0
    while time.time() < deadline and proc.poll() is None:
        if progress.exists():
            heads_done = sum(1 for line in progress.read_text().splitlines() if '"type": "head"' in line)
            if heads_done >= 3:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "results.jsonl").exists()
    # simulate a torn last line as well (killed mid-write)
    with progress.open("a") as f:
        f.write('{"type": "head", "head": "L2')
    lines_before = progress.read_text().count("\n")
    assert 3 <= lines_before - 2 < 12

    resumed_heads = []
    resumed = run_sweep(adapter, tiny_examples(), out_dir=killed, progress=False, batch_heads=2,
                        on_head=lambda rec: resumed_heads.append(rec["head"]))
    uninterrupted = run_sweep(adapter, tiny_examples(), out_dir=clean, progress=False, batch_heads=2)
    assert len(resumed_heads) == 12 - (lines_before - 2)  # only the missing heads were computed
    # The killed process computed its heads with its own thread pool, so float sums may differ in the
    # last ulp from this process's; everything else (heads, order, predictions) must be identical.
    _assert_same_up_to_ulp(killed / "results.jsonl", clean / "results.jsonl")
    _assert_same_up_to_ulp(killed / "results.csv", clean / "results.csv")
    assert len(resumed.records) == len(uninterrupted.records) == 12
    for a, b in zip(resumed.records, uninterrupted.records, strict=True):
        assert (a["head"], a["pred"], a["correct"]) == (b["head"], b["pred"], b["correct"])
        assert torch.allclose(torch.tensor(sum(a["loglik"], [])), torch.tensor(sum(b["loglik"], [])), atol=1e-4)
    assert json.loads((killed / "progress.jsonl").read_text().splitlines()[0])["type"] == "header"


def _assert_same_up_to_ulp(a_path, b_path) -> None:
    """Same text once floats are taken out, and floats equal within 1e-4 (thread-order effects only)."""
    import re

    num = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
    a, b = a_path.read_text(), b_path.read_text()
    assert num.sub("#", a) == num.sub("#", b)
    xs, ys = [float(x) for x in num.findall(a)], [float(y) for y in num.findall(b)]
    assert len(xs) == len(ys) > 0
    assert max(abs(x - y) for x, y in zip(xs, ys, strict=True)) < 1e-4


def test_no_resume_starts_over(adapter, tmp_path):
    exs = tiny_examples()[:2]
    run_sweep(adapter, exs, out_dir=tmp_path, progress=False)
    seen = []
    run_sweep(adapter, exs, out_dir=tmp_path, progress=False, resume=False, on_head=lambda r: seen.append(r))
    assert len(seen) == 12


@pytest.mark.slow
def test_smollm2_fast_equals_naive_subset(smollm2):
    from ganda.heads import HeadId
    from ganda.tasks import get_task

    a = smollm2
    exs = get_task("kv", pairs=3).examples(limit=2)
    heads = [HeadId(0, 0), HeadId(16, 3), HeadId(29, 8)]
    fast = run_sweep(a, exs, heads=heads, progress=False)
    naive = run_sweep(a, exs, heads=heads, progress=False, naive=True)
    _assert_same(fast, naive, tol=1e-3)
    assert torch.isfinite(torch.tensor(fast.baseline["loglik"])).all()


def test_cli_unknown_task(capsys):
    from ganda.cli import main

    assert main(["sweep", "smollm2-135m", "--task", "nope"]) == 2
    assert "unknown task" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the batched LM head: one call per example for every head of a batch, on every family with a runner


def _lm_head_calls(monkeypatch) -> list[int]:
    """Record the number of rows of every LM-head call the sweep makes (the adapter's ``unembed``)."""
    calls: list[int] = []
    real = TransformerAdapter.unembed

    def spy(self, hidden):
        calls.append(hidden.shape[0])
        return real(self, hidden)

    monkeypatch.setattr(TransformerAdapter, "unembed", spy)
    return calls


def _sites(p) -> int:
    """Distinct read positions of a packed example (choices that share one read it once)."""
    return len({k for r in p.read for k in r})


@pytest.mark.parametrize("tokens", [1, sweep.FORWARD_TOKENS_CPU])
def test_lm_head_one_call_per_group_and_batch(adapter, monkeypatch, tokens):
    """Examples run ``batching(...).examples`` to a forward (one each when the token budget is 1)."""
    monkeypatch.setenv("GANDA_FORWARD_TOKENS", str(tokens))
    exs = tiny_examples()
    packed = [prepare(adapter, ex) for ex in exs]
    u = [_sites(p) for p in packed]
    assert u[1] == 1 and sum(len(r) for r in packed[1].read) == 2  # both letters read one position
    assert (sum(len(r) for r in packed[0].read), u[0]) == (9, 5)  # ' 13', ' 57', ' 20' share 2 of 3 reads
    g = sweep.batching(packed, [[h for h in adapter.heads() if h.layer == 0]]).examples
    assert (g == 1) == (tokens == 1) and (tokens == 1 or g >= len(exs))
    blocks = [u[i : i + g] for i in range(0, len(u), g)]
    run_sweep(adapter, exs[:1], heads=[HeadId(0, 0)], progress=False)  # a fresh adapter's one-time probe forward
    calls = _lm_head_calls(monkeypatch)
    layer0 = []
    handle = adapter.decoder_layers()[0].register_forward_pre_hook(lambda *_: layer0.append(1))
    try:
        fast = run_sweep(adapter, exs, progress=False)
    finally:
        handle.remove()
    # the intact baseline: the recording pass's own residuals, one call per block of examples; then
    # per layer (4 heads in one batch) one call per block holding all 4 heads' distinct read rows
    assert calls == [sum(b) for b in blocks] + [4 * sum(b) for b in blocks] * 3
    # per block: the recording pass, the layer-0 batch and the intact state's step to layer 1;
    # the baseline runs no layer of its own
    assert len(layer0) == 3 * len(blocks)
    monkeypatch.undo()
    _assert_same(fast, run_sweep(adapter, exs, progress=False, naive=True))


def test_lm_head_split_into_chunks_equals_naive(adapter, monkeypatch):
    """A batch whose read rows exceed the logits bound is split across calls, with the same result."""
    import ganda.sweep as sweep_mod

    exs = tiny_examples()
    naive = run_sweep(adapter, exs, progress=False, naive=True)
    monkeypatch.setattr(sweep_mod, "_LM_HEAD_LOGITS", 3 * 64)  # vocab 64: 3 rows per call
    calls = _lm_head_calls(monkeypatch)
    _assert_same(run_sweep(adapter, exs, progress=False), naive)
    assert max(calls) == 3 and len(calls) > 16


FAMILY_CONFIGS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q/k/v biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),  # q/k norms
    # a window shorter than the packed prompts: the runner scores padded rows instead
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",  # final-logit soft-capping, alternating windows
               {"head_dim": 8, "final_logit_softcapping": 5.0, "sliding_window": 64, "query_pre_attn_scalar": 8}),
}


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_batched_lm_head_equals_naive_on_every_runner_family(family, monkeypatch):
    import transformers

    import ganda

    cfg_name, model_name, extra = FAMILY_CONFIGS[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                          **extra)
    ad = ganda.from_model(getattr(transformers, model_name)(cfg), _ns["CharTok"](), spec=f"tiny-{family}")
    assert ad.skips_layers() and ad.packs_choices(8)
    exs = tiny_examples()[:3]
    calls = _lm_head_calls(monkeypatch)
    fast = run_sweep(ad, exs, progress=False)
    # baseline + 3 layers, one call each where the 3 examples run as one padded packed batch; a
    # window shorter than the prompts runs each example's rows alone
    assert len(calls) == (4 if family != "mistral" else 4 * len(exs))
    monkeypatch.undo()
    _assert_same(fast, run_sweep(ad, exs, progress=False, naive=True))


@pytest.mark.parametrize("raw", ["0", "-5", "1k", "2.5"])
def test_a_bad_token_budget_is_refused_before_any_forward(adapter, monkeypatch, raw):
    monkeypatch.setenv("GANDA_FORWARD_TOKENS", raw)
    with pytest.raises(GandaError, match="GANDA_FORWARD_TOKENS=.* is not a whole number of tokens"):
        run_sweep(adapter, tiny_examples()[:1], progress=False)


def test_examples_per_forward_follows_the_budget(adapter, monkeypatch):
    """Few heads a batch: many examples a forward; a whole layer's heads: fewer (median batch size)."""
    packed = [prepare(adapter, ex) for ex in tiny_examples()]
    width = sum(len(p.tokens) for p in packed) / len(packed)
    monkeypatch.setenv("GANDA_FORWARD_TOKENS", str(math.ceil(8 * width)))
    one, four = [[HeadId(0, 0)]], [[HeadId(0, h) for h in range(4)]]
    assert sweep.batching(packed, [[None], *one * 3]).examples == 8
    assert sweep.batching(packed, [[None], *four * 3, *one]).examples == 2
    assert sweep.batching(packed, four, gpu=True).examples == 2  # the variable sets the GPU's budget too
    monkeypatch.setenv("GANDA_FORWARD_TOKENS", "1")
    assert sweep.batching(packed, four).examples == 1
    monkeypatch.delenv("GANDA_FORWARD_TOKENS")
    assert sweep.forward_tokens() == sweep.FORWARD_TOKENS_CPU < sweep.forward_tokens(gpu=True)
    # a forward holds no more heads than the budget allows once examples are grouped
    assert sweep.Batching(8, 800).heads_per_forward(50, 4) == 2 and sweep.Batching(8, 800).heads_per_forward(200, 4) == 1
    assert sweep.Batching(1, 800).heads_per_forward(200, 4) == 4  # one example a forward: a batch is never split


def test_a_big_batch_among_small_ones_runs_in_several_forwards(adapter, monkeypatch):
    """Examples grouped for batches of one head: a whole layer's batch is split to stay in the budget,
    and the numbers are the naive loop's."""
    exs = tiny_examples()
    packed = [prepare(adapter, ex) for ex in exs]
    width = max(len(p.tokens) for p in packed)
    monkeypatch.setenv("GANDA_FORWARD_TOKENS", str(len(exs) * width))
    heads = [HeadId(0, h) for h in range(4)] + [HeadId(1, 0), HeadId(2, 0)]  # batches of 4, 1 and 1 heads
    assert sweep.batching(packed, [heads[:4], heads[4:5], heads[5:]]).examples >= len(exs)
    run_sweep(adapter, exs[:1], heads=[HeadId(0, 0)], progress=False)  # a fresh adapter's one-time probe forward
    layer0 = []
    handle = adapter.decoder_layers()[0].register_forward_pre_hook(lambda *_: layer0.append(1))
    try:
        fast = run_sweep(adapter, exs, heads=heads, progress=False)
    finally:
        handle.remove()
    assert len(layer0) == 1 + 4 + 1  # the recording pass, layer 0's 4 heads one a forward, the step to layer 1
    monkeypatch.delenv("GANDA_FORWARD_TOKENS")
    _assert_same(fast, run_sweep(adapter, exs, heads=heads, progress=False, naive=True))
