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
from .base import Experiment, Options, option

# The built-in experiments: name -> ("module:Class", its one-line summary). The class is imported
# when the experiment is looked up; the summary is here so that ``ganda --help`` lists every
# command without importing torch. An alias is a name whose entry is another name; eval and maps
# are costed by ganda plan and run by the commands eval and attn.
for _name, _entry in {
    "eval": ("ganda.experiments.builtin:Evaluation", "Score every example once (ganda eval)"),
    "maps": ("ganda.experiments.builtin:Maps", "Attention and exact implicit maps of chosen heads (ganda attn)"),
    "sweep": ("ganda.experiments.builtin:Sweep", "Single-head ablation: accuracy with each head zeroed"),
    "rank": ("ganda.experiments.builtin:Rank", "Rank every head by its ablation effect on the task's margin"),
    "attribution": "rank",
    "prune": ("ganda.experiments.prune:Prune", "Cumulative layer pruning and the minimal model (Figures 2, 3)"),
    "transplant": ("ganda.experiments.transplant:Transplant",
                   "Replace student layers or heads with a donor's (Figure 7)"),
    "roles": ("ganda.experiments.roles:Roles", "Where the most damaging heads matter, and their labels"),
    "retain": ("ganda.experiments.retain:Retain", "Keep none, either or both critical heads (Table 1)"),
    "mask-last-row": ("ganda.experiments.mask_last_row:MaskLastRow",
                      "Zero attention's last row and score MMLU and knowledge"),
    "extends": ("ganda.experiments.extends:Extends", "Each task intact, G&A heads ablated, random heads ablated"),
    "heads": ("ganda.experiments.heads:Heads", "Rank heads by Gather and Aggregate patterns, then verify"),
    "sharpness": ("ganda.experiments.sharpness:Sharpness", "Sharpness of the top-k Aggregate and Gather heads of models"),
    "kv-curve": ("ganda.experiments.kv_curve:KVCurve", "KV-retrieval accuracy against the number of pairs (Figure 4)"),
    "path": ("ganda.experiments.circuit:PathExperiment",
             "Remove one head's contribution along its paths into another"),
    "edges": ("ganda.experiments.circuit:EdgesExperiment",
              "Score every sender -> receiver head pair and draw the circuit"),
    # above the experiments' layer: the demo writes its report.html as part of its run
    "demo": ("ganda.demo:Demo", "The main job: KV's G&A heads found, ablated and reported"),
}.items():
    if isinstance(_entry, str):
        registry.register_experiment(_name, registry.experiment_target(_entry), command=False)
    else:
        registry.register_experiment(_name, _entry[0], summary=_entry[1], command=_name not in ("eval", "maps"))

# The built-in result kinds (kind -> "module:Class", imported when a result of that kind is read).
for _kind, _target in {
    "sweep": "ganda.experiments.head_effects:HeadSweepResult",
    "rank": "ganda.experiments.head_effects:RankingResult",
    "extends": "ganda.experiments.extends:ExtendsResult",
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
    "demo": "ganda.demo:DemoResult",  # ``ganda demo``'s finding
}.items():
    registry.register_result(_kind, _target)


#: names served by the modules that load torch, imported when first used (not with the package, so
#: that ``ganda --help`` lists the experiments without torch)
_LAZY = {"ExperimentResult": "common", "Scorer": "common", "read_run": "reading", "result_class": "reading",
         "run_files": "reading", "run_kind": "reading"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def result_from_json(d: dict[str, Any]) -> Any:
    """Rebuild a result object of its registered kind's class from its ``result.json``."""
    from .common import ExperimentResult

    cls = registry.result_class(d.get("kind", ""))
    return (cls or ExperimentResult).from_json(d)


def draw_result(d: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the figures of a saved result."""
    return result_from_json(d).draw(Path(out_dir))


__all__ = ["Experiment", "ExperimentResult", "Options", "Scorer", "draw_result", "option", "read_run", "result_class",
           "result_from_json", "run_files", "run_kind"]
