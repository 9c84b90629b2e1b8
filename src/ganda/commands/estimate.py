"""How long a run will take, said before it starts: ``ganda eval``'s and ``ganda plan``'s shared
reading of a workload (a module of its own, so that the commands that announce do not import plan)."""

from __future__ import annotations

import os
from typing import Any

# Published token counts are not at hand for a config alone: characters per token of English
# text under a ~128k BPE vocabulary (Llama-3's tokenizer gives 4.1-4.4 on MMLU).
CHARS_PER_TOKEN = 4.2
SAMPLE = 200  # examples read to measure prompt lengths


ANNOUNCE_AFTER = 60.0  # seconds: a run estimated to take longer says so before it starts


def _new_chars(examples: list) -> float:
    """The fraction of the prompts' characters not shared with the previous prompt: what is left to
    compute when a shared prefix (MMLU's k-shot exemplars of one subject) is computed once."""
    total = new = 0
    prev = ""
    for ex in examples:
        shared = len(os.path.commonprefix([prev, ex.prompt]))
        total += len(ex.prompt)
        new += len(ex.prompt) - shared
        prev = ex.prompt
    return new / total if total else 1.0


def announce(adapter: Any, examples: list, experiment: str = "eval", shared_prefix: bool = True,
             **opts: Any) -> float | None:
    """Before a long run, one line on stderr with ``ganda plan``'s estimate of its time on this CPU
    (lengths measured on 50 of the examples, a prefix shared with the previous prompt counted once
    when ``shared_prefix``); returns the estimate in seconds. Nothing on a GPU (no calibrated rates)
    or when the run is estimated under :data:`ANNOUNCE_AFTER`."""
    from .. import plan as planner
    from ..progress import note
    from ..scoring import encode

    if not examples or adapter.device.type != "cpu":
        return None
    try:
        some = examples[:: max(1, len(examples) // 50)][:50]
        w = planner.workload_from_examples(some, lambda text: encode(adapter, text), CHARS_PER_TOKEN)
        tokens = w.tokens * (_new_chars(examples) if shared_prefix else 1.0)
        w = planner.Workload(n=len(examples), tokens=tokens, choices=w.choices, choice_tokens=w.choice_tokens,
                             max_tokens=w.max_tokens)
        seconds = planner.plan(planner.profile(adapter), experiment, w, "cpu", 1,
                               layer_skip=layer_skip(adapter), **opts).seconds
    except Exception:  # noqa: BLE001 - an estimate is a courtesy; a model the planner cannot cost runs anyway
        return None
    if seconds >= ANNOUNCE_AFTER:
        took = f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
        note(f"this run: {len(examples):,} examples, ~{w.tokens:.0f} tokens each to compute: about {took} on one "
             f"CPU core (ganda plan's calibrated rates); --limit N runs fewer")
    return seconds


def layer_skip(adapter: Any) -> bool:
    """Whether the exact sweep recomputes only the layers after each head's (the family skips layers)."""
    return bool(adapter.skips_layers())
