"""Train a lab model on the synthetic world: seeded, resumable, with a progress bar.

Each batch is a fresh, seeded mixture (``train_rng(seed, step)``) of

* ``statement``: ``The home of bako is red hill.`` for every entity's facts (loss on all tokens),
* ``mmlu``: MMLU-format questions about *training* facts (loss on the answer letter),
* ``letters``: MMLU-format questions whose answer is stated in context (loss on the letter),
* ``kv``: dictionary prompts (loss on the value).

Because batches are a pure function of (seed, step), resuming from a checkpoint continues the
exact same run. The output directory is an ordinary Hugging Face model directory
(``config.json``, ``model.safetensors``, tokenizer files) plus ``lab.json`` (config, world, log).
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ganda.progress import tqdm
from ganda.tasks.base import Example

from .configs import build_model, resolve_config
from .tokenizer import PATTERN, build_tokenizer
from .world import World, WorldConfig, eval_rng, train_rng


# ---- batches ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1 << 17)
def token_ids(tok, text: str) -> tuple[int, ...]:
    """Ids of ``text`` without special tokens, as ``tok(text).input_ids`` gives them, memoised.

    Half of a training batch's ~135 pieces recur (statements, option lines, prompts), and the
    tokenizer's Python wrapper was most of the time spent building a batch; the Rust backend
    called directly returns the same ids (tested) at well under half the cost. For the lab's own
    tokenizer, a regular-expression split and a dictionary lookup in Python return them again
    (tested), ~10x faster than a call into the backend, which dominated building a batch of
    fresh dictionary and option prompts that no cache can hold."""
    fast = _word_level_encoder(tok)
    ids = fast(text) if fast is not None else None
    if ids is not None:
        return ids
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return tuple(tok(text, add_special_tokens=False).input_ids)
    return tuple(backend.encode(text, add_special_tokens=False).ids)


@functools.lru_cache(maxsize=16)
def _word_level_encoder(tok) -> Callable[[str], tuple[int, ...] | None] | None:
    """A Python encoder for a tokenizer built like the lab's (no normaliser, the lab's regex
    split with isolated pieces, a word-level vocabulary), else None. It returns None for any text
    it cannot vouch for (a special token's text, characters the split leaves over, a piece not
    in the vocabulary), which then goes to the Rust backend."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    if (spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "WordLevel"
            or pre.get("type") != "Split" or pre.get("pattern") != {"Regex": PATTERN}
            or pre.get("behavior") != "Isolated" or pre.get("invert")):
        return None
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = [t["content"] for t in spec.get("added_tokens", [])]
    split = re.compile(PATTERN).findall

    def encode(text: str) -> tuple[int, ...] | None:
        if any(a in text for a in added):
            return None
        pieces = split(text)
        if sum(map(len, pieces)) != len(text):
            return None
        try:
            return tuple([vocab[p] for p in pieces])
        except KeyError:
            return None

    return encode


def example_ids(tok, ex: Example) -> tuple[list[int], int]:
    """Token ids of prompt + gold choice, and the index where the answer starts."""
    ctx = token_ids(tok, ex.prompt)
    full = list(token_ids(tok, ex.prompt + ex.choices[ex.gold]))
    return full, len(ctx)


def _pieces_sequence(tok, pieces: list[tuple[str, bool]], answer_weight: float | None
                     ) -> tuple[list[int], list[int], list[float]]:
    """(ids, labels, weights) of text pieces, the answer pieces weighted (or the only ones with loss)."""
    ids, weights = [], []
    aw = 1.0 if answer_weight is None else float(answer_weight)
    for text, is_answer in pieces:
        piece = token_ids(tok, text)
        ids += piece
        weights += [aw if is_answer else (1.0 if answer_weight is not None else 0.0)] * len(piece)
    labels = [i if w > 0 else -100 for i, w in zip(ids, weights, strict=True)]
    return ids, labels, [w if w > 0 else 1.0 for w in weights]


def copy_pool(world: World, tok) -> list[int]:
    """The copy drill's tokens: every id of a dictionary key or value, sorted. Memoised per
    tokenizer and world (rebuilt per sequence it cost ~3% of a KV-pair training step)."""
    return _token_pool(tok, world.kv_texts)


@functools.lru_cache(maxsize=16)
def _token_pool(tok, texts: tuple[str, ...]) -> list[int]:
    return sorted({i for t in texts for i in token_ids(tok, t)})


def copy_sequence(world: World, tok, rng, length: int) -> tuple[list[int], list[int], list[float]]:
    """A *copy drill*: ``length`` distinct dictionary tokens (KV keys and values) in random order,
    then the same run again, with loss on the whole second copy. Every target is one induction
    step (find the current token's earlier copy, read what followed it), so a 2-layer Transformer
    forms induction heads in a few hundred steps here, where the dictionary prompt alone or the
    repeat drill (one target per line) left it on the plateau for 15000 (docs/lab.md, finding 3)."""
    pool = copy_pool(world, tok)
    if not 2 <= length <= len(pool):
        raise ValueError(f"copy drill length must be 2..{len(pool)}, not {length}")
    x = rng.sample(pool, length)
    ids = [tok.bos_token_id, *x, *x]
    return ids, [-100] * (length + 2) + x[1:], [1.0] * len(ids)


def sample_sequence(world: World, tok, rng, kind: str, kv_pairs: tuple[int, int],
                    n_options: tuple[int, int] = (4, 4), answer_weight: float | None = None,
                    hard: bool | None = None, kv_queries: tuple[int, int] = (1, 1),
                    copy_len: tuple[int, int] = (8, 16),
                    ) -> tuple[list[int], list[int], list[float]]:
    """(ids, labels, weights) for one training sequence; labels are -100 where there is no loss.

    ``answer_weight`` None: loss on the answer only; a number: loss on every token, the answer's
    weighted this much more (predicting the next option letter trains the Gather side early).

    ``n_options``: MMLU-format training questions get between these many options (a 2-4 option
    curriculum shortens the plateau before the Gather-and-Aggregate circuit forms).

    ``hard``: override the world's distractor kind (a random-then-hard curriculum).
    ``kv_queries``: dictionary prompts ask between these many keys in turn (a dense signal).
    ``copy_len``: tokens per copy drill (inclusive range)."""
    if kind == "copy":
        return copy_sequence(world, tok, rng, rng.randint(*copy_len))
    if kind == "statement":
        f = rng.choice(world.facts)
        ids = list(token_ids(tok, world.statement(f.entity, f.relation, f.value)))
        return ids, list(ids), [1.0] * len(ids)
    if kind == "drill":
        return _pieces_sequence(tok, world.drill_pieces(rng, 4, rng.randint(2, 4), hard), answer_weight)
    if kind in ("kvrepeat", "kvrepeat_adjacent"):
        sep = ":" if kind == "kvrepeat" else " "
        return _pieces_sequence(tok, world.kv_repeat_pieces(rng, rng.randint(kv_pairs[0], kv_pairs[1]), sep), answer_weight)
    if kind == "kv" and kv_queries[1] > 1:
        n_pairs = rng.randint(kv_pairs[0], kv_pairs[1])
        pieces = world.kv_pieces(rng, n_pairs, rng.randint(kv_queries[0], kv_queries[1]))
        return _pieces_sequence(tok, pieces, answer_weight)
    if kind == "mmlu":
        ex = world.mmlu_example(rng, rng.choice(world.train_facts), rng.randint(*n_options), hard)
    elif kind == "letters":
        ex = world.letters_example(rng, rng.randint(*n_options), hard)
    elif kind == "kv":
        ex = world.kv_example(rng, rng.randint(kv_pairs[0], kv_pairs[1]))
    else:
        raise ValueError(f"unknown mixture component {kind!r}")
    ids, start = example_ids(tok, ex)
    if answer_weight is None:
        return ids, [-100] * start + ids[start:], [1.0] * len(ids)
    return ids, list(ids), [1.0] * start + [float(answer_weight)] * (len(ids) - start)


def make_batch(world: World, tok, cfg_train: dict[str, Any], seed: int, step: int) -> dict[str, torch.Tensor]:
    rng = train_rng(seed, step)
    mix = cfg_train["mixture"]
    kinds, weights = list(mix), [float(mix[k]) for k in mix]
    kvp = tuple(cfg_train["kv_pairs"])
    nopt = tuple(cfg_train.get("n_options", (4, 4)))
    if step < cfg_train.get("two_option_steps", 0):  # curriculum: binary questions first
        nopt = (2, 2)
    aw = cfg_train.get("answer_weight")
    # curriculum: random distractors before ``hard_from_step`` in a world with hard ones
    hard = False if step < cfg_train.get("hard_from_step", 0) else None
    kvq = tuple(cfg_train.get("kv_queries", (1, 1)))
    cl = tuple(cfg_train.get("copy_len", (8, 16)))
    seqs = [sample_sequence(world, tok, rng, rng.choices(kinds, weights)[0], kvp, nopt, aw, hard, kvq, cl)
            for _ in range(cfg_train["batch_size"])]
    return _pad(tok, seqs)


def bucket_batch(batch: dict[str, torch.Tensor], buckets: int) -> list[dict[str, torch.Tensor]]:
    """Split a right-padded batch into ``buckets`` groups of similar length, each cut to its own
    width: the same sequences with far less padding (statements are 8 tokens, drills 70). The
    weighted loss summed over the groups and divided once by the total weight is exactly the
    loss of the whole batch (:func:`lm_loss_parts`)."""
    if buckets <= 1:
        return [batch]
    lengths = batch["attention_mask"].sum(1)
    order = torch.argsort(lengths, stable=True)
    out = []
    for idx in torch.tensor_split(order, buckets):
        if len(idx) == 0:
            continue
        width = int(lengths[idx].max())
        out.append({k: v[idx, :width] for k, v in batch.items()})
    return out


def _pad(tok, seqs) -> dict[str, torch.Tensor]:
    """Right-padded tensors of (ids, labels, weights) sequences, each built by one call from
    padded lists (three ``torch.tensor`` calls per sequence were a fifth of building a batch)."""
    width = max(len(s[0]) for s in seqs)
    pad = tok.pad_token_id
    ids, labels, mask, wts = [], [], [], []
    for s, lab, w in seqs:
        gap = width - len(s)
        ids.append([*s, *[pad] * gap])
        labels.append([*lab, *[-100] * gap])
        mask.append([1] * len(s) + [0] * gap)
        wts.append([*w, *[0.0] * gap])
    # through numpy: ~5x faster than torch.tensor on nested lists, the same values and dtypes
    return {"input_ids": torch.from_numpy(np.array(ids, dtype=np.int64)),
            "labels": torch.from_numpy(np.array(labels, dtype=np.int64)),
            "attention_mask": torch.from_numpy(np.array(mask, dtype=np.int64)),
            "weights": torch.from_numpy(np.array(wts, dtype=np.float32))}


# ---- quick evaluation (batched; the final numbers use ganda.scoring) ----------------------------
def eval_examples(world: World, kind: str, n: int, seed: int = 0, split: str = "all", n_pairs: int = 8) -> list[Example]:
    rng = eval_rng(kind, seed)
    if kind == "knowledge":
        facts = world.fact_split(split)
        return [world.knowledge_example(rng, facts[i % len(facts)]) for i in _order(rng, len(facts), n)]
    if kind == "mmlu":
        facts = world.fact_split(split, asked=True)
        return [world.mmlu_example(rng, facts[i % len(facts)]) for i in _order(rng, len(facts), n)]
    if kind == "letters":
        return [world.letters_example(rng) for _ in range(n)]
    if kind == "kv":
        return [world.kv_example(rng, n_pairs) for _ in range(n)]
    raise ValueError(kind)


def _order(rng, n_items: int, n: int) -> list[int]:
    idx = list(range(n_items))
    rng.shuffle(idx)
    return [idx[i % n_items] for i in range(n)]


@torch.no_grad()
def quick_accuracy(model, tok, examples: list[Example], batch_rows: int = 256) -> float:
    """Accuracy by summed log-likelihood of each choice (same rule as ganda.scoring's ``acc``)."""
    rows, owners = [], []
    for ei, ex in enumerate(examples):
        ctx = token_ids(tok, ex.prompt)
        for ci, c in enumerate(ex.choices):
            full = token_ids(tok, ex.prompt + c)
            rows.append((full, len(ctx)))
            owners.append((ei, ci))
    scores: dict[tuple[int, int], float] = {}
    was_training = model.training
    model.eval()
    for b in range(0, len(rows), batch_rows):
        chunk = rows[b : b + batch_rows]
        width = max(len(r[0]) for r in chunk)
        ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (r, _) in enumerate(chunk):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), -1)
        for i, (r, start) in enumerate(chunk):
            pos = torch.arange(start - 1, len(r) - 1)
            scores[owners[b + i]] = float(logp[i, pos, torch.tensor(r[start:])].sum())
    if was_training:
        model.train()
    correct = 0
    for ei, ex in enumerate(examples):
        best = max(range(len(ex.choices)), key=lambda ci: scores[(ei, ci)])
        correct += best == ex.gold
    return correct / max(1, len(examples))


def quick_eval(model, tok, world: World, n: int, seed: int = 1) -> dict[str, float]:
    return {
        "knowledge": quick_accuracy(model, tok, eval_examples(world, "knowledge", n, seed)),
        "mmlu": quick_accuracy(model, tok, eval_examples(world, "mmlu", n, seed)),
        "mmlu_held": quick_accuracy(model, tok, eval_examples(world, "mmlu", n, seed, split="held")),
        "letters": quick_accuracy(model, tok, eval_examples(world, "letters", n, seed)),
        "kv": quick_accuracy(model, tok, eval_examples(world, "kv", n, seed)),
    }


# ---- training -----------------------------------------------------------------------------------
def _lr(step: int, cfg_train: dict[str, Any]) -> float:
    """Linear warm-up, then ``schedule``: ``cosine`` to ``min_lr_frac`` over the run, or ``wsd``
    (warm-up, stable, decay): the full rate until the last ``decay_frac`` of the run, then a
    linear decay to ``min_lr_frac``. The SSMs leave their retrieval plateau only while the rate
    is still high (around step 3000), which a short cosine run does not give them.

    ``schedule_steps`` (default ``steps``) is the length the curve is drawn for, and
    ``anneal_from`` a step from which the rate falls linearly from the curve's value there to
    ``min_lr_frac`` at ``steps``: a run cut short of its planned schedule with a short anneal.
    Up to ``anneal_from`` it computes exactly what the planned run computes (same batches, same
    rates), so its trajectory is that run's, bit for bit, until the anneal."""
    a = cfg_train.get("anneal_from")
    if a is not None and step >= int(a):
        a, end = int(a), cfg_train["steps"]
        top = _lr_curve(a, cfg_train)
        low = cfg_train["lr"] * cfg_train["min_lr_frac"]
        return top + (low - top) * min(1.0, (step - a) / max(1, end - a))
    return _lr_curve(step, cfg_train)


def _lr_curve(step: int, cfg_train: dict[str, Any]) -> float:
    base, warm = cfg_train["lr"], cfg_train["warmup"]
    total = int(cfg_train.get("schedule_steps") or cfg_train["steps"])
    if step < warm:
        return base * (step + 1) / warm
    lo = cfg_train["min_lr_frac"]
    if cfg_train.get("schedule", "cosine") == "wsd":
        return base * wsd_multiplier(total, float(cfg_train.get("decay_frac", 0.2)), lo)(step)
    frac = (step - warm) / max(1, total - warm)
    return base * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@functools.lru_cache(maxsize=16)
def wsd_multiplier(total: int, decay_frac: float, min_lr_frac: float) -> Callable[[int], float]:
    """transformers' warm-up-stable-decay schedule (``get_wsd_schedule``) as a step -> rate-multiplier
    function: 1 until the last ``decay_frac`` of ``total`` steps, then linear to ``min_lr_frac``.

    Only its stable and decay phases are used: the lab's linear warm-up (``(step + 1) / warmup``, shared
    with the cosine schedule, 1% of the rate at step 0 for 100 warm-up steps) comes first, where
    transformers' linear warm-up would start at ``min_lr_frac`` (10%). transformers writes the decay
    as ``(1 - p)(1 - lo) + lo``, the same line as ``1 - (1 - lo) p``: on the lab's wsd settings the
    two differ in the last bit of the double at about a third of the decay steps (relative 7e-16)
    and at none in the float32 scalars AdamW applies (the rate, rate / bias correction, 1 - rate x
    weight decay; tests/test_lab_train.py), so a run trains to the same weights bit for bit."""
    from transformers import get_wsd_schedule  # the lab's models are transformers models already

    stable = round(total * (1 - decay_frac))  # the first decay step (110 x 0.8 is 88.00000000000001)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # the schedule only reads its rate
    sched = get_wsd_schedule(opt, num_warmup_steps=0, num_stable_steps=stable, num_decay_steps=total - stable,
                             decay_type="linear", min_lr_ratio=min_lr_frac)
    return sched.lr_lambdas[0]


def lm_loss_parts(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of weighted next-token cross-entropy, sum of weights) on labelled positions only
    (the LM head runs only there)."""
    h = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    labels = batch["labels"][:, 1:]
    keep = labels != -100
    logits = model.lm_head(h[:, :-1][keep]).float()
    ce = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="none")
    w = batch["weights"][:, 1:][keep] if "weights" in batch else torch.ones_like(ce)
    return (ce * w).sum(), w.sum()


def lm_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Weighted mean next-token cross-entropy of a batch."""
    total, weight = lm_loss_parts(model, batch)
    return total / weight


@torch.no_grad()
def space_tied_init(model, tok) -> None:
    """Start " word" with the embedding of "word" (so copying a label "A" to the answer " A" is
    easy from step 0); the two rows are free to drift apart during training."""
    emb = model.get_input_embeddings().weight
    vocab = tok.get_vocab()
    for t, i in vocab.items():
        if t.startswith(" ") and t[1:] in vocab:
            emb[i] = emb[vocab[t[1:]]]


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model, tok, out: Path, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    (out / "lab.json").write_text(json.dumps(meta, indent=2))


def train(
    config: str | dict[str, Any],
    out: str | Path,
    *,
    steps: int | None = None,
    seed: int | None = None,
    resume: bool = False,
    progress: bool = True,
    log=print,
    eval_every: int | None = None,
) -> dict[str, Any]:
    """Train a model from a config; returns the run record (also written to ``out/lab.json``).

    ``eval_every`` overrides how often the quick evaluation runs. It only changes the logged
    history: evaluation draws from its own seeded streams and the model has no dropout, so the
    trained weights are the same for every value (tested)."""
    cfg = resolve_config(config)
    tr = cfg["train"]
    if steps is not None:
        tr["steps"] = int(steps)
    if seed is not None:
        tr["seed"] = int(seed)
    if eval_every is not None:
        tr["eval_every"] = int(eval_every)
    if tr.get("threads"):
        torch.set_num_threads(int(tr["threads"]))
    out = Path(out)
    world = World(WorldConfig.from_json(cfg["world"]))
    tok = build_tokenizer(world)
    torch.manual_seed(tr["seed"])
    model = build_model(cfg, tok)
    if tr.get("space_tied_init"):
        space_tied_init(model, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], weight_decay=tr["weight_decay"], betas=(0.9, 0.98))
    ckpt = out / "checkpoint"
    start, history, elapsed = 0, [], 0.0
    if resume and (ckpt / "state.json").exists():
        state = json.loads((ckpt / "state.json").read_text())
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=False)
        model.tie_weights()
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
        start, history, elapsed = state["step"], state["history"], state["seconds"]
        log(f"resuming from step {start}")
    model.train()
    record: dict[str, Any] = {"config": cfg, "world": world.config.to_json(), "params": n_params(model)}
    t0 = time.perf_counter() - elapsed
    bar = tqdm(range(start, tr["steps"]), desc=f"train {cfg['name']}", disable=not progress, initial=start, total=tr["steps"])
    ema = None
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = _lr(step, tr)
        batch = make_batch(world, tok, tr, tr["seed"], step)
        opt.zero_grad(set_to_none=True)
        parts = bucket_batch(batch, int(tr.get("buckets", 1)))
        total_w = sum(float(b["weights"][:, 1:][b["labels"][:, 1:] != -100].sum()) for b in parts)
        loss = torch.zeros(())
        for part in parts:  # one backward per bucket: the graph of one bucket at a time in memory
            s_, _ = lm_loss_parts(model, part)
            (s_ / total_w).backward()
            loss = loss + s_.detach() / total_w
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        lv = loss.item()
        if step == 0:
            record["first_loss"] = round(lv, 4)
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        bar.set_postfix(loss=f"{ema:.3f}")
        done = step + 1
        if done % tr["eval_every"] == 0 or done == tr["steps"]:
            acc = quick_eval(model, tok, world, tr["eval_n"])
            history.append({"step": done, "loss": round(ema, 4), "seconds": round(time.perf_counter() - t0, 1),
                            **{k: round(v, 3) for k, v in acc.items()}})
            log(json.dumps(history[-1]))
        if done % tr["ckpt_every"] == 0 and done < tr["steps"]:
            _save_checkpoint(model, opt, ckpt, done, history, time.perf_counter() - t0, cfg)
    record.update({"steps": tr["steps"], "seconds": round(time.perf_counter() - t0, 1), "history": history,
                   "torch_threads": torch.get_num_threads()})
    model.eval()
    save_model(model, tok, out, record)
    return record


def _save_checkpoint(model, opt, ckpt: Path, step: int, history: list, seconds: float,
                     cfg: dict[str, Any] | None = None) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    # tied weights share storage; safetensors refuses duplicates
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(ckpt / "model.safetensors"))
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    (ckpt / "state.json").write_text(json.dumps({"step": step, "history": history, "seconds": seconds, "config": cfg}))


def export_checkpoint(run_dir: str | Path, out: str | Path, config: str | dict[str, Any] | None = None) -> dict[str, Any]:
    """Turn a run's latest resume checkpoint (``run_dir/checkpoint``) into a model directory,
    e.g. to ship a run that was stopped before its last step. ``config`` is needed only for
    checkpoints written before the config was stored in ``state.json``."""
    ckpt = Path(run_dir) / "checkpoint"
    state = json.loads((ckpt / "state.json").read_text())
    cfg = resolve_config(config if config is not None else state["config"])
    world = World(WorldConfig.from_json(cfg["world"]))
    tok = build_tokenizer(world)
    model = build_model(cfg, tok)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=False)
    model.tie_weights()
    model.eval()
    cfg["train"]["stopped_at"] = state["step"]
    record = {"config": cfg, "world": world.config.to_json(), "params": n_params(model), "steps": state["step"],
              "seconds": round(state["seconds"], 1), "history": state["history"], "exported_from_checkpoint": True}
    save_model(model, tok, Path(out), record)
    return record
