"""Extending ganda from outside the package: a new model family, a new task, a new experiment and
a new result kind, each one class here plus a registration line (``ganda.registry``), then used end
to end through the library, the experiments, the command line, the grid, the planner and the
results tables (docs/extending.md)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_experiments import tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from ganda import registry
from ganda.errors import GandaError
from ganda.experiments.base import Experiment, Options
from ganda.experiments.common import ExperimentResult
from ganda.figures import bars
from ganda.heads import expand
from ganda.interventions import AblateHeads
from ganda.models.transformer import TransformerAdapter
from ganda.tasks.base import Example, Task

# ---- what a third-party package would write (one file) ----------------------------------------


class ToyLM(LlamaForCausalLM):
    """A model class transformers does not know by its ``model_type`` ("toy_lm")."""


def load_toy(path: Path) -> ToyLM:
    raw = json.loads((path / "config.json").read_text())
    model = ToyLM(LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"}))
    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
    return model


class ToyAdapter(TransformerAdapter):
    """ToyLM has the Llama layout, so the Transformer adapter's machinery serves it."""

    family = "toy"

    @classmethod
    def matches(cls, model: torch.nn.Module) -> bool:
        return isinstance(model, ToyLM)


class FirstLetterTask(Task):
    """``Letters: C A D B`` -> the first letter, among ``options`` letters."""

    name = "toy-first"
    kind = "mc"
    bounds = {"options": (2, 4), "n": (1, None)}

    def __init__(self, options: int = 4, n: int = 20) -> None:
        self.options, self.n = options, n

    @classmethod
    def chance(cls, options: dict[str, Any] | None = None) -> float:
        return 1 / int((options or {}).get("options") or 4)

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        rng = random.Random(f"toy-first-{self.options}-{seed}")
        letters = "ABCD"[: self.options]
        out = []
        for _ in range(self.n if limit is None else limit):
            order = rng.sample(letters, len(letters))
            out.append(Example(prompt=f"Letters: {' '.join(order)}\nThe first letter is",
                               choices=[f" {c}" for c in letters], gold=letters.index(order[0])))
        return out


@dataclass
class LetterCountResult(ExperimentResult):
    """How many of the task's examples a model gets right, with one bar figure."""

    kind: str = "toy_letters"

    def headline(self) -> str:
        return f"{self.model} answers **{self.summary['correct']} of {self.summary['n']}** first letters."

    def draw(self, out_dir: Path) -> list[Path]:
        s = self.summary
        return [bars(["correct", "wrong"], {"examples": [s["correct"], s["n"] - s["correct"]]},
                     Path(out_dir) / "toy_letters.png")]


@dataclass
class OneHeadOptions(Options):
    head: str = field(default="L0H0", metadata={"help": "the head to ablate, e.g. L1H2"})

    def check(self) -> None:
        if not re.fullmatch(r"L\d+H\d+", self.head):
            raise GandaError(f"{self.flag('head')} must be one head id such as L1H2, not {self.head!r}")


@dataclass
class OneHeadResult(ExperimentResult):
    kind: str = "toy_one_head"

    def headline(self) -> str:
        s = self.summary
        return f"Ablating {s['head']} takes accuracy from **{s['intact']:.2f}** to **{s['ablated']:.2f}**."


class OneHead(Experiment):
    """Accuracy intact and with one head ablated, on one task's examples."""

    name = "toy-one-head"
    summary = "accuracy intact and with one head ablated"
    Options = OneHeadOptions
    phases = f"{__name__}:one_head_phases"

    def run(self, adapter, examples, options, *, out_dir, config, progress=True):
        from ganda.scoring import evaluate_examples

        expand(options.head, adapter)  # a head the model does not have: one line
        intact = evaluate_examples(adapter, examples, progress=False)
        ablated = evaluate_examples(adapter, examples, [AblateHeads(options.head)], progress=False)
        res = OneHeadResult(model=adapter.spec, config=config, summary={
            "head": options.head, "intact": intact.accuracy, "ablated": ablated.accuracy, "n": intact.n})
        res.save(out_dir)
        return res


def one_head_phases(p, w, opts):
    """Two scoring passes over the examples."""
    from ganda.plan import scoring_phase

    return [scoring_phase(p, w, "intact and ablated", 2, opts)], 0.0, []


# ---- the registrations, and a model directory to load ------------------------------------------


@pytest.fixture
def toy(tmp_path):
    """Register the toy family, name, task and result kind (the registries are restored after)."""
    registry.load_plugins()  # what the plugins register belongs to the state restored afterwards
    registry.experiment_names()  # the built-in experiments too
    boxes = (registry._FAMILIES, registry.MODEL_TYPES, registry.LOADERS, registry._RESOLVERS, registry._TASKS,
             registry._NUMBER_OPTION, registry._RESULTS, registry._EXPERIMENTS)
    saved = [list(b) if isinstance(b, list) else dict(b) for b in boxes]
    model_dir = tmp_path / "toy-tiny"
    model_dir.mkdir()
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id)
    save_file({k: v.contiguous() for k, v in ToyLM(cfg).state_dict().items()}, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps({**cfg.to_diff_dict(), "model_type": "toy_lm"}))
    tok.save_pretrained(model_dir)

    registry.register_family(ToyAdapter, {"toy_lm": "Toy LM"}, loader=load_toy)
    registry.register_resolver("toy-", lambda spec: tmp_path / spec if (tmp_path / spec).is_dir() else None,
                               names=lambda: ["toy-tiny"], label="a toy model")
    registry.register_task("toy-first", FirstLetterTask, number_option="options")
    registry.register_result("toy_letters", LetterCountResult)
    registry.register_experiment("toy-one-head", OneHead)
    registry.register_result("toy_one_head", OneHeadResult)
    yield model_dir
    for box, old in zip(boxes, saved, strict=True):
        box.clear()
        box.extend(old) if isinstance(box, list) else box.update(old)


def test_a_new_family_task_and_result_kind_work_end_to_end(toy, tmp_path, capsys):
    import ganda
    from ganda.cli import main
    from ganda.evaluation import evaluate
    from ganda.experiments import result_from_json
    from ganda.experiments.common import Scorer, chance, parse_tasks
    from ganda.experiments.prune import prune_curve
    from ganda.report import write_report
    from ganda.scoring import score_example
    from ganda.tasks import get_task

    # the family: a name resolves to the directory, the loader builds the model, the adapter serves it
    ad = ganda.load_model("toy-tiny", device="cpu")
    assert type(ad) is ToyAdapter and type(ad.model) is ToyLM and ad.spec == "toy-tiny"
    assert ad.num_layers == 2 and len(ad.heads()) == 8
    with pytest.raises(ganda.GandaError, match="or a toy model: toy-tiny"):
        ganda.load_model("toy-nope")

    # the task: built by name with its declared options, scored like any task
    task = get_task("toy-first", options=3)
    exs = task.examples(limit=12)
    right = sum(score_example(ad, ex).pred == ex.gold for ex in exs)
    r = evaluate(ad, task, limit=12, progress=False)
    assert (r.n, r.correct) == (12, right) and r.accuracy == right / 12
    with pytest.raises(ganda.GandaError, match="options must be between 2 and 4"):
        get_task("toy-first", options=9)

    # the experiments take it by name (toy-first3: three options), at its declared chance
    assert parse_tasks("toy-first3,toy-first") == ["toy-first3", "toy-first"]
    assert chance("toy-first3") == pytest.approx(1 / 3) and chance("toy-first") == 0.25
    curve = prune_curve(ad, Scorer(ad, ["toy-first3"], limit=12, progress=False))
    assert curve.rows[0]["layers"] == 2 and curve.rows[0]["toy-first3"] == right / 12  # the same 12 examples

    # the command line loads it by name too
    assert main(["eval", "toy-tiny", "--task", "toy-first", "--option", "options=3", "--limit", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accuracy"] == pytest.approx(right / 12, rel=1e-6) and out["n"] == 12  # printed to 6 digits

    # the result kind: saved, rebuilt from its JSON as its own class, rendered with its headline and figure
    res = LetterCountResult(model=ad.spec, summary={"correct": right, "n": 12})
    run = res.save(tmp_path / "run")
    assert (run / "toy_letters.png").is_file()
    assert type(result_from_json(json.loads((run / "result.json").read_text()))) is LetterCountResult
    (run / "toy_letters.png").unlink()  # the report draws it from result.json
    page = write_report([run], tmp_path / "report.html").read_text()
    assert f"toy-tiny answers <b>{right} of 12</b> first letters." in page
    assert page.count("data:image/png;base64,") == 1
    assert main(["report", str(run), "--out", str(tmp_path / "cli.html")]) == 0
    assert re.search(r"<b>\d+ of 12</b>", (tmp_path / "cli.html").read_text())


def test_a_new_experiment_runs_from_the_command_line_the_grid_the_planner_and_results(toy, tmp_path, capsys):
    """One class and one registration: ``ganda run``, ``ganda grid``, ``ganda plan``'s costs and
    ``ganda.results.load`` all find the experiment, and its options are checked in one place."""
    import ganda
    from ganda import plan as planner
    from ganda.cli import main
    from ganda.grid import run_grid
    from ganda.results import load
    from ganda.scoring import evaluate_examples
    from ganda.tasks import get_task

    ad = ganda.load_model("toy-tiny", device="cpu")
    exs = get_task("toy-first").examples(limit=12)
    intact = evaluate_examples(ad, exs, progress=False).accuracy
    ablated = evaluate_examples(ad, exs, [AblateHeads("L1H2")], progress=False).accuracy

    run = tmp_path / "run"
    argv = ["run", "toy-one-head", "toy-tiny", "--task", "toy-first", "--limit", "12", "--option", "head=L1H2"]
    assert main([*argv, "--out", str(run)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["experiment"] == "toy-one-head" and printed["head"] == "L1H2"
    saved = json.loads((run / "result.json").read_text())
    assert (saved["summary"]["intact"], saved["summary"]["ablated"]) == pytest.approx((intact, ablated), rel=1e-6)
    assert saved["config"]["options"] == {"head": "L1H2"} and saved["config"]["limit"] == 12

    assert main(["run", "toy-one-head", "toy-tiny", "--task", "toy-first", "--option", "head=banana"]) == 2
    assert "head must be one head id such as L1H2, not 'banana'" in capsys.readouterr().err
    assert main(["run", "toy-one-head", "toy-tiny", "--task", "toy-first", "--option", "layer=3"]) == 2
    assert "unknown option 'layer' (takes head)" in capsys.readouterr().err

    spec = {"models": ["toy-tiny"], "tasks": ["toy-first"], "experiments": ["toy-one-head"],
            "options": {"limit": 12, "toy-one-head": {"head": "L1H2"}}, "out": str(tmp_path / "grid")}
    job = run_grid(spec)[0]
    assert job["status"] == "done" and job["result"]["ablated"] == ablated
    with pytest.raises(GandaError, match=r"options.toy-one-head: head must be one head id"):
        run_grid({**spec, "options": {"toy-one-head": {"head": "L9"}}})

    prof, w = planner.profile(ad), planner.workload_from_examples(exs)
    two = planner.plan(prof, "toy-one-head", w, "cpu")
    one = planner.plan(prof, "eval", w, "cpu")
    assert "toy-one-head" in planner.costed_experiments() and two.flops == pytest.approx(2 * one.flops)

    res = load(run, tmp_path / "grid")
    assert list(res.runs["kind"]) == ["toy_one_head", "toy_one_head"]
    assert list(res.runs["ablated"]) == pytest.approx([ablated, ablated], rel=1e-6)  # result.json: 6 digits


def test_the_lab_is_a_plugin_the_core_never_imports():
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "ganda"
    importers = []
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            importers += [f"{f.relative_to(src)}: {n}" for n in names if n.split(".")[0] == "ganda_lab"]
    assert importers == []
    # what the lab adds, it adds through its entry point
    assert "lab" in registry.plugins()
    assert {"lab-mmlu", "lab-knowledge", "lab-letters", "lab-kv"} <= set(registry.task_names())
    assert registry.parse_task_name("lab-kv16") == ("lab-kv", {"pairs": 16})
    assert registry.result_class("lab_findings").__module__ == "ganda_lab.programme"
    assert registry.resolve_model("lab-llama-h1") is not None and registry.resolve_model("lab-nope") is None


def test_a_plugin_that_fails_to_load_is_reported_and_left_out(monkeypatch):
    class Broken:
        name, value = "broken", "nowhere:plugin"

        def load(self):
            raise ImportError("No module named 'nowhere'")

    class Fine:
        name, value = "fine", "here:plugin"
        registered: list[str] = []

        def load(self):
            return self

        def register(self):
            Fine.registered.append("yes")

    monkeypatch.setattr(registry, "_PLUGINS", None)
    monkeypatch.setattr(registry, "PLUGIN_ERRORS", {})
    monkeypatch.setattr(registry.md, "entry_points", lambda group: [Broken(), Fine()])
    assert registry.load_plugins() is True and registry.load_plugins() is False  # once
    assert Fine.registered == ["yes"] and list(registry.plugins()) == ["fine"]
    assert "No module named 'nowhere'" in registry.PLUGIN_ERRORS["broken"]
