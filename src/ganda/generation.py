"""Greedy generation under interventions, and the runner for generation tasks (GSM8K, BBH).

Interventions are forward hooks (or a swapped layer list), so they act during generation
unchanged. Two paths, chosen per call:

* **cached** (adapters that support it, :meth:`ModelAdapter.supports_kv_cache_generation`:
  Llama-layout Transformers whose decoder-layer list is intact): one prefill of the
  left-padded batch, then one token per step with a fresh HF ``DynamicCache`` built for this
  call only. Hooks fire on every step, so a head ablation applies to every generated token; a
  ``positions="query"`` ablation applies to the newest position of each step (each generated
  token is the query when it is produced).
* **uncached** (any other family, or when a layer intervention changed the layer list, which
  would desynchronise the cache's layer indices): the whole growing sequence is re-run through
  ``adapter.forward`` for every new token, one example at a time. Slower (quadratic) but
  correct for every adapter.
* **prefix-cached** (the default where :func:`ganda.scoring.prefix_cache_enabled`: every family
  with its layer list as loaded): prompts are grouped by their longest common token prefix (a
  GSM8K or BBH subtask's few-shot exemplars), the prefix runs once under the active
  interventions, and each batch of suffixes decodes from a copy of its cache (attention KV and
  SSM conv/recurrent states). Position-restricted ablations see no query in the prefix; SSMs and
  hybrids decode one row per batch (a recurrent state would carry left pads).
  ``GANDA_PREFIX_CACHE=0`` or ``prefix_cache=False`` keeps the two paths above.

Both are greedy (argmax), stop at the tokenizer's EOS ids, at any stop string (the text is cut
at the earliest one, as lm-eval's ``until`` does) or after ``max_new_tokens``. The prompt is
encoded like lm-eval's HFLM encodes a ``generate_until`` context: as-is, no trailing-space
move, no special tokens (BOS only for Gemma, see :func:`ganda.scoring.encode`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import GandaError
from .finite import check_logits
from .intervals import ci
from .interventions import CLASS_POSITIONS, Intervention, apply, bind_reference
from .models.base import ModelAdapter
from .progress import tqdm
from .scoring import EvalResult, encode, pad_id, prefix_cache_enabled, prefix_groups, run_prefix
from .stats import wilson
from .tasks.base import Example, Task

DEFAULT_MAX_NEW_TOKENS = 256
BATCH_SIZE = 8  # a generation task's prompts decoded together
CHUNK = 4 * BATCH_SIZE  # a generation task's prompts handed to generate() at a time (the progress bar moves)


@dataclass
class Generation:
    text: str  # the generated text cut at the first stop sequence (what tasks score)
    raw: str  # everything generated, special tokens included
    n_tokens: int  # tokens generated (including the one that completed a stop or EOS)
    finish: str  # "stop" | "eos" | "length" | "context"
    prompt_tokens: int = 0


def cut_at_stops(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """Cut ``text`` at the earliest occurrence of any stop string (lm-eval ``until``)."""
    cut = len(text)
    for s in stop or []:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut], cut < len(text)


def eos_ids(adapter: ModelAdapter) -> set[int]:
    ids: set[int] = set()
    tok_eos = getattr(adapter.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_cfg = getattr(adapter.model, "generation_config", None)
    g = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(g, int):
        ids.add(g)
    elif isinstance(g, (list, tuple)):
        ids.update(int(x) for x in g)
    return ids


class _Row:
    def __init__(self, prompt_ids: list[int], stop: Sequence[str] | None, max_new: int) -> None:
        self.prompt_ids = prompt_ids
        self.stop = list(stop or [])
        self.max_new = max_new
        self.new: list[int] = []
        self.finish: str | None = None


def _check_row(adapter: ModelAdapter, row: _Row, token: int, eos: set[int], n_ctx: int | None) -> None:
    row.new.append(token)
    if token in eos:
        row.finish = "eos"
        return
    if row.stop:
        # stops are checked on the decoded text; only the tail can contain a new match
        text = adapter.tokenizer.decode(row.new, skip_special_tokens=False)
        if cut_at_stops(text, row.stop)[1]:
            row.finish = "stop"
            return
    if len(row.new) >= row.max_new:
        row.finish = "length"
    elif n_ctx is not None and len(row.prompt_ids) + len(row.new) >= n_ctx:
        row.finish = "context"


def _finish(adapter: ModelAdapter, row: _Row) -> Generation:
    raw = adapter.tokenizer.decode(row.new, skip_special_tokens=False)
    body = row.new[:-1] if row.finish == "eos" else row.new  # an EOS finish is the last token's (_check_row)
    text = adapter.tokenizer.decode(body, skip_special_tokens=False)
    text, _ = cut_at_stops(text, row.stop)
    return Generation(text=text, raw=raw, n_tokens=len(row.new), finish=row.finish or "length",
                      prompt_tokens=len(row.prompt_ids))


@torch.no_grad()
def _generate_cached(adapter: ModelAdapter, rows: list[_Row], eos: set[int], prefix: Any = None,
                     plen: int = 0) -> None:
    """Batched greedy decoding with a per-call cache (left padding, explicit position ids),
    continuing from a copy of ``prefix``, the cached state of the rows' first ``plen`` tokens
    (None: from nothing). Left pads sit between prefix and suffix, masked out; only adapters whose
    mask removes them exactly (``prefix_left_padding``) get rows of different lengths."""
    dev = adapter.device
    pad = pad_id(adapter)
    k = len(rows)
    width = max(len(r.prompt_ids) - plen for r in rows)
    ids = torch.full((k, width), pad, dtype=torch.long)
    mask = torch.zeros((k, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r.prompt_ids) + plen:] = torch.tensor(r.prompt_ids[plen:])
        mask[i, width - len(r.prompt_ids) + plen:] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = plen + (mask.cumsum(-1) - 1).clamp(min=0)
    full = torch.cat([torch.ones((k, plen), dtype=mask.dtype, device=dev), mask], 1) if not bool(mask.all()) else None
    cache = adapter.expand_cache(prefix, k) if prefix is not None else adapter.new_cache()
    n_ctx = adapter.n_ctx
    logits = adapter.forward_cached(ids, cache, pos, full, keep=torch.tensor([width - 1], device=dev))
    next_pos = pos[:, -1:] + 1
    while True:
        check_logits(logits[:, -1], "the next-token logits", adapter, rows[0].prompt_ids)  # argmax of NaN: token 0
        nxt = logits[:, -1].argmax(-1)
        step = torch.full((k, 1), pad, dtype=torch.long, device=dev)
        for i, r in enumerate(rows):
            if r.finish is None:
                tok = int(nxt[i])
                _check_row(adapter, r, tok, eos, n_ctx)
                step[i, 0] = tok
        if all(r.finish is not None for r in rows):
            return
        if full is not None:
            full = torch.cat([full, torch.ones((k, 1), dtype=full.dtype, device=dev)], dim=1)
        logits = adapter.forward_cached(step, cache, next_pos, full)
        next_pos = next_pos + 1


def _generate_prefixed(adapter: ModelAdapter, rows: list[_Row], eos: set[int], batch_size: int,
                       bar: Any) -> None:
    """Greedy decoding with shared prompt prefixes run once per group (:func:`prefix_groups`):
    suffixes in length-sorted batches over copies of the group's cache, one row per batch where
    left pads cannot be masked exactly (recurrent states)."""
    size = max(1, batch_size) if adapter.prefix_left_padding else 1
    ids = [r.prompt_ids for r in rows]
    for plen, members in prefix_groups(ids, [len(x) - 1 for x in ids]):
        prefix = run_prefix(adapter, ids[members[0]][:plen]) if plen else None
        _generate_batches(adapter, [rows[i] for i in members], eos, size, bar, prefix, plen)
        del prefix


def _generate_batches(adapter: ModelAdapter, rows: list[_Row], eos: set[int], size: int, bar: Any,
                      prefix: Any = None, plen: int = 0) -> None:
    """:func:`_generate_cached` on ``size`` rows at a time, similar lengths together (less padding)."""
    order = sorted(rows, key=lambda r: len(r.prompt_ids))
    for k in range(0, len(order), size):
        chunk = order[k: k + size]
        _generate_cached(adapter, chunk, eos, prefix, plen)
        bar.update(len(chunk))


@torch.no_grad()
def _generate_uncached(adapter: ModelAdapter, row: _Row, eos: set[int]) -> None:
    dev = adapter.device
    seq = list(row.prompt_ids)
    n_ctx = adapter.n_ctx
    while row.finish is None:
        logits = adapter.forward(torch.tensor([seq], device=dev))
        check_logits(logits[0, -1], "the next-token logits", adapter, row.prompt_ids)
        tok = int(logits[0, -1].argmax())
        _check_row(adapter, row, tok, eos, n_ctx)
        seq.append(tok)


def generate(
    adapter: ModelAdapter,
    prompts: str | Sequence[str],
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    stop: Sequence[str] | Sequence[Sequence[str] | None] | None = None,
    batch_size: int = BATCH_SIZE,
    use_cache: bool | None = None,
    progress: bool = False,
    prefix_cache: bool | None = None,
) -> list[Generation]:
    """Greedy continuations of ``prompts`` with the interventions currently applied.

    ``stop`` is one list of stop strings for every prompt, or one list per prompt.
    ``use_cache=None`` picks the cached path where it is safe
    (:meth:`ModelAdapter.supports_kv_cache_generation`); ``True`` where it is not raises nothing
    but falls back to the uncached path. With shared-prefix reuse (``prefix_cache``, see
    :func:`ganda.scoring.prefix_cache_enabled`) the prompts' common prefixes run once and every
    family that supports it decodes from a cache; ``use_cache=False`` turns every cache off.
    """
    single = isinstance(prompts, str)
    plist = [prompts] if single else list(prompts)
    if stop is None or (len(stop) > 0 and isinstance(stop[0], str)):
        stops: list[Sequence[str] | None] = [stop] * len(plist)  # type: ignore[list-item]
    else:
        if len(stop) != len(plist):
            raise ValueError("one stop list per prompt expected")
        stops = list(stop)  # type: ignore[arg-type]
    rows = []
    for p, s in zip(plist, stops, strict=True):
        ids = encode(adapter, p)
        if not ids:
            raise ValueError("empty prompt")
        adapter.check_length(len(ids))
        rows.append(_Row(ids, s, max_new_tokens))
    eos = eos_ids(adapter)
    safe = adapter.supports_kv_cache_generation()
    cached = safe if use_cache is None else (use_cache and safe)
    bar = tqdm(total=len(rows), desc="generate", disable=not progress, leave=False)
    if use_cache is not False and prefix_cache_enabled(adapter, prefix_cache):
        _generate_prefixed(adapter, rows, eos, batch_size, bar)
    elif cached:
        _generate_batches(adapter, rows, eos, max(1, batch_size), bar)
    else:
        for r in rows:
            _generate_uncached(adapter, r, eos)
            bar.update(1)
    bar.close()
    gens = [_finish(adapter, r) for r in rows]
    return gens[:1] if single else gens


def _generate_all(adapter: ModelAdapter, desc: str, examples: Sequence[Example], max_new: int,
                  prefix_cache: bool | None, progress: bool) -> list[Generation]:
    """Every example's greedy generation, :data:`CHUNK` examples at a time so that the progress bar moves."""
    gens: list[Generation] = []
    bar = tqdm(total=len(examples), desc=desc, disable=not progress, leave=False)
    for k in range(0, len(examples), CHUNK):
        chunk = examples[k: k + CHUNK]
        gens.extend(generate(adapter, [ex.prompt for ex in chunk], max_new_tokens=max_new,
                             stop=[ex.stop for ex in chunk], prefix_cache=prefix_cache))
        bar.update(len(chunk))
    bar.close()
    return gens


def _prediction(task: Task, ex: Example, i: int, g: Generation) -> dict[str, Any]:
    """One generation's prediction record: the task's verdict (``correct``) and, where the task
    offers them, the answer it read (``extracted``) and every metric it reports (``metrics``)."""
    rec: dict[str, Any] = {"id": ex.key(task.name, i), "target": ex.target, "generated": g.text, "finish": g.finish,
                           "n_tokens": g.n_tokens, "correct": bool(task.score_generation(ex, g.text))}
    if hasattr(task, "extract"):
        rec["extracted"] = task.extract(ex, g.text)
    if hasattr(task, "metrics"):
        rec["metrics"] = task.metrics(ex, g.text)
    if ex.meta:
        rec["meta"] = ex.meta
    return rec


def evaluate_generation(
    adapter: ModelAdapter,
    task: Task,
    examples: Sequence[Example],
    interventions: Sequence[Intervention] | None = None,
    *,
    seed: int = 0,
    progress: bool = True,
    prefix_cache: bool | None = None,
) -> EvalResult:
    """Exact-match accuracy of greedy generations on a generation task.

    The task supplies ``score_generation(example, text) -> bool`` (the primary metric) and,
    optionally, ``metrics(example, text) -> dict[name, bool]`` (every metric it reports, e.g.
    GSM8K's strict and flexible matches) and ``extract(example, text) -> str`` (the answer it
    read). Secondary metrics are aggregated into ``result.config["metrics"]``; a task's optional
    ``aggregate(records) -> dict`` (BBH: per-subtask and macro accuracy) is merged into ``config``.
    Its ``max_new_tokens`` caps every generation (:data:`DEFAULT_MAX_NEW_TOKENS` where it has none).
    """
    t0 = time.perf_counter()
    max_new = getattr(task, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    interventions = bind_reference(interventions, examples)  # a mean ablation: over the prompts generated from
    if any(getattr(iv, "how", None) == "resample" or getattr(iv, "positions", None) in CLASS_POSITIONS
           for iv in interventions):
        raise GandaError("resample ablation and position classes (--ablate-at) score multiple-choice tasks only; "
                         f"{task.name!r} generates")
    with apply(adapter, interventions):
        gens = _generate_all(adapter, task.name, examples, max_new, prefix_cache, progress)
    preds = [_prediction(task, ex, i, g) for i, (ex, g) in enumerate(zip(examples, gens, strict=True))]
    cfg = {**task.config(), "seed": seed, "max_new_tokens": max_new, **generation_tally(task, preds)}
    return EvalResult.from_counts(task.name, adapter, sum(p["correct"] for p in preds), len(examples), t0,
                                  interventions=interventions, config=cfg, predictions=preds)


def generation_tally(task: Task, preds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a generation result's config tallies over its prediction records: how each generation
    finished, every secondary metric's count and accuracy with its Wilson interval, and the task's
    own ``aggregate`` (BBH's per-subtask accuracy); shards of one run merged tally the same."""
    n = len(preds)
    finishes: dict[str, int] = {}
    metric_sums: dict[str, int] = {}
    for rec in preds:
        finishes[rec["finish"]] = finishes.get(rec["finish"], 0) + 1
        for name, v in rec.get("metrics", {}).items():
            metric_sums[name] = metric_sums.get(name, 0) + bool(v)
    out: dict[str, Any] = {"finish": finishes}
    if metric_sums:
        out["metrics"] = {k: {"correct": v, "accuracy": v / n if n else 0.0, **ci(wilson(v, n))}
                          for k, v in metric_sums.items()}
    if hasattr(task, "aggregate"):
        out.update(task.aggregate(preds))
    return out
