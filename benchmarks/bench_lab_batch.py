"""Building lab training batches: the memoised, vectorised builder against a plain baseline.

Each training step first builds its batch in Python: ~135 text pieces sampled from the world,
tokenised and padded. The tokenisation is memoised (the Rust backend called directly, 1.55-1.72x
over the tokenizer's own call). Dictionary and option prompts are fresh in every batch, so half
the pieces would still go to the backend; the builder avoids that and more:

* ``token_ids`` splits the lab tokenizer's text with the tokenizer's own regular expression and
  looks the pieces up in its vocabulary, in Python, where the backend took ~0.1-0.3 ms per call;
* ``_pad`` builds each tensor once through numpy (three ``torch.tensor`` calls per sequence before);
* the hard distractors' pools come from a per-relation index (every value split per question before);
* the copy drill's token pool is memoised (rebuilt per sequence before).

The batches must be *identical* (a shipped checkpoint retrains bit for bit only then). The
baseline arm patches the previous implementations (kept below) back in. Per config, the same
steps' batches built both ways, alternating blocks, one thread, cold caches:

    .venv/bin/python benchmarks/bench_lab_batch.py [--steps 300] [--out benchmarks/results/lab_batch.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from ganda_lab import train as T
from ganda_lab.configs import resolve_config
from ganda_lab.tokenizer import build_tokenizer
from ganda_lab.world import World, WorldConfig, edit_distractors, phrase_pool

CONFIGS = {"llama-h1 (lab-llama-h1)": "llama-h1", "mamba2 (lab-mamba2)": "mamba2",
           "hybrid-late (lab-hybrid-late)": "hybrid-late", "kv-llama (lab-kv-llama)": "kv-llama"}


# ---- the previous implementations (the baseline) ----------------------------------------------
@functools.lru_cache(maxsize=1 << 17)
def backend_token_ids(tok, text: str) -> tuple[int, ...]:
    return tuple(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def pad_per_row(tok, seqs) -> dict[str, torch.Tensor]:
    width = max(len(s[0]) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    wts = torch.zeros((len(seqs), width))
    for i, (s, lab, w) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(lab)
        mask[i, : len(s)] = 1
        wts[i, : len(s)] = torch.tensor(w)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, "weights": wts}


def options_split_per_question(self, rng, relation, gold_value, n=4, hard=False):
    others = [v for v in self.values[relation] if v != gold_value]
    if hard and self.config.values == "phrases":
        opts = edit_distractors(rng, gold_value, phrase_pool(relation, self.config.phrase_words),
                                self.config.max_words, n - 1) + [gold_value]
    elif hard:
        adj, noun = gold_value.split()
        same_adj = [v for v in others if v.split()[0] == adj]
        same_noun = [v for v in others if v.split()[1] == noun]
        picks = [rng.choice(pool) for pool in (same_adj, same_noun)[: n - 1] if pool]
        near = [v for v in same_adj + same_noun if v not in picks]
        picks += rng.sample(near, min(n - 1 - len(picks), len(near)))
        rest = [v for v in others if v not in picks]
        opts = picks + rng.sample(rest, n - 1 - len(picks)) + [gold_value]
    else:
        opts = rng.sample(others, n - 1) + [gold_value]
    rng.shuffle(opts)
    return opts, opts.index(gold_value)


def copy_pool_per_sequence(world, tok):
    return sorted({i for k in world.kv_key_pool for i in T.token_ids(tok, k)}
                  | {i for v in range(world.config.n_kv_values) for i in T.token_ids(tok, str(v))})


NOW = {"token_ids": T.token_ids, "_pad": T._pad, "copy_pool": T.copy_pool, "_options": World._options}
BEFORE = {"token_ids": backend_token_ids, "_pad": pad_per_row, "copy_pool": copy_pool_per_sequence,
          "_options": options_split_per_question}


def build(world, tok, tr, steps: range, impl: dict) -> tuple[float, list[dict[str, torch.Tensor]]]:
    for name in ("token_ids", "_pad", "copy_pool"):
        setattr(T, name, impl[name])
    World._options = impl["_options"]
    try:
        t0 = time.perf_counter()
        batches = [T.make_batch(world, tok, tr, tr["seed"], s) for s in steps]
        return time.perf_counter() - t0, batches
    finally:
        for name in ("token_ids", "_pad", "copy_pool"):
            setattr(T, name, NOW[name])
        World._options = NOW["_options"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/lab_batch.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, name in CONFIGS.items():
        cfg = resolve_config(name)
        tr = cfg["train"]
        world = World(WorldConfig.from_json(cfg["world"]))
        tok = build_tokenizer(world)
        NOW["token_ids"].cache_clear()  # cold caches: the first steps pay for every new piece
        backend_token_ids.cache_clear()
        t = {"before": 0.0, "now": 0.0}
        equal = True
        half = args.steps // 2
        for block in (range(0, half), range(5000, 5000 + args.steps - half)):  # early and mid-run steps
            dt_before, ref = build(world, tok, tr, block, BEFORE)
            dt_now, got = build(world, tok, tr, block, NOW)
            t["before"] += dt_before
            t["now"] += dt_now
            equal &= all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype
                         for a, b in zip(ref, got, strict=True) for k in a)
        rows.append({"config": label, "steps": args.steps, "before_ms": 1000 * t["before"] / args.steps,
                     "now_ms": 1000 * t["now"] / args.steps, "speedup": t["before"] / t["now"], "identical": equal})
        r = rows[-1]
        print(f"{label:32s} before {r['before_ms']:6.1f} ms  now {r['now_ms']:6.1f} ms  "
              f"{r['speedup']:.2f}x  identical {equal}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "torch_threads": 1}, indent=2))


if __name__ == "__main__":
    main()
