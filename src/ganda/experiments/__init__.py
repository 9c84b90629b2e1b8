"""The paper's experiments, one module each. Each runnable experiment is an :class:`Experiment`
registered by name (:func:`ganda.registry.register_experiment`: its options, runner, costs and
result file; see :mod:`.base`), and each returns an :class:`ExperimentResult` that
serialises to JSON (``to_json``), saves itself (``save(out_dir)``: result.json, CSV, PNG), draws
itself (``draw``) and states its result in one line (``headline``). Each kind is registered
(:func:`ganda.registry.register_result`), which is how ``ganda report`` renders a run directory.

=================  ======================================  =============================
kind               paper                                   module
=================  ======================================  =============================
``prune``          Fig. 2, cumulative layer pruning         :mod:`.prune`
``remove_restore`` Fig. 3, remove one layer and restore     :mod:`.prune`
``retain``         Table 1, keep only the critical heads    :mod:`.retain`
``kv_curve``       Fig. 4, KV retrieval vs pairs            :mod:`.kv_curve`
``mask_last_row``  Sec. 5.3, hybrids' last attention row    :mod:`.mask_last_row`
``transplant``     Fig. 7, donor layers/heads in a student  :mod:`.transplant`
``roles``          Gather vs Aggregate, by where a head     :mod:`.roles`
                   matters (final position or before it)
``heads``          heads ranked by G&A pattern scores,      :mod:`ganda.discovery`
                   the top ones verified by ablation
``sharpness``      G&A map sharpness of two models          :mod:`ganda.discovery`
``circuit_path``   which of a head's effect runs through    :mod:`.circuit`
                   another (path ablation)
``circuit_edges``  every head pair scored, the top          :mod:`.circuit`
                   verified, drawn as a circuit
``sweep``          every head ablated alone                 :mod:`.builtin` (``results.jsonl``)
``rank``           heads ranked by attribution, the top     :mod:`.builtin` (``ranking.json``)
                   verified exactly
``extends``        G&A heads ablated beyond MMLU            :mod:`.extends` (``extends.json``)
=================  ======================================  =============================

The registered result class is the only reader of its kind's run directories
(:func:`read_run`), for :func:`ganda.results.load` and ``ganda report`` alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import registry
from .base import Experiment, Options
from .common import ExperimentResult, Scorer, read_json_object

# The built-in experiments (name -> "module:Class", imported when one is looked up); aliases too.
for _name, _target in {
    "eval": "ganda.experiments.builtin:Evaluation",
    "maps": "ganda.experiments.builtin:Maps",
    "sweep": "ganda.experiments.builtin:Sweep",
    "rank": "ganda.experiments.builtin:Rank",
    "attribution": "ganda.experiments.builtin:Rank",
    "prune": "ganda.experiments.prune:Prune",
    "transplant": "ganda.experiments.transplant:Transplant",
    "path": "ganda.experiments.circuit:PathExperiment",
    "edges": "ganda.experiments.circuit:EdgesExperiment",
}.items():
    registry.register_experiment(_name, _target)

# The built-in result kinds (kind -> "module:Class", imported when a result of that kind is read).
for _kind, _target in {
    "sweep": "ganda.experiments.builtin:HeadSweepResult",
    "rank": "ganda.experiments.builtin:RankingResult",
    "extends": "ganda.experiments.extends:ExtendsResult",
    "prune": "ganda.experiments.prune:PruneResult",
    "remove_restore": "ganda.experiments.prune:RemoveRestoreResult",
    "retain": "ganda.experiments.retain:RetainResult",
    "kv_curve": "ganda.experiments.kv_curve:KVCurveResult",
    "mask_last_row": "ganda.experiments.mask_last_row:MaskLastRowResult",
    "transplant": "ganda.experiments.transplant:TransplantResult",
    "roles": "ganda.experiments.roles:RolesResult",
    "heads": "ganda.discovery:HeadsResult",
    "sharpness": "ganda.discovery:SharpnessResult",
    "circuit_path": "ganda.experiments.circuit:PathResult",
    "circuit_edges": "ganda.experiments.circuit:EdgesResult",
    "demo": "ganda.demo:DemoResult",  # ``ganda demo``'s finding (named, not imported: the demo sits above)
}.items():
    registry.register_result(_kind, _target)


def result_class(kind: str) -> type[ExperimentResult]:
    """The class that reads, presents and draws results of ``kind``: its registered class, an
    :class:`ExperimentResult` for a kind nobody registered, and for a registered class that is no
    ExperimentResult (one with only ``from_json``, ``headline`` and ``draw``) an ExperimentResult
    that headlines and draws as that class does."""
    cls = registry.result_class(kind)
    if cls is None or (isinstance(cls, type) and issubclass(cls, ExperimentResult)):
        return cls or ExperimentResult
    if cls not in _SHOWN:
        _SHOWN[cls] = type(getattr(cls, "__name__", "Result"), (_Shown,), {
            "shown_by": cls, "title": getattr(cls, "title", ""), "table": getattr(cls, "table", "rows")})
    return _SHOWN[cls]


_SHOWN: dict[Any, type[ExperimentResult]] = {}


class _Shown(ExperimentResult):
    """An ExperimentResult that says and draws what its ``shown_by`` class makes of it."""

    shown_by: Any = None

    def _shown(self) -> Any:
        return self.shown_by.from_json(self.page())

    def headline(self) -> str:
        return self._shown().headline()

    def draw(self, out_dir: Path) -> list[Path]:
        return list(self._shown().draw(out_dir))


def _files() -> list[tuple[str, str]]:
    """``(file, kind)``: the files other than ``result.json`` that make a directory a run, each
    kind's first files before any kind's second (a finished sweep's before a journal)."""
    by_kind = [(kind, result_class(kind).files) for kind in registry.result_kinds()]
    return [(files[i], kind) for i in range(max((len(f) for _, f in by_kind), default=0))
            for kind, files in by_kind if i < len(files)]


def run_files() -> list[str]:
    """Every file that makes a directory a run: ``result.json``, then each kind's own."""
    return list(dict.fromkeys(["result.json", *(f for f, _ in _files())]))


def run_kind(run_dir: Path) -> str | None:
    """The kind of the run in ``run_dir``: its ``result.json``'s ``kind`` (``"?"`` where it names
    none), else the kind whose file it holds; None when it holds no run."""
    run_dir = Path(run_dir)
    if (run_dir / "result.json").is_file():
        d = read_json_object(run_dir / "result.json")
        return str(d.get("kind", "?"))
    return next((kind for f, kind in _files() if (run_dir / f).is_file()), None)


def read_run(run_dir: Path) -> ExperimentResult | None:
    """The result in ``run_dir``, read by its kind's class (:func:`result_class`); None when the
    directory holds no run."""
    kind = run_kind(run_dir)
    return None if kind is None else result_class(kind).read(Path(run_dir))


def result_from_json(d: dict[str, Any]) -> ExperimentResult:
    """Rebuild a result object of its registered kind's class from its ``result.json``."""
    cls = registry.result_class(d.get("kind", ""))
    return (cls or ExperimentResult).from_json(d)


def draw_result(d: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the figures of a saved result."""
    return result_from_json(d).draw(Path(out_dir))


__all__ = ["Experiment", "ExperimentResult", "Options", "Scorer", "draw_result", "read_run", "result_class", "result_from_json",
           "run_files", "run_kind"]
