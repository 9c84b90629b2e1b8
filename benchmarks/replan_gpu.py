"""The planner's predictions for the rows of a ``bench_gpu.py`` result, recomputed with the planner
as it stands (meta-device models: no GPU, no weights), beside what was measured.

    python benchmarks/replan_gpu.py benchmarks/results/gpu-nvidia-h200.json [--json OUT]

What ``bench_gpu.py`` recorded as ``predicted_s`` is the planner of its own run; this prints the
measured / predicted ratio of each section under the planner of this checkout, so a refit of the
device rows is checked against every recorded measurement at once: time, and peak memory
(``torch.cuda.max_memory_allocated`` against the planned peak).

Files written before ``bench_gpu.py`` recorded ``peaks`` took their peaks differently, and the
memory rows of those are read as what they measured:

* a section's peak was read after the stretch that follows it (the counter runs until the next
  section resets it): attribution's includes the plain forward + backward beside it (weight
  gradients and every layer's graph), so it is shown and not compared; eval's and the sweep's
  include the whole-row check and the naive loop, which hold less than the timed runs;
* the model before was still allocated (freed by no garbage collection) where it ran attribution
  or a sweep: its weights are taken off the later models' peaks;
* the ``memory`` row is the largest section peak (together their stretches cover the run).

Where the run's model held other weights than the meta-device model (``materialise`` once gave each
of Zamba2's shared blocks its own copy), the plan is costed with the weights the run held.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]


def meta_planner(spec: str, row: str, dtype: torch.dtype, small: bool = False) -> Any:
    """A :class:`bench_gpu.Planner` over the model of ``spec`` (``small``: its shrunken config) built
    on the meta device."""
    import ganda
    from ganda.models import meta

    model = meta.build_model(bench.config(spec, small), dtype)
    vocab = int(bench.embedding(model).weight.shape[0])
    adapter = ganda.from_model(model.eval(), bench.tokenizer(ROOT / "benchmarks" / "tokenizers" / "smollm2-135m", vocab),
                               spec=spec)
    return bench.Planner(adapter, row)


GiB = float(1 << 30)


def peak_plan(pl: Any, sec: str, rec: dict[str, Any], examples: list[Any]) -> float | None:
    """The planner's peak bytes for one recorded section (the workload and options the bench planned)."""
    if sec == "attribution":
        w = pl.workload(examples[: rec["prompts"]])
        return pl.seconds("attribution", w, skip_exact=True, method="atp*", verify_top=0, audit=0)[1]
    if sec == "eval":
        return pl.seconds("eval", pl.workload(examples[: rec["n"]]))[1]
    if sec == "sweep":
        heads = [h for h in pl.adapter.heads() if str(h) in set(rec["heads"])]
        hpl = [sum(1 for h in heads if h.layer == i) for i in range(len(pl.prof.layers))]
        w = pl.workload(examples[: rec["prompts"]])
        return pl.seconds("sweep", w, heads_per_layer=hpl, batch_heads=16, layer_skip=rec["layer_skip"])[1]
    return None


def memory_rows(doc: dict[str, Any], spec: str, pl: Any, examples: list[Any], held: float) -> list[dict[str, Any]]:
    """measured / planned peak memory of each section of ``spec`` (``held``: bytes of an earlier model
    the run still held, taken off the measured peaks of files written without ``peaks``)."""
    secs = doc["models"][spec]
    old = "peaks" not in doc
    built = secs.get("build", {}).get("n_params")
    extra = (built - pl.prof.n_params) * pl.prof.bytes_per_param if built else 0.0
    rows: list[dict[str, Any]] = []
    for sec, rec in secs.items():
        if not isinstance(rec, dict) or not rec.get("peak_bytes") or sec == "memory":
            continue
        planned = peak_plan(pl, sec, rec, examples)
        if planned is None:
            continue
        notes, compared = [], True
        if old and sec == "attribution":
            notes.append("read after the plain forward+backward beside it: that run's peak")
            compared = False
        rows.append({"model": spec, "section": sec, "quantity": "peak_bytes", "measured_bytes": rec["peak_bytes"],
                     "predicted_bytes": planned, "notes": notes, "compared": compared})
    if old and rows:  # the whole run: the largest of the sections' peaks, beside the largest plan
        rows.append({"model": spec, "section": "memory", "quantity": "peak_bytes",
                     "measured_bytes": max(r["measured_bytes"] for r in rows),
                     "predicted_bytes": max(r["predicted_bytes"] for r in rows),
                     "notes": ["the largest section peak"], "compared": all(r["compared"] for r in rows)})
    elif "memory" in secs and secs["memory"].get("peak_bytes") and rows:
        rows.append({"model": spec, "section": "memory", "quantity": "peak_bytes",
                     "measured_bytes": secs["memory"]["peak_bytes"],
                     "predicted_bytes": max(r["predicted_bytes"] for r in rows), "notes": [], "compared": True})
    for r in rows:
        if extra:
            r["predicted_bytes"] += extra
            r["notes"].append(f"planned with the run's {built / 1e9:.2f}B parameters "
                              f"(the meta-device model has {pl.prof.n_params / 1e9:.2f}B)")
        if old and held:
            r["measured_bytes"] -= held
            r["notes"].append(f"less {held / GiB:.2f} GiB of the model before, still allocated")
        r["ratio"] = r["measured_bytes"] / r["predicted_bytes"]
    return rows


def predictions(pl: Any, sec: str, rec: dict[str, Any], examples: list[Any]) -> dict[str, float]:
    """The planner's seconds for one recorded section (the same workload the bench planned)."""
    if sec == "attribution":
        w = pl.workload(examples[: rec["prompts"]])
        out = {"measured_s": pl.seconds("attribution", w, skip_exact=True, method="atp*", verify_top=0, audit=0)[0]}
        out["forward_s"] = pl.forward(rec["prompts"], w.max_tokens or w.tokens)
        out["forward_backward_s"] = pl.forward(rec["prompts"], w.max_tokens or w.tokens, backward=2.0)
        return out
    if sec == "eval":
        return {"measured_s": pl.seconds("eval", pl.workload(examples[: rec["n"]]))[0]}
    if sec == "sweep":
        heads = [h for h in pl.adapter.heads() if str(h) in set(rec["heads"])]
        w = pl.workload(examples[: rec["prompts"]])
        hpl = [sum(1 for h in heads if h.layer == i) for i in range(len(pl.prof.layers))]
        fast = pl.seconds("sweep", w, heads_per_layer=hpl, batch_heads=16, layer_skip=rec["layer_skip"])[0]
        return {"measured_s": fast, "naive_s": (len(heads) + 1) * pl.seconds("eval", w, batch_rows=1)[0]}
    return {}


def from_probe(probe: dict[str, Any]) -> dict[str, Any]:
    """A ``gpu_probe.py`` result as a bench_gpu.py document: its steady-state (second) calls."""
    fb = probe["fb"]
    return {"plan_device": "h200", "dtype": "bfloat16", "n": 64, "shots": 5, "models": {"meta-llama/Llama-3.1-8B (steady)": {
        "attribution": {"prompts": 4, "measured_s": probe["atp_warm_s"], "forward_s": fb["forward_s"],
                        "forward_backward_s": fb["forward_backward_s"]},
        "eval": {"n": 64, "measured_s": probe["eval_warm_s"]}}}}


def replan(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if "models" not in doc and "atp_warm_s" in doc:
        doc = from_probe(doc)
    dtype = getattr(torch, doc.get("dtype", "bfloat16"))
    examples = bench.examples_for(doc["n"], doc["shots"])
    rows = []
    held = 0.0  # bytes of the model before that the run still held (files without "peaks")
    for spec, secs in doc["models"].items():
        pl = meta_planner(spec.split(" (")[0], doc["plan_device"], dtype, bool(doc.get("small")))
        for sec, rec in secs.items():
            if not isinstance(rec, dict) or "error" in rec or "skipped" in rec:
                continue
            for key, predicted in predictions(pl, sec, rec, examples).items():
                measured = rec.get(key)
                if measured:
                    rows.append({"model": spec, "section": sec, "quantity": key, "measured_s": measured,
                                 "predicted_s": predicted, "ratio": measured / predicted})
        rows += memory_rows(doc, spec, pl, examples, held)
        ran = [s for s in ("attribution", "sweep") if "measured_s" in secs.get(s, {})]
        built = secs.get("build", {}).get("n_params")
        held = built * pl.prof.bytes_per_param if ran and built else 0.0  # kept alive by reference cycles
    return rows


def row_text(r: dict[str, Any]) -> str:
    head = f"{r['model']:<28} {r['section']:<12} {r['quantity']:<20}"
    if r["quantity"] != "peak_bytes":
        return (f"{head} measured {r['measured_s']:8.3f} s    planned {r['predicted_s']:8.3f} s    "
                f"ratio {r['ratio']:5.2f}")
    notes = ("" if r["compared"] else " (not compared)") + "".join(f"; {n}" for n in r["notes"])
    return (f"{head} measured {r['measured_bytes'] / GiB:8.2f} GiB  planned {r['predicted_bytes'] / GiB:8.2f} GiB  "
            f"ratio {r['ratio']:5.2f}{notes}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench_gpu.py JSON files")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = [r for path in args.results for r in replan(json.loads(path.read_text()))]
    for r in rows:
        print(row_text(r))
    for label, part in (("time", [r for r in rows if r["quantity"] != "peak_bytes"]),
                        ("memory", [r for r in rows if r["quantity"] == "peak_bytes" and r["compared"]])):
        if part:
            ratios = [r["ratio"] for r in part]
            print(f"{label}: {len(part)} rows, measured / planned {min(ratios):.2f}-{max(ratios):.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
