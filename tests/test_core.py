"""Core behaviour on tiny real-architecture models: heads, interventions, tasks, scoring, CLI errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from ganda import AblateHeads, GandaError, HeadId, KeepHeads, KeepLayers, RemoveLayers, mask_last_row, runio
from ganda.heads import expand
from ganda.interventions import apply, parse_layers
from ganda.scoring import encode_pair, score_choices
from ganda.stats import wilson
from ganda.tasks import get_task, token_spans


def ids(tok, text="Memorize the following dictionary:\napple:42\nriver:7\nThe value of the key 'river' is"):
    return torch.tensor([tok(text, add_special_tokens=False).input_ids])


# ---- head ids --------------------------------------------------------------------------------
def test_head_parsing_and_expansion(tiny):
    assert str(HeadId.parse("L17H24")) == "L17H24"
    assert HeadId.parse("L6.attnH3") == HeadId(6, 3, "attn")
    assert expand("L1H0-2,L2H*", tiny) == [HeadId(1, 0), HeadId(1, 1), HeadId(1, 2)] + [HeadId(2, h) for h in range(4)]
    assert len(expand("L*H1", tiny)) == 3
    with pytest.raises(GandaError, match="layer 99 out of range"):
        expand("L99H0", tiny)
    with pytest.raises(GandaError, match="head 4 out of range"):
        expand("L0H4", tiny)
    with pytest.raises(GandaError, match="not a head id"):
        expand("layer3", tiny)


# ---- interventions ---------------------------------------------------------------------------
def test_hook_ablation_equals_weight_column_zeroing_with_gqa(tiny, byte_tok):
    x = ids(byte_tok)
    base = tiny.forward(x)
    with AblateHeads("L1H3,L2H0").apply(tiny):
        hooked = tiny.forward(x)
    attn = tiny.model.model.layers
    saved = [attn[1].self_attn.o_proj.weight.data.clone(), attn[2].self_attn.o_proj.weight.data.clone()]
    hd = tiny.mixer(1).head_dim
    assert tiny.mixer(1).num_heads == 4 and tiny.model.config.num_key_value_heads == 2  # query heads, not KV
    attn[1].self_attn.o_proj.weight.data[:, 3 * hd : 4 * hd] = 0
    attn[2].self_attn.o_proj.weight.data[:, 0:hd] = 0
    zeroed = tiny.forward(x)
    attn[1].self_attn.o_proj.weight.data.copy_(saved[0])
    attn[2].self_attn.o_proj.weight.data.copy_(saved[1])
    assert (hooked - zeroed).abs().max().item() < 1e-6
    assert (hooked - base).abs().max().item() > 1e-4  # the ablation did something


def test_interventions_restore_bit_for_bit_even_on_error(tiny, byte_tok):
    x = ids(byte_tok)
    base = tiny.forward(x)
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    n_layers = len(tiny.decoder_layers())
    with pytest.raises(RuntimeError):
        with apply(tiny, [AblateHeads("L0H1"), KeepLayers([0, 1]), KeepHeads("L0H0")]):
            assert len(tiny.decoder_layers()) == 2
            raise RuntimeError("boom")
    assert len(tiny.decoder_layers()) == n_layers
    assert torch.equal(tiny.forward(x), base)
    assert all(torch.equal(v, state[k]) for k, v in tiny.model.state_dict().items())
    assert all(not m.out_proj._forward_pre_hooks for m in tiny.mixers())


def test_keep_heads_equals_ablating_the_rest(tiny, byte_tok):
    x = ids(byte_tok)
    with KeepHeads("L1H2").apply(tiny):
        a = tiny.forward(x)
    with AblateHeads("L1H0,L1H1,L1H3").apply(tiny):
        b = tiny.forward(x)
    assert torch.equal(a, b)
    with KeepHeads([], layers=[1]).apply(tiny):  # no critical head retained: the layer's attention is zero
        c = tiny.forward(x)
    with AblateHeads("L1H*").apply(tiny):
        d = tiny.forward(x)
    assert torch.equal(c, d)


def test_layer_interventions(tiny, byte_tok):
    x = ids(byte_tok)
    with RemoveLayers([1]).apply(tiny):
        removed = tiny.forward(x)
    with KeepLayers([0, 2]).apply(tiny):
        kept = tiny.forward(x)
    assert torch.equal(removed, kept)
    # by hand: run layer 0 and 2 only
    m = tiny.model.model
    layers = m.layers
    m.layers = torch.nn.ModuleList([layers[0], layers[2]])
    ref = tiny.model(input_ids=x, use_cache=False).logits
    m.layers = layers
    assert torch.equal(removed, ref)
    assert parse_layers("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(GandaError):
        with RemoveLayers([7]).apply(tiny):
            pass


def test_mask_last_row_changes_only_the_last_position(tiny, byte_tok):
    x = ids(byte_tok)
    base = tiny.forward(x)
    with mask_last_row("L*H*").apply(tiny):
        masked = tiny.forward(x)
    assert torch.equal(masked[0, :-1], base[0, :-1])
    assert (masked[0, -1] - base[0, -1]).abs().max().item() > 1e-4


# ---- tasks -----------------------------------------------------------------------------------
def test_kv_task_format_and_segments(byte_tok):
    t = get_task("kv", pairs=5)
    ex = t.examples(limit=3, seed=7)[1]
    assert ex.prompt.startswith("Memorize the following dictionary:\n")
    assert ex.prompt.endswith(f"The value of the key '{ex.meta['key']}' is")
    lines = ex.prompt.split("\n")[1:6]
    assert [s for s in lines] == [ex.prompt[a:b - 1] for a, b in ex.segments]
    assert ex.choices[ex.gold] == f" {ex.meta['value']}"
    assert ex.prompt[slice(*ex.segments[ex.gold_segment])] == f"{ex.meta['key']}:{ex.meta['value']}\n"
    assert t.examples(limit=3, seed=7)[1] == ex  # seeded
    assert t.examples(limit=3, seed=8)[1] != ex
    enc = byte_tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
    spans = token_spans(enc.offset_mapping, ex.segments)
    toks = byte_tok.convert_ids_to_tokens(enc.input_ids)
    assert all(toks[e].endswith("Ċ") for _, e in spans)  # the summary token is the newline


def test_letters_task_format():
    ex = get_task("letters", options=5, words=3).examples(limit=1, seed=3)[0]
    assert ex.prompt.endswith("Answer:")
    assert ex.choices == [" A", " B", " C", " D", " E"]
    target = ex.meta["options"][ex.gold]
    assert f'Which option is "{target}"?' in ex.prompt
    assert ex.prompt[slice(*ex.segments[ex.gold])] == f"{'ABCDE'[ex.gold]}. {target}\n"
    assert all(len(o.split()) == 3 for o in ex.meta["options"])


def test_mmlu_prompt_equals_lm_eval_template():
    ex = get_task("mmlu", subjects="abstract_algebra").examples()[0]
    expected = (
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
        "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
    )
    assert ex.prompt == expected and ex.gold == 1 and ex.choices == [" A", " B", " C", " D"]
    assert ex.prompt[slice(*ex.segments[1])] == "B. 4\n"
    five = get_task("mmlu", subjects="abstract_algebra", shots=5).examples()[0]
    assert five.prompt.count("Answer:") == 6 and five.prompt.endswith(expected.split("\n\n", 1)[1])
    assert "\nAnswer: A\n\n" in five.prompt or "\nAnswer: B\n\n" in five.prompt
    assert len(get_task("mmlu", sample=True).examples(limit=50, seed=1)) == 50  # --sample: 50 in all
    with pytest.raises(GandaError, match="unknown MMLU subject"):
        get_task("mmlu", subjects="astrology")


# ---- scoring ---------------------------------------------------------------------------------
def test_encode_pair_moves_trailing_space(byte_tok, tiny):
    ctx, cont = encode_pair(tiny, "Answer: ", "A")
    ctx2, cont2 = encode_pair(tiny, "Answer:", " A")
    assert ctx == ctx2 and cont == cont2


def test_multi_token_choices_sum_every_token(tiny, byte_tok):
    ctx = "The value of the key 'river' is"
    sc = score_choices(tiny, ctx, [" 42", " 7"])
    full = byte_tok(ctx + " 42", add_special_tokens=False).input_ids
    n_ctx = len(byte_tok(ctx, add_special_tokens=False).input_ids)
    assert len(full) - n_ctx >= 2  # a multi-token value
    logp = torch.log_softmax(tiny.forward(torch.tensor([full]))[0].detach().float(), -1)
    manual = sum(float(logp[i - 1, full[i]]) for i in range(n_ctx, len(full)))
    assert sc.loglik[0] == pytest.approx(manual, abs=1e-4)


def test_by_answer_splits_accuracy_by_gold_letter():
    from ganda.experiments.roles import answers_lost
    from ganda.scoring import answers_text, by_answer

    preds = [{"gold": 0, "pred": 0, "correct": True}, {"gold": 0, "pred": 2, "correct": False},
             {"gold": 1, "pred": 2, "correct": False}, {"gold": 2, "pred": 2, "correct": True}]
    rows = by_answer(preds)
    assert [r["answer"] for r in rows] == ["A", "B", "C"]
    assert [r["n"] for r in rows] == [2, 1, 1]
    assert [r["accuracy"] for r in rows] == [0.5, 0.0, 1.0]
    assert [r["predicted"] for r in rows] == [0.25, 0.0, 0.75]
    assert answers_text(rows) == "by gold answer A 50% B 0% C 100%; predicted A 25% B 0% C 75%"
    # a letter that is never the gold answer has no accuracy, but can be predicted
    rows = by_answer([{"gold": 0, "pred": 3, "correct": False}])
    assert [r["accuracy"] for r in rows] == [0.0, None, None, None] and rows[3]["predicted"] == 1.0
    # the letters a head serves: those whose accuracy falls by half or more when it is ablated
    assert answers_lost({"A": 1.0, "B": 0.9, "C": 1.0}, {"A": 0.0, "B": 0.5, "C": None}) == ["A"]
    assert answers_lost({"A": 1.0, "B": 0.9}, {"A": 0.4, "B": 0.41}, drop=0.5) == ["A"]


def test_wilson_interval():
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


# ---- CLI: bad inputs exit non-zero with one clear line ---------------------------------------
def run_cli(*args):
    """The real process (``python -m ganda``): for the tests that must see one."""
    return subprocess.run([sys.executable, "-m", "ganda", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def cli(capfd):
    """``ganda ARGS`` in this process (``ganda.cli.main``): the same exit code, stdout and stderr as the
    entry point, which tests/test_cli_bad_inputs.py checks against the real process."""
    from types import SimpleNamespace

    from ganda.cli import main

    def run(*args: str) -> SimpleNamespace:
        capfd.readouterr()
        code = main([str(a) for a in args])
        out, err = capfd.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


@pytest.mark.parametrize("which, message", [("missing", "no such model"), ("text", "is not a model"), ("gguf", "not a GGUF")])
def test_cli_bad_model_paths(which, message, tmp_path, cli):
    path = tmp_path / {"missing": "nope", "text": "notes.txt", "gguf": "fake.gguf"}[which]
    if which != "missing":
        path.write_text("hello")
    r = cli("eval", str(path))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_errors_on_real_directories(tiny_dir, tmp_path, cli):
    r = cli("eval", str(tiny_dir), "--ablate", "L99H0", "--limit", "1")
    assert r.returncode == 2 and "layer 99 out of range" in r.stderr and "Traceback" not in r.stderr
    r = cli("eval", str(tiny_dir), "--task", "kv", "--pairs", "40", "--limit", "1")  # ctx is 128 tokens
    assert r.returncode == 2 and "longer than the model's context of 128" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("eval", str(tiny_dir), "--limit", "2", "--pairs", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"task", "model", "n", "accuracy", "ci_low", "ci_high", "interventions"} <= set(out) and out["n"] == 2
    ans = out["by_answer"]  # the accuracy split by gold answer adds back up to the total
    assert sum(x["n"] for x in ans) == 2 and sum(x["predicted"] for x in ans) == pytest.approx(1.0)
    assert sum(round(x["accuracy"] * x["n"]) for x in ans if x["n"]) == out["correct"]
    # an architecture ganda does not support
    from transformers import GPT2Config, GPT2LMHeadModel

    gdir = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(gdir)
    r = cli("info", str(gdir))
    assert r.returncode == 2 and "unsupported architecture 'gpt2'" in r.stderr and "Llama" in r.stderr
    # pickle weights are refused
    pdir = tmp_path / "pickled"
    pdir.mkdir()
    (pdir / "config.json").write_text((tiny_dir / "config.json").read_text())
    (pdir / "pytorch_model.bin").write_bytes(b"x")
    r = cli("info", str(pdir))
    assert r.returncode == 2 and "pickle" in r.stderr


def test_parse_options_types_and_errors():
    from ganda.commands.options import parse_options

    # text by key; whatever takes an option reads it as the type it declares
    assert parse_options(["cot=true", "subtask=date_understanding", "pairs=10", "frac=0.5", "match=no"]) == {
        "cot": "true", "subtask": "date_understanding", "pairs": "10", "frac": "0.5", "match": "no"}
    assert parse_options(["data-dir=/x"]) == {"data_dir": "/x"}
    with pytest.raises(GandaError, match="KEY=VALUE"):
        parse_options(["cot"])
    # ``ganda extends`` names each option's task first
    assert parse_options(["bbh.cot=false", "gsm8k-cot.shots=4", "bbh.max-new-tokens=3"], per_task=True) == {
        "bbh": {"cot": "false", "max_new_tokens": "3"}, "gsm8k-cot": {"shots": "4"}}
    for bad in (["cot=false"], [".cot=false"], ["bbh.=1"], ["bbh.cot"]):
        with pytest.raises(GandaError, match=r"TASK\.KEY=VALUE"):
            parse_options(bad, per_task=True)


def test_option_text_is_read_as_each_option_declares_it():
    """``--option`` text is read one way, for an experiment's options and a task's: a layer list
    that looks like a number stays text, ``1``/``0`` are a switch's true/false, numbers become
    numbers, and what fits no declared type is one line naming the type."""
    from ganda.attribution.ranking import RankOptions
    from ganda.commands.options import parse_options
    from ganda.sweep import SweepOptions
    from ganda.tasks import get_task

    rank = RankOptions.build(parse_options(["verify_layers=1", "verify_top=7", "threshold=0.25"]), text=True)
    assert (rank.verify_layers, rank.verify_top, rank.threshold) == ("1", 7, 0.25)
    assert SweepOptions.build(parse_options(["naive=1"]), text=True).naive is True
    assert SweepOptions.build(parse_options(["naive=off"]), text=True).naive is False
    task = get_task("gsm8k", **parse_options(["cot=1", "shots=2"]))
    assert (task.cot, task.shots) == (True, 2)
    with pytest.raises(GandaError, match="verify_top must be an integer, not 'seven'"):
        RankOptions.build(parse_options(["verify_top=seven"]), text=True)
    with pytest.raises(GandaError, match="naive must be true or false, not 'maybe'"):
        SweepOptions.build(parse_options(["naive=maybe"]), text=True)
    with pytest.raises(GandaError, match="must be true or false, not '1'"):  # a grid spec's JSON is typed: no text reading
        SweepOptions.build({"naive": "1"})
    # a list of text takes one --option as one item; a list or a path of another type is one line
    from ganda import registry

    extends, attn = registry.experiment("extends").Options, registry.experiment("attn").Options
    got = extends.build({"heads": "L0H0", "task": "lab-kv", **parse_options(["task_option=lab-kv.pairs=4"])}, text=True)
    assert got.task_option == ["lab-kv.pairs=4"]
    for bad in (5, ["a", 3]):
        with pytest.raises(GandaError, match="task_option must be a list of text"):
            extends.build({"heads": "L0H0", "task_option": bad})
    with pytest.raises(GandaError, match="out must be a path, not 5"):
        attn.build({"out": 5})


def test_cli_eval_knowledge_task_with_options(tiny_dir, cli):
    """Knowledge tasks (Winogrande's per-option contexts included) run through ``ganda eval``,
    and ``--option`` reaches the task (an unknown option is a clear error)."""
    r = cli("eval", str(tiny_dir), "--task", "winogrande", "--limit", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["task"] == "winogrande" and out["n"] == 3 and 0.0 <= out["accuracy"] <= 1.0
    r = cli("eval", str(tiny_dir), "--task", "bbh", "--option", "subtask=no_such_task", "--limit", "1")
    assert r.returncode == 2 and "unknown BBH subtask 'no_such_task'" in r.stderr
    r = cli("eval", str(tiny_dir), "--task", "kv", "--option", "bogus=1", "--limit", "1")
    assert r.returncode == 2 and "bogus" in r.stderr


@pytest.mark.slow  # a whole demo run (the slow tier holds the demo's runs)
def test_attn_heads_and_demo_end_to_end(tiny_dir, tmp_path, cli):
    png = tmp_path / "fig.png"
    r = cli("attn", str(tiny_dir), "--task", "kv", "--pairs", "3", "--heads", "L0H1,L2H3", "--out", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "heads"
    r = cli("heads", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "2", "--verify-n", "4", "--top", "2",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "result.json").read_text())
    assert len(res["all_heads"]) == 12 and len(res["summary"]["top_aggregate"]) == 2
    assert all(0.0 <= h["gather"] <= 1.0 and -1.0 <= h["aggregate"] <= 1.0 for h in res["all_heads"])
    assert (out / "heads.csv").read_text().count("\n") == 13
    assert "gather [evidence]" in r.stdout and "agg peak [95% CI]" in r.stdout  # headers, not rich markup
    from ganda.demo import run_demo

    report = run_demo(str(tiny_dir), tmp_path / "demo", pairs=3, n=2, verify_n=4, top=1, max_heads=2, rank_n=4,
                      prompt_sets=1)
    html = report.read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    demo = json.loads((tmp_path / "demo" / "result.json").read_text())
    assert demo["kind"] == "demo" and demo["rows"][0]["condition"] == "intact"
    assert 1 <= len(demo["cumulative_ablation"]) <= 2
    # ranked causally: every head of layers 0-1 and the top 20 verified exactly (12 heads: all of them)
    s = demo["summary"]
    assert s["verified"] == 12 and s["n_heads"] == 12 and len(demo["heads"]) == 12
    ranks = [h for h in demo["heads"] if h["exact"] is not None]
    assert [h["exact"] for h in ranks] == sorted((h["exact"] for h in ranks), reverse=True)  # one signed effect
    assert all(h["role"] in ("gather", "aggregate", "neither") for h in demo["heads"])
    for r in demo["rows"][1:]:
        assert r["drop"] == pytest.approx(demo["rows"][0]["accuracy"] - r["accuracy"])
        assert r["drop_ci_low"] <= r["drop"] <= r["drop_ci_high"]
    assert s["finding"] and s["finding"].replace("**", "<b>", 1).split("<b>")[0] in html
    assert (tmp_path / "demo" / "ga_heads.json").exists() and (tmp_path / "demo" / "ranking" / "ranking.csv").exists()
    assert "<figcaption>scatter.png</figcaption>" in html and "<figcaption>verify_heatmap.png</figcaption>" in html


def test_discover_drops_equal_the_plain_ablation_loop(tiny):
    """``discover`` verifies candidates through the sweep engine; its numbers must be exactly
    what ``evaluate_examples`` under ``AblateHeads([head])`` gives for every verified head."""
    from ganda.experiments.heads import discover
    from ganda.scoring import evaluate_examples
    from ganda.tasks import get_task

    task = get_task("kv", pairs=3)
    d = discover(tiny, task.examples(limit=2, seed=0), task.examples(limit=6, seed=1), top=3, progress=False)
    verify = task.examples(limit=6, seed=1)
    base = evaluate_examples(tiny, verify, progress=False).accuracy
    assert d.baseline_accuracy == base
    checked = [s for s in d.scores if s.drop is not None]
    assert 3 <= len(checked) <= 6
    for s in checked:
        acc = evaluate_examples(tiny, verify, [AblateHeads([s.head])], progress=False).accuracy
        assert s.ablated_accuracy == acc and s.drop == pytest.approx(base - acc)


@pytest.mark.integration
@pytest.mark.usefixtures("lab_checkpoints")
def test_shipped_lab_checkpoints_load_by_name_and_sweep_from_the_cli(tmp_path):
    """``lab-llama`` is a model spec like ``smollm2-135m``; ``ganda sweep`` takes lab tasks."""
    import ganda
    from ganda_lab.analysis import model_world

    ad = ganda.load_model("lab-llama", device="cpu")
    assert ad.spec == "lab-llama" and ad.num_layers == 3 and model_world(ad)["n_entities"] == 200
    r = run_cli("sweep", "lab-llama", "--task", "lab-mmlu", "--limit", "24", "--heads", "L1H1,L2H3", "--out",
                str(tmp_path / "sw"))
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "sw" / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 4 and rows[1].startswith("none,") and rows[2].startswith("L1H1,")
    assert float(rows[2].split(",")[8]) > 0.15  # L1H1 carries lab-mmlu (docs/lab.md: 91.5% -> 59.5%)
    # its drops with their paired intervals: on 24 prompts L1H1's margin drop is told from 0, its
    # accuracy drop (+0.167 [-0.042, 0.375]) is not
    assert "acc drop [paired 95% CI]" in r.stdout and "margin drop [paired 95% CI]" in r.stdout
    cells = [float(v) for v in rows[2].split(",")[8:]]
    drop, margin_drop, (low, high), (m_low, m_high) = cells[0], cells[5], cells[6:8], cells[10:12]
    assert low < 0 < drop < high and 0 < m_low < margin_drop < m_high
    from ganda.experiments.head_effects import HeadSweepResult

    headline = HeadSweepResult.read(tmp_path / "sw").headline()  # the report's
    assert "**L1H1**; ablating it alone costs 16.7 points [-4.2, 37.5] of 79.2% on 24 prompts (*weak*" in headline
    # ganda rank verifies with the sweep's engine: the same drops and the same intervals
    r = run_cli("rank", "lab-llama", "--task", "lab-mmlu", "--limit", "24", "--out", str(tmp_path / "rk"))
    assert r.returncode == 0, r.stderr
    assert "margin drop [paired 95% CI]" in r.stdout
    assert re.search(r"L1H1 .* \+3\.3377 \[1\.579, 4\.977\] .* \+0\.1667 \[-0\.042, 0\.375\]", r.stdout), r.stdout
    # both also write the result.json every run directory holds: kind, options, summary and every
    # head's row with its intervals, what the reader makes of the engine's own files
    from ganda.experiments import read_run

    sw, rk = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("sw", "rk"))
    assert sw["kind"] == "sweep" and sw["model"] == "lab-llama" and sw["config"]["options"]["heads"] == "L1H1,L2H3"
    assert sw["summary"]["top_head"] == "L1H1" and [r["head"] for r in sw["rows"]] == ["L1H1", "L2H3"]
    assert (sw["rows"][0]["drop_ci_low"], sw["rows"][0]["margin_drop_ci_high"]) == pytest.approx((low, m_high), abs=1e-5)
    ranking = json.loads((tmp_path / "rk" / "ranking.json").read_text())
    assert rk["kind"] == "rank" and rk["rows"] == ranking["ranking"] and rk["summary"]["top_exact_ci_low"] is not None
    for d, written in (("sw", sw), ("rk", rk)):
        assert runio.rounded(read_run(tmp_path / d).summary) == runio.rounded(written["summary"])
        (tmp_path / d / "result.json").unlink()  # a run directory of the format before result.json
        assert runio.rounded(read_run(tmp_path / d).summary) == runio.rounded(written["summary"])
    r = run_cli("info", "lab-nope")
    assert r.returncode == 2 and "shipped lab checkpoint" in r.stderr
