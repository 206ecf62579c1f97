"""Triplet margin ranking loss over (mention, gold, negative) triples."""

from __future__ import annotations

from torch import Tensor, nn

from hnce.mining.losses.masking import check_inputs


class TripletLoss(nn.Module):
    """J = mean over valid (mention, negative) pairs of max(0, margin − s(x,y) + s(x,y_k)).

    The pairwise hinge used with hard negatives by ANCE/DPR-style retrievers; zero once every
    negative trails the gold by the margin. Returns 0 when no entry is valid. ``log_q`` is
    ignored.
    """

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.margin = margin

    def forward(
        self,
        positive_scores: Tensor,
        negative_scores: Tensor,
        valid: Tensor | None = None,
        log_q: Tensor | None = None,
    ) -> Tensor:
        check_inputs(positive_scores, negative_scores, valid, log_q)
        hinge = (self.margin - positive_scores.unsqueeze(1) + negative_scores).clamp_min(0.0)
        if valid is None:
            return hinge.mean()
        weights = valid.to(hinge.dtype)
        return (hinge * weights).sum() / weights.sum().clamp_min(1.0)
