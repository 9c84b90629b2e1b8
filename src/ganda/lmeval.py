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
csv``) and :func:`arc_easy_task` (ARC-Easy from a JSONL file, ``dataset_path: json``). Named
lm-eval tasks whose data is cached locally work too; others fail to download.

lm-eval is an optional dependency: ``pip install 'ganda[eval]'`` (``lm-eval==0.4.13``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import GandaError
from .interventions import Intervention, apply, describe_all
from .models.base import ModelAdapter

MMLU_DIR = Path(__file__).resolve().parent / "data" / "mmlu"
SHARED = Path("/work/shared/data")
MMLU_COLUMNS = ["question", "A", "B", "C", "D", "answer"]


def _import_lm_eval():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GandaError("lm-eval is not installed: pip install 'ganda[eval]' (lm-eval==0.4.13)") from exc
    return HFLM


def hflm(adapter: ModelAdapter, *, batch_size: int | str = 1, **kwargs: Any):
    """An lm-eval ``HFLM`` around the adapter's (possibly hooked) HF model and tokenizer.

    Build it inside the intervention context, or use :func:`lm_eval_model`; hooks attached
    later also act, since HFLM holds the same model object.
    """
    HFLM = _import_lm_eval()
    return HFLM(pretrained=adapter.model, tokenizer=adapter.tokenizer, batch_size=batch_size,
                device=str(adapter.device), **kwargs)


@contextmanager
def lm_eval_model(adapter: ModelAdapter, interventions: Sequence[Intervention] | None = None,
                  **kwargs: Any) -> Iterator[Any]:
    """``with lm_eval_model(adapter, [AblateHeads(...)]) as lm:`` - an HFLM on the intervened model."""
    with apply(adapter, interventions):
        yield hflm(adapter, **kwargs)


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
    import lm_eval
    import lm_eval.evaluator as ev

    kwargs.setdefault("log_samples", False)
    if "task_manager" not in kwargs and all(isinstance(t, dict) for t in tasks):
        # only local config dicts: skip indexing lm-eval's thousands of built-in task YAMLs
        from lm_eval.tasks import TaskManager

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
    for d in [Path(data_dir)] if data_dir else [MMLU_DIR, SHARED / "mmlu"]:
        if (d / "test").is_dir():
            return d
    raise GandaError(f"no MMLU CSVs found ({data_dir or MMLU_DIR})")


def mmlu_task(subject: str, *, data_dir: str | Path | None = None, shots: int = 0,
              name_prefix: str = "ganda_mmlu_") -> dict[str, Any]:
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
    cfg: dict[str, Any] = {
        "task": f"{name_prefix}{subject}",
        "dataset_path": "csv",
        "dataset_kwargs": {"data_files": files, "column_names": MMLU_COLUMNS},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question.strip()}}\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\nAnswer:",
        "doc_to_choice": ["A", "B", "C", "D"],
        "doc_to_target": "{{answer.strip()}}",
        "description": f"The following are multiple choice questions (with answers) about "
                       f"{subject.replace('_', ' ')}.\n\n",
        "num_fewshot": shots,
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "source": "ganda local MMLU CSVs"},
    }
    if shots:
        cfg["fewshot_split"] = "dev"
        cfg["fewshot_config"] = {"sampler": "first_n"}
    return cfg


def mmlu_tasks(subjects: Sequence[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """One :func:`mmlu_task` config per subject (all 57 by default)."""
    from .tasks.mmlu import subjects as all_subjects

    d = _mmlu_dir(kwargs.get("data_dir"))
    return [mmlu_task(s, **kwargs) for s in (subjects or all_subjects(d))]


def _arc_docs(dataset):
    """ARC's original JSONL layout -> lm-eval's ``allenai/ai2_arc`` fields."""
    def convert(doc):
        labels = [c["label"] for c in doc["question"]["choices"]]
        return {"id": doc["id"], "question_text": doc["question"]["stem"],
                "choice_text": [c["text"] for c in doc["question"]["choices"]],
                "gold": labels.index(doc["answerKey"])}
    return dataset.map(convert)


def arc_easy_task(path: str | Path | None = None, name: str = "ganda_arc_easy") -> dict[str, Any]:
    """lm-eval's ``arc_easy`` (``Question: ...\\nAnswer:`` + each choice text, acc/acc_norm) over
    the authors' ``ARC-Easy-Test.jsonl`` (``dataset_path: json``)."""
    p = Path(path) if path else SHARED / "arc" / "ARC-Easy-Test.jsonl"
    if not p.is_file():
        raise GandaError(f"no ARC-Easy JSONL at {p} (pass path=...)")
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(p)}},
        "test_split": "test",
        "process_docs": _arc_docs,
        "output_type": "multiple_choice",
        "doc_to_text": "Question: {{question_text}}\nAnswer:",
        "doc_to_choice": "{{choice_text}}",
        "doc_to_target": "{{gold}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "source": "ganda local ARC-Easy JSONL"},
    }


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
        out.append({"doc_id": s["doc_id"], "pred": max(range(len(ll)), key=lambda i: ll[i]),
                    "gold": gold, "loglik": ll, "acc": s.get("acc")})
    return out
