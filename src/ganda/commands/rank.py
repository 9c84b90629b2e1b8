"""``ganda rank``: rank every head by attribution (AtP / AtP* / IG), verify the top K exactly, bound the rest."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from ..tasks import get_task
from . import options
from .core import (
    MODEL,
    PAIRS,
    PICKLE,
    QUIET,
    SAMPLE,
    SHOTS,
    SUBJECTS,
    flag,
    limit_option,
    mmlu_options,
    model_inputs,
    require_heads,
)
from .grid import RAY, RAY_ACTORS


def register(app: typer.Typer) -> None:
    @app.command(short_help="Rank every head by its ablation effect on the task's margin")
    def rank(
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="any multiple-choice task (kv, mmlu, lab-mmlu, arc_easy, ...)"),
        method: str = typer.Option("atp", "--method", "-m", help="atp (one backward), atp* (adds GradDrop), ig "
                                   "(integrated gradients over --ig-steps) or exact (the exhaustive sweep)"),
        graddrop_blocks: int = typer.Option(6, "--graddrop-blocks", help="atp*: GradDrop over this many blocks of "
                                            "layers (0: one per layer, the paper's form; cost grows with it)"),
        ig_steps: int = typer.Option(5, "--ig-steps", help="ig: midpoint steps from every head ablated to the clean "
                                     "model (each costs about one AtP pass)"),
        verify_top: int = typer.Option(10, "--verify-top", "-k", help="verify this many top heads exactly"),
        verify_layers: str | None = typer.Option(None, "--verify-layers", help="also verify every head of these layers, "
                                          "e.g. 0,1 (first-order estimates underrate the first layers' heads)"),
        audit: int = typer.Option(0, "--audit", help="also verify this many random other heads: the false-negative "
                                  "bound's sample (10 cost about 4% of the exhaustive sweep on SmolLM2)"),
        widen: int = typer.Option(0, "--widen", help="then verify this many more heads by estimate, round after "
                                  "round, until a round leaves the reported top --top unchanged (0: off)"),
        screen: int = typer.Option(0, "--screen", help="also verify the heads whose ablation at the answer's "
                                   "position hurts most, this many (exact there, one token per head; 0: off)"),
        active: int = typer.Option(30, "--active", help="also verify this many heads with the largest mean |AtP| "
                                   "per prompt (heads whose per-prompt effects cancel in the estimate; 0: off)"),
        threshold: float | None = typer.Option(None, "--threshold", help="effect size the bound speaks about "
                                               "(default: the smallest exact effect in the verified top --top)"),
        ablation: str = options.ablation_option("zero|mean (resample needs a donor per scored row: eval runs it)"),
        margin: str = typer.Option("mean", "--margin", help="gold log-likelihood minus the mean or the max of the others'"),
        limit: int | None = limit_option(None, "number of prompts (default: 32)"),
        sample: bool = SAMPLE,
        pairs: int | None = PAIRS,
        shots: int | None = SHOTS,
        subjects: str | None = SUBJECTS,
        heads: str | None = typer.Option(None, "--heads", help="only these heads (default: all), e.g. 'L16H*'"),
        seed: int = typer.Option(0, "--seed", help="prompt sample and audit draw"),
        top: int = typer.Option(10, "--top", help="rows in the printed table; the bound's default threshold"),
        out: Path = typer.Option(None, "--out", "-o", help="directory (default: runs/rank-<task>)"),
        resume: bool = typer.Option(True, "--resume/--no-resume", help="continue a stopped run in --out"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object (ranking of every head) instead of a table"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
        ray: str | None = RAY,
        ray_actors: int | None = RAY_ACTORS,
    ) -> None:
        """Rank every head by its ablation effect on the task's margin: attribution for all, exact for the top.

        A head's effect is the drop of the mean margin when it is ablated (intact minus ablated). The
        first table holds the verified heads that matter (positive effect), largest first; verified
        heads whose ablation raises the margin are listed apart, as helpful when ablated. Both tables
        show the margin and the accuracy drop.

        Writes OUT/ranking.json, ranking.csv, scatter.png (estimate vs exact), verify_heatmap.png (exact effect
        by layer and head), OUT/attribution.jsonl and OUT/verify/ (both resume a stopped run).
        """
        from ..attribution import check_rank_options, rank_heads
        from ..attribution.ranking import sign_flip_sentence
        from ..distributed import ray_sweeps
        from ..finite import finite_json
        from ..heads import expand
        from ..models import load_model
        from ..tasks import task_for_model

        if limit is not None and limit < 1:
            raise GandaError("--limit must be at least 1")
        if graddrop_blocks < 0:
            raise GandaError("--graddrop-blocks must be at least 0 (0: one block per layer)")
        check_rank_options(method, ablation, margin, verify_top, audit, top, threshold,
                           graddrop_blocks=graddrop_blocks or None, name=flag, ig_steps=ig_steps, widen=widen, screen=screen,
                           active=active)
        layer_list = _layers(verify_layers)
        require_heads("--heads", heads)
        opts = {"pairs": pairs, "shots": shots, "subjects": subjects, **mmlu_options(sample)}
        task_obj = get_task(task, **opts)
        if task_obj.kind != "mc":
            raise GandaError(f"task {task!r} is a generation task; rank scores multiple-choice tasks only")
        n = limit if limit is not None else 32
        runio.claim_run_dir(out if out is not None else Path("runs") / f"rank-{task}", kind="rank",
                            models=model_inputs(model))
        adapter = load_model(model, allow_pickle=allow_pickle)
        task_obj = task_for_model(task, task_obj, adapter, **opts)
        examples = task_obj.examples(limit=n, seed=seed)
        if not examples:
            raise GandaError(f"task {task!r} gave no examples")
        if any(len(ex.choices) < 2 for ex in examples):
            raise GandaError(f"task {task!r} has examples with fewer than two choices; a margin needs two")
        head_list = expand(heads, adapter) if heads else None
        out_dir = out if out is not None else Path("runs") / f"rank-{task}"
        cfg = {"task": task_obj.config(), "limit": n, "n": len(examples), "seed": seed}
        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):  # the exact (zero-ablation) verification
            res = rank_heads(adapter, examples, method=method, ablation=ablation, margin=margin,
                             verify_top=verify_top, audit=audit, threshold=threshold, top=top, seed=seed,
                             verify_layers=layer_list, graddrop_blocks=graddrop_blocks or None, ig_steps=ig_steps,
                             heads=head_list, out_dir=out_dir, resume=resume, progress=not (as_json or quiet),
                             config=cfg, widen=widen, screen=screen, active=active)
        if as_json:
            print(json.dumps(runio.rounded(finite_json({**res.to_json(), "out": str(out_dir)}))))
            return

        console = options.console()
        s = res.seconds
        timing = ", ".join(f"{k} {s[k]:.1f} s" for k in ("attribution", "screen", "verification", "total") if k in s)
        blocks = res.config.get("graddrop_blocks")
        how = f"{method} (GradDrop over {blocks} blocks of layers)" if blocks else method
        if res.config.get("ig_steps"):
            how = f"{method} ({res.config['ig_steps']} steps)"
        console.print(f"[bold]{model}[/bold] on {task} (n={len(examples)}), {how}, {ablation}-ablation, "
                      f"{margin} margin {res.clean:+.3f}; {len(res.heads)} heads, {len(res.exact)} verified"
                      + (f" ({res.config['widened']} by --widen)" if res.config.get("widened") else "") + f"; {timing}")
        _print_heads(console, res, top)
        if res.bound is not None and res.audited:
            console.print(f"bound: {res.bound.sentence()}")
        elif res.bound is not None:
            console.print("bound: none without an audit (--audit N verifies N random unverified heads for one)")
        if flips := sign_flip_sentence(res.sign_flips()):
            console.print(f"sign: {flips}")
        console.print(f"wrote {out_dir}/ranking.json, ranking.csv" + (", scatter.png" if res.estimate and res.exact else "")
                      + (", verify_heatmap.png" if res.exact else ""))


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+.4f}"


def _heads_table(res, heads: list[str], title: str):
    """One table of verified heads: estimate, exact margin drop, exact accuracy drop and both ranks."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("rank", "head", "estimate", "margin drop", "acc drop", "rank by estimate", "rank by exact"):
        table.add_column(col, justify="right")
    rows = {r["head"]: r for r in res.rows()}
    for i, h in enumerate(heads, 1):
        row = rows[h]
        table.add_row(str(i), h, _num(row["estimate"]), _num(row["exact"]), _num(row["acc_drop"]),
                      str(row["rank_estimate"] or "-"), str(row["rank_exact"] or "-"))
    return table


def _print_heads(console, res, top: int) -> None:
    """The verified heads that matter (ablation lowers the margin), then those helpful when ablated."""
    options.print_split(console, lambda rows, title: _heads_table(res, rows, title), res.matter(), res.helpful_when_ablated(),
                top, f"{res.margin} margin", heads="verified head")


def _layers(text: str | None) -> list[int]:
    """``--verify-layers`` as layer numbers ("0,1" -> [0, 1]; not given: none); a list naming no layer
    is refused, as an empty head list is."""
    if text is None:
        return []
    try:
        layers = [int(x) for x in text.split(",") if x.strip() and x.strip().isascii()]
    except ValueError:
        layers = []
    if not layers or len(layers) != len([x for x in text.split(",") if x.strip()]):
        raise GandaError(f"--verify-layers takes comma-separated layer numbers, not {text!r}")
    return layers
