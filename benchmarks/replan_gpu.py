"""The planner's predictions for the rows of a ``bench_gpu.py`` result, recomputed with the planner
as it stands (meta-device models: no GPU, no weights), beside what was measured.

    python benchmarks/replan_gpu.py benchmarks/results/gpu-nvidia-h200.json [--json OUT]

What ``bench_gpu.py`` recorded as ``predicted_s`` is the planner of its own run; this prints the
measured / predicted ratio of each section under the planner of this checkout, so a refit of the
device rows is checked against every recorded measurement at once.
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
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench_gpu.py JSON files")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = [r for path in args.results for r in replan(json.loads(path.read_text()))]
    for r in rows:
        print(f"{r['model']:<28} {r['section']:<12} {r['quantity']:<20} measured {r['measured_s']:8.3f} s  "
              f"planned {r['predicted_s']:8.3f} s  ratio {r['ratio']:5.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
