"""The G&A circuit, not just its heads: which head feeds which, measured exactly and estimated for
every pair.

* :func:`path_ablation` removes one sender head's contribution only along its paths into one
  receiver head (all paths, or the direct edge; the receiver's inputs together or one part at a
  time) and compares it with the sender ablated everywhere (:mod:`.paths`, :mod:`.ablation`);
* :func:`edge_attribution` scores every sender -> receiver edge to first order from one forward
  and one backward pass per batch, :func:`rank_edges` verifies the top edges exactly and bounds
  what the unverified ones could hide (:mod:`.edges`).

docs/circuit.md has the definitions and the measured costs.
"""

from .ablation import EVERYWHERE, INTACT, PathAblation, path_ablation
from .paths import PATHS, TOGETHER, PathBatch, Variant, parse_pair

__all__ = ["EVERYWHERE", "INTACT", "PATHS", "TOGETHER", "PathAblation", "PathBatch", "Variant", "parse_pair",
           "path_ablation"]
