"""The circuit (ganda.circuit): edge attribution's cost against one AtP* pass, its top edges against
an exhaustive path patching, and the lab models' Aggregate heads' dependence on each earlier head.

Speed on SmolLM2-135M (270 heads: 270 x 270 pairs, the upper triangle scored), the same 16 KV
prompts for both arms, one process, one thread (CPU seconds; ``--repeat`` runs the pair again):

    .venv/bin/python benchmarks/bench_circuit.py speed --n 16 --seed 0

Quality on the same prompts: the top 30 heads by AtP*, every pair of them in different layers
ablated exactly along its direct path (the exhaustive reference, resumable in
runs/bench-circuit/quality-<seed>), against ``rank_edges`` over all pairs (the top 10 and the top
30 by estimate verified):

    .venv/bin/python benchmarks/bench_circuit.py quality --n 16 --seed 0

The lab models' Aggregate head against every head of an earlier layer, every path (exact path
ablation), next to each sender ablated everywhere, on one prompt set:

    .venv/bin/python benchmarks/bench_circuit.py lab --n 200 --seed 0

Results go to benchmarks/results/circuit_<what>[_<seed>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
RUNS = Path("runs") / "bench-circuit"
# the lab's Aggregate heads (RESULTS.md: the most retrieval-critical head at the final position)
LAB = {"transformer": ("lab-llama-h1", "L3H0"), "ssm": ("lab-mamba2-9k", "L1H2"),
       "hybrid": ("lab-hybrid-late-7k5", "L3H3")}


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def smollm2(n: int, seed: int):
    import ganda
    from ganda.tasks import get_task, task_for_model

    adapter = ganda.load_model("smollm2-135m")
    task = task_for_model("kv", get_task("kv", pairs=5), adapter, pairs=5)
    return adapter, task.examples(limit=n, seed=seed)


def meta(extra: dict) -> dict:
    import ganda

    return {**extra, "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg()),
            "torch": torch.__version__, "ganda": ganda.__version__}


def speed_cmd(args) -> None:
    from ganda.attribution import attribute
    from ganda.circuit.edges import _EdgeEngine, edge_attribution

    torch.set_num_threads(args.threads)
    adapter, examples = smollm2(args.n, args.seed)
    attribute(adapter, examples[:1], method="atp", progress=False)  # warm-up (allocator, kernels)
    copies = {"cpu": 0.0}
    plain = _EdgeEngine._receiver_grads

    def counted(self, *a, **k):  # the receiver copies' forward and VJP, timed inside the edge pass
        c = time.process_time()
        try:
            return plain(self, *a, **k)
        finally:
            copies["cpu"] += time.process_time() - c

    _EdgeEngine._receiver_grads = counted
    runs = []
    for _ in range(args.repeat):
        _, w0, c0 = timed(lambda: attribute(adapter, examples, method="atp", progress=False))
        _, w1, c1 = timed(lambda: attribute(adapter, examples, method="atp*", progress=False))
        copies["cpu"] = 0.0
        es, w2, c2 = timed(lambda: edge_attribution(adapter, examples, progress=False))
        runs.append({"atp": {"wall": w0, "cpu": c0}, "atp*": {"wall": w1, "cpu": c1},
                     "edges": {"wall": w2, "cpu": c2, "receiver_copies_cpu": copies["cpu"]},
                     "ratio_cpu": c2 / c1, "ratio_wall": w2 / w1})
        print(json.dumps(runs[-1]), flush=True)
    out = meta({"command": f"python benchmarks/bench_circuit.py speed --n {args.n} --seed {args.seed}"
                f" --repeat {args.repeat}", "model": "smollm2-135m", "task": "kv", "pairs": 5, "n": len(examples),
                "seed": args.seed, "senders": len(es.senders), "receivers": len(es.receivers),
                "edges": len(es.by_edge()), "batches": es.config["batches"], "runs": runs})
    (RESULTS / f"circuit_speed_{args.seed}.json").write_text(json.dumps(out, indent=1) + "\n")


def adopt_reference(adapter, examples, run: Path, check: int = 2) -> dict | None:
    """Let a finished reference journal recorded under another weights fingerprint of the same files
    (a reinstall changes their modification times) resume: ``check`` of its edges are ablated again
    and must give the recorded log-likelihoods to 1e-4, else the journal stays refused."""
    from ganda.circuit.edges import exact_edges, parse_edge
    from ganda.sweep import weights_fingerprint

    path = run / "edges_exact.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    now = weights_fingerprint(adapter)
    if lines[0]["config"].get("weights") == now:
        return None
    recs = [r for r in lines[1:] if "edge" in r][:check]
    _, lls = exact_edges(adapter, examples, [parse_edge(r["edge"]) for r in recs], progress=False)
    diff = max(abs(a - b) for r in recs for row, old in zip(lls[r["edge"]], r["loglik"], strict=True)
               for a, b in zip(row, old, strict=True))
    if diff > 1e-4:
        raise SystemExit(f"{path}: recorded edges differ from a fresh check by {diff:.2g}; not adopted")
    lines[0]["config"]["weights"] = now
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"checked": [r["edge"] for r in recs], "max_abs_loglik_diff": diff}


def reference_edges(run: Path) -> int:
    """Edges a reference journal holds already (0: none yet)."""
    path = run / "edges_exact.jsonl"
    return sum('"edge"' in x for x in path.read_text().splitlines()) if path.exists() else 0


def quality_cmd(args) -> None:
    from ganda.attribution import attribute, spearman, top_by_magnitude
    from ganda.circuit.edges import exact_edges, most_active, rank_edges
    from ganda.effects import mean_margin

    torch.set_num_threads(args.threads)
    adapter, examples = smollm2(args.n, args.seed)
    golds = [ex.gold for ex in examples]
    run = RUNS / f"quality-{args.seed}"
    att, _, atp_cpu = timed(lambda: attribute(adapter, examples, method="atp*", progress=False))
    heads = [att.heads[i] for i in att.order()[:30]]
    pairs = [(s, r) for s in heads for r in heads if s.layer < r.layer]
    adopted = {d.name: a for d in sorted(run.glob("*")) if (a := adopt_reference(adapter, examples, d))}
    recorded = reference_edges(run / "exhaustive")
    (clean, lls), _, ex_cpu = timed(lambda: exact_edges(adapter, examples, pairs, out_dir=run / "exhaustive"))
    base = mean_margin(clean, golds)
    exhaustive = {e: base - mean_margin(ll, golds) for e, ll in lls.items()}
    top10 = top_by_magnitude(exhaustive, 10)
    arms = {}
    est_rank: dict[str, int] = {}
    act_rank: dict[str, int] = {}
    wanted = set(args.arms.split(","))
    for k, widen, active in ((10, 0, 0), (30, 0, 0), (30, 10, 0), (10, 0, args.active)):
        tag = f"verify{k}" + (f"-widen{widen}" if widen else "") + (f"-active{active}" if active else "")
        kind = f"verify{k}_active" if active else tag.replace("-", "_")
        if "all" not in wanted and kind not in wanted:
            continue
        res, _, cpu = timed(lambda k=k, widen=widen, active=active, tag=tag: rank_edges(
            adapter, examples, verify_top=k, audit=0, seed=args.seed, widen=widen, active=active,
            out_dir=run / f"edges-{tag}", progress=True))
        name = tag.replace("-", "_")
        act = res.scores.by_edge(res.scores.activity)
        act_rank = {e: i + 1 for i, e in enumerate(most_active(act, len(act)))}
        est_rank = {e: i + 1 for i, e in enumerate(top_by_magnitude(res.estimate, len(res.estimate)))}
        verified = {e: res.exact[e] for e in res.exact}  # the first verification and every widening round
        mine = top_by_magnitude(verified, 10)
        inside = top_by_magnitude({e: v for e, v in verified.items() if e in exhaustive}, 10)
        arms[name] = {
            "cpu": cpu, "verified": len(verified), "top10": mine, "top10_exact": [res.exact[e] for e in mine],
            # the exhaustive top 10 among the edges this arm verifies (estimate rank <= k)
            "exhaustive_top10_verified": sum(e in verified for e in top10) / 10,
            # the arm's top 10 among its verified edges inside the reference's pairs, against the reference's
            "top10_match_inside_reference": sum(e in inside for e in top10) / 10,
            # the arm's top 10 over every edge: how many lie outside the top-30 heads' pairs
            "top10_match": sum(e in mine for e in top10) / 10,
            "top10_outside_reference": {e: res.exact[e] for e in mine if e not in exhaustive},
        }
        print(name, json.dumps(arms[name]), flush=True)
    ref = sorted(exhaustive)
    rho = spearman([abs(res.estimate[e]) for e in ref], [abs(exhaustive[e]) for e in ref])
    path = RESULTS / f"circuit_quality_{args.seed}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if recorded == len(pairs) and old.get("exhaustive_cpu"):  # the reference was read back, not rerun
        ex_cpu = old["exhaustive_cpu"]
    arms = {**old.get("arms", {}), **arms}  # arms this run left out keep their recorded numbers
    out = meta({"command": f"python benchmarks/bench_circuit.py quality --n {args.n} --seed {args.seed}"
                f" --active {args.active}",
                "model": "smollm2-135m", "task": "kv", "pairs": 5, "n": len(examples), "seed": args.seed,
                "top30_heads": [str(h) for h in heads], "head_pairs": len(pairs), "atp*_cpu": atp_cpu,
                "exhaustive_cpu": ex_cpu, "exhaustive_top10": top10,
                "exhaustive_top10_exact": [exhaustive[e] for e in top10],
                "exhaustive_top10_estimate_rank": [est_rank[e] for e in top10],
                "exhaustive_top10_activity_rank": [act_rank[e] for e in top10],
                "reference_adopted": adopted,
                "spearman_abs_estimate_vs_exact_on_reference_pairs": rho, "arms": arms})
    path.write_text(json.dumps(out, indent=1) + "\n")


def lab_cmd(args) -> None:
    import ganda
    from ganda.circuit import path_ablation
    from ganda.heads import HeadId
    from ganda.intervals import bounds, ci
    from ganda.tasks import get_task, task_for_model

    torch.set_num_threads(args.threads)
    out = {}
    for kind, (name, receiver) in LAB.items():
        adapter = ganda.load_model(name)
        task = task_for_model("lab-mmlu", get_task("lab-mmlu"), adapter)
        examples = task.examples(limit=args.n, seed=args.seed)
        r = adapter.canonical(HeadId.parse(receiver))
        rows = []
        for s in adapter.heads():
            if s.layer >= r.layer:
                continue
            res = path_ablation(adapter, examples, s, r, paths="all", progress=False)
            every, path = res.rows()[1], res.rows()[2]
            rows.append({"sender": str(s), "kind": adapter.mixer_of(s).kind, "path_margin_drop": path["margin_drop"],
                         **ci(bounds(path, "margin_drop"), "path_margin_drop"), "path_acc_drop": path["drop"],
                         **ci(bounds(path, "drop"), "path_acc_drop"), "sender_margin_drop": every["margin_drop"],
                         "sender_acc_drop": every["drop"], **ci(bounds(every, "drop"), "sender_acc_drop")})
            print(kind, rows[-1]["sender"], f"{rows[-1]['path_margin_drop']:.3f}", flush=True)
        drops = sorted((max(0.0, x["path_margin_drop"]) for x in rows), reverse=True)
        total = sum(drops) or 1.0
        needed = next(i + 1 for i in range(len(drops)) if sum(drops[: i + 1]) >= 0.8 * total)
        clear = [x["sender"] for x in rows if x["path_margin_drop_ci_low"] > 0]
        out[kind] = {"model": name, "receiver": str(r), "n": len(examples), "senders": rows,
                     "largest_share": drops[0] / total, "senders_for_80pct": needed,
                     "senders_above_zero": clear, "intact_accuracy": res.rows()[0]["accuracy"]}
    out = meta({"command": f"python benchmarks/bench_circuit.py lab --n {args.n} --seed {args.seed}",
                "seed": args.seed, "models": out})
    (RESULTS / f"circuit_lab_{args.seed}.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("speed", "quality", "lab"):
        p = sub.add_parser(name)
        p.add_argument("--n", type=int, default=16 if name != "lab" else 200)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--repeat", type=int, default=1)
        p.add_argument("--active", type=int, default=100, help="quality: the activity arm's most active edges")
        p.add_argument("--arms", default="all", help="quality: arms to run (verify10, verify30, verify30_widen10, "
                       "verify10_active; the others keep their recorded numbers)")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    {"speed": speed_cmd, "quality": quality_cmd, "lab": lab_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
