"""The paper's experiments, one module each; each returns an :class:`ExperimentResult` that
serialises to JSON (``to_json``), saves itself (``save(out_dir)``: result.json, CSV, PNG) and
draws itself (``draw``).

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
=================  ======================================  =============================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import ExperimentResult, Scorer

RESULT_CLASSES: dict[str, str] = {
    "prune": "ganda.experiments.prune:PruneResult",
    "remove_restore": "ganda.experiments.prune:RemoveRestoreResult",
    "retain": "ganda.experiments.retain:RetainResult",
    "kv_curve": "ganda.experiments.kv_curve:KVCurveResult",
    "mask_last_row": "ganda.experiments.mask_last_row:MaskLastRowResult",
    "transplant": "ganda.experiments.transplant:TransplantResult",
    "roles": "ganda.experiments.roles:RolesResult",
    "lab_findings": "ganda.lab.programme:LabFindingsResult",
}


def result_from_json(d: dict[str, Any]) -> ExperimentResult:
    """Rebuild a result object (of the right class) from its ``result.json``."""
    import importlib

    target = RESULT_CLASSES.get(d.get("kind", ""))
    if target is None:
        return ExperimentResult.from_json(d)
    module, name = target.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls.from_json(d)


def draw_result(d: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the figures of a saved result (used by the report for run dirs without PNGs)."""
    return result_from_json(d).draw(Path(out_dir))


__all__ = ["ExperimentResult", "RESULT_CLASSES", "Scorer", "draw_result", "result_from_json"]
