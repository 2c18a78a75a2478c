"""Drafters: what proposes the tokens the target verifies.

`model` (any `Model` sampled with warp + sample), `lookup` (prompt lookup), `suffix`
(suffix trees of the context), `confidence` (trees grown by a draft model's confidence),
`head` (a feature-level draft head), `hybrid` (lookup where the context repeats, a model
elsewhere). Each depends on the core only.
"""

from specsample.drafters.confidence import ConfidenceTreeDrafter, grow_tree
from specsample.drafters.head import DistillPlan, FeatureHead, HeadDrafter, HeadTreeDrafter
from specsample.drafters.hybrid import FeatureHybridDrafter, HybridDrafter
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import (
    DraftRating,
    DraftState,
    ModelDrafter,
    confidence_lengths,
    draft_support,
    token_confidence,
)
from specsample.drafters.suffix import SuffixTreeDrafter

__all__ = [
    "ConfidenceTreeDrafter",
    "DistillPlan",
    "DraftRating",
    "DraftState",
    "FeatureHead",
    "FeatureHybridDrafter",
    "HeadDrafter",
    "HeadTreeDrafter",
    "HybridDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SuffixTreeDrafter",
    "confidence_lengths",
    "draft_support",
    "grow_tree",
    "token_confidence",
]
