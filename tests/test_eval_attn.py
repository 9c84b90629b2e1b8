"""``ganda eval`` and ``ganda attn`` are registered experiments (run once, printed, no run directory):
their commands are built from ``EvalOptions`` and ``MapsOptions``, they score what the library
scores, and ``ganda plan`` costs them under both of attn's names."""

from __future__ import annotations

import json

import pytest
import typer.main

from ganda import registry
from ganda.cli import app, main

LAB = "lab-llama-h1"


def _command(name: str):
    return typer.main.get_command(app).get_command(None, name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["eval", "attn"])
def test_the_command_is_built_from_the_experiments_options(name, capsys):
    cls = registry.experiment(name)
    assert name in registry.command_experiments()
    assert name not in {c.name for c in app.registered_commands}  # no hand-written body
    cmd = _command(name)
    declared = {f.name: cls.Options.cli_flag(f.name) for f in cls.Options.fields() if not f.metadata["hidden"]}
    shown = {p.name: p.opts[0] for p in cmd.params if p.param_type_name == "option"}
    assert declared and all(shown.get(k) == flag for k, flag in declared.items()), (declared, shown)
    assert main([name, "--help"]) == 0
    text = capsys.readouterr().out
    assert all(flag in text for flag in declared.values())
    assert cmd.short_help == registry.experiment_summary(name)


def _eval_json(capsys, *argv: str) -> dict:
    assert main(["-q", "eval", LAB, "--task", "lab-mmlu", "--limit", "20", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_gives_the_librarys_numbers_intact_and_ablated(capsys):
    from ganda import load_model, runio
    from ganda.evaluation import evaluate
    from ganda.interventions import AblateHeads
    from ganda.tasks import get_task

    ad = load_model(LAB)
    task = get_task("lab-mmlu", adapter=ad)
    keys = ("task", "model", "n", "correct", "accuracy", "ci_low", "ci_high", "interventions")
    runs = {}
    for ablate, ivs in ((None, []), ("L2H0", [AblateHeads("L2H0")])):
        got = _eval_json(capsys, *(["--ablate", ablate] if ablate else []))
        want = runio.rounded(evaluate(ad, task, ivs, limit=20, progress=False).to_json())  # as --json prints it
        assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
        runs[ablate] = got
    assert runs[None]["n"] == runs["L2H0"]["n"] == 20
    assert runs["L2H0"]["accuracy"] < runs[None]["accuracy"]  # the head matters on this task
    assert runs["L2H0"]["interventions"] == [{"type": "ablate_heads", "heads": "L2H0", "ablation": "zero"}]
    # a Python caller's run through the command's runner: the same numbers
    from ganda.experiments.evaluation import EvalOptions, Evaluation
    from ganda.experiments.runner import RunInputs, run_direct

    done = run_direct(Evaluation, RunInputs(model=LAB, task="lab-mmlu", limit=20, progress=False),
                      EvalOptions.build({"ablate": "L2H0"}))
    assert done.out_dir is None
    assert {k: runio.rounded(done.result.to_json())[k] for k in keys} == {k: runs["L2H0"][k] for k in keys}
    # the text line carries the same numbers
    assert main(["-q", "eval", LAB, "--task", "lab-mmlu", "--limit", "20", "--ablate", "L2H0"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    r = runs["L2H0"]
    assert line.startswith(f"lab-mmlu on {r['model']}: accuracy {r['accuracy']:.3f} (95% CI {r['ci_low']:.3f}-"
                           f"{r['ci_high']:.3f}), n=20, ")
    assert line.endswith('interventions: {"type": "ablate_heads", "heads": "L2H0", "ablation": "zero"}')
    # ganda run eval: the same run, its options as --option
    assert main(["-q", "run", "eval", LAB, "--task", "lab-mmlu", "--limit", "20", "--option", "ablate=L2H0"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": None, "experiment": "eval", "task": "lab-mmlu",
                                                   **{k: r[k] for k in ("accuracy", "ci_low", "ci_high", "n")}}


def test_eval_options_are_checked_the_same_from_python():
    from ganda.errors import GandaError

    opts = registry.experiment("eval").Options
    with pytest.raises(GandaError, match=r"^ablation and ablate_at need ablate HEADS$"):
        opts.build({"ablation": "mean"})
    with pytest.raises(GandaError, match=r"^mask_rule must be query or last, not 'x'$"):
        opts.build({"mask_rule": "x"})
    built = opts.build({"ablate": "L1H0", "ablation": "resample", "ablate_at": "key", "keep_layers": "0-2"})
    assert [iv.describe()["type"] for iv in built.interventions(3)] == ["keep_layers", "ablate_heads"]
    ablate = built.interventions(3)[1]
    assert (ablate.how, ablate.positions, ablate.seed) == ("resample", "key", 3)
    zeroed = built.interventions(3, zeroed=True)[1]
    assert (zeroed.how, zeroed.positions) == ("zero", None)


def test_plan_costs_attn_under_both_names_and_eval(capsys):
    plans = []
    for name in ("attn", "maps"):
        assert main(["-q", "plan", LAB, "-e", name, "--rows", "4", "--limit", "3", "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0]["flops"] == plans[1]["flops"] > 0 and plans[0]["phases"] == plans[1]["phases"]
    assert main(["-q", "plan", LAB, "-e", "eval", "--limit", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flops"] > 0
    plan = {p.name for p in _command("plan").params}
    assert {"rows", "map_layers"} <= plan and not {"predictions", "prompt", "index", "mask_rule"} & plan


def test_attn_refuses_plans_map_layers_and_run_names_its_command(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    assert main(["attn", LAB, "--heads", "L1H0", "--map-layers", "1", "--out", "a.png"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        "ganda: error: --map-layers is what ganda plan costs; ganda attn draws the layers of --heads"]
    assert not any(tmp_path.iterdir())
    # ganda run is the same run, its options as --option (the same checks, named as --option names them)
    for name in ("attn", "maps"):
        assert main(["run", name, LAB]) == 2
        assert capfd.readouterr().err.splitlines() == ["ganda: error: heads is required: head ids such as L16H22"]
    assert main(["-q", "run", "maps", LAB, "--task", "lab-kv", "--option", "heads=L1H0", "--option", "out=b.png"]) == 0
    assert json.loads(capfd.readouterr().out) == {"out": None, "experiment": "attn", "figure": "b.png", "maps": "b.json"}
    assert main(["-q", "attn", LAB, "--task", "lab-kv", "--heads", "L1H0", "--out", "c.png"]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["prompts"] == json.loads((tmp_path / "c.json").read_text())["prompts"]
