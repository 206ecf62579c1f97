"""Triplet margin ranking loss over (mention, gold, negative) triples."""

from __future__ import annotations

from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives


class TripletLoss(ContrastiveLoss):
    """J = mean over valid (mention, negative) pairs of max(0, margin − s(x,y) + s(x,y_k)).

    The pairwise hinge used with hard negatives by ANCE/DPR-style retrievers; zero once every
    negative trails the gold by the margin. Returns 0 when no entry is valid. ``log_q`` is
    ignored.
    """

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.margin = margin

    def loss(self, scored: ScoredNegatives) -> Tensor:
        margin = self.margin - scored.positive.unsqueeze(1) + scored.negative
        weights = scored.weights
        return (margin.clamp_min(0.0) * weights).sum() / weights.sum().clamp_min(1.0)
