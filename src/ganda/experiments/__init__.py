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
``heads``          heads ranked by G&A pattern scores,      :mod:`.heads`
                   the top ones verified by ablation
``sharpness``      G&A map sharpness of two models          :mod:`.sharpness`
``circuit_path``   which of a head's effect runs through    :mod:`.circuit`
                   another (path ablation)
``circuit_edges``  every head pair scored, the top          :mod:`.circuit`
                   verified, drawn as a circuit
=================  ======================================  =============================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import registry
from .base import Experiment, Options
from .common import ExperimentResult, Scorer

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
    "prune": "ganda.experiments.prune:PruneResult",
    "remove_restore": "ganda.experiments.prune:RemoveRestoreResult",
    "retain": "ganda.experiments.retain:RetainResult",
    "kv_curve": "ganda.experiments.kv_curve:KVCurveResult",
    "mask_last_row": "ganda.experiments.mask_last_row:MaskLastRowResult",
    "transplant": "ganda.experiments.transplant:TransplantResult",
    "roles": "ganda.experiments.roles:RolesResult",
    "heads": "ganda.experiments.heads:HeadsResult",
    "sharpness": "ganda.experiments.sharpness:SharpnessResult",
    "circuit_path": "ganda.experiments.circuit:PathResult",
    "circuit_edges": "ganda.experiments.circuit:EdgesResult",
    "demo": "ganda.demo:DemoResult",  # ``ganda demo``'s finding (named, not imported: the demo sits above)
}.items():
    registry.register_result(_kind, _target)


def result_from_json(d: dict[str, Any]) -> ExperimentResult:
    """Rebuild a result object of its registered kind's class from its ``result.json``."""
    cls = registry.result_class(d.get("kind", ""))
    return (cls or ExperimentResult).from_json(d)


def draw_result(d: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the figures of a saved result."""
    return result_from_json(d).draw(Path(out_dir))


__all__ = ["Experiment", "ExperimentResult", "Options", "Scorer", "draw_result", "result_from_json"]
