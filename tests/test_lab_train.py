"""Lab training: the CI smoke run learns, resume is exact, the CLI works, shipped checkpoints load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ganda_lab import checkpoint, shipped
from ganda_lab.train import train

MICRO = {
    "arch": "llama",
    "name": "micro",
    "model": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2},
    "world": {"n_entities": 8, "n_novel": 20},
    "train": {"steps": 4, "batch_size": 4, "eval_every": 100, "eval_n": 4, "ckpt_every": 2},
}


@pytest.mark.integration
def test_smoke_training_learns(tmp_path):
    rec = train("smoke", tmp_path / "m", progress=False, log=lambda *_: None)
    last = rec["history"][-1]
    assert last["loss"] < rec["first_loss"] * 0.5
    assert last["knowledge"] > 0.45  # chance is 0.25
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert json.loads((tmp_path / "m" / "lab.json").read_text())["params"] == rec["params"]


def test_resume_continues_the_same_run(tmp_path):
    from safetensors.torch import load_file

    train(MICRO, tmp_path / "a", progress=False, log=lambda *_: None)
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "checkpoint", tmp_path / "b" / "checkpoint")  # the step-2 checkpoint
    train(MICRO, tmp_path / "b", resume=True, progress=False, log=lambda *_: None)
    wa, wb = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k  # bit for bit: a resumed run is the same run


def test_quick_evaluation_interval_leaves_the_weights_unchanged(tmp_path):
    """``--eval-every`` (``ganda lab --from-scratch`` evaluates less often to save time) changes
    the logged history only: the same config gives bit-identical weights."""
    from safetensors.torch import load_file

    cfg = {**MICRO, "train": {**MICRO["train"], "steps": 6}}
    often = train(cfg, tmp_path / "often", eval_every=1, progress=False, log=lambda *_: None)
    rarely = train(cfg, tmp_path / "rarely", eval_every=1000, progress=False, log=lambda *_: None)
    assert [h["step"] for h in often["history"]] == [1, 2, 3, 4, 5, 6]
    assert [h["step"] for h in rarely["history"]] == [6]  # the final evaluation always runs
    wa, wb = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("often", "rarely"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_trained_dir_loads_in_ganda(tmp_path):
    import ganda
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task

    train(MICRO, tmp_path / "m", progress=False, log=lambda *_: None)
    adapter = ganda.load_model(str(tmp_path / "m"))
    assert adapter.num_layers == 1
    r = evaluate(adapter, get_task("lab-mmlu", adapter=adapter), limit=3, progress=False)  # its world
    assert r.n == 3
    with ganda.AblateHeads("L0H1").apply(adapter):
        evaluate(adapter, get_task("lab-kv", adapter=adapter), limit=2, progress=False)


def test_cli_train(tmp_path, capsys):
    from ganda.cli import main

    cfg = tmp_path / "micro.json"
    cfg.write_text(json.dumps(MICRO))
    assert main(["train", str(cfg), "--out", str(tmp_path / "m"), "--steps", "2", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["params"] > 0 and (tmp_path / "m" / "config.json").exists()
    assert main(["train", "no-such-config", "--out", str(tmp_path / "x")]) == 2


@pytest.mark.parametrize("name", shipped())
def test_shipped_checkpoint_hits_its_accuracy(name):
    import ganda
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task

    path = checkpoint(name)
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    assert size < 6_000_000
    adapter = ganda.load_model(str(path))
    expected = json.loads((path / "lab.json").read_text())["eval"]
    for task in ("lab-mmlu", "lab-letters") if "lab-mmlu" in expected else ("lab-kv",):  # the KV pair: KV only
        r = evaluate(adapter, get_task(task, adapter=adapter), limit=60, seed=7, progress=False)
        assert r.accuracy >= expected[task]["accuracy"] - 0.12, (task, r.accuracy)


def test_distill_builds_an_aligned_ssm(tmp_path):
    import ganda
    from ganda_lab.distill import distill, teacher_states

    micro = {**MICRO, "model": {**MICRO["model"], "num_hidden_layers": 2}}
    train(micro, tmp_path / "t", progress=False, log=lambda *_: None)
    rec = distill(tmp_path / "t", tmp_path / "s", steps=4, eval_every=4, eval_n=4, batch_size=4,
                  progress=False, log=lambda *_: None)
    assert rec["history"][-1]["step"] == 4
    student = ganda.load_model(str(tmp_path / "s"))
    teacher = ganda.load_model(str(tmp_path / "t"))
    assert student.num_layers == teacher.num_layers == 2
    assert all(m.kind == "ssm" for m in student.mixers())
    # frozen parts are the teacher's
    assert torch.equal(student.model.model.embed_tokens.weight, teacher.model.model.embed_tokens.weight)
    hs = teacher_states(teacher.model, torch.tensor([[5, 6, 7]]))
    assert len(hs) == 3


def test_grow_stacks_frozen_base_blocks_under_new_ones(tmp_path):
    """Block expansion: the grown model starts as the base exactly, trains only its new blocks,
    and its first layers stay the base's, weight for weight (pruning it back gives the base)."""
    import ganda
    from ganda.errors import GandaError
    from ganda_lab.grow import expand_blocks, grow

    micro = {**MICRO, "model": {**MICRO["model"], "num_hidden_layers": 2}}
    train(micro, tmp_path / "b", progress=False, log=lambda *_: None)
    base = ganda.load_model(str(tmp_path / "b"))
    ids = torch.tensor([[2, 5, 9, 14, 30, 31]])
    fresh = expand_blocks(base.model, 2)
    assert fresh.config.num_hidden_layers == 4
    assert [n for n, p in fresh.named_parameters() if p.requires_grad] and all(
        n.startswith(("model.layers.2.", "model.layers.3.")) for n, p in fresh.named_parameters() if p.requires_grad)
    with torch.no_grad():  # zeroed output projections: the grown model is the base at the start
        assert torch.equal(fresh(ids).logits, base.model(ids).logits)
    rec = grow(tmp_path / "b", tmp_path / "g", layers=1, steps=3, eval_every=3, eval_n=4, batch_size=4,
               unasked=["pet"], progress=False, log=lambda *_: None)
    assert rec["config"]["base_layers"] == 2 and rec["world"]["unasked_relations"] == ["pet"]
    assert set(rec["history"][-1]["exit2"]) == {"knowledge_asked", "knowledge_unasked", "mmlu"}
    grown = ganda.load_model(str(tmp_path / "g"))
    assert grown.num_layers == 3
    a, b = grown.model.state_dict(), base.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)  # the base's every tensor, untouched
    assert a["model.layers.2.mlp.down_proj.weight"].abs().sum() > 0  # the new block trained
    from ganda.interventions import truncate

    with torch.no_grad(), truncate(2).apply(grown):
        assert torch.equal(grown.model(ids).logits, base.model(ids).logits)
    with pytest.raises(GandaError, match="Llama"):
        expand_blocks(ganda.load_model(str(checkpoint("lab-kv-mamba2"))).model, 1)


def test_cli_grow_refuses_what_it_cannot_grow(tmp_path, capsys):
    from ganda.cli import main

    assert main(["grow", str(tmp_path / "missing"), "--out", str(tmp_path / "g")]) == 2
    assert "neither a model directory nor a shipped lab checkpoint" in capsys.readouterr().err
    plain = tmp_path / "plain"  # a Llama directory without a lab world
    shutil.copytree(checkpoint("lab-llama-h1"), plain)
    (plain / "lab.json").unlink()
    assert main(["grow", str(plain), "--out", str(tmp_path / "g"), "--quiet"]) == 2
    assert "not a lab model" in capsys.readouterr().err
    assert main(["grow", "lab-kv-mamba2", "--out", str(tmp_path / "g"), "--quiet"]) == 2
    assert "block expansion needs a Llama model" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_export_checkpoint(tmp_path):
    import ganda
    from ganda_lab.train import export_checkpoint

    train(MICRO, tmp_path / "a", progress=False, log=lambda *_: None)
    rec = export_checkpoint(tmp_path / "a", tmp_path / "e")
    assert rec["steps"] == 2 and rec["exported_from_checkpoint"]
    assert ganda.load_model(str(tmp_path / "e")).num_layers == 1


@pytest.mark.parametrize("arch", ["llama", "mamba2"])
def test_length_buckets_give_the_whole_batch_gradient(arch):
    """Bucketing a batch by length cuts padding; the summed, once-normalised loss must give the
    gradient of the whole padded batch (right padding never reaches a real token)."""
    from ganda_lab.configs import build_model, resolve_config
    from ganda_lab.tokenizer import build_tokenizer
    from ganda_lab.train import bucket_batch, lm_loss, lm_loss_parts, make_batch
    from ganda_lab.world import World, WorldConfig

    model = ({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 2} if arch == "llama" else
             {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "state_size": 8,
              "expand": 2, "n_groups": 1, "chunk_size": 8})
    cfg = resolve_config({"arch": arch, "model": model, "world": {"distractors": "hard", "n_values": 36},
                          "train": {"batch_size": 12, "answer_weight": 5.0, "kv_queries": [1, 3],
                                    "mixture": {"statement": 1, "drill": 1, "kv": 1, "mmlu": 1}}})
    world = World(WorldConfig.from_json(cfg["world"]))
    tok = build_tokenizer(world)
    torch.manual_seed(0)
    m = build_model(cfg, tok)
    batch = make_batch(world, tok, cfg["train"], 0, 1)
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < lengths.max()  # something to bucket
    lm_loss(m, batch).backward()
    full = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    parts = bucket_batch(batch, 3)
    assert len(parts) == 3 and sum(p["input_ids"].shape[0] for p in parts) == 12
    assert sum(p["input_ids"].numel() for p in parts) < batch["input_ids"].numel()  # less padding
    weight = sum(lm_loss_parts(m, p)[1] for p in parts)
    for p in parts:
        (lm_loss_parts(m, p)[0] / weight).backward()
    for n, g in full.items():
        torch.testing.assert_close(dict(m.named_parameters())[n].grad, g, atol=1e-6, rtol=1e-4, msg=n)


def test_learning_rate_schedules():
    from ganda_lab.train import _lr

    cfg = {"lr": 1.0, "warmup": 10, "steps": 110, "min_lr_frac": 0.1}
    assert _lr(0, cfg) == pytest.approx(0.1)  # warm-up is linear from 1/warmup
    cos = {**cfg, "schedule": "cosine"}
    assert _lr(60, cos) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    assert _lr(110, cos) == pytest.approx(0.1)
    wsd = {**cfg, "schedule": "wsd", "decay_frac": 0.2}  # decay starts at step 88
    assert _lr(60, wsd) == 1.0 and _lr(88, wsd) == 1.0
    assert _lr(99, wsd) == pytest.approx(1 - 0.9 * 0.5)
    assert _lr(110, wsd) == pytest.approx(0.1)


def test_anneal_follows_the_planned_curve_then_falls_linearly():
    """``anneal_from`` cuts a planned run short: until then the rate is exactly the planned run's
    (so the trajectory is that run's, bit for bit), then it falls linearly to the floor."""
    from ganda_lab.train import _lr

    planned = {"lr": 1.0, "warmup": 10, "steps": 1000, "min_lr_frac": 0.1, "schedule": "cosine"}
    cut = {**planned, "steps": 700, "schedule_steps": 1000, "anneal_from": 600}
    assert all(_lr(s, cut) == _lr(s, planned) for s in range(600))
    top = _lr(600, planned)
    assert 0.4 < top < 0.43 and _lr(600, cut) == top  # 0.1 + 0.9 * (1 + cos(pi * 590 / 990)) / 2
    assert _lr(650, cut) == pytest.approx((top + 0.1) / 2)
    assert _lr(699, cut) == pytest.approx(0.1 + (top - 0.1) / 100)
    wsd = {**planned, "schedule": "wsd", "decay_frac": 0.2}  # the same as a shorter WSD run with a shorter decay
    short = {**wsd, "steps": 700, "schedule_steps": 1000, "anneal_from": 600}
    same = {**wsd, "steps": 700, "decay_frac": 1 / 7}
    assert all(_lr(s, short) == pytest.approx(_lr(s, same), abs=1e-12) for s in range(700))


GOLDEN_BATCHES = {  # sha256 (first 16 hex) of steps 0, 1, 2, 777, 5001, as the shipped checkpoints were trained on
    "llama-h1": "e7ea01311426ce8f", "mamba2": "a83b1306a010868d", "hybrid-late": "56f1ed109cd19273",
    "kv-llama": "0f72268d21b3187c", "kv-mamba2": "13317acd88818a34",
}


@pytest.mark.parametrize("config", sorted(GOLDEN_BATCHES))
def test_training_batches_are_the_ones_the_shipped_models_saw(config):
    """Any change to how batches are built (tokenising, padding, sampling options or copy runs)
    must leave every tensor the same, or the shipped checkpoints no longer retrain bit for bit."""
    import hashlib

    from ganda_lab import train as T
    from ganda_lab.configs import resolve_config
    from ganda_lab.tokenizer import build_tokenizer
    from ganda_lab.world import World, WorldConfig

    cfg = resolve_config(config)
    tr = cfg["train"]
    world = World(WorldConfig.from_json(cfg["world"]))
    tok = build_tokenizer(world)
    h = hashlib.sha256()
    for s in (0, 1, 2, 777, 5001):
        b = T.make_batch(world, tok, tr, tr["seed"], s)
        for k in sorted(b):
            h.update(f"{k}{b[k].dtype}{tuple(b[k].shape)}".encode())
            h.update(b[k].contiguous().numpy().tobytes())
    assert h.hexdigest()[:16] == GOLDEN_BATCHES[config]


def test_token_ids_fast_path_matches_the_backend_and_defers_what_it_cannot_vouch_for():
    from ganda_lab import train as T
    from ganda_lab.tokenizer import build_tokenizer
    from ganda_lab.world import World

    world = World()
    tok = build_tokenizer(world)
    enc = T._word_level_encoder(tok)
    assert enc is not None
    w = world.words[40]
    texts = [f"The home of {world.entities[0]} is red hill.", "Answer: A", f"A. {w}\nB. {w}\n", f"'{world.novel[0]}':3\n", "?:.",
             " " + w, ""]
    for t in texts:
        assert enc(t) == tuple(tok.backend_tokenizer.encode(t, add_special_tokens=False).ids), t
        assert T.token_ids(tok, t) == tuple(tok(t, add_special_tokens=False).input_ids), t
    # left to the backend: special tokens' text, spaces the split leaves over, unknown words
    for t in ["<bos> hill", "red  hill", "red hill ", "tab\there", "zzzqqq"]:
        assert enc(t) is None, t
        assert T.token_ids(tok, t) == tuple(tok(t, add_special_tokens=False).input_ids), t
    assert T._word_level_encoder(_other_tokenizer()) is None  # another pre-tokenizer: no fast path


def _other_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "a": 1}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")


@pytest.mark.parametrize("name,heads,layers,steps,params,wd", [
    ("E1", 2, 4, 6000, 284288, 0.01), ("E2", 2, 4, 9000, 284288, 0.01), ("E3", 4, 3, 10000, 230912, 0.01),
    ("E4", 2, 4, 13000, 284288, 0.01), ("E5", 2, 3, 10000, 230912, 0.01), ("E6", 2, 4, 11000, 284288, 0.01),
    ("F1", 4, 6, 6000, 391040, 0.01), ("F2", 2, 6, 6000, 391040, 0.01),
    ("E3w", 4, 3, 10000, 230912, 0.0), ("E3d", 4, 3, 10000, 230912, 0.1), ("E6w", 2, 4, 11000, 284288, 0.0),
    ("E6d", 2, 4, 11000, 284288, 0.1), ("E6d3", 2, 4, 11000, 284288, 0.3), ("E4d", 2, 4, 13000, 284288, 0.1)])
def test_finding1_run_configs_resolve(name, heads, layers, steps, params, wd):
    """docs/lab.md's finding-1 table quotes these configs: they must still build the models it lists."""
    from ganda_lab.configs import build_model, resolve_config
    from ganda_lab.tokenizer import build_tokenizer
    from ganda_lab.train import n_params
    from ganda_lab.world import World, WorldConfig

    cfg = resolve_config(str(Path(__file__).parents[1] / "docs" / "lab-runs" / "finding1" / f"{name}.json"))
    assert cfg["arch"] == "llama" and cfg["world"] == {"distractors": "hard", "n_values": 36}
    assert (cfg["model"]["num_attention_heads"], cfg["model"]["num_hidden_layers"]) == (heads, layers)
    assert cfg["train"]["steps"] == steps and cfg["train"]["seed"] == 0
    assert cfg["train"]["weight_decay"] == wd and cfg["name"] == name
    torch.manual_seed(0)
    model = build_model(cfg, build_tokenizer(World(WorldConfig(**cfg["world"]))))
    assert n_params(model) == params  # the count `ganda train` records in lab.json


def test_config_base_overrides_key_by_key():
    """A variant names a base and only what it changes; a new mixture replaces the base's whole."""
    from ganda.errors import GandaError
    from ganda_lab.configs import CONFIGS, resolve_config

    cfg = resolve_config({"base": "llama", "name": "v", "model": {"num_hidden_layers": 5},
                          "train": {"steps": 7, "mixture": {"kv": 1.0}}})
    assert cfg["name"] == "v" and cfg["arch"] == "llama"
    assert cfg["model"]["num_hidden_layers"] == 5
    assert cfg["model"]["hidden_size"] == CONFIGS["llama"]["model"]["hidden_size"] == 64
    assert cfg["train"]["steps"] == 7 and cfg["train"]["mixture"] == {"kv": 1.0}
    assert cfg["train"]["lr"] == 3e-3 and cfg["train"]["answer_weight"] == 5.0  # kept from the base's recipe
    assert cfg["world"] == {"distractors": "hard", "n_values": 36}
    assert CONFIGS["llama"]["model"]["num_hidden_layers"] == 3  # the base itself is untouched
    assert resolve_config({"base": "mamba2"})["name"] == "mamba2"
    with pytest.raises(GandaError, match="unknown base config 'llamba'"):
        resolve_config({"base": "llamba"})
    with pytest.raises(GandaError, match="'train' must be an object"):
        resolve_config({"base": "llama", "train": 5})


@pytest.mark.parametrize("config,name", [("llama", "lab-llama"), ("llama-wd", "lab-llama-wd"), ("llama-h1", "lab-llama-h1"),
                                         ("mamba2", "lab-mamba2"), ("hybrid-late", "lab-hybrid-late"),
                                         ("mamba2-9k", "lab-mamba2-9k"), ("hybrid-late-7k5", "lab-hybrid-late-7k5"),
                                         ("mamba2-c32", "lab-mamba2-c32"), ("hybrid", "lab-hybrid"),
                                         ("kv-llama", "lab-kv-llama"), ("kv-mamba2", "lab-kv-mamba2")])
@pytest.mark.usefixtures("lab_checkpoints")
def test_named_config_is_the_one_its_shipped_checkpoint_ran(config, name):
    """`ganda train NAME` rebuilds the shipped checkpoint only if the named config is the recorded one.
    Keys added to the recipe after a run was recorded must default to what it did; the logging
    intervals do not touch the weights."""
    from ganda_lab.configs import TRAIN_DEFAULTS, resolve_config

    ran = json.loads((checkpoint(name) / "lab.json").read_text())["config"]
    named = resolve_config(config)
    logging = {"eval_every", "eval_n", "ckpt_every"}
    for k in set(named["train"]) - set(ran["train"]):
        assert named["train"][k] == TRAIN_DEFAULTS[k], k
    assert {k: v for k, v in ran["train"].items() if k not in logging} == \
        {k: v for k, v in named["train"].items() if k in ran["train"] and k not in logging}
    assert {k: v for k, v in ran.items() if k not in ("name", "train")} == \
        {k: v for k, v in named.items() if k not in ("name", "train")}


@pytest.mark.usefixtures("lab_checkpoints")
def test_distill_defaults_are_the_ones_the_default_student_ran():
    """`ganda distill lab-llama-h1` rebuilds lab-distilled-h1 only if the defaults are its recorded
    config (so does `ganda distill lab-llama-wd` for lab-distilled-wd; lab-distilled ran the earlier
    800 steps: `--steps 800`)."""
    from ganda_lab.distill import DISTILL_DEFAULTS
    from ganda_lab.programme import DEFAULT_MODELS

    assert DEFAULT_MODELS["distilled"] == "lab-distilled-h1"
    for student, teacher in ((DEFAULT_MODELS["distilled"], DEFAULT_MODELS["transformer"]),
                             ("lab-distilled-wd", "lab-llama-wd")):
        ran = json.loads((checkpoint(student) / "lab.json").read_text())["config"]
        assert ran.pop("arch") == "distilled-mamba2" and ran.pop("teacher") == teacher
        assert ran == DISTILL_DEFAULTS, student
    old = json.loads((checkpoint("lab-distilled") / "lab.json").read_text())["config"]
    assert old["teacher"] == "lab-llama" and old["steps"] == 800


def test_grow_defaults_are_the_ones_the_deep_model_ran():
    """`ganda grow lab-llama-h1` rebuilds lab-llama-deep (the from-scratch run checks it bit for bit)
    only if the defaults are its recorded config."""
    from ganda_lab.grow import GROW_DEFAULTS
    from ganda_lab.programme import DEFAULT_MODELS

    assert DEFAULT_MODELS["deep"] == "lab-llama-deep"
    ran = json.loads((checkpoint("lab-llama-deep") / "lab.json").read_text())
    cfg = dict(ran["config"])
    assert cfg.pop("arch") == "grown-llama" and cfg.pop("base") == DEFAULT_MODELS["transformer"]
    assert cfg.pop("base_layers") == 4 and cfg.pop("train")["steps"] == GROW_DEFAULTS["steps"]
    assert cfg == GROW_DEFAULTS
    assert ran["world"]["unasked_relations"] == GROW_DEFAULTS["unasked"]


@pytest.mark.parametrize("config", ["llama-h1", "hybrid-late"])
def test_memoised_token_ids_build_the_very_same_batches(config, monkeypatch):
    """Training batches tokenise through the memoised Rust backend (``token_ids``); every tensor of
    every batch must equal the one built with the tokenizer's own call, or a shipped checkpoint
    would no longer retrain bit for bit."""
    from ganda_lab import train as T
    from ganda_lab.configs import resolve_config
    from ganda_lab.tokenizer import build_tokenizer
    from ganda_lab.world import World, WorldConfig

    cfg = resolve_config(config)
    tr = cfg["train"]
    world = World(WorldConfig.from_json(cfg["world"]))
    tok = build_tokenizer(world)
    steps = [0, 1, 2, 3, 500, 7001]
    fast = [T.make_batch(world, tok, tr, tr["seed"], s) for s in steps]
    assert T.token_ids.cache_info().hits > 0  # statements and option lines recur within a batch
    monkeypatch.setattr(T, "token_ids", lambda tok, text: tuple(tok(text, add_special_tokens=False).input_ids))
    for s, f in zip(steps, fast, strict=True):
        slow = T.make_batch(world, tok, tr, tr["seed"], s)
        assert f.keys() == slow.keys()
        for k in f:
            assert torch.equal(f[k], slow[k]), (s, k)


def _handwritten_wsd(step: int, tr: dict) -> float:
    """The wsd curve written out by hand: the reference transformers' schedule is checked against."""
    base, warm, lo = tr["lr"], tr["warmup"], tr["min_lr_frac"]
    total = int(tr.get("schedule_steps") or tr["steps"])
    if step < warm:
        return base * (step + 1) / warm
    start = total * (1 - float(tr.get("decay_frac", 0.2)))
    if step < start:
        return base
    return base * (1 - (1 - lo) * min(1.0, (step - start) / max(1.0, total - start)))


def test_wsd_is_transformers_schedule_with_the_handwritten_rates():
    """Every lab config with the wsd schedule, every step: the rate equals the hand-written
    curve's exactly in warm-up and stable phases and to the last bit of a double in the decay (two
    float expressions of one line), and the float32 scalars AdamW applies (rate, rate / bias
    correction, 1 - rate x weight decay) are identical at every step."""
    import numpy as np
    from transformers import get_wsd_schedule

    from ganda_lab.configs import CONFIGS, resolve_config
    from ganda_lab.train import _lr_curve, wsd_multiplier

    f32 = np.float32
    names = [n for n in CONFIGS if resolve_config(n)["train"]["schedule"] == "wsd"]
    assert {"llama-h1", "hybrid-late-7k5"} <= set(names)
    differ = 0
    for name in names:
        tr = resolve_config(name)["train"]
        total = int(tr.get("schedule_steps") or tr["steps"])
        for step in range(total):
            new, old = _lr_curve(step, tr), _handwritten_wsd(step, tr)  # the curve an anneal_from also starts from
            differ += new != old
            assert new == pytest.approx(old, rel=1e-15, abs=0), (name, step)
            if step < total * (1 - tr["decay_frac"]):
                assert new == old, (name, step)
            bc = 1 - 0.9 ** (step + 1)
            assert f32(new) == f32(old) and f32(new / bc) == f32(old / bc), (name, step)
            assert f32(1 - new * tr["weight_decay"]) == f32(1 - old * tr["weight_decay"]), (name, step)
    assert differ > 0  # the two expressions do differ in the last bit somewhere: the check has teeth
    # the multiplier is transformers' own lambda
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    ref = get_wsd_schedule(opt, 0, 2200, num_stable_steps=8800, decay_type="linear", min_lr_ratio=0.1).lr_lambdas[0]
    assert all(wsd_multiplier(11000, 0.2, 0.1)(s) == ref(s) for s in range(0, 11000, 7))


@pytest.mark.integration
def test_wsd_training_is_bit_identical_to_the_handwritten_curve(tmp_path, monkeypatch):
    """A short wsd run (the smoke model, three quarters of it decaying) trains to the same weights, bit for bit,
    with the hand-written curve."""
    from safetensors.torch import load_file

    from ganda_lab import train as T
    from ganda_lab.configs import resolve_config

    cfg = {"base": "smoke", "train": {"steps": 40, "warmup": 5, "schedule": "wsd", "decay_frac": 0.75,
                                      "eval_every": 40, "ckpt_every": 1000}}
    tr = resolve_config(cfg)["train"]
    T.train(cfg, tmp_path / "new", progress=False, log=lambda *a: None)
    lrs = [T._lr(s, tr) for s in range(40)]
    monkeypatch.setattr(T, "_lr_curve", _handwritten_wsd)
    assert [T._lr(s, tr) for s in range(40)] != lrs  # the rates differ (in the last bit), and the hand-written curve ran
    T.train(cfg, tmp_path / "old", progress=False, log=lambda *a: None)
    a, b = load_file(tmp_path / "new" / "model.safetensors"), load_file(tmp_path / "old" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
