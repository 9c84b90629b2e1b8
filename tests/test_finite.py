"""Non-finite weights, configs and scores are refused in one line naming where they first appear
(:mod:`ganda.finite`), never turned into an accuracy, a sweep or a ranking."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_llama

import ganda
from ganda.errors import GandaError
from ganda.finite import check_config, check_weights, finite_json
from ganda.tasks import get_task

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(byte_tok, **config) -> ganda.ModelAdapter:
    model = make_tiny_llama(len(byte_tok), ctx=256)
    for k, v in config.items():
        setattr(model.config, k, v)
        for layer in model.model.layers:  # the norms read eps when built: rebuild them from the config
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                if k == "rms_norm_eps":
                    norm.variance_epsilon = v
    return ganda.from_model(model, byte_tok, spec="tiny-llama")


def _nan_o_proj(byte_tok) -> ganda.ModelAdapter:
    ad = _tiny(byte_tok)
    with torch.no_grad():
        ad.model.model.layers[1].self_attn.o_proj.weight[0, 0] = float("nan")
    return ad


def test_scores_that_are_not_finite_name_the_module_where_they_appear(byte_tok):
    from ganda.evaluation import evaluate

    with pytest.raises(GandaError, match=r"computes non-finite scores \(NaN in .*first appear in the output of "
                                         r"model\.layers\.1\.self_attn\.o_proj;") as info:
        evaluate(_nan_o_proj(byte_tok), get_task("kv", pairs=3), limit=4, progress=False)
    assert "\n" not in str(info.value)
    with pytest.raises(GandaError, match=r"first appear in the output of model\.layers\.0\.input_layernorm"):
        evaluate(_tiny(byte_tok, rms_norm_eps=-1.0), get_task("kv", pairs=3), limit=4, progress=False)
    # the prefix cache off: the plain batched path is checked the same way
    with pytest.raises(GandaError, match="model.layers.1.self_attn.o_proj"):
        evaluate(_nan_o_proj(byte_tok), get_task("letters"), limit=3, progress=False, prefix_cache=False)


def test_a_sweep_writes_no_record_that_is_not_finite(byte_tok, tmp_path):
    from ganda.sweep import run_sweep

    ad = _nan_o_proj(byte_tok)
    exs = get_task("kv", pairs=3).examples(limit=3)
    with pytest.raises(GandaError, match=r"NaN in prompt 0\).*model\.layers\.1\.self_attn\.o_proj"):
        run_sweep(ad, exs, heads=ad.heads()[:2], out_dir=tmp_path, progress=False)
    lines = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["header"]  # no NaN baseline to resume from
    assert not (tmp_path / "results.jsonl").exists()
    with pytest.raises(GandaError, match="non-finite"):
        run_sweep(ad, exs, heads=ad.heads()[:2], naive=True, progress=False)


def test_a_ranking_is_never_made_of_nan(byte_tok, tmp_path):
    from ganda.attribution import rank_heads

    ad = _nan_o_proj(byte_tok)
    exs = get_task("kv", pairs=3).examples(limit=3)
    with pytest.raises(GandaError, match=r"NaN in prompt 0\).*model\.layers\.1\.self_attn\.o_proj"):
        rank_heads(ad, exs, verify_top=2, active=0, audit=0, out_dir=tmp_path / "rank", progress=False)
    assert not (tmp_path / "rank" / "ranking.json").exists()


def test_generation_stops_at_the_first_logits_that_are_not_finite(byte_tok):
    from ganda.evaluation import evaluate

    with pytest.raises(GandaError, match=r"NaN in the next-token logits.*model\.layers\.1\.self_attn\.o_proj"):
        evaluate(_nan_o_proj(byte_tok), get_task("gsm8k"), limit=1, progress=False)


def test_weights_are_checked_on_their_device_without_a_copy(monkeypatch):
    import ganda.finite as finite

    model = torch.nn.Sequential(torch.nn.Linear(30, 30), torch.nn.Linear(30, 30).to(torch.bfloat16))
    check_weights(model, "m")
    with torch.no_grad():
        model[1].weight[29, 29] = float("-inf")  # the last element
        model[1].bias[0] = float("nan")
    with pytest.raises(GandaError, match=r"^m: the weights are not finite: 1\.weight holds 1 infinite of 900 values "
                                         r"\(1 more tensor too\)"):
        check_weights(model, "m")
    check_weights(torch.nn.Module(), "nothing")  # no weights, nothing to refuse
    # a dtype without a min/max kernel is checked in chunks
    monkeypatch.setattr(finite, "CHUNK", 100)
    monkeypatch.setattr(torch, "aminmax", lambda t: (_ for _ in ()).throw(RuntimeError("no kernel")))
    with pytest.raises(GandaError, match=r"1\.weight holds 1 infinite"):
        check_weights(model, "m")
    check_weights(torch.nn.Linear(30, 30), "m")


def _configs() -> list[Path]:
    from ganda.models.meta import CONFIG_DIR
    from ganda_lab import checkpoint_dirs

    return sorted(CONFIG_DIR.glob("*.json")) + sorted(p / "config.json" for d in checkpoint_dirs()
                                                      for p in d.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("path", _configs(), ids=lambda p: p.parent.name if p.name == "config.json" else p.stem)
def test_every_real_config_passes_the_config_check(path):
    check_config(json.loads(path.read_text()), str(path))


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers is 1,000,000; ganda builds models with at most 2,048 layers"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0; it must be at least 1"),
    ({"hidden_size": 1 << 30}, "hidden_size is 1,073,741,824"),
    ({"vocab_size": 10**9}, "vocab_size is 1,000,000,000"),
    ({"text_config": {"num_attention_heads": 10**7}}, "text_config.num_attention_heads is 10,000,000"),
    ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon is 0.0; it must be positive"),
    ({"rope_scaling": {"factor": math.inf}}, "rope_scaling.factor is inf"),
    ({"rope_theta": -10000.0}, "rope_theta is -10000.0; it must be positive"),
])
def test_config_numbers_and_sizes_are_bounded(change, message):
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
            "eos_token_id": [1, 2], "pad_token_id": -1}
    check_config(base, "c")
    with pytest.raises(GandaError, match=f"^c: {message}"):
        check_config({**base, **change}, "c")


def test_json_never_holds_a_bare_nan():
    assert json.dumps(finite_json({"a": [1.0, math.nan], "b": {"c": math.inf}, "d": "x"}),
                      allow_nan=False) == '{"a": [1.0, null], "b": {"c": null}, "d": "x"}'
