"""The report's interactive attention view: maps saved by a run (``attention.json`` beside its
PNG) as compact JSON that the page's inline script draws.

The page stays one offline file, so what is embedded is budgeted: prompts longer than
``max_tokens`` are sampled (:func:`sample_positions`: the first token, the last ones, every
segment's summary token, whole segments, then the rest from the end back) and every map is quantised to integers ``0..1000`` of its largest
``|entry|`` (``value = q * scale / 1000``: three significant digits of the largest entry).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_TOKENS = 160  # longest prompt embedded whole; longer ones are sampled
BUDGET_BYTES = 1_200_000  # embedded data per page; heads past it are left to the PNGs
LEVELS = 1000  # quantisation steps of a map's largest |entry|
ATTENTION_FORMAT = "ganda-attention/1"  # the same as ganda.attention.ATTENTION_FORMAT (tested)


def display_token(tok: str) -> str:
    """A token as the viewer prints it: byte-level markers turned back into spaces and newlines."""
    return tok.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ").replace("<0x0A>", "\n")


def sample_positions(t: int, segments: Sequence[Sequence[int]] = (), max_tokens: int = MAX_TOKENS,
                     tail: int = 32, marks: Sequence[int] = ()) -> list[int]:
    """Positions kept from a prompt of ``t`` tokens: all when ``t <= max_tokens``; else, in this
    order until ``max_tokens`` are kept: the first token, the last ``tail`` (the final position an
    Aggregate head reads from), every segment's last token (the summary a Gather head writes),
    whole segments from the last one back, then the rest from the end back, so what is shown
    reads as contiguous text wherever it can. ``marks`` (positions a run singles out) are kept
    like summary tokens."""
    if t <= max_tokens:
        return list(range(t))
    spans = [(max(0, a), min(t - 1, b)) for a, b in segments if a <= b]
    marked = [m for m in marks if 0 <= m < t]
    order = [0, *range(max(0, t - tail), t), *(b for _, b in spans), *marked]
    order += [p for a, b in reversed(spans) for p in range(a, b + 1)]
    order += list(range(t - 1, -1, -1))
    keep = list(dict.fromkeys(order))
    must = len(dict.fromkeys(order[: 1 + min(tail, t) + len(spans) + len(marked)]))  # never drop a summary or mark
    return sorted(keep[: max(max_tokens, must)])


def quantise(rows: Sequence[Sequence[float]]) -> tuple[float, list[list[int]]]:
    """``(scale, q)`` with ``q = round(v / scale * LEVELS)``; ``scale`` is the largest ``|v|``."""
    scale = max((abs(float(v)) for r in rows for v in r), default=0.0) or 1.0
    return scale, [[round(float(v) / scale * LEVELS) for v in r] for r in rows]


def _remap_segments(segments: Sequence[Sequence[int]], keep: list[int]) -> list[list[int]]:
    index = {p: i for i, p in enumerate(keep)}
    out = []
    for a, b in segments:
        inside = [index[p] for p in keep if a <= p <= b]
        out.append([inside[0], inside[-1]] if inside else [-1, -1])
    return out


def prompt_payload(rec: dict[str, Any], roles: dict[str, str] | None = None,
                   max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """One prompt of an attention record (:func:`ganda.attention.attention_record`) as the
    viewer's data: sampled positions, display tokens, segments, gold segment, quantised maps."""
    tokens = list(rec["tokens"])
    t = len(tokens)
    segments = [list(s) for s in rec.get("segments") or []]
    keep = sample_positions(t, segments, max_tokens, marks=rec.get("marks") or ())
    rows = rec.get("rows")
    row_pos = list(rows) if rows else list(range(t))
    kept_rows = [(r, p) for r, p in enumerate(row_pos) if p in set(keep)]
    index = {p: i for i, p in enumerate(keep)}
    heads = []
    for name, h in rec["heads"].items():
        m = h["map"]
        sub = [[m[r][p] for p in keep if p < len(m[r])] for r, _ in kept_rows]
        scale, q = quantise(sub)
        role = (roles or {}).get(name) or h.get("role")
        heads.append({"name": name, "kind": h.get("kind", "softmax"), "role": role, "scale": scale, "q": q})
    out = {
        "label": rec.get("label", ""), "T": t, "pos": keep, "tokens": [display_token(tokens[p]) for p in keep],
        "rows": [index[p] for _, p in kept_rows], "segments": _remap_segments(segments, keep),
        "gold": rec.get("gold_segment"), "heads": heads,
    }
    if rec.get("marks"):  # positions a run singles out (ganda edges: where the sender's write matters)
        out["marks"] = [index[p] for p in rec["marks"] if p in index]
        out["mark_label"] = str(rec.get("mark_label") or "marked positions")
    return out


def read_attention_files(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The run directory's saved attention documents (``*.json`` of :data:`ATTENTION_FORMAT`)."""
    out = []
    for p in sorted(Path(run_dir).glob("*.json")):
        if p.name == "result.json" or p.stat().st_size > 50_000_000:
            continue
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            continue
        if isinstance(doc, dict) and doc.get("format") == ATTENTION_FORMAT and doc.get("prompts"):
            out.append((p, doc))
    return out


def result_roles(result: dict[str, Any]) -> dict[str, str]:
    """Head -> role as a result names them (``gather_head``/``aggregate_head``, ``top_*`` lists)."""
    s = result.get("summary") if isinstance(result.get("summary"), dict) else {}
    roles: dict[str, str] = {}
    for role in ("gather", "aggregate"):
        for h in s.get(f"top_{role}") or []:
            roles.setdefault(str(h), role)
        if s.get(f"{role}_head"):
            roles[str(s[f"{role}_head"])] = role
    return roles


def viewer_payload(docs: Sequence[tuple[str, dict[str, Any]]], roles: dict[str, str] | None = None,
                   max_tokens: int = MAX_TOKENS, budget: int = BUDGET_BYTES) -> dict[str, Any]:
    """Every prompt of the named ``docs`` as one viewer's data (prompts labelled by their document
    where there are several); heads that would take the embedded JSON past ``budget`` bytes are
    left out (counted in ``omitted``), the PNGs still show them."""
    prompts, used, omitted = [], 0, 0
    for name, doc in docs:
        for i, rec in enumerate(doc.get("prompts") or []):
            label = rec.get("label") or f"prompt {i}"
            p = prompt_payload({**rec, "label": f"{name}: {label}" if len(docs) > 1 else label}, roles, max_tokens)
            kept = []
            for h in p["heads"]:
                size = len(json.dumps(h["q"], separators=(",", ":")))
                if used + size > budget:
                    omitted += 1
                    continue
                used += size
                kept.append(h)
            if kept:
                prompts.append({**p, "heads": kept})
    model = next((d.get("model") for _, d in docs if d.get("model")), "")
    return {"model": model, "prompts": prompts, "omitted": omitted, "levels": LEVELS}


def payload_json(payload: dict[str, Any]) -> str:
    """The payload as JSON safe inside ``<script type="application/json">`` (no ``</``)."""
    return json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")


def dequantise(head: dict[str, Any], levels: int = LEVELS) -> list[list[float]]:
    """A payload head's map back in the saved units (what the viewer shows)."""
    return [[v * head["scale"] / levels for v in r] for r in head["q"]]

