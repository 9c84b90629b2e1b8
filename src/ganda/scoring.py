"""Multiple-choice scoring: log-likelihood of choices, accuracy with a CI, and the result record.

Conventions follow lm-eval so that numbers are comparable: a choice is a continuation of the
context (``" A"``, ``" 42"``), trailing whitespace of the context moves into the continuation,
``context + continuation`` is encoded whole and split at the length of the encoded context, and
the prediction is the argmax of the summed continuation log-probabilities (``acc``);
``acc_norm`` divides by the continuation's length in characters, not counting the leading space.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .effects import predicted
from .engine import Trace
from .errors import GandaError, env_switch
from .finite import check_scores
from .intervals import split
from .interventions import REFERENCES, Donors, Intervention, apply, bind_reference, describe_all, z_point
from .models.base import Mixer, ModelAdapter, ReadPositions
from .progress import tqdm
from .sites import row_classes
from .stats import wilson
from .tasks.base import Example, token_spans


def add_bos(adapter: ModelAdapter) -> bool:
    """Gemma models need a BOS token (lm-eval adds it for them); Llama-style SmolLM2 does not."""
    mt = getattr(getattr(adapter.model, "config", None), "model_type", "") or ""
    return mt.startswith("gemma")


def encode(adapter: ModelAdapter, text: str) -> list[int]:
    """``text``'s ids as the model reads them: no special tokens but a BOS where :func:`add_bos`."""
    return encode_many(adapter, [text])[0]


def _split_space(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval moves the context's trailing whitespace to the front of the continuation."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def encode_pair(adapter: ModelAdapter, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: returns (context ids, continuation ids)."""
    return encode_pairs(adapter, [(context, continuation)])[0]


def encode_many(adapter: ModelAdapter, texts: Sequence[str]) -> list[list[int]]:
    """:func:`encode` of each text, in one call of the tokenizer where it takes a list (a fast
    tokenizer encodes the batch on all cores; one call per 5-shot choice is most of eval's host time)."""
    tok = adapter.require_tokenizer()
    try:
        out = [list(ids) for ids in tok(list(texts), add_special_tokens=False).input_ids]
        batched = len(out) == len(texts)
    except (TypeError, AttributeError, ValueError):  # a tokenizer that takes one text at a time
        batched = False
    if not batched:
        out = [list(tok(t, add_special_tokens=False).input_ids) for t in texts]
    if add_bos(adapter) and tok.bos_token_id is not None:
        out = [[tok.bos_token_id, *ids] for ids in out]
    return out


def encode_pairs(adapter: ModelAdapter, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """:func:`encode_pair` of each (context, continuation): one tokenizer call, each distinct
    context encoded once (an MMLU example's choices share one 5-shot context)."""
    split = [_split_space(c, t) for c, t in pairs]
    contexts = list(dict.fromkeys(c for c, _ in split))
    encoded = encode_many(adapter, [c + t for c, t in split] + contexts)
    wholes, ctx_ids = encoded[: len(split)], dict(zip(contexts, encoded[len(split):], strict=True))
    out = []
    for (c, _), whole in zip(split, wholes, strict=True):
        n = len(ctx_ids[c])
        out.append((whole[:n], whole[n:]))
    return out


@dataclass
class ChoiceScores:
    loglik: list[float]
    n_chars: list[int]

    @property
    def pred(self) -> int:
        return predicted(self.loglik)

    @property
    def norm(self) -> list[float]:
        """Each choice's log-likelihood per character (lm-eval's ``acc_norm``)."""
        return [ll / max(1, n) for ll, n in zip(self.loglik, self.n_chars, strict=True)]

    @property
    def pred_norm(self) -> int:
        return predicted(self.norm)


def choice_chars(choices: Sequence[str]) -> list[int]:
    """lm-eval's acc_norm lengths: each choice's characters without the leading target delimiter."""
    return [len(c[1:]) if c.startswith(" ") else len(c) for c in choices]


@torch.no_grad()
def score_choices(adapter: ModelAdapter, context: str, choices: Sequence[str]) -> ChoiceScores:
    """Summed log-likelihood of each continuation after ``context`` (one batched forward).

    When every continuation is one token after the same context (MMLU letters) a single
    forward of the context suffices; otherwise all ``context+choice`` rows run as one batch.
    """
    return score_example(adapter, Example(context, list(choices)))


def example_pairs(ex: Example) -> list[tuple[str, str]]:
    """(context, continuation) per choice: one context for ordinary examples, one per choice
    for lm-eval's *partial* scoring (Winogrande: ``meta["contexts"]`` + ``meta["continuation"]``)."""
    if "contexts" in ex.meta:
        return [(c, ex.meta["continuation"]) for c in ex.meta["contexts"]]
    return [(ex.prompt, c) for c in ex.choices]


def norm_chars(ex: Example) -> list[int]:
    """lm-eval's acc_norm lengths for an example (the continuation without its leading space)."""
    return choice_chars([cont for _, cont in example_pairs(ex)])


def examples_digest(examples: Sequence[Example]) -> str:
    """A short digest of everything scoring reads of ``examples`` (each choice's context and
    continuation, Winogrande's partial contexts included, and the gold answer), in order: what a
    resumed run checks its prompts against."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([example_pairs(ex), ex.gold]).encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def score_example(adapter: ModelAdapter, ex: Example) -> ChoiceScores:
    """Score one multiple-choice example, Winogrande-style partial scoring included; where the
    model continues from a cached prefix (:func:`prefix_cache_enabled`), the shared context runs
    once and the choices as suffixes."""
    pairs = encode_pairs(adapter, example_pairs(ex))
    items = [(pairs, one_row(pairs), norm_chars(ex))]
    if prefix_cache_enabled(adapter):
        return _score_rows_prefixed(adapter, items)[0]
    return _score_rows(adapter, items)[0]


def pad_id(adapter: ModelAdapter) -> int:
    """The id padded positions hold: the tokenizer's pad token, else 0 (no real position reads one)."""
    tok = adapter.tokenizer
    return int(getattr(tok, "pad_token_id", None) or 0) if tok is not None else 0


def right_pad(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, width]`` ids right-padded with :func:`pad_id` and their 0/1 mask (long), on the CPU."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id(adapter), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r))
        mask[i, : len(r)] = 1
    return ids, mask


def pad_rows(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[rows, width]`` ids and attention mask on the model's device (lm-eval's
    batch layout); fails before any work if the longest row exceeds the context."""
    adapter.check_length(max(len(r) for r in rows))
    ids, mask = right_pad(adapter, rows)
    return ids.to(adapter.device), mask.to(adapter.device)


Pairs = list[tuple[list[int], list[int]]]  # (context ids, continuation ids) per choice


def one_row(pairs: Pairs) -> bool:
    """Whether one row (the shared context) scores every pair: each continuation is one token after
    the same context (MMLU letters)."""
    return len({tuple(p[0]) for p in pairs}) == 1 and all(len(p[1]) == 1 for p in pairs)


def encode_examples(adapter: ModelAdapter, examples: Sequence[Example]) -> list[tuple[Pairs, bool, list[int]]]:
    """``(pairs, single, n_chars)`` per example, every example's pairs in one tokenizer call."""
    texts = [example_pairs(ex) for ex in examples]
    flat = iter(encode_pairs(adapter, [p for t in texts for p in t]))
    pairs = [[next(flat) for _ in t] for t in texts]
    return [(p, one_row(p), norm_chars(ex)) for p, ex in zip(pairs, examples, strict=True)]


@torch.no_grad()
def _score_rows(adapter: ModelAdapter, items: Sequence[tuple[Pairs, bool, list[int]]],
                sites: Sequence[dict[str, list[int]] | None] | None = None) -> list[ChoiceScores]:
    """One right-padded forward for one or several examples (``(pairs, single, n_chars)`` each):
    a shared-context example takes one row, any other one row per choice. Each row carries its own
    query and last-scored positions (and its ids; with ``sites``, per item its prompt's
    :func:`ganda.sites.prompt_sites`, each row's position classes), so position-restricted
    interventions act on every row as they would alone; log-probabilities are taken only where a
    continuation token is scored."""
    rows = _score_rows_list(items)
    dev = adapter.device
    ids, mask = pad_rows(adapter, [r.ids for r in rows])
    lone = len(items) == 1 and items[0][1]  # one shared-context row: nothing padded, no mask
    classes = None
    if sites is not None:
        classes = row_classes(sites, [(r.reads[0][0], r.first, len(r.ids)) for r in rows], ids.shape[1], dev)
    read = ReadPositions(torch.tensor([r.first for r in rows], device=dev),
                         torch.tensor([r.last for r in rows], device=dev), ids, classes)
    logits = adapter.forward(ids, attention_mask=None if lone else mask, read=read)
    lls = [[0.0] * len(pairs) for pairs, _, _ in items]
    _read_batch(logits, rows, None, 0, lls)
    return _finite(adapter, items, lls)


# ---- shared-prefix reuse -------------------------------------------------------------------
# Requests of one task share long token prefixes (an MMLU subject's header and few-shot exemplars,
# a BBH subtask's exemplars, one question's context before its choices). The common prefix of a
# group runs once under the active interventions, and every request continues from a copy of its
# cached state (attention keys/values, SSM conv and recurrent states). Exact token ids decide the
# prefix, so tokenisation at the boundary is never changed.

PREFIX_MIN = 8  # tokens: a shorter common prefix is run with its rows
SUFFIX_ROWS = 64  # rows per suffix forward
CACHE_TOKENS = 8192  # rows x (prefix + suffix width) per suffix forward
LOGIT_ROWS = 1024  # rows x read positions per suffix forward (each a vocabulary of fp32 logits)
PAD_WASTE = 0.25  # padded tokens a suffix batch may add, as a fraction of its real tokens


@dataclass(frozen=True)
class Budget:
    """What one suffix forward may hold: rows, cached and padded tokens (the keys and values every
    row holds), rows of fp32 logits."""

    rows: int = SUFFIX_ROWS
    cache_tokens: int = CACHE_TOKENS
    logit_rows: int = LOGIT_ROWS


CPU_BUDGET = Budget()
MAX_CACHE_TOKENS = 1 << 18


def budget_for(n_layers: int, d_model: int, kv_width: int, vocab: int, elem_bytes: int,
               free_bytes: float | None) -> Budget:
    """The suffix batches' bounds on a device with ``free_bytes`` free (None: the CPU's, where larger
    batches only add padding). On a GPU the cached tokens take a quarter of the free memory (a key and
    a value of ``kv_width`` per layer, plus a few hidden vectors), the fp32 logits a tenth, and the
    rows grow with them: the card is kept busy instead of running a few rows at a time."""
    if free_bytes is None:
        return CPU_BUDGET
    per_token = (2 * n_layers * kv_width + 8 * d_model) * elem_bytes
    tokens = int(max(CACHE_TOKENS, min(MAX_CACHE_TOKENS, 0.25 * free_bytes // per_token)))
    logits = int(max(LOGIT_ROWS, min(16 * LOGIT_ROWS, 0.1 * free_bytes // (vocab * (4 + elem_bytes)))))
    return Budget(rows=max(SUFFIX_ROWS, min(1024, SUFFIX_ROWS * tokens // CACHE_TOKENS)), cache_tokens=tokens,
                  logit_rows=logits)


def score_budget(adapter: ModelAdapter) -> Budget:
    """:func:`budget_for` on the model's device (its free memory on CUDA; the CPU's fixed bounds)."""
    dev = adapter.device
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
    cfg = getattr(adapter.model, "config", None)
    vocab = int(getattr(cfg, "vocab_size", None) or 1 << 15)
    d_model = adapter.d_model
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    kv_width = d_model * kv // heads if heads and kv else d_model  # grouped-query attention keeps fewer
    elem = next(adapter.model.parameters()).element_size()
    return budget_for(len(adapter.decoder_layers()), d_model, kv_width, vocab, elem, free)


def prefix_cache_enabled(adapter: ModelAdapter, flag: bool | None = None) -> bool:
    """Whether scoring and generation reuse shared prefixes: ``flag``, else the environment
    variable ``GANDA_PREFIX_CACHE`` (``0`` turns it off; on by default), and only where the
    adapter can continue from a cached state (:meth:`ModelAdapter.supports_prefix_cache`)."""
    if flag is None:
        flag = env_switch("GANDA_PREFIX_CACHE", True)
    return bool(flag) and adapter.supports_prefix_cache()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def prefix_groups(seqs: Sequence[Sequence[int]], limits: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``(prefix length, row indices)`` groups of rows that share a token prefix.

    Rows are sorted by their ids, so a group's common prefix is the smallest common prefix of
    neighbours. A row joins the running group while that prefix stays at least ``PREFIX_MIN``
    tokens and at least half the group's (so one MMLU subject's 5-shot prefix is not cut down to
    the header every subject shares). ``limits[i]``: how many leading tokens of row ``i`` may be
    cached (its first scored position must be run with the suffix). Rows that share no prefix of
    ``PREFIX_MIN`` tokens with another row form one last group with prefix 0 (they run whole)."""
    order = sorted(range(len(seqs)), key=lambda i: tuple(seqs[i]))
    groups: list[tuple[int, list[int]]] = []
    cur: list[int] = []
    plen = 0
    for i in order:
        if cur:
            lcp = common_prefix(seqs[cur[-1]], seqs[i])
            shared = lcp if len(cur) == 1 else min(plen, lcp)
            if lcp >= PREFIX_MIN and (len(cur) == 1 or 2 * lcp >= plen):
                cur.append(i)
                plen = shared
                continue
            groups.append((plen, cur))
        cur, plen = [i], len(seqs[i])
    if cur:
        groups.append((plen, cur))
    out, alone = [], []
    for plen, rows in groups:
        p = min([plen, *(limits[r] for r in rows)])
        if p >= PREFIX_MIN and len(rows) > 1:
            out.append((p, rows))
        else:
            alone += rows
    return out + ([(0, alone)] if alone else [])


def suffix_batches(lengths: Mapping[int, int], rows: Sequence[int], plen: int = 0,
                   keeps: Mapping[int, set[int]] | None = None, max_rows: int | None = None,
                   budget: Budget = CPU_BUDGET) -> list[list[int]]:
    """Rows bucketed by suffix length (shortest first) into batches that bound memory: at most
    ``max_rows`` rows (default the budget's), ``budget.cache_tokens`` cached and padded tokens (rows x
    (``plen`` + width): the keys and values every row holds during its forward) and
    ``budget.logit_rows`` rows of logits (rows x the positions any of them reads, ``keeps``) and
    padding: a batch's padded tokens stay within ``1 + PAD_WASTE`` times its real ones (suffixes of
    unrelated questions differ in length; on a CPU their padding costs more than the batching saves)."""
    max_rows = budget.rows if max_rows is None else max_rows
    out: list[list[int]] = []
    cur: list[int] = []
    union: set[int] = set()
    real = 0
    for r in sorted(rows, key=lambda r: lengths[r]):
        want = union | (keeps[r] if keeps else set())
        n = len(cur) + 1
        if cur and (n > max_rows or n * (plen + lengths[r]) > budget.cache_tokens or n * len(want) > budget.logit_rows
                    or n * lengths[r] > (1.0 + PAD_WASTE) * (real + lengths[r])):
            out.append(cur)
            cur, want, real = [], set(keeps[r] if keeps else ()), 0
        cur.append(r)
        union = want
        real += lengths[r]
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def run_prefix(adapter: ModelAdapter, ids: Sequence[int]) -> Any:
    """The cached state after ``ids`` (one row), computed under the interventions active now.
    Position-restricted interventions see no query position in it (the query is in each suffix)."""
    cache = adapter.new_cache()
    if ids:
        dev = adapter.device
        x = torch.tensor([list(ids)], device=dev)
        outside = torch.tensor([len(ids)], device=dev)
        adapter.forward_cached(x, cache, torch.arange(len(ids), device=dev)[None],
                               keep=torch.tensor([len(ids) - 1], device=dev), read=ReadPositions(outside, outside))
    return cache


@dataclass
class _ScoreRow:
    ids: list[int]
    first: int  # the query position (last context token): the first position whose logits are read
    last: int  # the last position whose logits are read
    reads: list[tuple[int, int, int, list[int]]]  # (item, choice, first position, continuation ids)


def _score_rows_list(items: Sequence[tuple[Pairs, bool, list[int]]]) -> list[_ScoreRow]:
    rows = []
    for k, (pairs, single, _) in enumerate(items):
        if single:  # every choice one token after one context: one row, one position
            ctx = pairs[0][0]
            rows.append(_ScoreRow(ctx, len(ctx) - 1, len(ctx) - 1,
                                  [(k, c, len(ctx) - 1, cont) for c, (_, cont) in enumerate(pairs)]))
            continue
        for c, (ctx, cont) in enumerate(pairs):
            rows.append(_ScoreRow(ctx + cont, len(ctx) - 1, len(ctx) + len(cont) - 2, [(k, c, len(ctx) - 1, cont)]))
    return rows


@torch.no_grad()
def _score_rows_prefixed(adapter: ModelAdapter, items: Sequence[tuple[Pairs, bool, list[int]]],
                         max_rows: int | None = None) -> list[ChoiceScores]:
    """:func:`_score_rows` with shared prefixes run once: rows grouped by :func:`prefix_groups`,
    each group's suffixes right-padded in length buckets over copies of the group's cached prefix
    (right pads never reach a real position of a causal model), logits only where a continuation
    token is scored. The prefix cache lives for its group only."""
    rows = _score_rows_list(items)
    for r in rows:
        adapter.check_length(len(r.ids))
    lls = [[0.0] * len(pairs) for pairs, _, _ in items]
    budget = score_budget(adapter)
    dev = adapter.device
    for plen, members in prefix_groups([r.ids for r in rows], [r.first for r in rows]):
        prefix = run_prefix(adapter, rows[members[0]].ids[:plen]) if plen else None
        lengths = {m: len(rows[m].ids) - plen for m in members}
        keeps = {m: set(range(rows[m].first - plen, rows[m].last - plen + 1)) for m in members}
        for batch in suffix_batches(lengths, members, plen, keeps, max_rows, budget):
            ids, _ = right_pad(adapter, [rows[m].ids[plen:] for m in batch])
            width = ids.shape[1]
            keep = sorted({p - plen for m in batch for p in range(rows[m].first, rows[m].last + 1)})
            col = {p: j for j, p in enumerate(keep)}
            cache = adapter.expand_cache(prefix, len(batch)) if prefix is not None else adapter.new_cache()
            pos = (plen + torch.arange(width, device=dev))[None].expand(len(batch), -1)
            q = torch.tensor([rows[m].first - plen for m in batch], device=dev)
            last = torch.tensor([rows[m].last - plen for m in batch], device=dev)
            logits = adapter.forward_cached(ids.to(dev), cache, pos, keep=torch.tensor(keep, device=dev),
                                            read=ReadPositions(q, last))
            del cache
            _read_batch(logits, [rows[m] for m in batch], col, plen, lls)
        del prefix
    return _finite(adapter, items, lls)


def _read_batch(logits: torch.Tensor, rows: Sequence[_ScoreRow], col: Mapping[int, int] | None, plen: int,
                lls: list[list[float]]) -> None:
    """Each read's continuation log-likelihood into ``lls``, from one batch's kept logits
    ``[rows, kept, V]`` (``col``: a suffix position's kept column; None: every position kept,
    ``plen`` 0). One log-softmax over every read
    position and one transfer to the host per batch: a sync per choice leaves a GPU idle between them.
    Each choice's sum is the same float32 reduction over its own positions as one read at a time."""
    dev = logits.device
    at_row, at_col, tokens, spans = [], [], [], []
    for i, r in enumerate(rows):
        for k, c, first, cont in r.reads:
            start = len(tokens)
            at_row += [i] * len(cont)
            at_col += [col[first - plen + j] if col is not None else first + j for j in range(len(cont))]
            tokens += list(cont)
            spans.append((k, c, start, len(tokens)))
    if not spans:
        return
    logp = torch.log_softmax(logits[torch.tensor(at_row, device=dev), torch.tensor(at_col, device=dev)].float(), -1)
    picked = logp.gather(-1, torch.tensor(tokens, device=dev)[:, None])[:, 0]
    sums = torch.stack([picked[a:b].sum() for _, _, a, b in spans]).cpu().tolist()
    for (k, c, _, _), v in zip(spans, sums, strict=True):
        lls[k][c] = v


def _finite(adapter: ModelAdapter, items: Sequence[tuple[Pairs, bool, list[int]]],
            lls: list[list[float]]) -> list[ChoiceScores]:
    """Each item's scores, once every log-likelihood is finite (:func:`ganda.finite.check_scores`: a
    NaN score would make the first choice every prediction); the prompt whose scores are not is run
    again to name the module where the non-finite values first appear."""
    scores = [ChoiceScores(ll, n_chars) for ll, (_, _, n_chars) in zip(lls, items, strict=True)]
    for (pairs, _, _), sc in zip(items, scores, strict=True):
        if not all(math.isfinite(v) for v in sc.loglik):
            ctx = pairs[0][0]
            tail = adapter.tokenizer.decode(ctx[-12:]) if adapter.tokenizer is not None else str(ctx[-12:])
            check_scores(sc.loglik, f"the choices' log-likelihoods after {tail!r}", adapter, ctx)
    return scores


SMALL_MODEL_PARAMS = 20_000_000
BATCH_ROWS = 64


def default_batch_rows(n_params: int) -> int:
    """Rows per forward when scoring many examples of a model of ``n_params`` parameters: batched
    for small models (the lab's, tiny test models), where Python and per-call overhead dominate a
    forward; one example per forward for real LMs, which keeps their numbers identical to lm-eval's
    one-request layout and bounds the ``rows x length x vocab`` logits (``ganda plan`` reads it too)."""
    return BATCH_ROWS if n_params < SMALL_MODEL_PARAMS else 1


PREFIX_CHUNK = 128  # examples grouped at once (a group's prefix runs once per chunk)


def score_examples(adapter: ModelAdapter, examples: Sequence[Example], *, batch_rows: int | None = None,
                   progress: bool = False, desc: str = "?", prefix_cache: bool | None = None) -> list[ChoiceScores]:
    """Scores of many examples. With shared-prefix reuse (:func:`prefix_cache_enabled`) every
    shared prefix runs once and the rest in length-bucketed batches of up to ``batch_rows``
    suffixes (default the device's :func:`score_budget`: ``SUFFIX_ROWS`` on the CPU); without it up to ``batch_rows`` whole rows per forward
    (default :func:`default_batch_rows`; ``batch_rows=1`` is :func:`score_example` one by one)."""
    sited = bool(getattr(adapter, "row_needs", 0))  # resample or position-class ablation: every row whole, with its prompt
    if not sited and prefix_cache_enabled(adapter, prefix_cache):
        rows = None if batch_rows is None else max(1, int(batch_rows))
        res: list[ChoiceScores] = []
        bar = tqdm(total=len(examples), desc=desc, disable=not progress, leave=False)
        for k in range(0, len(examples), PREFIX_CHUNK):
            chunk = examples[k: k + PREFIX_CHUNK]
            items = encode_examples(adapter, chunk)
            res += _score_rows_prefixed(adapter, items, rows)
            bar.update(len(chunk))
        bar.close()
        return res
    n = default_batch_rows(adapter.n_params()) if batch_rows is None else max(1, int(batch_rows))
    # up to n rows per forward (at n = 1 one example, whatever its rows); a sited row also carries its
    # prompt's position classes (:func:`prompt_sites`, what a resample or position-class ablation
    # reads, :mod:`ganda.ablation`)
    out: list[ChoiceScores] = []
    chunk: list[tuple[Pairs, bool, list[int]]] = []
    where: list[dict[str, list[int]] | None] = []
    size = 0
    bar = tqdm(total=len(examples), desc=desc, disable=not progress, leave=False)
    for ex, item in zip(examples, encode_examples(adapter, examples), strict=True):
        k = 1 if item[1] else len(item[0])
        if chunk and size + k > n:
            out += _score_rows(adapter, chunk, where if sited else None)
            bar.update(len(chunk))
            chunk, where, size = [], [], 0
        chunk.append(item)
        if sited:
            where.append(prompt_sites(adapter, ex))
        size += k
    if chunk:
        out += _score_rows(adapter, chunk, where if sited else None)
        bar.update(len(chunk))
    bar.close()
    return out


@dataclass
class EvalResult:
    task: str
    model: str
    n: int
    correct: int
    accuracy: float
    ci_low: float  # the Wilson 95% interval of the accuracy
    ci_high: float
    seconds: float
    interventions: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    acc_norm: float | None = None
    predictions: list[dict[str, Any]] = field(default_factory=list)
    answer_labels: list[str] = field(default_factory=list)  # what choice i is called (see choice_labels)

    @classmethod
    def from_counts(cls, task: str, adapter: ModelAdapter, correct: int, n: int, started: float, *,
                    interventions: Sequence[Intervention] | None, config: dict[str, Any],
                    predictions: list[dict[str, Any]], correct_norm: int | None = None) -> EvalResult:
        """The one way a result is built (multiple-choice scoring and generation alike): accuracy
        and its Wilson interval from the counts, seconds since ``started`` (``time.perf_counter``)."""
        low, high = wilson(correct, n)
        return cls(
            task=task, model=adapter.spec, n=n, correct=correct, accuracy=correct / n if n else 0.0,
            ci_low=low, ci_high=high, seconds=time.perf_counter() - started,
            interventions=describe_all(interventions), config=config,
            acc_norm=(correct_norm / n if n else None) if correct_norm is not None else None,
            predictions=predictions,
        )

    def by_answer(self) -> list[dict[str, Any]]:
        """Accuracy split by the gold answer (see :func:`by_answer`); empty unless every gold answer
        is a choice index (generation tasks have text answers)."""
        if not self.predictions or not all(isinstance(p.get("gold"), int) for p in self.predictions):
            return []
        return by_answer(self.predictions, self.answer_labels)

    def answer_accuracy(self) -> dict[str, float | None]:
        """``{"A": accuracy on gold-A examples, "B": ...}``."""
        return {x["answer"]: x["accuracy"] for x in self.by_answer()}

    def to_json(self) -> dict[str, Any]:
        """The result as ``ganda eval --json`` prints it: no predictions (``--predictions`` writes them)."""
        d = split(asdict(self))
        if answers := self.by_answer():
            d["by_answer"] = answers
        d.pop("predictions")
        return d


ANSWER_LABELS = "ABCDEFGHIJ"


def choice_labels(examples: Sequence[Example]) -> list[str]:
    """A name for each choice position: its text where every example offers the same one there
    (MMLU's ``A``..``D``), else ``#k``, the k-th choice (kv: the k-th pair of the dictionary, whose
    value differs from prompt to prompt), so that a breakdown never names letters a task has not."""
    out = []
    for i in range(max((len(ex.choices) for ex in examples), default=0)):
        texts = {ex.choices[i].strip() for ex in examples if i < len(ex.choices)}
        out.append(texts.pop() if len(texts) == 1 else f"#{i + 1}")
    return out


def by_answer(predictions: Sequence[dict[str, Any]], labels: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Accuracy on the examples whose gold answer is A, B, C, ..., and how often each is predicted.

    Why: one accuracy hides *which* answers a head serves. In the lab Transformers the last
    layer's heads split the Aggregate step by answer letter (ablating ``lab-llama-wd``'s L3H0 takes
    gold A and B to 0% and leaves C and D at 100%), which is why no single head takes the task to
    chance. ``predictions``: :class:`EvalResult` rows with integer ``gold`` and ``pred``; ``labels``:
    the choices' names (:func:`choice_labels`; default A, B, C, ...)."""
    n_opts = 1 + max([max(p["gold"], p["pred"]) for p in predictions], default=-1)
    out = []
    for i in range(n_opts):
        gold = [p for p in predictions if p["gold"] == i]
        label = labels[i] if labels and i < len(labels) else ANSWER_LABELS[i] if i < len(ANSWER_LABELS) else str(i)
        out.append({"answer": label, "n": len(gold),
                    "accuracy": sum(bool(p["correct"]) for p in gold) / len(gold) if gold else None,
                    "predicted": sum(p["pred"] == i for p in predictions) / len(predictions)})
    return out


def answers_text(rows: Sequence[dict[str, Any]]) -> str:
    """``by gold answer A 98% B 0% ...; predicted A 24% ...``: one line for a terminal."""
    acc = " ".join(f"{r['answer']} {_pct0(r['accuracy'])}" for r in rows)
    pred = " ".join(f"{r['answer']} {_pct0(r['predicted'])}" for r in rows)
    return f"by gold answer {acc}; predicted {pred}"


def _pct0(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def evaluate_examples(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    interventions: Sequence[Intervention] | None = None,
    *,
    task_name: str = "?",
    config: dict[str, Any] | None = None,
    progress: bool = True,
    batch_rows: int | None = None,
    prefix_cache: bool | None = None,
) -> EvalResult:
    """Accuracy of the model on multiple-choice examples, under the given interventions
    (``batch_rows``, ``prefix_cache``: see :func:`score_examples`; prefix caches are computed
    inside the interventions and live for this call only)."""
    t0 = time.perf_counter()
    if adapter.n_ctx is not None:  # fail before any work, not halfway through
        for ids in encode_many(adapter, [ex.prompt for ex in examples]):
            adapter.check_length(len(ids))
    preds: list[dict[str, Any]] = []
    correct = correct_norm = 0
    interventions = bind_reference(interventions, examples)  # mean and resample: over the scored prompts
    with apply(adapter, interventions):
        scores = score_examples(adapter, examples, batch_rows=batch_rows, progress=progress, desc=task_name,
                                prefix_cache=prefix_cache)
        for i, (ex, sc) in enumerate(zip(examples, scores, strict=True)):
            ok, ok_norm = sc.pred == ex.gold, sc.pred_norm == ex.gold
            correct += ok
            correct_norm += ok_norm
            # per example, what lm-eval's --log_samples holds: its doc_id, every choice's log-likelihood
            # (its filtered_resps), the acc and acc_norm predictions and whether each is right
            preds.append({"id": ex.key(task_name, i), "gold": ex.gold, "pred": sc.pred, "pred_norm": sc.pred_norm,
                          "loglik": sc.loglik, "correct": bool(ok), "correct_norm": bool(ok_norm)})
    res = EvalResult.from_counts(task_name, adapter, correct, len(examples), t0, interventions=interventions,
                                 config=config or {}, predictions=preds, correct_norm=correct_norm)
    res.answer_labels = choice_labels(examples)
    return res


# ---- reference prompts (mean and resample ablation, ganda.ablation) and position classes ---------
REFERENCE_ROWS = 16  # reference prompts per forward


def context_ids(adapter: ModelAdapter, examples: Sequence[Example]) -> list[list[int]]:
    """Each prompt's tokens as scoring runs its context (the first choice's; a prompt without
    choices as :func:`ganda.scoring.encode` gives it)."""
    mc = {i: ex for i, ex in enumerate(examples) if ex.choices}
    enc = dict(zip(mc, encode_examples(adapter, list(mc.values())), strict=True))
    return [list(enc[i][0][0][0]) if i in enc else encode(adapter, ex.prompt) for i, ex in enumerate(examples)]



def _traced(adapter: ModelAdapter, seqs: list[list[int]], points: Any) -> Any:
    """Right-padded forwards of ``seqs``, ``REFERENCE_ROWS`` at a time, with ``points`` traced:
    ``(first index, mask, trace)`` per forward."""
    for k in range(0, len(seqs), REFERENCE_ROWS):
        ids, mask = pad_rows(adapter, seqs[k:k + REFERENCE_ROWS])
        with adapter.reading(ReadPositions.of_mask(mask)), Trace(adapter, points) as tr:
            adapter.forward(ids, attention_mask=mask)
        yield k, mask, tr



@torch.no_grad()
def reference_means(adapter: ModelAdapter, reference: Sequence[Example], mixers: Sequence[Mixer]
                    ) -> dict[tuple[int, str], torch.Tensor]:
    """``μ`` per mixer (``{(layer, kind): [H*D]}``, fp32): its output-projection input averaged over
    every token of every reference prompt, each prompt's context run alone."""
    if not reference:
        raise GandaError("mean ablation needs reference prompts")
    points = {z_point(m): (m.layer, m.kind) for m in mixers}
    sums: dict[str, torch.Tensor] = {}
    count = 0
    for _, mask, tr in _traced(adapter, context_ids(adapter, reference), points):
        for p in points:
            s = (tr[p].float() * mask[..., None]).sum((0, 1))
            sums[p] = sums[p] + s if p in sums else s
        count += int(mask.sum())
    return {key: sums[p] / count for p, key in points.items()}



@torch.no_grad()
def reference_donors(adapter: ModelAdapter, reference: Sequence[Example], mixers: Sequence[Mixer], seed: int = 0
                     ) -> Donors:
    """Resample donors: every reference prompt's context run alone, each mixer's output-projection
    input kept (:mod:`ganda.ablation`)."""
    seqs = context_ids(adapter, reference)
    points = [z_point(m) for m in mixers]
    z: dict[str, list[torch.Tensor]] = {p: [] for p in points}
    for k, mask, tr in _traced(adapter, seqs, points):
        for p in points:
            z[p] += [tr[p][r, : len(seqs[k + r])].clone() for r in range(mask.shape[0])]
    return Donors([tuple(s) for s in seqs], z, seed)




REFERENCES.update(mean=lambda adapter, reference, mixers, seed: reference_means(adapter, reference, mixers),
                  resample=reference_donors)


def prompt_sites(adapter: ModelAdapter, ex: Example) -> dict[str, list[int]]:
    """The ``ends`` and ``key`` positions of ``ex``'s encoded prompt (a BOS shifts them)."""
    spans: list[tuple[int, int]] = []
    key = ex.meta.get("key") if isinstance(ex.meta, dict) else None
    quoted = f"'{key}'" if key else None
    at = ex.prompt.rfind(quoted) if quoted else -1
    if at >= 0:
        spans.append((at + 1, at + 1 + len(str(key))))
    if not ex.segments and not spans:
        return {"ends": [], "key": []}
    enc = adapter.require_tokenizer()(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
    shift = len(encode(adapter, ex.prompt)) - len(enc.input_ids)
    seg = token_spans(enc.offset_mapping, list(ex.segments)) if ex.segments else []
    ends = sorted({b + shift for _, b in seg})
    keys: list[int] = []
    if spans:
        (a, b), = token_spans(enc.offset_mapping, spans)
        keys = list(range(a + shift, b + shift + 1))
    return {"ends": ends, "key": keys}


