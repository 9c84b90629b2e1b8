"""What an ablated head's slice becomes: zero, its mean, or another prompt's value.

Every command that ablates heads takes ``--ablation zero|mean|resample`` and runs it through
:class:`ganda.interventions.AblateHeads` (the sweep's batched rows through the same
:func:`edit_for`), at the output-projection input of the head's mixer:

* **zero** (the default): the slice is set to 0, which removes the head's write to the residual
  stream exactly.
* **mean**: the slice is set to ``μ_h``, its mean over *every token of every reference prompt*,
  one vector per head, the same at every position. The reference prompts are the prompts being
  scored (their contexts as scoring encodes them, each run alone with the other interventions of
  the run active, the ablation itself not). A position-independent mean does not depend on how
  prompts of different lengths line up, so the layer-skipping sweep, the packed and prefix-cached
  scoring paths, path ablation and ``rank``'s attribution all give the same number for it (a
  per-position mean would need an alignment, and differ between aligned-from-start and
  aligned-from-end prompts).
* **resample**: the slice takes its value in another prompt of the same task at the same
  position: for each scored prompt a donor is drawn among the reference prompts with a different
  context (seeded, from the prompt's tokens, so the draw does not depend on batching), run alone,
  and aligned *from the end of the prompt*: the query token takes the donor's query token's value
  and position ``t`` the donor's ``t - (q - q_donor)``; positions before the donor's first token
  take its first token's value, the answer's tokens after the query the donor's query value.
  A donor is needed per scored row, so resample runs on the rows path of scoring (``eval``,
  ``demo``, ``extends``); the sweep, path and edge commands refuse it in one line.
"""

from __future__ import annotations

from .errors import GandaError
from .interventions import ABLATIONS, Donors, check_ablation, edit_for, reference_data
from .scoring import REFERENCE_ROWS, context_ids, reference_donors, reference_means


def check_batched_ablation(how: str, flag: str = "--ablation", what: str = "this command") -> None:
    """Refuse (one line) an ablation a batched engine cannot run exactly: zero and mean only
    (resample needs a donor per scored row, which batched rows do not keep)."""
    if how == "resample":
        raise GandaError(f"{flag} resample is not run by {what} (it needs a donor per scored row); use zero or "
                         "mean, or eval --ablate HEAD --ablation resample")
    check_ablation(how, flag, ("zero", "mean"))




__all__ = ["ABLATIONS", "REFERENCE_ROWS", "Donors", "check_ablation", "check_batched_ablation", "context_ids",
           "edit_for", "reference_data", "reference_donors", "reference_means"]
