"""Run any lm-evaluation-harness task on a ganda model with interventions active.

Interventions are forward hooks (or a swapped layer list) on the HF model that the adapter
wraps, so handing that very model object to lm-eval's ``HFLM`` *inside* the intervention context
makes every lm-eval request run on the intervened model::

    from ganda import load_model, AblateHeads
    from ganda.lmeval import simple_evaluate, mmlu_tasks

    adapter = load_model("smollm2-135m")
    res = simple_evaluate(adapter, mmlu_tasks(["abstract_algebra"]), [AblateHeads("L20H3")], limit=20)
    res["results"]["ganda_mmlu_abstract_algebra"]["acc,none"]

lm-eval must not touch the Hugging Face hub (ganda runs offline), so this module sets
``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` before importing lm-eval and provides *local* task
configs: :func:`mmlu_tasks` (lm-eval's MMLU template over the vendored CSVs, ``dataset_path:
csv``) and :func:`arc_easy_task` (lm-eval's ``arc_easy`` over the vendored ARC-Easy JSONL,
``dataset_path: json``). :func:`arc_easy_cross_check` scores the same ARC-Easy questions with
lm-eval and with ganda's own scorer and counts per-question agreement. Named
lm-eval tasks whose data is cached locally work too; others fail to download.

lm-eval is an optional dependency: ``pip install 'ganda[eval]'`` (``lm-eval==0.4.13``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .effects import predicted
from .errors import GandaError
from .interventions import Intervention, apply, describe_all
from .models.base import ModelAdapter
from .scoring import ChoiceScores, evaluate_examples, example_pairs, norm_chars
from .tasks import get_task
from .tasks.mmlu import DATA_DIR as MMLU_DIR
from .tasks.mmlu import description
from .tasks.mmlu import subjects as all_subjects

ARC_EASY = Path(__file__).resolve().parent / "data" / "arc" / "ARC-Easy-Test.jsonl.gz"
MMLU_COLUMNS = ["question", "A", "B", "C", "D", "answer"]


def _import_lm_eval():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:  # optional (pip install 'ganda[eval]'), and it must see the offline settings first
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GandaError("lm-eval is not installed: pip install 'ganda[eval]' (lm-eval==0.4.13)") from exc
    return HFLM


@contextmanager
def lm_eval_model(adapter: ModelAdapter, interventions: Sequence[Intervention] | None = None, *,
                  batch_size: int | str = 1, **kwargs: Any) -> Iterator[Any]:
    """``with lm_eval_model(adapter, [AblateHeads(...)]) as lm:`` - an lm-eval ``HFLM`` around the
    adapter's HF model and tokenizer, with the interventions' hooks on that very model object."""
    HFLM = _import_lm_eval()
    with apply(adapter, interventions):
        yield HFLM(pretrained=adapter.model, tokenizer=adapter.tokenizer, batch_size=batch_size,
                   device=str(adapter.device), **kwargs)


def simple_evaluate(
    adapter: ModelAdapter,
    tasks: Sequence[str | dict[str, Any]],
    interventions: Sequence[Intervention] | None = None,
    *,
    batch_size: int | str = 1,
    env_info: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` under the interventions; the result records what was done.

    ``kwargs`` go to ``lm_eval.simple_evaluate`` (``limit``, ``num_fewshot``, ``log_samples``...).
    ``env_info=False`` skips lm-eval's environment report (it shells out to ``pip list``, seconds).
    """
    _import_lm_eval()
    import lm_eval  # optional dependency, imported after _import_lm_eval's offline settings
    import lm_eval.evaluator as ev

    kwargs.setdefault("log_samples", False)
    if "task_manager" not in kwargs and all(isinstance(t, dict) for t in tasks):
        # only local config dicts: skip indexing lm-eval's thousands of built-in task YAMLs
        from lm_eval.tasks import TaskManager  # optional dependency (see above)

        kwargs["task_manager"] = TaskManager(include_defaults=False)
    saved = ev.add_env_info
    if not env_info:
        ev.add_env_info = lambda results: None
    try:
        with lm_eval_model(adapter, interventions, batch_size=batch_size) as lm:
            res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), **kwargs)
    finally:
        ev.add_env_info = saved
    if res is None:  # pragma: no cover - non-zero ranks
        raise GandaError("lm-eval returned no result")
    res["ganda"] = {"model": adapter.spec, "interventions": describe_all(interventions)}
    return res


# ---- local task configs (no hub) -----------------------------------------------------------

def _mmlu_dir(data_dir: str | Path | None) -> Path:
    """``data_dir``, else the CSVs ganda ships, which ``get_task("mmlu")`` reads."""
    d = Path(data_dir) if data_dir else MMLU_DIR
    if not (d / "test").is_dir():
        raise GandaError(f"no MMLU CSVs found ({d})")
    return d


def _local_task(task: str, dataset_path: str, dataset_kwargs: dict[str, Any], source: str, **fields: Any
                ) -> dict[str, Any]:
    """An lm-eval multiple-choice task over local files (its test split), scored by lm-eval's
    ``acc`` and ``acc_norm``: what MMLU's and ARC-Easy's configs share."""
    return {"task": task, "dataset_path": dataset_path, "dataset_kwargs": dataset_kwargs, "test_split": "test",
            "output_type": "multiple_choice", **fields,
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")],
            "metadata": {"version": 1.0, "source": source}}


def mmlu_task(subject: str, *, data_dir: str | Path | None = None, shots: int = 0) -> dict[str, Any]:
    """lm-eval's ``mmlu_<subject>`` (default template) as a config dict over the local CSVs.

    Same ``doc_to_text``, choices, description, first-n dev few-shot sampler and ``acc``/
    ``acc_norm`` metrics as ``lm_eval/tasks/mmlu/default``; only the data source differs.
    """
    d = _mmlu_dir(data_dir)
    test = d / "test" / f"{subject}_test.csv"
    if not test.is_file():
        raise GandaError(f"no MMLU subject {subject!r} in {d}")
    files = {"test": str(test)}
    dev = d / "dev" / f"{subject}_dev.csv"
    if dev.is_file():
        files["dev"] = str(dev)
    cfg = _local_task(f"ganda_mmlu_{subject}", "csv", {"data_files": files, "column_names": MMLU_COLUMNS},
                      "ganda local MMLU CSVs",
                      doc_to_text="{{question.strip()}}\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\nAnswer:",
                      doc_to_choice=["A", "B", "C", "D"], doc_to_target="{{answer.strip()}}",
                      description=description(subject), num_fewshot=shots)
    if shots:
        cfg["fewshot_split"] = "dev"
        cfg["fewshot_config"] = {"sampler": "first_n"}
    return cfg


def mmlu_tasks(subjects: Sequence[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """One :func:`mmlu_task` config per subject (all 57 by default)."""
    d = _mmlu_dir(kwargs.get("data_dir"))
    return [mmlu_task(s, **kwargs) for s in (subjects or all_subjects(d))]


def _arc_docs(dataset):
    """ARC's original JSONL layout -> the fields of lm-eval's ``allenai/ai2_arc`` dataset
    (``id``, ``question``, ``choices: {text, label}``, ``answerKey``)."""
    def convert(doc):
        q = doc["question"]
        return {"id": doc["id"], "question": q["stem"],
                "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]},
                "answerKey": doc["answerKey"]}
    return dataset.map(convert, remove_columns=dataset.column_names)


def arc_easy_task(path: str | Path | None = None) -> dict[str, Any]:
    """lm-eval's ``arc_easy`` (``lm_eval/tasks/arc/arc_easy.yaml``: ``Question: ...\nAnswer:`` +
    each choice text, ``acc``/``acc_norm``) over ARC's JSONL (``dataset_path: json``).

    By default it reads ganda's vendored ``ganda/data/arc/ARC-Easy-Test.jsonl.gz``, the file
    ``get_task("arc_easy")`` reads, so both see the same questions in the same order (lm-eval's
    ``limit=N`` = ``examples(limit=N)``); ``path=`` takes another ``.jsonl`` / ``.jsonl.gz``.
    ``process_docs`` maps the authors' layout to ``ai2_arc``'s fields, so ``doc_to_text``,
    ``doc_to_choice`` and ``doc_to_target`` are lm-eval's own strings.
    """
    p = Path(path) if path else ARC_EASY
    if not p.is_file():
        raise GandaError(f"no ARC-Easy JSONL at {p} (pass path=...)")
    return _local_task("ganda_arc_easy", "json", {"data_files": {"test": str(p)}}, "ganda local ARC-Easy JSONL",
                       process_docs=_arc_docs, doc_to_text="Question: {{question}}\nAnswer:",
                       doc_to_target="{{choices.label.index(answerKey)}}", doc_to_choice="{{choices.text}}")


def sample_predictions(res: dict[str, Any], task: str) -> list[dict[str, Any]]:
    """Per-document predictions of a multiple-choice task run with ``log_samples=True``:
    ``[{doc_id, pred, gold, loglik}]`` in document order."""
    samples = res.get("samples", {}).get(task)
    if samples is None:
        raise GandaError(f"no samples for {task!r}: run with log_samples=True")
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        ll = [float(r[0]) for r in s["filtered_resps"]]
        gold: Any = s["target"]
        if isinstance(gold, str) and gold.strip().lstrip("-").isdigit():
            gold = int(gold)
        elif isinstance(gold, str) and len(gold.strip()) == 1 and gold.strip() in "ABCDE":
            gold = "ABCDE".index(gold.strip())  # MMLU's letter targets
        out.append({"doc_id": s["doc_id"], "pred": predicted(ll),
                    "gold": gold, "loglik": ll, "acc": s.get("acc")})
    return out


def compare_arc(res: dict[str, Any], examples: Sequence[Any], ganda: Any,
                task: str = "ganda_arc_easy") -> dict[str, Any]:
    """Per-question agreement between an lm-eval ARC run (``log_samples=True``) and ganda's
    :func:`~ganda.scoring.evaluate_examples` result on the same ``examples`` (same order).

    Both sides are :class:`~ganda.scoring.ChoiceScores`. lm-eval's is taken from its samples: the
    requests it built (``arguments``), its log-likelihoods, and the lengths of its ``doc_to_choice``
    (what ``ConfigurableTask.process_results`` divides by; checked against the ``acc_norm`` it
    logged). ganda's: its predictions, and the lengths of its :func:`~ganda.scoring.norm_chars`.
    """
    samples = sorted(res.get("samples", {}).get(task) or [], key=lambda s: s["doc_id"])
    if not samples:
        raise GandaError(f"no samples for {task!r}: run with log_samples=True")
    n = len(samples)
    if n != len(examples) or n != len(ganda.predictions):
        raise GandaError(f"{task}: lm-eval scored {n} questions, ganda {len(examples)}")
    out = {"n": n, "same_requests": 0, "same_pred": 0, "same_pred_norm": 0,
           "lm_eval_correct": 0, "lm_eval_correct_norm": 0, "ganda_correct": 0, "ganda_correct_norm": 0,
           "lm_eval_acc_norm_consistent": True, "same_gold": True,
           "max_abs_loglik_diff": 0.0, "max_abs_norm_diff": 0.0}
    for s, ex, g in zip(samples, examples, ganda.predictions, strict=True):
        lm = ChoiceScores([float(r[0]) for r in s["filtered_resps"]], [len(c) for c in s["doc"]["choices"]["text"]])
        ga = ChoiceScores(list(g["loglik"]), norm_chars(ex))
        gold = int(s["target"])
        if "acc_norm" in s and float(s["acc_norm"]) != float(lm.pred_norm == gold):
            out["lm_eval_acc_norm_consistent"] = False
        out["same_requests"] += [tuple(a) for a in s["arguments"]] == example_pairs(ex)
        out["same_pred"] += lm.pred == ga.pred
        out["same_pred_norm"] += lm.pred_norm == ga.pred_norm
        out["same_gold"] &= gold == ex.gold
        out["lm_eval_correct"] += lm.pred == gold
        out["lm_eval_correct_norm"] += lm.pred_norm == gold
        out["ganda_correct"] += ga.pred == ex.gold
        out["ganda_correct_norm"] += ga.pred_norm == ex.gold
        for key, a, b in (("max_abs_loglik_diff", lm.loglik, ga.loglik), ("max_abs_norm_diff", lm.norm, ga.norm)):
            out[key] = max(out[key], *(abs(x - y) for x, y in zip(a, b, strict=True)))
    r = res["results"][task]
    out.update({"lm_eval_acc": r["acc,none"], "lm_eval_acc_norm": r["acc_norm,none"],
                "ganda_acc": ganda.accuracy, "ganda_acc_norm": ganda.acc_norm})
    return out


def arc_easy_cross_check(adapter: ModelAdapter, limit: int,
                         interventions: Sequence[Intervention] | None = None, *,
                         batch_size: int | str = 1) -> dict[str, Any]:
    """Score the first ``limit`` ARC-Easy questions with lm-eval (through the bridge, local
    :func:`arc_easy_task`) and with ganda (``get_task("arc_easy").examples(limit=...)`` +
    :func:`~ganda.scoring.evaluate_examples`) under the same interventions; :func:`compare_arc`
    plus the wall time of each side (``lm_eval_seconds``, ``ganda_seconds``)."""
    t0 = time.perf_counter()
    res = simple_evaluate(adapter, [arc_easy_task()], interventions, limit=limit, log_samples=True,
                          batch_size=batch_size)
    t1 = time.perf_counter()
    examples = get_task("arc_easy").examples(limit=limit)
    ga = evaluate_examples(adapter, examples, interventions, task_name="arc_easy", progress=False)
    t2 = time.perf_counter()
    out = compare_arc(res, examples, ga)
    out.update({"interventions": describe_all(interventions), "batch_size": batch_size,
                "lm_eval_seconds": round(t1 - t0, 2), "ganda_seconds": round(t2 - t1, 2)})
    return out
