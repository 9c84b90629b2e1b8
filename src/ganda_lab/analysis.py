"""Find a lab model's Gather and Aggregate heads by exhaustive single-head zero-ablation.

For every head: ablate it alone (``AblateHeads``), score ``lab-mmlu`` and ``lab-knowledge``
(and optionally ``lab-letters``/``lab-kv``), record the drop. The heads whose single ablation
hurts MMLU-format while leaving knowledge intact are the G&A candidates; their attention maps
then tell which is which (a Gather head's option newlines attend inside their own option line;
an Aggregate head's final position attends to the gold option's newline).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ganda.errors import GandaError
from ganda.evaluation import evaluate
from ganda.heads import HeadId
from ganda.intervals import ci
from ganda.interventions import AblateHeads
from ganda.models import load_model
from ganda.models.base import ModelAdapter
from ganda.progress import tqdm
from ganda.scoring import evaluate_examples
from ganda.tasks import get_task
from ganda.tasks.base import Example, token_spans

from . import shipped_path
from .world import checked_world


def model_world(adapter: ModelAdapter, task: str | None = None) -> dict[str, Any]:
    """The world a lab model was trained on, from the ``lab.json`` beside its weights (the directory
    it was loaded from: a path, a shipped name or a hub snapshot). A model without ``lab.json`` (a
    lab model copied without it, or not a lab model), or with one that records no world, is
    refused: scored on a world it never learned it would get a chance-level number that looks like
    a result."""
    spec = str(adapter.spec)
    root = getattr(adapter, "source_path", None) or Path(spec).expanduser()
    if not root.exists():
        root = shipped_path(spec) or root
    f = root / "lab.json"
    if not f.is_file():
        who = f"task {task!r} needs" if task else "the lab tasks need"
        raise GandaError(f"{who} the world the model was trained on, and {spec} has no lab.json: copy "
                         "lab.json with the model, or name the world with --option world=DIR (a lab model "
                         "directory or its lab.json) or --option world=default")
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GandaError(f"{f}: cannot read the lab record: {exc}") from None
    return checked_world(meta, str(f))


def _examples(task: str, n: int, seed: int, world: dict[str, Any] | None = None) -> list[Example]:
    return get_task(task, world=world).examples(limit=n, seed=seed)


def head_sweep(
    adapter: ModelAdapter,
    tasks: Sequence[str] = ("lab-mmlu", "lab-knowledge"),
    n: int = 200,
    seed: int = 0,
    heads: Sequence[HeadId] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Accuracy of every single-head ablation on each task, with the baseline."""
    exs = {t: _examples(t, n, seed, model_world(adapter)) for t in tasks}
    base = {t: evaluate_examples(adapter, e, None, task_name=t, progress=False).accuracy for t, e in exs.items()}
    rows = []
    for h in tqdm(list(heads or adapter.heads()), desc="head sweep", disable=not progress):
        accs = {t: evaluate_examples(adapter, e, [AblateHeads([h])], task_name=t, progress=False).accuracy
                for t, e in exs.items()}
        rows.append({"head": str(h), **{t: accs[t] for t in tasks},
                     **{f"drop:{t}": base[t] - accs[t] for t in tasks}})
    return {"model": adapter.spec, "n": n, "seed": seed, "baseline": base, "heads": rows}


@torch.no_grad()
def pattern_scores(adapter: ModelAdapter, heads: Sequence[HeadId | str], n: int = 32, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per head, two attention-pattern scores on ``lab-mmlu`` prompts (attention heads only):

    * ``gather``: mean attention mass that each option's newline puts on its own option line
      (excluding the newline itself);
    * ``aggregate``: mean attention mass the final position puts on the gold option's newline.
    """
    hs = [h if isinstance(h, HeadId) else HeadId.parse(h) for h in heads]
    hs = [adapter.canonical(h) for h in hs]
    out = {str(h): {"gather": 0.0, "aggregate": 0.0} for h in hs}
    exs = _examples("lab-mmlu", n, seed, model_world(adapter))
    tok = adapter.tokenizer
    for ex in exs:
        enc = tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
        spans = token_spans(enc.offset_mapping, ex.segments)
        ids = torch.tensor([enc.input_ids])
        maps = adapter.attention_maps(ids, hs)
        last = ids.shape[1] - 1
        for h in hs:
            m = maps[h]
            g = sum(float(m[e, s:e].sum()) for s, e in spans) / len(spans)
            a = float(m[last, spans[ex.gold_segment][1]])
            out[str(h)]["gather"] += g / len(exs)
            out[str(h)]["aggregate"] += a / len(exs)
    return out


LAB_TASKS = ("lab-knowledge", "lab-mmlu", "lab-letters", "lab-kv")


def evaluate_lab(adapter: ModelAdapter, n: int = 200, seed: int = 0, interventions=None,
                 tasks: Sequence[str] = LAB_TASKS, held: bool = True) -> dict[str, Any]:
    """Accuracy (with Wilson 95% CI) of a model on the lab tasks (+ ``lab-mmlu`` on held-out facts)."""
    out: dict[str, Any] = {}
    world = model_world(adapter)
    todo = [(t, get_task(t, world=world)) for t in tasks]
    if held and "lab-mmlu" in tasks:
        todo.append(("lab-mmlu:held", get_task("lab-mmlu", split="held", world=world)))
    for name, task in todo:
        r = evaluate(adapter, task, interventions, limit=n, seed=seed, progress=False)
        out[name] = {"accuracy": round(r.accuracy, 4), **ci([round(x, 4) for x in (r.ci_low, r.ci_high)]), "n": r.n}
    return out


def finalize_checkpoint(run_dir: str, dest: str, n: int = 400, seed: int = 0, sweep: bool = True,
                        sweep_n: int = 200, tasks: Sequence[str] = LAB_TASKS) -> dict[str, Any]:
    """Copy a trained run (model + tokenizer + lab.json, not the resume checkpoint) to ``dest``,
    evaluate it with ganda's scorer on ``tasks``, optionally run the single-head sweep, and record both."""
    src, dst = Path(run_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "generation_config.json":
            shutil.copy2(f, dst / f.name)
    adapter = load_model(str(dst))
    meta = json.loads((dst / "lab.json").read_text())
    meta["eval"] = evaluate_lab(adapter, n=n, seed=seed, tasks=tasks)
    meta["eval_protocol"] = {"n": n, "seed": seed, "scorer": "ganda.scoring.evaluate (acc)"}
    if sweep:
        sw = head_sweep(adapter, n=sweep_n, seed=seed, progress=False)
        meta["head_sweep"] = sw
    (dst / "lab.json").write_text(json.dumps(meta, indent=2))
    return meta
