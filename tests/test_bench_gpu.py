"""benchmarks/bench_gpu.py's code path on the CPU: shrunken configs of the four full-size models,
every section measured beside the planner and written as JSON after each section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--small", "--device", "cpu", "--dtype", "float32", "--n", "2", "--shots", "0", "--sweep-prompts", "2",
         "--attr-prompts", "2", "--sweep-heads", "2", "--map-tokens", "128"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def small(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_gpu") / "small.json"
    before = torch.get_num_threads()
    try:
        rc = bench.main([*SMALL, "--out", str(out)])
    finally:
        torch.set_num_threads(before)
    return rc, json.loads(out.read_text())


@pytest.mark.integration
def test_every_section_of_every_model_has_its_numbers(bench, small):
    rc, doc = small
    assert rc == 0, {m: {s: r.get("error") for s, r in rows.items() if "error" in r} for m, rows in doc["models"].items()}
    assert doc["plan_device"] == "cpu" and doc["small"] and doc["dtype"] == "float32" and doc["finished"]
    assert list(doc["models"]) == bench.MODELS
    for model, rows in doc["models"].items():
        assert rows["build"]["n_params"] > 0 and rows["build"]["heads"] > 0, model
        for section in ("eval", "sweep", "attribution", "maps"):
            r = rows[section]
            assert r["measured_s"] > 0 and r["predicted_s"] > 0, (model, section, r)
            assert r["ratio"] == pytest.approx(r["measured_s"] / r["predicted_s"]), (model, section)
            assert r["predicted_peak_bytes"] > 0, (model, section)
        ev, sw, at, mp = rows["eval"], rows["sweep"], rows["attribution"], rows["maps"]
        assert ev["n"] == 2 and ev["questions_per_s"] == pytest.approx(2 / ev["measured_s"])
        assert ev["prefix_vs_rows"]["ok"] and ev["prefix_vs_rows"]["dtype"] == "float32"
        assert ev["prefix_vs_rows"]["max_diff"] <= 1e-4  # fp32: float tolerance
        assert sw["naive_s"] > 0 and sw["s_per_head"] == pytest.approx(sw["measured_s"] / len(sw["heads"]))
        assert sw["fast_vs_naive"]["ok"] and sw["fast_vs_naive"]["max_diff"] <= 1e-4, sw["fast_vs_naive"]
        assert at["heads"] == rows["build"]["heads"]  # every head
        assert min(at["forward_s"], at["forward_backward_s"], at["forward_input_grads_s"]) > 0
        assert at["predicted_forward_s"] > 0 and at["predicted_forward_backward_s"] > at["predicted_forward_s"]
        assert mp["tokens"] == 128 and mp["heads"] > 0 and mp["finite"], mp
        assert rows["memory"]["peak_bytes"] >= 0 and rows["memory"]["predicted_peak_bytes"] > 0
        assert at["forward_backward_peak_bytes"] >= 0
    kinds = {m: set(r["maps"]["kinds"]) for m, r in doc["models"].items()}
    assert kinds["meta-llama/Llama-3.1-8B"] == {"softmax"} and kinds["tiiuae/falcon-mamba-7b"] == {"implicit"}


def test_a_failing_section_is_recorded_and_the_run_goes_on(bench, tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("expected m1 and m2 to have the same dtype\nsecond line")

    monkeypatch.setitem(bench.RUNNERS, "eval", broken)
    out = tmp_path / "r.json"
    rc = bench.main([*SMALL, "--models", "meta-llama/Llama-3.1-8B", "--sections", "eval,maps", "--out", str(out)])
    rows = json.loads(out.read_text())["models"]["meta-llama/Llama-3.1-8B"]
    assert rc == 1
    assert rows["eval"]["error"] == "RuntimeError: expected m1 and m2 to have the same dtype"
    assert rows["maps"]["measured_s"] > 0  # the next section ran
    assert "sweep" not in rows  # only the sections asked for


def test_a_spent_budget_skips_the_remaining_sections(bench, tmp_path):
    out = tmp_path / "b.json"
    assert bench.main([*SMALL, "--models", "meta-llama/Llama-3.1-8B", "--sections", "eval,memory", "--budget-s", "1",
                       "--section-s", "5", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["models"]["meta-llama/Llama-3.1-8B"]
    assert rows["eval"]["skipped"].startswith("budget")
    assert "measured_s" not in rows["eval"] and rows["memory"]["peak_bytes"] >= 0


def test_planner_rows_follow_the_device_name(bench):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert bench.plan_row(cuda, "NVIDIA H200") == "h200"
    assert bench.plan_row(cuda, "NVIDIA H100 80GB HBM3") == "h100"
    assert bench.plan_row(cuda, "NVIDIA A100-SXM4-80GB") == "a100"
    assert bench.plan_row(cuda, "NVIDIA GeForce RTX 4090") == "h100"  # an unknown card: the default row
    assert bench.plan_row(cpu, "cpu") == "cpu"


def test_folded_tokenizer_keeps_counts_and_stays_in_the_vocabulary(bench):
    tok_dir = ROOT / "benchmarks" / "tokenizers" / "smollm2-135m"
    full = bench.FoldedTokenizer(tok_dir, 1 << 20)
    small = bench.FoldedTokenizer(tok_dir, 512)
    text = "The following are multiple choice questions (with answers) about anatomy.\n\nAnswer:"
    ids = full(text).input_ids
    assert len(ids) == len(small(text).input_ids) < len(text) / 2  # real BPE counts
    assert max(ids) >= 512 and all(0 <= i < 512 for i in small(text).input_ids)
    assert small(text).input_ids == [i % 512 for i in ids]
    assert full.eos_token_id == full.pad_token_id == full.tok.token_to_id("<|im_end|>")


@pytest.mark.integration
def test_replan_reproduces_the_bench_runs_own_predictions(small):
    """benchmarks/replan_gpu.py recomputes a result's predictions from meta-device models: on the
    run it was given it finds the numbers bench_gpu.py planned itself, row by row."""
    spec = importlib.util.spec_from_file_location("replan_gpu", ROOT / "benchmarks" / "replan_gpu.py")
    replan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replan)
    _, doc = small
    rows = replan.replan(doc)
    assert {(r["section"], r["quantity"]) for r in rows} >= {("attribution", "measured_s"), ("eval", "measured_s"),
                                                              ("sweep", "measured_s"), ("sweep", "naive_s")}
    assert {r["section"] for r in rows if r["quantity"] == "peak_bytes"} >= {"attribution", "eval", "sweep", "memory"}
    for r in rows:
        rec = doc["models"][r["model"]][r["section"]]
        if r["quantity"] == "peak_bytes":  # a file with "peaks": each section's own peak, nothing taken off
            assert r["compared"] and not r["notes"] and r["measured_bytes"] == rec["peak_bytes"], r
            if r["section"] != "memory":
                assert r["predicted_bytes"] == pytest.approx(rec["predicted_peak_bytes"], rel=1e-6), r
            continue
        planned = rec[{"measured_s": "predicted_s", "naive_s": "naive_predicted_s", "forward_s": "predicted_forward_s",
                       "forward_backward_s": "predicted_forward_backward_s"}[r["quantity"]]]
        assert r["predicted_s"] == pytest.approx(planned, rel=1e-6), r


def test_section_peaks_are_their_own_and_the_whole_run_holds_them_all(bench, monkeypatch):
    """CUDA keeps one peak counter: each section's Peak resets it, so a Peak is fixed when its block
    exits (not when read: what follows must not count) and folds into the Peaks around it."""
    state = {"alloc": 100, "max": 100}

    def reset(_dev=None):
        state["max"] = state["alloc"]

    def alloc(n):
        state["alloc"] += n
        state["max"] = max(state["max"], state["alloc"])

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda _dev=None: state["max"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda _dev=None: state["alloc"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    dev = torch.device("cuda")
    with bench.Peak(dev) as whole:
        with bench.Peak(dev) as first:
            alloc(500)
            alloc(-500)
        alloc(900)  # between sections (attribution's plain forward + backward): no section's peak
        alloc(-900)
        with bench.Peak(dev) as second:
            alloc(50)
            alloc(-50)
    alloc(2000)
    assert (first.bytes, second.bytes, whole.bytes) == (600, 150, 1000)
    assert first.start_bytes == second.start_bytes == 100


def test_materialise_keeps_shared_parameters_shared(bench):
    """Zamba2's shared blocks: ``to_empty`` alone gives every module its own copy of them."""
    from ganda.models import meta

    raw = {**bench.config("Zyphra/Zamba2-7B", True), "num_hidden_layers": 4,
           "layers_block_type": ["hybrid", "mamba", "hybrid", "hybrid"]}
    model = meta.build_model(raw, torch.float32)
    before = meta.param_count(model)
    bench.materialise(model, torch.device("cpu"))
    assert meta.param_count(model) == before
    copy = meta.build_model(raw, torch.float32).to_empty(device="cpu")
    assert meta.param_count(copy) > before
