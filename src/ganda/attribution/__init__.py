"""Rank every head by a first-order estimate of its ablation effect, then verify the top exactly.

``attribute`` estimates every head's effect on the task's multiple-choice margin from one forward
and one backward pass per batch of prompts (AtP, or AtP* with GradDrop; or integrated gradients over k steps); ``rank_heads`` verifies
the top K with the exact sweep engine and bounds the false negatives among the rest. See
docs/attribution.md.
"""

from .engine import (
    ABLATIONS,
    BATCH_TOKENS,
    GRADDROP_BLOCKS,
    IG_STEPS,
    MARGINS,
    METHODS,
    Attribution,
    attribute,
    batch_tokens_for,
    check_options,
    default_batch_tokens,
    graddrop_blocks,
    graddrop_scores,
    ig_alphas,
    margin_of,
)
from .ranking import (
    RANK_METHODS,
    Bound,
    RankOptions,
    RankResult,
    false_negative_bound,
    quality,
    rank_heads,
    spearman,
    top_by_magnitude,
    upper_count,
)

__all__ = [
    "ABLATIONS", "BATCH_TOKENS", "batch_tokens_for", "default_batch_tokens", "GRADDROP_BLOCKS", "IG_STEPS", "MARGINS", "METHODS", "RANK_METHODS", "Attribution", "Bound", "RankResult", "attribute", "check_options",
    "RankOptions",
    "false_negative_bound", "graddrop_blocks", "graddrop_scores", "ig_alphas", "margin_of", "quality", "rank_heads", "spearman",
    "top_by_magnitude", "upper_count",
]
