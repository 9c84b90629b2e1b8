"""``ganda train``, ``distill``, ``grow`` and ``lab``: train the CPU lab's tiny models and run the
programme. The lab's plugin adds these commands to ``ganda`` (:func:`ganda_lab.plugin.register_cli`).

Each command imports its lab module when it runs: training pulls in the whole training stack, and
the programme every experiment and matplotlib, which ``ganda --help`` should not wait for.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ganda import runio
from ganda.commands.options import QUIET, at_least, int_option, limit_option
from ganda.errors import GandaError

from . import DEFAULT_MODELS, NEEDS, lab_model, shipped


def _print_run(out: Path, rec: dict) -> None:
    last = rec["history"][-1] if rec["history"] else {}
    print(json.dumps({"out": str(out), "params": rec["params"], "seconds": rec["seconds"], **last}))


def register(app: typer.Typer) -> None:
    @app.command(short_help="Train a lab model on the synthetic world")
    def train(
        config: str = typer.Argument(..., help="lab config name (llama, mamba2, hybrid, smoke) or a JSON file/string"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory (a Hugging Face model directory)"),
        steps: int = int_option(None, "--steps", help="override the number of training steps"),
        seed: int = int_option(None, "--seed", help="override the training seed"),
        resume: bool = typer.Option(False, "--resume", help="continue from OUT/checkpoint if present"),
        eval_every: int = int_option(None, "--eval-every", help="steps between quick evaluations (the logged "
                                       "history; the trained weights do not depend on it)"),
        quiet: bool = QUIET,
    ) -> None:
        """Train a lab model on the synthetic world (seeded, checkpointed, resumable)."""
        from .train import train as run  # the training stack loads when the command runs

        out = Path(out)
        if out.exists() and (out / "config.json").exists() and not resume and not (out / "checkpoint").exists():
            raise GandaError(f"{out} already holds a model; choose another --out or pass --resume")
        at_least("--eval-every", eval_every)
        at_least("--steps", steps)
        runio.claim_run_dir(out, kind="model")
        _print_run(out, run(config, out, steps=steps, seed=seed, resume=resume, progress=not quiet,
                            eval_every=eval_every))

    @app.command(short_help="Distil a Mamba-2 student from a lab Llama, layer by layer")
    def distill(
        teacher: str = typer.Argument(..., help="lab Llama teacher: a model directory or a shipped checkpoint name"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory for the distilled SSM"),
        steps: int = int_option(None, "--steps", help="alignment steps"),
        seed: int = int_option(None, "--seed", help="training seed"),
        quiet: bool = QUIET,
    ) -> None:
        """Distil a Mamba-2 student from a lab Llama, layer by layer (no end-to-end stage)."""
        from .distill import distill as run  # the training stack loads when the command runs

        at_least("--steps", steps)
        runio.claim_run_dir(out, kind="model", models=[lab_model(teacher)])
        _print_run(out, run(lab_model(teacher), out, steps=steps, seed=seed, progress=not quiet))

    @app.command(short_help="Grow a lab Llama by block expansion")
    def grow(
        base: str = typer.Argument(..., help="lab Llama to grow: a model directory or a shipped checkpoint name"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory for the grown model"),
        layers: int = int_option(None, "--layers", help="new blocks on top (default 2)"),
        steps: int = int_option(None, "--steps", help="training steps of the new blocks"),
        seed: int = int_option(None, "--seed", help="training seed"),
        quiet: bool = QUIET,
    ) -> None:
        """Grow a lab Llama by block expansion (new blocks on top, the base frozen) and train the new
        blocks on facts MMLU never asks: finding 2's deep Transformer."""
        from .grow import grow as run  # the training stack loads when the command runs

        at_least("--layers", layers)
        at_least("--steps", steps)
        runio.claim_run_dir(out, kind="model", models=[lab_model(base)])
        _print_run(out, run(lab_model(base), out, layers=layers, steps=steps, seed=seed, progress=not quiet))

    @app.command(short_help="The lab programme: the paper's six findings on the lab models")
    def lab(
        transformer: str = typer.Option(DEFAULT_MODELS["transformer"], "--transformer",
                                       help="Llama model (findings 1-4, donor of 6)"),
        ssm: str = typer.Option(DEFAULT_MODELS["ssm"], "--ssm", help="Mamba-2 model (findings 3, 4); '' to skip"),
        hybrid: str = typer.Option(DEFAULT_MODELS["hybrid"], "--hybrid", help="hybrid model (finding 5; lab-hybrid has its "
                                   "attention mid-stack); '' to skip"),
        distilled: str = typer.Option(DEFAULT_MODELS["distilled"], "--distilled",
                                     help="distilled SSM student of --transformer (finding 6); '' to skip"),
        kv_transformer: str = typer.Option(DEFAULT_MODELS["kv_transformer"], "--kv-transformer",
                                          help="Llama trained for KV (finding 3's KV curve); '' with --kv-ssm '' "
                                          "to measure the curve on --transformer and --ssm"),
        kv_ssm: str = typer.Option(DEFAULT_MODELS["kv_ssm"], "--kv-ssm", help="Mamba-2 trained for KV (finding 3's "
                                  "KV curve)"),
        deep: str = typer.Option(DEFAULT_MODELS["deep"], "--deep", help="--transformer grown by blocks that store facts "
                                 "MMLU never asks (ganda grow; finding 2 prunes it); '' to prune --transformer"),
        from_scratch: bool = typer.Option(False, "--from-scratch", help="first train all seven models into "
                                          "--workdir (resumable; two at a time), then use them"),
        workdir: Path = typer.Option(Path("runs/lab-train"), "--workdir", help="--from-scratch: model directories"),
        jobs: int = int_option(2, "--jobs", help="--from-scratch: trainings at a time (one torch thread each; "
                                 "two: the teacher, its student and the KV pair on one core, the SSM then the hybrid "
                                 "on the other; more share cores, niced but for the teacher and its student)"),
        eval_every: int = int_option(1000, "--eval-every", help="--from-scratch: steps between the trainings' "
                                       "quick evaluations (their logged history; the weights do not depend on it)"),
        steps: int = int_option(None, "--steps", help="--from-scratch: override every config's training steps"),
        limit: int = limit_option(200, "held-out prompts per task", mmlu=False),
        seed: int = int_option(0, "--seed", help="evaluation seed"),
        prompt_sets: int = int_option(1, "--prompt-sets", help="run the programme on K prompt sets (evaluation "
                                        "seeds --seed, +1, ...; one run directory each, OUT/set-1 ...) and count "
                                        "on how many each finding holds"),
        top: int = int_option(6, "--top", help="heads whose role is tested per model"),
        only: str = typer.Option("1,2,3,4,5,6", "--only", help="findings to run, e.g. 1,5"),
        out: Path = typer.Option(Path("runs/lab"), "--out", "-o", help="run directory (one folder per finding, "
                                 "findings/, report.html)"),
        quiet: bool = QUIET,
        replay: Path = typer.Option(None, "--replay", help="redraw the verdicts, findings.png and report.html "
                                    "of a finished run directory (runs no model)"),
    ) -> None:
        """The lab programme: the paper's six findings on the lab models (shipped, given, or trained
        --from-scratch), heads discovered, verdicts next to the paper's numbers, one HTML report."""
        from .programme import Programme  # every experiment and matplotlib: loaded on use
        from .programme import replay as replay_run

        for flag, value in (("--limit", limit), ("--top", top), ("--jobs", jobs), ("--eval-every", eval_every),
                            ("--steps", steps), ("--prompt-sets", prompt_sets)):
            at_least(flag, value)
        if replay is not None:
            runio.claim_run_dir(replay, "--replay", kind="lab")
            for f in replay_run(replay):
                print(f"finding {f['finding']}: {f['verdict']:<15} {f['lab']}")
            print(f"wrote {replay}/findings/findings.png and {replay}/report.html")
            return

        try:
            findings = tuple(sorted({int(x) for x in only.split(",") if x.strip()}))
        except ValueError:
            raise GandaError(f"--only: not a list of finding numbers: {only!r}") from None
        if not findings or any(f not in range(1, 7) for f in findings):
            raise GandaError("--only takes finding numbers 1 to 6")
        models = {"transformer": transformer, "ssm": ssm, "hybrid": hybrid, "distilled": distilled,
                  "kv_transformer": kv_transformer, "kv_ssm": kv_ssm, "deep": deep}
        if from_scratch:
            from .scratch import train_all  # the training stack loads when the command runs

            runio.claim_run_dir(workdir, "--workdir")
            models = train_all(workdir, jobs=jobs, steps=steps, eval_every=eval_every)
        needed = set().union(*(NEEDS[f] for f in findings))  # --only 1 does not need a student
        for role, spec in models.items():
            if role in needed and spec and not Path(spec).exists() and spec not in shipped():
                raise GandaError(f"--{role.replace('_', '-')} {spec!r} is neither a model directory nor a shipped lab checkpoint "
                                 f"({', '.join(shipped())})")
        runio.claim_run_dir(out, kind="lab", models=[lab_model(m) for r, m in models.items() if r in needed and m])
        if prompt_sets > 1:
            _lab_sets(models, out, limit, seed, top, findings, prompt_sets, quiet)
            return
        res = Programme(models=models, out=out, n=limit, seed=seed, top=top, only=findings, progress=not quiet).run()
        for f in res["findings"]:
            print(f"finding {f['finding']}: {f['verdict']:<15} {f['lab']}")
        print(f"wrote {out}/report.html ({res['seconds']:.0f} s)")


def _lab_sets(models: dict, out: Path, limit: int, seed: int, top: int, findings: tuple[int, ...], k: int,
              quiet: bool) -> None:
    """The programme once per prompt set (seeds ``seed .. seed + k - 1``, resumable each), then each
    finding's count of sets that reproduce it: ``prompt_sets.json`` and ``prompt_sets.csv``."""
    from .programme import Programme, across_text, verdicts_across

    seeds = [seed + i for i in range(k)]
    sets = []
    for i, s in enumerate(seeds):
        res = Programme(models=models, out=out / f"set-{i + 1}", n=limit, seed=s, top=top, only=findings,
                        progress=not quiet).run()
        sets.append(res["findings"])
    rows = verdicts_across(sets, seeds)
    runio.write_json(out / "prompt_sets.json", {"kind": "lab-prompt-sets", "seeds": seeds, "findings": rows})
    runio.write_csv(out / "prompt_sets.csv", [
        {"finding": r["finding"], "set": i + 1, "seed": s, "verdict": v, "lab": lab}
        for r in rows for i, (s, v, lab) in enumerate(zip(seeds, r["verdicts"], r["lab"], strict=True))])
    for r in rows:
        print(across_text(r))
    print(f"wrote {out}/prompt_sets.json, prompt_sets.csv and one run per set ({out}/set-1 ... set-{k})")
