"""``ganda train`` and ``ganda lab``: train the CPU lab's tiny models and run the programme."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import GandaError

LAB_TASK_NAMES = ("lab-knowledge", "lab-mmlu", "lab-letters", "lab-kv")


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        config: str = typer.Argument(..., help="lab config name (llama, mamba2, hybrid, smoke) or a JSON file/string"),
        out: Path = typer.Option(..., "--out", help="output directory (a Hugging Face model directory)"),
        steps: int = typer.Option(None, help="override the number of training steps"),
        seed: int = typer.Option(None, help="override the training seed"),
        resume: bool = typer.Option(False, help="continue from OUT/checkpoint if present"),
        progress: bool = typer.Option(True, help="show a progress bar"),
    ) -> None:
        """Train a lab model on the synthetic world (seeded, checkpointed, resumable)."""
        from ..lab.train import train as run

        out = Path(out)
        if out.exists() and (out / "config.json").exists() and not resume and not (out / "checkpoint").exists():
            raise GandaError(f"{out} already holds a model; choose another --out or pass --resume")
        rec = run(config, out, steps=steps, seed=seed, resume=resume, progress=progress)
        last = rec["history"][-1] if rec["history"] else {}
        print(json.dumps({"out": str(out), "params": rec["params"], "seconds": rec["seconds"], **last}))

    @app.command()
    def distill(
        teacher: str = typer.Argument(..., help="lab Llama teacher: a model directory or a shipped checkpoint name"),
        out: Path = typer.Option(..., "--out", help="output directory for the distilled SSM"),
        steps: int = typer.Option(None, help="alignment steps"),
        seed: int = typer.Option(None, help="seed"),
        progress: bool = typer.Option(True, help="show a progress bar"),
    ) -> None:
        """Distil a Mamba-2 student from a lab Llama, layer by layer (no end-to-end stage)."""
        from ..lab import checkpoint, shipped
        from ..lab.distill import distill as run

        path = Path(teacher) if Path(teacher).exists() else checkpoint(teacher) if teacher in shipped() else None
        if path is None:
            raise GandaError(f"{teacher!r} is neither a model directory nor a shipped lab checkpoint")
        rec = run(path, out, steps=steps, seed=seed, progress=progress)
        last = rec["history"][-1] if rec["history"] else {}
        print(json.dumps({"out": str(out), "params": rec["params"], "seconds": rec["seconds"], **last}))

    @app.command()
    def lab(
        models: str = typer.Option("lab-llama", help="comma-separated shipped checkpoint names, model directories, "
                                   "or lab config names (llama, mamba2, hybrid, smoke: trained into --workdir)"),
        workdir: Path = typer.Option(Path("lab-runs"), help="where config names are trained (resumable)"),
        steps: int = typer.Option(None, help="training steps for config names"),
        n: int = typer.Option(200, help="examples per task"),
        seed: int = typer.Option(0, help="evaluation seed"),
        sweep: bool = typer.Option(False, help="also run the single-head ablation sweep on lab-mmlu/lab-knowledge"),
        out: Path = typer.Option(None, help="write the results as JSON here"),
    ) -> None:
        """The lab programme: load shipped (or given) lab models and evaluate the four lab tasks."""
        from ..lab import checkpoint, shipped
        from ..lab.configs import CONFIGS
        from ..models import load_model
        from ..models.registry import _ensure_builtin
        from ..scoring import evaluate

        _ensure_builtin()  # SSM/hybrid families register their model types on import
        from ..tasks import get_task

        results = {}
        for spec in [m.strip() for m in models.split(",") if m.strip()]:
            path = Path(spec) if Path(spec).exists() else checkpoint(spec) if spec in shipped() else None
            if path is None and spec in CONFIGS:
                from ..lab.train import train as run

                path = Path(workdir) / spec
                if not (path / "lab.json").exists():
                    run(spec, path, steps=steps, resume=True)
            if path is None:
                raise GandaError(f"{spec!r} is neither a model directory nor a shipped lab checkpoint ({', '.join(shipped())})")
            adapter = load_model(str(path))
            from ..lab.analysis import model_world

            world = model_world(adapter)
            res = {}
            for t in LAB_TASK_NAMES:
                r = evaluate(adapter, get_task(t, world=world), limit=n, seed=seed, progress=False)
                res[t] = {"accuracy": r.accuracy, "ci95": list(r.ci95), "n": r.n}
                print(f"{spec:<16} {t:<14} {r.accuracy:6.3f}  [{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]  n={r.n}")
            entry = {"tasks": res}
            if sweep:
                from ..lab.analysis import format_sweep, head_sweep

                sw = head_sweep(adapter, n=n, seed=seed)
                print(format_sweep(sw, top=8))
                entry["sweep"] = sw
            results[spec] = entry
        if out:
            Path(out).write_text(json.dumps(results, indent=2))
