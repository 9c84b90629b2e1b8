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


def _here(target: str) -> str:
    """A target of the table below: ``module:Class`` in this package, or a whole dotted path."""
    return target if target.startswith("ganda.") else f"{__name__}.{target}"


# The built-in experiments, the one table of them: name -> ("module:Class", its one-line summary,
# the result kinds it writes and their classes). A class is imported when it is looked up; the
# summary is here so that ``ganda --help`` lists every command without importing torch. An alias
# is a name whose entry is another name.
for _name, _entry in {
    "sweep": ("builtin:Sweep", "Single-head ablation: accuracy with each head zeroed",
              {"sweep": "head_effects:HeadSweepResult"}),
    "rank": ("builtin:Rank", "Rank every head by its ablation effect on the task's margin",
             {"rank": "head_effects:RankingResult"}),
    "attribution": "rank",
    "eval": ("evaluation:Evaluation", "Accuracy of a model on a task, optionally under interventions", {}),
    "attn": ("maps:Maps", "Draw attention maps of heads on one prompt", {}),
    "maps": "attn",
    "prune": ("prune:Prune", "Cumulative layer pruning and the minimal model (Figures 2, 3)",
              {"prune": "prune:PruneResult", "remove_restore": "prune:RemoveRestoreResult"}),
    "transplant": ("transplant:Transplant", "Replace student layers or heads with a donor's (Figure 7)",
                   {"transplant": "transplant:TransplantResult"}),
    "roles": ("roles:Roles", "Where the most damaging heads matter, and their labels", {"roles": "roles:RolesResult"}),
    "retain": ("retain:Retain", "Keep none, either or both critical heads (Table 1)",
               {"retain": "retain:RetainResult"}),
    "mask-last-row": ("mask_last_row:MaskLastRow", "Zero attention's last row and score MMLU and knowledge",
                      {"mask_last_row": "mask_last_row:MaskLastRowResult"}),
    "extends": ("extends:Extends", "Each task intact, G&A heads ablated, random heads ablated",
                {"extends": "extends:ExtendsResult"}),
    "heads": ("heads:Heads", "Rank heads by Gather and Aggregate patterns, then verify", {"heads": "heads:HeadsResult"}),
    "sharpness": ("sharpness:Sharpness", "Sharpness of the top-k Aggregate and Gather heads of models",
                  {"sharpness": "sharpness:SharpnessResult"}),
    "kv-curve": ("kv_curve:KVCurve", "KV-retrieval accuracy against the number of pairs (Figure 4)",
                 {"kv_curve": "kv_curve:KVCurveResult"}),
    "path": ("circuit:PathExperiment", "Remove one head's contribution along its paths into another",
             {"circuit_path": "circuit:PathResult"}),
    "edges": ("circuit:EdgesExperiment", "Score every sender -> receiver head pair and draw the circuit",
              {"circuit_edges": "circuit:EdgesResult"}),
    # above the experiments' layer: the demo writes its report.html as part of its run
    "demo": ("ganda.demo:Demo", "The main job: KV's G&A heads found, ablated and reported",
             {"demo": "ganda.demo:DemoResult"}),
}.items():
    if isinstance(_entry, str):
        registry.register_experiment(_name, registry.experiment_target(_entry), command=False)
    else:
        _target, _summary, _results = _entry
        registry.register_experiment(_name, _here(_target), summary=_summary,
                                     results={k: _here(v) for k, v in _results.items()})


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
