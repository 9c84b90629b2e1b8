"""Attribution (AtP, AtP*) against the exhaustive exact sweep: ranking quality and speed.

Quality, one model and task per command (the exhaustive sweep on the same prompts and the same
margin metric is the ground truth; it resumes from runs/bench-attribution/<name>/sweep):

    .venv/bin/python benchmarks/bench_attribution.py quality --model smollm2-135m --task kv --pairs 5 --n 16
    .venv/bin/python benchmarks/bench_attribution.py quality --model lab-llama-h1 --task lab-mmlu --n 32
    .venv/bin/python benchmarks/bench_attribution.py quality --model lab-mamba2-9k --task lab-mmlu --n 32
    .venv/bin/python benchmarks/bench_attribution.py quality --model lab-hybrid-late-7k5 --task lab-mmlu --n 32

Speed on SmolLM2-135M (270 heads), the same 16 KV prompts, all arms in one process, one thread:
the AtP and AtP* passes, the exhaustive fast sweep, the naive loop (on every 10th layer's heads,
scaled to 270: its cost per head does not depend on the head), and the pipelines (AtP or AtP* +
exact verification of the top 30; AtP + the top 20 and every head of layers 0-1, the demo's ranking):

    .venv/bin/python benchmarks/bench_attribution.py speed --n 16

``--arms atp,pipeline_atp_verify30,...`` runs a subset side by side (written to
``attribution_speed_arms.json``, never over the full result).

AtP*'s GradDrop blocks against the per-layer form, on the exhaustive sweep of a quality run (AtP,
then AtP* per layer and with 15, 10, 6 and 4 blocks: CPU seconds, Spearman, top-10 recall):

    .venv/bin/python benchmarks/bench_attribution.py blocks --n 16 --seed 0

Where the AtP* pass spends its CPU time (torch.profiler, 8 prompts, one thread):

    .venv/bin/python benchmarks/bench_attribution.py profile --method atp* --n 8 [--graddrop-blocks 0]

Peak resident memory of the attribution pass against a plain no-grad forward of the same batch
(each arm in a fresh process, peak reset after loading):

    .venv/bin/python benchmarks/bench_attribution.py memory

AtP* against integrated gradients (k midpoint steps) on the same exhaustive sweep: Spearman, the
exhaustive top 10's recall in the estimate's top 10, sign flips among the top 30, CPU seconds
(written to ``attribution_ig_<name>.json``):

    .venv/bin/python benchmarks/bench_attribution.py ig --model lab-llama-h1 --task lab-mmlu --n 32
    .venv/bin/python benchmarks/bench_attribution.py ig --model smollm2-135m --task kv --pairs 6 --n 16 --seed 1

The answer screen (``rank --screen``) on one prompt set: every head's exact effect at the last shared
token, and its CPU time beside the set's exhaustive sweep (``attribution_screen_<name>.json``); then
the widening replay with the screen's top K verified too:

    .venv/bin/python benchmarks/bench_attribution.py screen --pairs 6 --n 40 --seed 1
    .venv/bin/python benchmarks/bench_attribution.py widen FILES --methods atp atp* --verify-layers "" --widen 0 --screen 15

How well a prompt set's exhaustive sweep decides its top 10 (effects and standard errors around
the cut, the paired SE of tenth minus eleventh; ``attribution_ties_<name>.json``):

    .venv/bin/python benchmarks/bench_attribution.py ties --pairs 6 --n 40 --seed 1

Then the markdown tables (benchmarks/results/attribution.md) from the JSON results:

    .venv/bin/python benchmarks/bench_attribution.py table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
RUNS = Path("runs") / "bench-attribution"
NAIVE_HEADS = "L0H*,L10H*,L20H*"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return "?"


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def load(args):
    import ganda
    from ganda.tasks import get_task, task_for_model

    opts = {"pairs": args.pairs} if args.pairs else {}
    adapter = ganda.load_model(args.model)
    task = task_for_model(args.task, get_task(args.task, **opts), adapter, **opts)
    return adapter, task.examples(limit=args.n, seed=args.seed), opts


def name_of(args) -> str:
    return (f"{args.model}-{args.task}" + (f"{args.pairs}" if args.pairs else "") + f"-n{args.n}"
            + (f"-s{args.seed}" if args.seed else ""))


def command_of(cmd: str, args, *extra: tuple[str, object]) -> str:
    """The command line that reproduces a prompt-set run (``--model --task [--pairs] --n --seed``)."""
    given = (("model", args.model), ("task", args.task), ("pairs", args.pairs), ("n", args.n), ("seed", args.seed),
             *extra)
    return f"python benchmarks/bench_attribution.py {cmd} " + " ".join(f"--{k} {v}" for k, v in given if v is not None)


def prompt_set_options(p, model: str = "smollm2-135m", task: str = "kv", n: int = 16) -> None:
    """The options that name a model and a prompt set (what :func:`load` and :func:`name_of` read)."""
    p.add_argument("--model", default=model, required=model is None)
    p.add_argument("--task", default=task, required=task is None)
    p.add_argument("--pairs", type=int, default=None)
    p.add_argument("--n", type=int, default=n)
    p.add_argument("--seed", type=int, default=0)


def exhaustive(adapter, examples, args, opts):
    """The exact sweep over every head (resumable); its time when this call ran it whole. A finished
    sweep with its recorded time is read back as it is, since a reinstalled model file's new
    modification time makes ``run_sweep`` refuse to resume it: its prompts are checked here, and
    ``rule`` checks its weights by the intact margin (:func:`same_clean`)."""
    from ganda.scoring import examples_digest
    from ganda.sweep import load_result, run_sweep

    out = RUNS / name_of(args) / "sweep"
    if (out / "results.jsonl").exists() and (out / "timing.json").exists():
        res = load_result(out)
        if res.config.get("prompts_sha") != examples_digest(examples):
            raise SystemExit(f"{out}: the recorded sweep scored other prompts")
        return res
    progress = out / "progress.jsonl"
    fresh = not progress.exists() or progress.read_text().count("\n") <= 1
    res, wall, cpu = timed(lambda: run_sweep(adapter, examples, out_dir=out, progress=True,
                                             config={"task": args.task, **opts, "limit": args.n, "seed": args.seed}))
    if fresh:
        (out / "timing.json").write_text(json.dumps({"wall": wall, "cpu": cpu}))
    return res


def same_clean(recorded: float, now: float, what: str) -> None:
    """Refuse a recorded sweep whose intact margin is not this run's clean margin (other weights)."""
    if abs(recorded - now) > 1e-3 * max(1.0, abs(now)):
        raise SystemExit(f"{what}: the recorded sweep's intact margin {recorded:.6f} is not this model's {now:.6f}")


def exact_effects(args) -> tuple:
    """The model, prompts, task options, exhaustive sweep, clean margin and every head's exact
    margin drop, the reference every estimator is measured against."""
    from ganda.effects import mean_margin

    torch.set_num_threads(args.threads)
    adapter, examples, opts = load(args)
    res = exhaustive(adapter, examples, args, opts)
    golds = [ex.gold for ex in examples]
    clean = mean_margin(res.baseline["loglik"], golds, args.margin)
    exact = {r["head"]: clean - mean_margin(r["loglik"], golds, args.margin) for r in res.records}
    return adapter, examples, opts, res, clean, exact


def quality_cmd(args) -> None:
    from ganda.attribution import attribute, quality, top_by_magnitude
    from ganda.heads import HeadId

    adapter, examples, opts, res, clean, exact = exact_effects(args)
    exact_rank = {h: i + 1 for i, h in enumerate(top_by_magnitude(exact, len(exact)))}
    rows = []
    for method in ("atp", "atp*"):
        att, wall, cpu = timed(lambda m=method: attribute(adapter, examples, method=m, margin=args.margin, progress=False))
        est = att.by_head()
        q = quality(est, exact, k=10, within=(10, 30))
        est_rank = {h: i + 1 for i, h in enumerate(top_by_magnitude(est, len(est)))}
        # after exact verification of the estimate's top 30, the reported top 10 is the exact top 10 among them
        verified = top_by_magnitude(est, 30)
        reported = top_by_magnitude({h: exact[h] for h in verified}, 10)
        # the early-layer remedies: the top 20 by estimate plus every head of layer 0 / layers 0 and 1
        # (rank_heads(verify_layers=[0]) / [0, 1], the demo's)
        remedies = {}
        for key, early in (("top20_plus_layer0", {0}), ("top20_plus_layers01", {0, 1})):
            plus = set(top_by_magnitude(est, 20)) | {h for h in est if HeadId.parse(h).layer in early}
            reported_plus = top_by_magnitude({h: exact[h] for h in plus}, 10)
            remedies[key] = {"verified": len(plus), "recall_top10": sum(h in plus for h in q["exact_top"]) / len(q["exact_top"]),
                             "verified_top10_identical": reported_plus == q["exact_top"][:10]}
        misses = [{"head": h, "exact": exact[h], "exact_rank": exact_rank[h], "estimate": est[h],
                   "estimate_rank": est_rank[h], "atp": dict(zip([str(x) for x in att.heads], att.atp, strict=True))[h]}
                  for h in q["missed_in_30"]]
        rows.append({"method": method, "seconds": wall, "cpu_seconds": cpu,
                     "spearman_abs": q["spearman_abs"], "spearman_signed": q["spearman_signed"],
                     "recall_top10_in_10": q["recall_top10_in_10"], "recall_top10_in_30": q["recall_top10_in_30"],
                     "verified_top10_identical": reported == q["exact_top"][:10],
                     **remedies,
                     "verified_top10": reported, "missed_in_10": q["missed_in_10"], "missed_in_30": misses,
                     "clean_matches_sweep": abs(att.clean - clean) < 1e-4,
                     "estimates": est})
    out = {"command": command_of("quality", args),
           "model": args.model, "task": args.task, "task_options": opts, "n_prompts": len(examples),
           "n_heads": len(exact), "margin": args.margin, "clean_margin": clean, "baseline_acc": res.baseline["acc"],
           "exact_top10": top_by_magnitude(exact, 10), "exact": exact, "methods": rows,
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg())}
    path = RESULTS / f"attribution_quality_{name_of(args)}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    scatter(out, RESULTS / f"attribution_quality_{name_of(args)}.png")
    for r in rows:
        print(f"{args.model} {args.task} {r['method']}: spearman |.| {r['spearman_abs']:.3f}, recall@10 in 10 "
              f"{r['recall_top10_in_10']:.2f}, in 30 {r['recall_top10_in_30']:.2f}, verified top-10 identical "
              f"{r['verified_top10_identical']}; missed in 30: {[m['head'] for m in r['missed_in_30']]}")
    print(f"wrote {path}")


def scatter(q: dict, path: Path) -> None:
    """Estimate against exhaustive exact effect for every head, one panel per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exact = q["exact"]
    top = set(q["exact_top10"])
    fig, axes = plt.subplots(1, len(q["methods"]), figsize=(5 * len(q["methods"]), 4.6), squeeze=False)
    for ax, r in zip(axes[0], q["methods"], strict=True):
        est = r["estimates"]
        hs = sorted(exact)
        ax.scatter([est[h] for h in hs], [exact[h] for h in hs], s=8, c=["C3" if h in top else "C0" for h in hs])
        lim = max(abs(v) for h in hs for v in (est[h], exact[h])) * 1.05
        ax.plot([-lim, lim], [-lim, lim], lw=0.8, c="grey", ls="--")
        ax.axhline(0, lw=0.5, c="k")
        ax.axvline(0, lw=0.5, c="k")
        for h in q["exact_top10"][:10]:
            ax.annotate(h, (est[h], exact[h]), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_xlabel(f"{r['method']} estimate")
        ax.set_ylabel("exact drop (zero-ablation)")
        ax.set_title(f"{q['model']} {q['task']}: {r['method']}, Spearman |.| {r['spearman_abs']:.2f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SPEED_ARMS = ("atp", "atp*", "pipeline_atp*_verify30", "pipeline_atp_verify30", "pipeline_atp_verify20_layers01",
              "audit10", "fast_sweep", "naive")
PIPELINES = ("atp", "atp*", "pipeline_atp*_verify30", "pipeline_atp_verify30", "pipeline_atp_verify20_layers01")


def speed_cmd(args) -> None:
    """Every arm in one process on the same prompts; ``--arms`` runs a subset (written beside the
    full result, never over it)."""
    import ganda
    from ganda.attribution import attribute, rank_heads
    from ganda.heads import expand
    from ganda.sweep import run_sweep

    torch.set_num_threads(args.threads)
    args.model, args.task, args.pairs = "smollm2-135m", "kv", 5
    adapter, examples, opts = load(args)
    heads = adapter.heads()
    wanted = [a.strip() for a in args.arms.split(",")] if args.arms else list(SPEED_ARMS)
    unknown = sorted(set(wanted) - set(SPEED_ARMS))
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {', '.join(SPEED_ARMS)}")
    subset = expand(args.naive_heads, adapter)
    scale = len(heads) / len(subset)
    runs = {
        "atp": lambda: attribute(adapter, examples, method="atp", progress=False),
        "atp*": lambda: attribute(adapter, examples, method="atp*", progress=False),
        "pipeline_atp*_verify30": lambda: rank_heads(adapter, examples, method="atp*", verify_top=30, audit=0, active=0,
                                                     progress=False),
        "pipeline_atp_verify30": lambda: rank_heads(adapter, examples, method="atp", verify_top=30, audit=0, active=0,
                                                    progress=False),
        "pipeline_atp_verify20_layers01": lambda: rank_heads(adapter, examples, method="atp", verify_top=20, active=0,
                                                             verify_layers=[0, 1], audit=0, progress=False),
        "audit10": lambda: run_sweep(adapter, examples, heads=heads[5::27][:10], progress=False),
        "fast_sweep": lambda: run_sweep(adapter, examples, progress=True),
        "naive": lambda: run_sweep(adapter, examples, heads=subset, naive=True, progress=True),
    }
    arms: dict[str, dict[str, float]] = {}
    attribute(adapter, examples[:1], method="atp", progress=False)  # warm-up (allocator, kernels)
    for name in SPEED_ARMS:
        if name in wanted:
            _, wall, cpu = timed(runs[name])
            arms[name] = {"wall": wall, "cpu": cpu} if name != "naive" else {"wall": wall * scale, "cpu": cpu * scale}
            print(f"{name}: {arms[name]['wall']:.1f} s wall, {arms[name]['cpu']:.1f} s CPU", flush=True)
    ratios = {}
    for ref in ("fast_sweep", "pipeline_atp_verify30"):
        if ref in arms:
            ratios.update({f"{a}_vs_{ref}": {k: arms[ref][k] / arms[a][k] for k in ("wall", "cpu")}
                           for a in PIPELINES if a in arms and a != ref})
    if "naive" in arms:
        ratios.update({f"{a}_vs_naive": {k: arms["naive"][k] / arms[a][k] for k in ("wall", "cpu")}
                       for a in ("atp", "atp*", "fast_sweep") if a in arms})
    command = f"python benchmarks/bench_attribution.py speed --n {args.n}" + (f" --arms {args.arms}" if args.arms else "")
    out = {"command": command, "model": "smollm2-135m",
           "task": "kv", "task_options": opts, "n_prompts": len(examples), "n_heads": len(heads),
           "naive_heads": args.naive_heads, "naive_scaled_by": scale, "arms": arms, "ratios": ratios,
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg()),
           "torch": torch.__version__, "ganda": ganda.__version__}
    path = RESULTS / ("attribution_speed.json" if set(wanted) == set(SPEED_ARMS) else "attribution_speed_arms.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(ratios, indent=1))
    print(f"wrote {path}")


def blocks_cmd(args) -> None:
    """AtP and AtP* with GradDrop per layer and over 15, 10, 6 and 4 blocks, on SmolLM2 KV5 against
    the exhaustive sweep (resumed from the quality run's directory)."""
    from ganda.attribution import attribute, quality, top_by_magnitude
    from ganda.effects import mean_margin

    torch.set_num_threads(1)
    args.model, args.task, args.pairs, args.margin = "smollm2-135m", "kv", 5, "mean"
    adapter, examples, opts = load(args)
    res = exhaustive(adapter, examples, args, opts)
    golds = [ex.gold for ex in examples]
    clean = mean_margin(res.baseline["loglik"], golds, "mean")
    exact = {r["head"]: clean - mean_margin(r["loglik"], golds, "mean") for r in res.records}
    attribute(adapter, examples[:1], method="atp", progress=False)  # warm-up
    rows = []
    for blocks in ("atp", 0, 15, 10, 6, 4):
        method = "atp" if blocks == "atp" else "atp*"
        att, wall, cpu = timed(lambda m=method, b=blocks: attribute(
            adapter, examples, method=m, graddrop_blocks=None if b in ("atp", 0) else b, progress=False))
        q = quality(att.by_head(), exact, k=10, within=(10, 30))
        rows.append({"arm": "atp" if blocks == "atp" else f"atp* {'per layer' if blocks == 0 else f'{blocks} blocks'}",
                     "cpu_seconds": cpu, "seconds": wall, "spearman_abs": q["spearman_abs"],
                     "recall_top10_in_10": q["recall_top10_in_10"], "recall_top10_in_30": q["recall_top10_in_30"],
                     "missed_in_30": q["missed_in_30"]})
        print(rows[-1], flush=True)
    path = RESULTS / f"attribution_graddrop_blocks_{name_of(args)}.json"
    path.write_text(json.dumps({"command": f"python benchmarks/bench_attribution.py blocks --n {args.n} --seed {args.seed}",
                                "n_prompts": len(examples), "rows": rows, "top10": top_by_magnitude(exact, 10),
                                "cpu": cpu_model(), "load_average_at_end": list(os.getloadavg())}, indent=1) + "\n")
    print(f"wrote {path}")


def profile_cmd(args) -> None:
    """Where an attribution pass spends its CPU time: torch.profiler's operators, largest first, and
    the share of matrix products (``aten::mm``) in the total."""
    from torch.profiler import ProfilerActivity, profile

    from ganda.attribution import attribute

    torch.set_num_threads(1)
    args.model, args.task, args.pairs = "smollm2-135m", "kv", 5
    adapter, examples, _ = load(args)
    attribute(adapter, examples[:1], method="atp", progress=False)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        attribute(adapter, examples, method=args.method, graddrop_blocks=args.graddrop_blocks or None, progress=False)
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops)
    print(ops.table(sort_by="self_cpu_time_total", row_limit=12))
    for name in ("aten::mm", "aten::mul", "aten::silu_backward"):
        share = sum(e.self_cpu_time_total for e in ops if e.key == name) / total
        calls = sum(e.count for e in ops if e.key == name)
        print(f"{name}: {share:.0%} of self CPU time, {calls} calls")


def _status_mb(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise RuntimeError(key)


def mem_arm_cmd(args) -> None:
    """One arm of ``memory`` (run in its own process)."""
    from ganda.attribution import attribute
    from ganda.prepared import make_batch, plan_batches

    torch.set_num_threads(1)
    adapter, examples, _ = load(args)
    plan, packed = plan_batches(adapter, examples, 4096)
    b = make_batch(adapter, plan[0], packed)
    attribute(adapter, examples[:2], method="atp", progress=False)  # warm-up: allocator, lazy modules
    kw = {"input_ids": b.ids, "attention_mask": b.mask, "use_cache": False}
    if b.position_ids is not None:
        kw["position_ids"] = b.position_ids
    base = _status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM)
    if args.arm == "forward":
        with torch.no_grad():
            adapter.model(**kw)
    else:
        attribute(adapter, examples, method=args.arm, progress=False)
    print(json.dumps({"arm": args.arm, "tokens": int(b.ids.numel()), "batches": len(plan),
                      "peak_mb": round(_status_mb("VmHWM") - base, 1)}))


def memory_cmd(args) -> None:
    import subprocess
    import sys

    out = []
    for model, task, pairs, n in (("smollm2-135m", "kv", 5, 16), ("lab-mamba2-9k", "lab-mmlu", None, 32)):
        rows = {}
        for arm in ("forward", "atp", "atp*"):
            cmd = [sys.executable, __file__, "_mem", "--arm", arm, "--model", model, "--task", task, "--n", str(n)]
            if pairs:
                cmd += ["--pairs", str(pairs)]
            line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            rows[arm] = json.loads(line)
            print(model, rows[arm], flush=True)
        out.append({"model": model, "task": task, "n": n, "arms": rows,
                    "ratio_atp": rows["atp"]["peak_mb"] / rows["forward"]["peak_mb"],
                    "ratio_atp*": rows["atp*"]["peak_mb"] / rows["forward"]["peak_mb"]})
    path = RESULTS / "attribution_memory.json"
    path.write_text(json.dumps({"command": "python benchmarks/bench_attribution.py memory", "rows": out}, indent=1) + "\n")
    print(f"wrote {path}")


def units(n_layers: int, heads_per_layer: int, verified_depth: float, k: int = 30, late: float = 14.0,
          late_depth: float = 0.5) -> dict[str, float]:
    """Cost in layer-forward units per prompt (docs/attribution.md): a layer VJP counted as one forward;
    ``verified_depth``: mean layer of the top-k verified heads over the layer count; ``late`` heads of
    the top 20 outside layers 0-1 at mean relative depth ``late_depth`` (the demo's rule verifies them
    and every head of layers 0 and 1)."""
    from ganda.attribution import GRADDROP_BLOCKS, graddrop_blocks

    L, H = n_layers, heads_per_layer
    block_of = graddrop_blocks(L, GRADDROP_BLOCKS)
    star = 2 * L + sum(1 + block_of[-1] - b for b in block_of)  # capture, recompute, VJPs per block above
    sweep = H * L * (L + 1) / 2 + L
    verify = k * L * (1 - verified_depth) + L
    early = late * L * (1 - late_depth) + H * (2 * L - 1) + L
    return {"fast_sweep": sweep, "atp": 3 * L, "atp*": star, "naive": H * L * L,
            "pipeline_atp_verify30": 3 * L + verify, "pipeline_atp*_verify30": star + verify,
            "pipeline_atp_verify20_layers01": 3 * L + early}


def extrapolation(speed: dict, quality: dict) -> list[str]:
    """Measured SmolLM2 ratios, the unit model's, and Llama-3.1-8B's (unit model x SmolLM2's calibration)."""
    arms = ("atp", "atp*", "pipeline_atp_verify30", "pipeline_atp*_verify30", "pipeline_atp_verify20_layers01")
    depth = {}
    for m in quality["methods"]:
        top = sorted(m["estimates"], key=lambda h: -abs(m["estimates"][h]))[:30]
        depth[m["method"]] = sum(int(h[1:].split("H")[0]) for h in top) / 30 / 30
    d = (depth["atp"] + depth["atp*"]) / 2
    atp = next(m["estimates"] for m in quality["methods"] if m["method"] == "atp")
    late = [int(h[1:].split("H")[0]) for h in sorted(atp, key=lambda h: -abs(atp[h]))[:20]
            if int(h[1:].split("H")[0]) > 1]
    late_depth = sum(late) / max(1, len(late)) / 30
    smol = units(30, 9, d, late=len(late), late_depth=late_depth)
    big = units(32, 32, d, late=len(late), late_depth=late_depth)
    out = ["", f"How the ratios scale (fast sweep ÷ arm). Unit model: cost in layer forwards per prompt "
           f"(docs/attribution.md); verified heads at the measured mean relative depth {d:.2f} (the demo's "
           f"rule: {len(late)} of the AtP top 20 outside layers 0-1, at depth {late_depth:.2f}, and every head "
           "of layers 0 and 1). "
           "Llama-3.1-8B = its unit ratio × SmolLM2's measured/unit calibration:", "",
           "| arm | SmolLM2 measured (CPU) | SmolLM2 unit model | Llama-3.1-8B unit model | Llama-3.1-8B calibrated |",
           "|---|---|---|---|---|"]
    for a in arms:
        meas = speed["ratios"][f"{a}_vs_fast_sweep"]["cpu"]
        u_s, u_b = smol["fast_sweep"] / smol[a], big["fast_sweep"] / big[a]
        out.append(f"| {a} | {meas:.1f}x | {u_s:.1f}x | {u_b:.1f}x | {u_b * meas / u_s:.0f}x |")
    nv = speed["ratios"]["atp_vs_naive"]["cpu"]
    out += ["", f"AtP against the naive loop: {nv:.0f}x measured on SmolLM2 (unit model {smol['naive'] / smol['atp']:.0f}x: "
            "the naive loop scores one row per choice with logits at every position, which the unit model leaves "
            f"out); Llama-3.1-8B unit model {big['naive'] / big['atp']:.0f}x."]
    return out


def _plus(r: dict, key: str) -> str:
    """An early-layer remedy's column: recall of the exhaustive top 10, and whether verifying the
    top 20 plus every head of those layers reports exactly the exhaustive top 10."""
    p = r.get(key)
    if not p:
        return "-"
    return f"{p['recall_top10']:.0%} ({p['verified']}), {'identical' if p['verified_top10_identical'] else 'differs'}"


def table_cmd(_args) -> None:
    lines = ["Attribution against the exhaustive exact sweep (same prompts, same metric: the mean margin of the gold "
             "choice's log-likelihood over the others'; heads ranked by |drop when zero-ablated|). Commands: "
             "`benchmarks/bench_attribution.py quality ...` (one per row pair), `speed`, `memory`, `table`.", "","| model, task (prompts, heads) | method | Spearman \\|est\\| vs \\|exact\\| | exhaustive top-10 in top-10 | "
             "in top-30 | top-10 after verifying top-30 | missed (exact rank: estimate rank) | "
             "top-20 + layer 0: top-10 in it (verified heads) | top-20 + layers 0-1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("attribution_quality_*.json")):
        q = json.loads(path.read_text())
        for r in q["methods"]:
            missed = ", ".join(f"{m['head']} ({m['exact_rank']}: {m['estimate_rank']})" for m in r["missed_in_30"]) or "-"
            seed = f", seed {q['command'].split('--seed ')[1].split()[0]}" if "--seed" in q["command"] else ""
            lines.append(f"| {q['model']}, {q['task']}{' ' + str(q['task_options'].get('pairs')) + ' pairs' if q['task_options'] else ''} "
                         f"({q['n_prompts']}{seed}, {q['n_heads']}) | {r['method']} | {r['spearman_abs']:.2f} | "
                         f"{r['recall_top10_in_10']:.0%} | {r['recall_top10_in_30']:.0%} | "
                         f"{'identical' if r['verified_top10_identical'] else 'differs'} | {missed} | {_plus(r, 'top20_plus_layer0')} | "
                         f"{_plus(r, 'top20_plus_layers01')} |")
    lines += ["", "The lab models have 4-32 heads, so a top 30 holds (nearly) all of them and their top-30 columns are "
              "full by construction; the Spearman and top-10-in-10 columns carry the information there. The last two "
              "columns are the early-layer remedies: the AtP (or AtP*) top 20 plus every head of layer 0 "
              "(`verify_layers=[0]`), or of layers 0 and 1 (`verify_layers=[0, 1]`, the demo's ranking), verified "
              "whatever their estimates. The seed in the first column is the prompt set (`quality ... --seed S`); the "
              "layer-0 rule was read off SmolLM2's seed 0, layers 0-1 after seed 1, and seed 2 checks both on "
              "prompts neither had seen."]
    speed = RESULTS / "attribution_speed.json"
    if speed.exists():
        s = json.loads(speed.read_text())
        a, r = s["arms"], s["ratios"]
        lines += ["", f"SmolLM2-135M, KV {s['task_options']['pairs']} pairs, {s['n_prompts']} prompts, {s['n_heads']} heads, "
                  f"{s['threads']} thread, {s['cpu']} (load average at end {s['load_average_at_end'][0]:.1f}):", "",
                  "| arm | CPU s | wall s | fast sweep ÷ arm (CPU) | (wall) |", "|---|---|---|---|---|"]
        for name in ("atp", "atp*", "pipeline_atp_verify30", "pipeline_atp_verify20_layers01", "pipeline_atp*_verify30",
                     "audit10", "fast_sweep", "naive"):
            if name not in a:
                continue
            ratio = r.get(f"{name}_vs_fast_sweep")
            rc, rw = (f"{ratio['cpu']:.1f}x", f"{ratio['wall']:.1f}x") if ratio else ("-", "-")
            lines.append(f"| {name} | {a[name]['cpu']:.1f} | {a[name]['wall']:.1f} | {rc} | {rw} |")
        lines += ["", f"naive: {s['naive_heads']} ({s['n_heads'] / s['naive_scaled_by']:.0f} heads) run, scaled "
                  f"x{s['naive_scaled_by']:.0f} (its cost per head does not depend on the head). audit10: 10 extra heads "
                  "verified exactly (the bound's price). The machine's 2 cores were shared with other jobs during the run: "
                  "CPU seconds are the robust column."]
    qpath = RESULTS / "attribution_quality_smollm2-135m-kv5-n16.json"
    if speed.exists() and qpath.exists():
        lines += extrapolation(json.loads(speed.read_text()), json.loads(qpath.read_text()))
    memory = RESULTS / "attribution_memory.json"
    if memory.exists():
        lines += ["", "Peak resident memory over the loaded model, one batch (MB):", "",
                  "| model (tokens in the batch) | plain no-grad forward | AtP | AtP* |", "|---|---|---|---|"]
        for row in json.loads(memory.read_text())["rows"]:
            a = row["arms"]
            lines.append(f"| {row['model']} ({a['forward']['tokens']}) | {a['forward']['peak_mb']:.0f} | "
                         f"{a['atp']['peak_mb']:.0f} ({row['ratio_atp']:.2f}x) | {a['atp*']['peak_mb']:.0f} "
                         f"({row['ratio_atp*']:.2f}x) |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "attribution.md").write_text(text)
    print(text)


def widen_cmd(args) -> None:
    """Replay ``rank --verify-top V --verify-layers ... --widen W`` on recorded quality/ig runs: their
    exhaustive sweep gives every head's exact effect, which is what verification measures, so the
    replay is what ``rank`` would report. Cost: the fast sweep reruns layers k.. for a head of layer
    k, so a head costs ``L - k`` layer-forwards; the share is verified cost over all heads' cost."""
    from ganda.attribution.ranking import reported_top, widen_until_stable
    from ganda.heads import HeadId

    def layer(h: str) -> int:
        return HeadId.parse(h).layer

    layers = {int(x) for x in args.verify_layers.split(",") if x.strip()}
    rows = []
    for path in args.files:
        d = json.loads(Path(path).read_text())
        exact = d["exact"]
        arms = {a.get("method") or a.get("arm"): a["estimates"] for a in d.get("methods") or d.get("arms")}
        n_layers = 1 + max(map(layer, exact))
        cost = {h: n_layers - layer(h) for h in exact}
        truth = reported_top(exact, args.top)
        stem = Path(path).name.split("_", 2)[2]  # attribution_{quality,ig}_<set>.json
        also: list[str] = []
        for k, kind, key in ((args.screen, "screen", "by_head"), (args.active, "rule", "activity")):
            if k:
                by = json.loads((Path(path).parent / f"attribution_{kind}_{stem}").read_text())[key]
                also += sorted(by, key=lambda h: (-by[h], h))[:k]
        for method in args.methods:
            est = arms[method]
            order = sorted(est, key=lambda h: (-abs(est[h]), h))
            first = list(dict.fromkeys(order[:args.verify_top] + also
                                       + [h for h in order[args.verify_top:] if layer(h) in layers]))
            known = {h: exact[h] for h in first}
            more = widen_until_stable(order, known, args.widen, args.top,
                                      lambda batch, _k, known=known, exact=exact: known.update(
                                          {h: exact[h] for h in batch})) if args.widen else []
            got = reported_top(known, args.top)
            share = sum(cost[h] for h in known) / sum(cost.values())
            rows.append({"file": Path(path).name, "n": d.get("n_prompts"), "method": method, "verified": len(known),
                         "widened": len(more), "found": len(got & truth), "top": args.top,
                         "missed": sorted(truth - got), "sweep_share": share})
            print(f"{Path(path).name:<52} {method:<5} verified {len(known):>3} ({len(more)} by widening), "
                  f"{len(got & truth)}/{args.top} of the exhaustive top {args.top}, {100 * share:.0f}% of the "
                  f"sweep's layer-forwards; missed {', '.join(sorted(truth - got)) or '-'}")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/bench_attribution.py " + " ".join(sys.argv[1:]), "rule": {
            "verify_top": args.verify_top, "verify_layers": sorted(layers), "widen": args.widen, "top": args.top,
            "screen": args.screen, "active": args.active},
            "rows": rows}, indent=1))


def ig_cmd(args) -> None:
    from ganda.attribution import attribute, quality, top_by_magnitude

    adapter, examples, opts, _, clean, exact = exact_effects(args)
    arms = [("atp", {}), ("atp*", {}), *((f"ig{k}", {"ig_steps": k}) for k in args.ig_steps)]
    rows = []
    for name, kw in arms:
        method = "ig" if name.startswith("ig") else name
        att, wall, cpu = timed(lambda m=method, kw=kw: attribute(adapter, examples, method=m, margin=args.margin,
                                                                 progress=False, **kw))
        est = att.by_head()
        q = quality(est, exact, k=10, within=(10, 30))
        top30 = top_by_magnitude(est, 30)
        flips = [h for h in top30 if est[h] * exact[h] < 0]
        rows.append({"arm": name, "seconds": wall, "cpu_seconds": cpu, "spearman_abs": q["spearman_abs"],
                     "spearman_signed": q["spearman_signed"], "recall_top10_in_10": q["recall_top10_in_10"],
                     "recall_top10_in_30": q["recall_top10_in_30"], "missed_in_10": q["missed_in_10"],
                     "sign_flips_in_top30": flips, "sum_estimate": sum(est.values()), "estimates": est})
        print(f"{name}: spearman |.| {q['spearman_abs']:.3f} signed {q['spearman_signed']:.3f}, recall@10 in 10 "
              f"{q['recall_top10_in_10']:.2f}, in 30 {q['recall_top10_in_30']:.2f}, sign flips in top 30 {len(flips)}, "
              f"{cpu:.1f} CPU s ({wall:.1f} s)", flush=True)
    out = {"command": command_of("ig", args),
           "model": args.model, "task": args.task, "task_options": opts, "n_prompts": len(examples),
           "n_heads": len(exact), "margin": args.margin, "clean_margin": clean,
           "exact_top10": top_by_magnitude(exact, 10), "exact": exact, "arms": rows,
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg())}
    path = RESULTS / f"attribution_ig_{name_of(args)}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def screen_cmd(args) -> None:
    """The answer screen on one prompt set (``rank --screen``'s list): every head's effect, its CPU
    time, and the exhaustive sweep's CPU time where the quality run recorded it."""
    from ganda.attribution.screen import answer_screen

    torch.set_num_threads(args.threads)
    adapter, examples, opts = load(args)
    sc = answer_screen(adapter, examples, progress=False)
    timing = RUNS / name_of(args) / "sweep" / "timing.json"
    sweep_cpu = json.loads(timing.read_text())["cpu"] if timing.exists() else None
    out = {"command": command_of("screen", args),
           "model": args.model, "task": args.task, "task_options": opts, "n_prompts": len(examples),
           **sc.to_json(), "sweep_cpu_seconds": sweep_cpu,
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg())}
    path = RESULTS / f"attribution_screen_{name_of(args)}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"screen: {sc.cpu_seconds:.1f} CPU s ({sc.seconds:.1f} s)"
          + (f", {100 * sc.cpu_seconds / sweep_cpu:.1f}% of the sweep's {sweep_cpu:.0f}" if sweep_cpu else "")
          + f"; wrote {path}")


def ties_cmd(args) -> None:
    """How well a prompt set's exhaustive sweep decides its top ``--top``: the heads around the cut
    with their effects and standard errors over prompts, and the paired standard error of the
    difference between the last head in and the first head out (the resumable sweep of ``quality``)."""
    from ganda.effects import margin

    adapter, examples, opts = load(args)
    res = exhaustive(adapter, examples, args, opts)
    golds = [ex.gold for ex in examples]

    def per_prompt(ll):
        return [margin(x, g, args.margin) for x, g in zip(ll, golds, strict=True)]

    base = per_prompt(res.baseline["loglik"])
    eff = {r["head"]: [b - a for a, b in zip(per_prompt(r["loglik"]), base, strict=True)] for r in res.records}
    mean = {h: sum(v) / len(v) for h, v in eff.items()}

    def se(v):
        m = sum(v) / len(v)
        return (sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v)) ** 0.5

    order = sorted(mean, key=lambda h: (-mean[h], h))
    k = args.top
    near = [{"head": h, "rank": i + 1, "effect": mean[h], "se": se(eff[h])} for i, h in enumerate(order)
            if k - 3 <= i < k + 3]
    last_in, first_out = order[k - 1], order[k]
    gap = mean[last_in] - mean[first_out]
    paired = se([a - b for a, b in zip(eff[last_in], eff[first_out], strict=True)])
    for r in near:
        print(f"{r['rank']:>3} {r['head']:<7} {r['effect']:.3f} ± {r['se']:.3f}")
    print(f"{last_in} (rank {k}) minus {first_out} (rank {k + 1}): {gap:.3f}, paired SE {paired:.3f}")
    out = {"command": command_of("ties", args, ("top", k)),
           "n_prompts": len(examples), "near_the_cut": near, "last_in": last_in, "first_out": first_out,
           "gap": gap, "paired_se": paired}
    path = RESULTS / f"attribution_ties_{name_of(args)}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def rule_cmd(args) -> None:
    """One ranking rule run whole (``rank_heads`` with these options) on a prompt set: its CPU time
    against the exhaustive sweep's, and how many of the exhaustive top ``--top`` its final top holds.
    The sweep's CPU time is the recorded one (``quality``'s timing.json), or with ``--side-by-side``
    one run in this process (the machine's load then weighs on both alike): the recorded sweep
    when this process ran it, else a fresh one after the rule. Writes every head's activity (mean |AtP| per prompt), which ``widen --active``
    replays."""
    from ganda.attribution import rank_heads
    from ganda.attribution.ranking import reported_top
    from ganda.sweep import run_sweep

    timing = RUNS / name_of(args) / "sweep" / "timing.json"
    if not timing.exists() and not args.side_by_side:
        raise SystemExit(f"no recorded sweep for {name_of(args)}: run `quality` on this prompt set first "
                         "or give --side-by-side")
    fresh = not timing.exists()  # then exact_effects runs the sweep in this process, beside the rule
    adapter, examples, opts, _, clean, exact = exact_effects(args)
    sweep_cpu = json.loads(timing.read_text())["cpu"]
    rule = {"method": args.method, "verify_top": args.verify_top, "active": args.active, "audit": args.audit,
            "verify_layers": [int(x) for x in args.verify_layers.split(",") if x.strip()], "screen": args.screen}
    res, wall, cpu = timed(lambda: rank_heads(adapter, examples, margin=args.margin, top=args.top, progress=False,
                                              **rule))
    same_clean(clean, res.clean, name_of(args))
    if args.side_by_side and not fresh:
        _, _, sweep_cpu = timed(lambda: run_sweep(adapter, examples, progress=False))
    truth = reported_top(exact, args.top)
    got = reported_top({h: res.exact[h] for h in res.verified}, args.top)
    flags = [("method", args.method), ("verify-top", args.verify_top), ("active", args.active), ("audit", args.audit),
             ("verify-layers", args.verify_layers or None), ("screen", args.screen or None),
             ("side-by-side", "" if args.side_by_side else None), ("tag", args.tag)]
    from ganda.sweep import forward_tokens

    env = os.environ.get("GANDA_FORWARD_TOKENS")  # the sweep engine's token budget, where set
    out = {"command": (f"GANDA_FORWARD_TOKENS={env} " if env else "") + command_of("rule", args, *flags),
           "forward_tokens": forward_tokens(),
           "model": args.model, "task": args.task, "task_options": opts, "n_prompts": len(examples), "rule": rule,
           "verified": len(res.verified), "audited": len(res.audited), "found": len(got & truth), "top": args.top,
           "missed": sorted(truth - got), "cpu_seconds": cpu, "seconds": wall, "parts_cpu": {
               k: res.seconds[k] for k in ("attribution_cpu", "screen_cpu", "verification_cpu") if k in res.seconds},
           "sweep_cpu_seconds": sweep_cpu, "sweep_side_by_side": args.side_by_side, "sweep_share": cpu / sweep_cpu,
           "activity": res.activity,
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "load_average_at_end": list(os.getloadavg())}
    path = RESULTS / f"attribution_rule_{name_of(args)}{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{name_of(args)}: {len(got & truth)}/{args.top} of the exhaustive top {args.top} "
          f"(missed {', '.join(sorted(truth - got)) or '-'}), {len(res.verified)} verified + {len(res.audited)} audited, "
          f"{cpu:.1f} CPU s = {100 * cpu / sweep_cpu:.1f}% of the sweep's {sweep_cpu:.0f}; wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    prompt_set_options(q)
    q.add_argument("--margin", default="mean")
    q.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("speed")
    s.add_argument("--n", type=int, default=16)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--naive-heads", default=NAIVE_HEADS, help="heads the naive loop runs (scaled to every head)")
    s.add_argument("--arms", default="", help=f"comma-separated subset of {','.join(SPEED_ARMS)}")
    pr = sub.add_parser("profile")
    pr.add_argument("--method", default="atp*")
    pr.add_argument("--graddrop-blocks", type=int, default=6, help="0: GradDrop over every layer")
    pr.add_argument("--n", type=int, default=8)
    pr.add_argument("--seed", type=int, default=0)
    bl = sub.add_parser("blocks")
    bl.add_argument("--n", type=int, default=16)
    bl.add_argument("--seed", type=int, default=0)
    sub.add_parser("memory")
    m = sub.add_parser("_mem")
    m.add_argument("--arm", required=True)
    prompt_set_options(m, model=None, task=None)
    ig = sub.add_parser("ig")
    prompt_set_options(ig, "lab-llama-h1", "lab-mmlu", 32)
    ig.add_argument("--margin", default="mean")
    ig.add_argument("--threads", type=int, default=1)
    ig.add_argument("--ig-steps", type=int, nargs="+", default=[5], help="IG arms, one per step count")
    w = sub.add_parser("widen")
    w.add_argument("files", nargs="+", help="quality or ig result files (their exhaustive sweep and estimates)")
    w.add_argument("--methods", nargs="+", default=["atp*"])
    w.add_argument("--verify-top", type=int, default=20)
    w.add_argument("--verify-layers", default="0,1")
    w.add_argument("--widen", type=int, default=10)
    w.add_argument("--top", type=int, default=10)
    w.add_argument("--screen", type=int, default=0, help="also verify the answer screen's top K "
                   "(attribution_screen_<set>.json beside each file)")
    w.add_argument("--active", type=int, default=0, help="also verify the K most active heads (mean |AtP| per "
                   "prompt, from attribution_rule_<set>.json beside each file)")
    w.add_argument("--out", default=None)
    ti = sub.add_parser("ties")
    prompt_set_options(ti)
    ti.add_argument("--margin", default="mean")
    ti.add_argument("--top", type=int, default=10)
    sc = sub.add_parser("screen")
    prompt_set_options(sc)
    sc.add_argument("--threads", type=int, default=1)
    ru = sub.add_parser("rule")
    prompt_set_options(ru)
    ru.add_argument("--margin", default="mean")
    ru.add_argument("--threads", type=int, default=1)
    ru.add_argument("--top", type=int, default=10)
    ru.add_argument("--method", default="atp")
    ru.add_argument("--verify-top", type=int, default=10)
    ru.add_argument("--active", type=int, default=30)
    ru.add_argument("--audit", type=int, default=0)
    ru.add_argument("--verify-layers", default="")
    ru.add_argument("--screen", type=int, default=0)
    ru.add_argument("--side-by-side", action="store_true", help="time a fresh sweep in this process after the rule")
    ru.add_argument("--tag", default=None, help="written to attribution_rule_<set>_<tag>.json (another rule)")
    sub.add_parser("table")
    args = ap.parse_args()
    {"quality": quality_cmd, "speed": speed_cmd, "profile": profile_cmd, "blocks": blocks_cmd, "memory": memory_cmd,
     "_mem": mem_arm_cmd, "table": table_cmd, "ig": ig_cmd, "widen": widen_cmd,
     "screen": screen_cmd, "ties": ties_cmd, "rule": rule_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
