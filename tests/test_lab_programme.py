"""The lab programme: verdict rules on known numbers, the from-scratch scheduler, and one whole
run of the six findings on tiny models trained here (the orchestration, not the science)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ganda.experiments.common import ExperimentResult
from ganda_lab.programme import verdicts


def _roles(gather_ablated, aggregate_ablated, g_ctrl=0.01, a_ctrl=0.0, heads_to_chance=2, best=None):
    rows = [{"head": "L0H3", "role": "gather", "all": gather_ablated},
            {"head": "L1H1", "role": "aggregate", "all": aggregate_ablated}]
    return ExperimentResult(kind="roles", rows=rows, summary={
        "baseline": 0.96, "gather": "L0H3", "aggregate": "L1H1", "gather_ablated": gather_ablated,
        "aggregate_ablated": aggregate_ablated, "gather_control_drop": g_ctrl, "aggregate_control_drop": a_ctrl,
        "heads_to_chance": heads_to_chance, "heads_to_chance_max": 24})


MODELS = {"transformer": {"lab-mmlu": 0.96, "lab-letters": 0.99}, "ssm": {"lab-mmlu": 0.7}}


def _f(rows, n):
    return next(r for r in rows if r["finding"] == n)


def test_finding1_rule():
    assert _f(verdicts({"models": MODELS, "roles_transformer": _roles(0.30, 0.33)}), 1)["verdict"] == "reproduced"
    assert _f(verdicts({"models": MODELS, "roles_transformer": _roles(0.30, 0.60)}), 1)["verdict"] == "partly"
    # knowledge moving by more than 5 points spoils the dissociation
    assert _f(verdicts({"models": MODELS, "roles_transformer": _roles(0.30, 0.60, g_ctrl=0.2)}), 1)["verdict"] == "not reproduced"
    # a clean Gather collapse still counts when the Aggregate head's collapse costs knowledge
    assert _f(verdicts({"models": MODELS, "roles_transformer": _roles(0.35, 0.32, a_ctrl=0.095)}), 1)["verdict"] == "partly"
    assert _f(verdicts({"models": MODELS, "roles_transformer": _roles(0.36, 0.32, a_ctrl=0.095)}), 1)["verdict"] == "not reproduced"
    low = {**MODELS, "transformer": {"lab-mmlu": 0.90, "lab-letters": 1.0}}
    lowroles = _roles(0.30, 0.33)
    lowroles.summary["baseline"] = 0.90
    assert _f(verdicts({"models": low, "roles_transformer": lowroles}), 1)["verdict"] == "partly"
    # heads found in a minimal model: the bar is the minimal model's accuracy, which the text names
    pruned = _roles(0.30, 0.33)
    pruned.config["keep_layers"] = [0, 1, 2]
    pruned.summary["lab-letters_baseline"] = 0.97
    f1 = _f(verdicts({"models": low, "roles_transformer": pruned}), 1)
    assert f1["verdict"] == "reproduced" and f1["lab"].startswith("minimal model (layers 0-2): lab-mmlu 96.0%, letters 97.0%")
    pruned.summary["lab-letters_baseline"] = 0.90
    assert _f(verdicts({"models": low, "roles_transformer": pruned}), 1)["verdict"] == "partly"


def _prune(mmlu, know, minimal, critical, removed, grown=None):
    """A pruning curve (layers kept: len(mmlu) .. 1) and a remove-and-restore table on its minimal
    model (``removed``: layer -> (lab-mmlu, knowledge); None is the minimal model intact)."""
    n = len(mmlu)
    curve = ExperimentResult(kind="prune", model="deep", rows=[
        {"layers": n - i, "lab-mmlu": m, "lab-knowledge": k} for i, (m, k) in enumerate(zip(mmlu, know, strict=True))],
        summary={"minimal_layers": minimal, "significant": True},
        config={"grown_from": grown} if grown else {})
    rr = ExperimentResult(kind="remove_restore", summary={"critical_layers": critical},
                          rows=[{"removed_layer": k, "lab-mmlu": m, "lab-knowledge": kn} for k, (m, kn) in removed.items()])
    return {"prune": curve, "remove_restore": rr}


def test_finding2_rule_needs_a_stable_stretch_and_retrieval_specific_last_two_layers():
    deep = _prune([.97, .97, .97, .31, .24, .24], [1.0, .69, .575, .545, .53, .39], 4, [1, 0, 3, 2],
                  {None: (.97, .575), 0: (.25, .30), 1: (.25, .40), 2: (.37, .585), 3: (.31, .545)},
                  grown={"model": "lab-llama-h1", "shared_layers": 4})
    row = _f(verdicts(deep), 2)
    assert row["verdict"] == "reproduced"
    assert row["lab"].startswith("deep (layers 0-3 are lab-llama-h1's): cumulative pruning: lab-mmlu 6L 97.0%")
    assert "removing its last two layers L2, L3: lab-mmlu 37.0%, 31.0%, knowledge 58.5%, 54.5% (vs 57.5%)" in row["lab"]
    assert "the other critical layers cost knowledge too: L0 30.0%, L1 40.0%" in row["lab"]
    # the lab's 4-layer Transformers: the cliff at the first cut, no stretch where MMLU survives
    shallow = _prune([.97, .315, .24, .24], [1.0, .915, .805, .51], 4, [1, 0, 3, 2],
                     {None: (.97, 1.0), 0: (.25, .45), 1: (.245, .715), 2: (.37, 1.0), 3: (.315, .97)})
    assert _f(verdicts(shallow), 2)["verdict"] == "partly"
    # the Aggregate layer's removal costing knowledge more than 5 points
    costly = _prune([.97, .97, .97, .31, .24, .24], [1.0, .69, .575, .545, .53, .39], 4, [1, 0, 3, 2],
                    {None: (.97, .575), 0: (.25, .30), 1: (.25, .40), 2: (.37, .585), 3: (.31, .52)})
    assert _f(verdicts(costly), 2)["verdict"] == "partly"
    # one of the last two layers not critical: a pruning cliff alone is "partly"
    one = _prune([.97, .97, .97, .31, .24, .24], [1.0, .69, .575, .545, .53, .39], 4, [1, 0, 3],
                 {None: (.97, .575), 0: (.25, .30), 1: (.25, .40), 2: (.80, .585), 3: (.31, .545)})
    assert _f(verdicts(one), 2)["verdict"] == "partly"
    # knowledge flat over the stretch MMLU survives, or rising as layers go
    flat = _prune([.97, .97, .97, .31, .24, .24], [.6, .59, .575, .545, .53, .39], 4, [3, 2],
                  {None: (.97, .575), 2: (.37, .585), 3: (.31, .545)})
    assert _f(verdicts(flat), 2)["verdict"] == "partly"
    rising = _prune([.97, .97, .97, .31, .24, .24], [1.0, .69, .575, .60, .53, .39], 4, [3, 2],
                    {None: (.97, .575), 2: (.37, .585), 3: (.31, .60)})
    assert _f(verdicts(rising), 2)["verdict"] == "partly"
    # past the drop knowledge wanders around chance: a rise there is not judged
    wander = _prune([.97, .97, .97, .31, .24, .24], [1.0, .69, .575, .545, .585, .39], 4, [3, 2],
                    {None: (.97, .575), 2: (.37, .585), 3: (.31, .545)})
    assert _f(verdicts(wander), 2)["verdict"] == "reproduced"


def test_finding3_rule_counts_each_check():
    t = _roles(0.30, 0.33, heads_to_chance=2)
    s_more = _roles(0.50, 0.55, heads_to_chance=5)
    def rows(t, s):  # (accuracy, lo, hi) at 2 and 16 pairs for the Transformer T and the SSM S
        return [{"pairs": p, "intact": ta, "intact_ci_low": tl, "intact_ci_high": th, "S": sa, "S_ci_low": sl,
                 "S_ci_high": sh}
                for p, (ta, tl, th), (sa, sl, sh) in zip((2, 16), t, s, strict=True)]

    kv = ExperimentResult(kind="kv_curve", model="T", summary={"fall": {"T": 0.2, "S": 0.5}, "at_max_pairs": {"T": 0.5, "S": 0.2}},
                          rows=rows([(.7, .63, .76), (.5, .43, .57)], [(.7, .63, .76), (.2, .15, .26)]))
    row = _f(verdicts({"models": MODELS, "roles_transformer": t, "roles_ssm": s_more, "kv": kv}), 3)
    assert row["verdict"] == "reproduced"
    kv_wrong = ExperimentResult(kind="kv_curve", model="T", summary={"fall": {"T": 0.5, "S": 0.2}},
                                rows=rows([(.7, .63, .76), (.2, .15, .26)], [(.7, .63, .76), (.5, .43, .57)]))
    assert _f(verdicts({"models": MODELS, "roles_transformer": t, "roles_ssm": s_more, "kv": kv_wrong}), 3)["verdict"] == "partly"
    s_same = _roles(0.20, 0.25, heads_to_chance=1)  # fewer heads, sharper bottleneck: the opposite
    assert _f(verdicts({"models": MODELS, "roles_transformer": t, "roles_ssm": s_same, "kv": kv_wrong}), 3)["verdict"] == "not reproduced"


def test_finding5_rule_distinguishes_the_two_masking_rules():
    def mask(kq, kl):
        return ExperimentResult(kind="mask_last_row", summary={
            "lab-mmlu_intact": 0.85, "lab-mmlu_masked": 0.40, "lab-knowledge_intact": 0.99,
            "lab-knowledge_masked": kq, "lab-knowledge_masked_last": kl})
    assert _f(verdicts({"mask": mask(0.97, 0.98)}), 5)["verdict"] == "reproduced"
    assert _f(verdicts({"mask": mask(0.70, 0.98)}), 5)["verdict"] == "partly"
    weak = ExperimentResult(kind="mask_last_row", summary={"lab-mmlu_intact": 0.85, "lab-mmlu_masked": 0.80,
                                                            "lab-knowledge_intact": 0.99, "lab-knowledge_masked": 0.99,
                                                            "lab-knowledge_masked_last": 0.99})
    assert _f(verdicts({"mask": weak}), 5)["verdict"] == "not reproduced"
    # the hybrid's roles are named with the kind of layer that holds them
    roles = ExperimentResult(kind="head_roles", summary={"aggregate": "L3H1", "aggregate_ablated": 0.625,
                                                         "gather": "L2H0", "gather_ablated": 0.615},
                             config={"layer_kinds": {"2": ["attn"], "3": ["ssm"]}})  # as read back from JSON
    lab = _f(verdicts({"mask": weak, "roles_hybrid": roles}), 5)["lab"]
    assert "Aggregate L3H1 (ssm) -> 62.5%" in lab and "Gather L2H0 (attn) -> 61.5%" in lab


def test_finding6_rule_needs_the_aggregate_layer():
    def tl(gains):
        rows = [{"condition": "student", "lab-mmlu": 0.30}, {"condition": "donor", "lab-mmlu": 0.92}]
        rows += [{"condition": f"L{i}", "lab-mmlu": 0.30 + g} for i, g in enumerate(gains)]
        return ExperimentResult(kind="transplant", rows=rows)
    rt = _roles(0.3, 0.3)  # Aggregate head L1H1: layer 1
    assert _f(verdicts({"roles_transformer": rt, "transplant_layers": tl([0.02, 0.40, 0.05])}), 6)["verdict"] == "reproduced"
    assert _f(verdicts({"roles_transformer": rt, "transplant_layers": tl([0.40, 0.05, 0.0])}), 6)["verdict"] == "partly"
    assert _f(verdicts({"roles_transformer": rt, "transplant_layers": tl([0.25, 0.40, 0.0])}), 6)["verdict"] == "partly"
    assert _f(verdicts({"roles_transformer": rt, "transplant_layers": tl([0.05, 0.10, 0.0])}), 6)["verdict"] == "not reproduced"


# ---- tiny real models through the real commands ---------------------------------------------------

TINY_WORLD = {"n_entities": 12, "n_novel": 24, "distractors": "hard", "n_values": 36}
TINY_TRAIN = {"steps": 3, "batch_size": 4, "eval_every": 100, "eval_n": 4, "ckpt_every": 2, "buckets": 2,
              "mixture": {"statement": 1, "mmlu": 1, "letters": 1, "kv": 1, "drill": 1}}
TINY = {
    "transformer": {"arch": "llama", "model": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                                                "num_attention_heads": 2, "num_key_value_heads": 2,
                                                "max_position_embeddings": 256}},
    "ssm": {"arch": "mamba2", "model": {"hidden_size": 16, "num_hidden_layers": 2, "num_heads": 2, "head_dim": 16,
                                         "state_size": 4, "expand": 2, "n_groups": 1, "chunk_size": 8}},
    "hybrid": {"arch": "hybrid", "model": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                                            "num_attention_heads": 2, "num_key_value_heads": 2, "attn_layer_indices": [1],
                                            "mamba_n_heads": 2, "mamba_d_head": 16, "mamba_d_state": 4,
                                            "mamba_expand": 2, "mamba_chunk_size": 8, "max_position_embeddings": 256}},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from ganda_lab.scratch import train_all

    root = tmp_path_factory.mktemp("lab")
    configs = {}
    kv_train = {**TINY_TRAIN, "mixture": {"copy": 1, "kv": 1}, "kv_queries": [1, 3], "copy_len": [4, 8]}
    for role, cfg, tr in (*((r, c, TINY_TRAIN) for r, c in TINY.items()),
                          ("kv_transformer", TINY["transformer"], kv_train), ("kv_ssm", TINY["ssm"], kv_train)):
        f = root / f"{role}.json"
        f.write_text(json.dumps({**cfg, "name": role, "world": TINY_WORLD, "train": tr}))
        configs[role] = str(f)
    log: list[str] = []
    models = train_all(root / "work", jobs=2, configs=configs, log=log.append, poll=0.2, distill_steps=20,
                       grow_steps=6)
    return root, configs, models, log


@pytest.mark.integration
def test_train_all_trains_every_role_and_resumes(trained):
    from ganda_lab.scratch import finished, train_all

    root, configs, models, log = trained
    assert set(models) == {"transformer", "ssm", "hybrid", "distilled", "kv_transformer", "kv_ssm", "deep"}
    assert all(finished(Path(d)) for d in models.values())
    assert any("distilled: started" in m for m in log)
    # the student and the grown model started only after the transformer had finished
    for role in ("distilled", "deep"):
        order = [m for m in log if "transformer: done" in m or f"{role}: started" in m]
        assert order[0].startswith("[lab] transformer: done"), role
    timing = json.loads((root / "work" / "timing.json").read_text())
    assert set(timing) >= {"transformer", "ssm", "hybrid", "distilled", "kv_transformer", "kv_ssm", "deep"}
    # own configs: nothing shipped to compare the weights with
    assert not (root / "work" / "rebuild.json").exists() and not any("bit-identical" in m for m in log)
    again: list[str] = []
    train_all(root / "work", jobs=2, configs=configs, log=again.append, poll=0.2)
    assert sum("already trained" in m for m in again) == 7 and not any("started" in m for m in again)


@pytest.mark.integration
def test_programme_runs_every_finding_and_writes_one_report(trained, tmp_path):
    from ganda_lab.programme import Programme

    _root, _configs, models, _log = trained
    out = tmp_path / "lab"
    res = Programme(models=models, out=out, n=4, top=2, progress=False, log=lambda *_: None).run()
    assert [f["finding"] for f in res["findings"]] == [1, 2, 3, 4, 5, 6]
    assert all(f["verdict"] in ("reproduced", "partly", "not reproduced") for f in res["findings"])
    for d in ("models", "findings", "f1-roles-transformer", "f2-prune", "f2-remove-restore", "f3-roles-ssm",
              "f3-kv", "f4-sharpness", "f4-sharpness-last", "f5-mask-hybrid", "f5-roles-hybrid",
              "f6-transplant-layers"):
        assert (out / d / "result.json").is_file(), d
    # finding 4 is measured with both summary tokens, and its text says where the Aggregate heads read
    summaries = {json.loads((out / d / "result.json").read_text())["models"][models["ssm"]]["summary"]
                 for d in ("f4-sharpness", "f4-sharpness-last")}
    assert summaries == {"end", "last"}
    f4 = next(f for f in res["findings"] if f["finding"] == 4)
    assert "reads" in f4["lab"] and "last word before the newline" in f4["lab"]
    page = (out / "report.html").read_text()
    assert "Reproduced:" in page and "Partly reproduced:" in page  # the findings' headline
    assert "<script src=" not in page and "<link " not in page  # self-contained
    models_rows = json.loads((out / "models" / "result.json").read_text())["rows"]
    assert {r["role"] for r in models_rows} == {"transformer", "ssm", "hybrid", "distilled", "kv_transformer", "kv_ssm",
                                                "deep"}
    # finding 2 pruned the grown model, whose base layers are the transformer's
    f2 = json.loads((out / "f2-prune" / "result.json").read_text())
    assert f2["model"] == models["deep"] and f2["config"]["grown_from"]["shared_layers"] == 2
    assert _f(res["findings"], 2)["lab"].startswith(f"{models['deep']} (layers 0-1 are {models['transformer']}'s)")
    # the KV pair is scored on KV only, and finding 3's curve is measured on it
    kv_row = next(r for r in models_rows if r["role"] == "kv_ssm")
    assert "lab-kv4" in kv_row and "lab-mmlu" not in kv_row
    f3 = json.loads((out / "f3-kv" / "result.json").read_text())
    assert f3["model"] == models["kv_transformer"] and f3["config"]["compare"] == [models["kv_ssm"]]
    assert f3["config"]["pairs"][-1] == 24
    # the findings figure: one panel per finding, drawn into findings/ and embedded in the page
    panels = json.loads((out / "findings" / "result.json").read_text())["panels"]
    assert [p["title"][0] for p in panels] == ["1", "2", "3", "4", "5", "6"]
    assert (out / "findings" / "findings.png").stat().st_size > 10_000 and "data:image/png" in page
    f1 = panels[0]["series"]["lab-mmlu"]
    roles = json.loads((out / "f1-roles-transformer" / "result.json").read_text())["summary"]
    assert f1 == [roles["baseline"], roles["gather_ablated"], roles["aggregate_ablated"]]
    # replay: the same verdicts and panels from the files alone, no model run
    from ganda_lab.programme import rebuild_state, replay

    first = json.loads((out / "findings" / "result.json").read_text())
    (out / "findings" / "findings.png").unlink()
    again = replay(out)
    assert [(f["finding"], f["verdict"], f["lab"]) for f in again] == \
        [(f["finding"], f["verdict"], f["lab"]) for f in res["findings"]]
    assert json.loads((out / "findings" / "result.json").read_text())["panels"] == first["panels"]
    assert (out / "findings" / "findings.png").is_file()
    kinds = {int(k): v for k, v in rebuild_state(out)["roles_hybrid"].config["layer_kinds"].items()}
    assert sorted(kinds) == list(range(len(kinds))) and ["attn"] in kinds.values()


@pytest.mark.integration
def test_finding1_heads_are_found_in_the_minimal_model(trained, tmp_path):
    """The paper finds its heads in Llama-3.1-8B cut to its minimal model: when pruning finds one
    shallower than the Transformer, finding 1 is scored on it."""
    from ganda.interventions import truncate
    from ganda.scoring import evaluate_examples
    from ganda_lab.programme import Programme

    _root, _configs, models, _log = trained
    prog = Programme(models=models, out=tmp_path / "lab", n=4, top=2, only=(1,), progress=False, log=lambda *_: None)
    ad = prog.adapter("transformer")
    n = len(ad.decoder_layers())
    # as if pruning had found the retrieval cliff below the last layer
    prog._curves["transformer"] = ExperimentResult(kind="prune", rows=[], summary={"minimal_layers": n - 1})
    res = prog.run()
    roles = json.loads((tmp_path / "lab" / "f1-roles-transformer" / "result.json").read_text())
    assert roles["config"]["keep_layers"] == list(range(n - 1))
    assert {int(h[1:].split("H")[0]) for h in roles["sweep_drops"]} == set(range(n - 1))
    sub = evaluate_examples(ad, prog.examples("transformer", "lab-mmlu"), [truncate(n - 1)], progress=False)
    assert roles["summary"]["baseline"] == pytest.approx(sub.accuracy)
    assert len(ad.decoder_layers()) == n
    f1 = res["findings"][0]
    assert f1["finding"] == 1 and f1["lab"].startswith(f"minimal model (layers 0-{n - 2}): lab-mmlu ")
    assert not (tmp_path / "lab" / "f2-prune").exists()  # finding 2 was not asked for
    # and only the model finding 1 reads was evaluated
    rows = json.loads((tmp_path / "lab" / "models" / "result.json").read_text())["rows"]
    assert [r["role"] for r in rows] == ["transformer"]


def test_replay_refuses_a_directory_that_is_not_a_lab_run(tmp_path):
    from ganda.cli import main

    assert main(["lab", "--replay", str(tmp_path)]) == 2


@pytest.mark.usefixtures("lab_checkpoints")
def test_finding6_refuses_a_student_of_another_depth_before_running_anything(tmp_path, capsys):
    """The default student, lab-distilled-h1, has lab-llama-h1's 4 layers; lab-llama has 3: finding 6
    cannot swap its layers one for one, and the run says so before any model is evaluated."""
    from ganda.cli import main

    assert main(["lab", "--transformer", "lab-llama", "--only", "6", "--out", str(tmp_path / "r"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "lab-distilled-h1 has 4 layers but the transformer lab-llama has 3" in err
    assert not (tmp_path / "r" / "models").exists()


def test_scratch_plan_starts_the_short_transformer_early_and_passes_the_eval_interval(tmp_path):
    from ganda_lab.scratch import plan

    jobs = plan(tmp_path, eval_every=1000)
    assert [j.role for j in jobs] == ["ssm", "transformer", "hybrid", "distilled", "deep", "kv_transformer", "kv_ssm"]
    assert "train kv-llama" in " ".join(jobs[5].argv) and "train kv-mamba2" in " ".join(jobs[6].argv)
    assert jobs[4].argv[3:5] == ["grow", str(tmp_path / "transformer")] and jobs[4].after == "transformer"
    assert "--steps" not in jobs[4].argv and plan(tmp_path, grow_steps=7)[4].argv[-2:] == ["--steps", "7"]
    for j in jobs[:3]:
        i = j.argv.index("--eval-every")
        assert j.argv[i + 1] == "1000" and "train" in j.argv
    assert "--eval-every" not in jobs[3].argv and jobs[3].after == "transformer"
    assert "--eval-every" not in plan(tmp_path)[0].argv
    assert "--steps" not in jobs[3].argv  # the student aligns for DISTILL_DEFAULTS["steps"]
    assert plan(tmp_path, distill_steps=20)[3].argv[-2:] == ["--steps", "20"]
    assert "train llama-h1" in " ".join(jobs[1].argv)  # the default programme's Transformer
    assert "train mamba2-9k" in " ".join(jobs[0].argv) and "train hybrid-late-7k5" in " ".join(jobs[2].argv)
    # the teacher and its student are the critical path; the two long trainings nothing waits for yield
    assert {j.role: j.nice for j in jobs} == {"ssm": 10, "transformer": 0, "hybrid": 10, "distilled": 0, "deep": 0,
                                              "kv_transformer": 10, "kv_ssm": 10}


@pytest.mark.usefixtures("lab_checkpoints")
def test_compare_with_shipped_tells_a_bit_for_bit_rebuild_from_a_near_miss(tmp_path):
    """`ganda lab --from-scratch` checks every rebuilt model against the shipped one: equal
    tensors are "identical"; one weight off by 1e-6 is not, and the report names the tensor."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from ganda_lab import checkpoint
    from ganda_lab.scratch import compare_with_shipped

    same, near = tmp_path / "same", tmp_path / "near"
    for d in (same, near):
        d.mkdir()
    shutil.copy(checkpoint("lab-llama") / "model.safetensors", same / "model.safetensors")
    w = load_file(str(checkpoint("lab-llama") / "model.safetensors"))
    w["model.layers.1.mlp.up_proj.weight"][3, 5] += 1e-6
    save_file(w, str(near / "model.safetensors"))
    rep = compare_with_shipped({"transformer": str(same), "ssm": str(near), "hybrid": str(same)},
                               {"transformer": "lab-llama", "ssm": "lab-llama"})
    assert set(rep) == {"transformer", "ssm"}  # nothing shipped named for the hybrid
    assert rep["transformer"]["identical"] and rep["transformer"]["tensors"] == len(w)
    assert rep["transformer"]["max_abs_diff"] == 0.0 and rep["transformer"]["worst"] is None
    assert not rep["ssm"]["identical"] and rep["ssm"]["worst"] == "model.layers.1.mlp.up_proj.weight"
    assert 5e-7 < rep["ssm"]["max_abs_diff"] < 2e-6
    # a model of another shape is a difference too, not a crash
    rep = compare_with_shipped({"transformer": str(same)}, {"transformer": "lab-llama-h1"})
    assert not rep["transformer"]["identical"]
    assert torch.isinf(torch.tensor(rep["transformer"]["max_abs_diff"])) or rep["transformer"]["max_abs_diff"] > 0


def test_lab_checks_only_the_models_its_findings_read(tmp_path, capsys):
    """A wrong path is refused before anything runs, but only for a model the chosen findings read:
    `--only 1` never loads a student, so a missing one is not an error there."""
    from ganda.cli import main

    bad = str(tmp_path / "missing")
    assert main(["lab", "--only", "6", "--distilled", bad, "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "--distilled" in capsys.readouterr().err
    assert main(["lab", "--only", "1", "--distilled", bad, "--transformer", bad + "2", "--out", str(tmp_path / "r"),
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert "--transformer" in err and "--distilled" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.usefixtures("lab_checkpoints")
def test_lab_on_prompt_sets_counts_each_findings_verdicts(tmp_path, capsys):
    """``--prompt-sets K``: one programme run per evaluation seed, each in its own directory, and
    each finding's verdicts across them counted as the sets' own findings files say."""
    from ganda.cli import main
    from ganda_lab.programme import load_findings

    out = tmp_path / "lab"
    assert main(["lab", "--only", "1", "--limit", "6", "--top", "2", "--seed", "4", "--prompt-sets", "2",
                 "--out", str(out), "-q"]) == 0
    doc = json.loads((out / "prompt_sets.json").read_text())
    assert doc["seeds"] == [4, 5] and [r["finding"] for r in doc["findings"]] == [1]
    row = doc["findings"][0]
    per_set = [load_findings(out / f"set-{i}")[0] for i in (1, 2)]
    assert row["verdicts"] == [f["verdict"] for f in per_set] and row["lab"] == [f["lab"] for f in per_set]
    assert row["reproduced_on"] + row["partly_on"] + row["not_on"] == 2
    assert row["reproduced_on"] == sum(f["verdict"] == "reproduced" for f in per_set)
    cfg = [json.loads((out / f"set-{i}" / "f1-roles-transformer" / "result.json").read_text())["config"] for i in (1, 2)]
    assert cfg[0] != cfg[1]  # two prompt sets, not one twice
    assert f"finding 1: reproduced on {row['reproduced_on']} of 2 prompt sets" in capsys.readouterr().out
    assert len((out / "prompt_sets.csv").read_text().splitlines()) == 3
