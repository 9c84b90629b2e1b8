"""``ganda demo``: one complete path from a real model to a measured G&A finding.

KV-retrieval baseline -> every head ranked by Gather/Aggregate pattern scores -> the top
candidates verified by single-head ablation -> the most damaging Gather and Aggregate heads
ablated alone and together -> how many heads must go to reach chance -> attention figures ->
``result.json``, CSVs, PNGs and one self-contained ``report.html`` in the run directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from . import runio
from .attention import draw_attention
from .discovery import ablate_until_chance, discover, save_discovery
from .figures import curves
from .interventions import AblateHeads
from .models import load_model
from .report.html import write_report
from .scoring import evaluate_examples
from .tasks import get_task


def run_demo(
    model: str, out: str | Path, *, pairs: int = 5, n: int = 8, verify_n: int = 40, top: int = 4,
    seed: int = 0, max_heads: int = 16,
) -> Path:
    con = Console(stderr=True)
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con.print(f"[bold]ganda demo[/] on {model}: KV retrieval with {pairs} pairs")
    adapter = load_model(model)
    task = get_task("kv", pairs=pairs)
    pattern_ex = task.examples(limit=n, seed=seed)
    verify_ex = task.examples(limit=verify_n, seed=seed + 1)

    con.print("1/4 ranking every head by Gather/Aggregate pattern scores, verifying the top ones")
    d = discover(adapter, pattern_ex, verify_ex, top=top, task_config=task.config())
    save_discovery(d, out / "heads", model=adapter.spec)
    best_a, best_g = d.best("aggregate"), d.best("gather")
    chosen = [s.head for s in (best_g, best_a) if s is not None]

    con.print("2/4 ablating the most damaging candidates")
    rows: list[dict[str, Any]] = [{"condition": "intact", "heads": "", "accuracy": d.baseline_accuracy}]
    for label, heads in (("gather", [best_g.head] if best_g else []), ("aggregate", [best_a.head] if best_a else []),
                         ("gather+aggregate", chosen)):
        if not heads:
            continue
        r = evaluate_examples(adapter, verify_ex, [AblateHeads(heads)], progress=False)
        rows.append({"condition": label, "heads": ",".join(heads), "accuracy": r.accuracy,
                     "ci95": list(r.ci95), "drop": d.baseline_accuracy - r.accuracy})

    con.print("3/4 cumulative ablation until chance")
    by = {s.head: s for s in d.scores}
    verified = sorted((s for s in d.scores if s.drop is not None), key=lambda s: -(s.drop or 0))
    rest = sorted((s for s in d.scores if s.drop is None), key=lambda s: -max(s.aggregate, s.gather / 10))
    ranked = [s.head for s in verified if (s.drop or 0) > 0] + [s.head for s in rest]
    curve = ablate_until_chance(adapter, verify_ex, ranked, chance=1.0 / pairs, max_heads=max_heads)

    con.print("4/4 figures and report")
    figs = []
    if chosen:
        figs.append(draw_attention(adapter, pattern_ex[0].prompt, chosen, out / "ga_heads.png",
                                   title=f"{adapter.spec}: Gather {best_g.head if best_g else '-'}, "
                                         f"Aggregate {best_a.head if best_a else '-'}"))
    _curve_png(curve, d.baseline_accuracy, 1.0 / pairs, out / "ablation_curve.png")
    seconds = time.perf_counter() - t0
    result = {
        "kind": "demo", "model": adapter.spec, "ganda_version": runio.ganda_version(),
        "config": {**task.config(), "n_pattern": n, "n_verify": verify_n, "top": top, "seed": seed},
        "summary": {
            "baseline_accuracy": d.baseline_accuracy, "chance": 1.0 / pairs,
            "gather_head": best_g.head if best_g else None, "aggregate_head": best_a.head if best_a else None,
            "heads_to_chance": curve[-1]["n_heads"] if curve and curve[-1]["accuracy"] <= 1.0 / pairs + 0.05 else None,
            "seconds": round(seconds, 1),
        },
        "rows": rows,
        "cumulative_ablation": curve,
        "candidates": [by[h].to_json() for h in dict.fromkeys(d.top_aggregate + d.top_gather)],
    }
    runio.write_text(out / "result.json", json.dumps(result, indent=2))
    runio.write_csv(out / "ablations.csv", rows)
    runio.write_csv(out / "cumulative_ablation.csv", curve)
    report = write_report([out, out / "heads"], out / "report.html", title=f"ganda demo: {adapter.spec}")
    con.print(f"done in {seconds:.0f} s")
    for r in rows:
        con.print(f"  {r['condition']:>17}: accuracy {r['accuracy']:.3f} {r.get('heads', '')}")
    return report


def _curve_png(curve: list[dict[str, Any]], base: float, chance: float, path: Path) -> Path:
    xs = [0] + [c["n_heads"] for c in curve]
    ys = [base] + [c["accuracy"] for c in curve]
    return curves(xs, {"kv accuracy": ys}, path, xlabel="heads ablated (cumulative, ranked)",
                  hlines={"chance": chance}, title="How many heads must go")
