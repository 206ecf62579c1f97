"""Negative sampling (Mikolov et al. 2013), as contrasted with NCE in Dyer 2014."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives


class NegativeSamplingLoss(ContrastiveLoss):
    """J = −log σ(s(x,y)) − Σ_j log σ(−s(x,y_j)), over the valid negatives.

    Binary NCE with k·q(y) replaced by 1 (Dyer 2014): cheaper and not consistent for the
    conditional distribution (s learns log p(y|x)/(k q(y))), but fine for representations.
    ``log_q`` is ignored.
    """

    def loss(self, scored: ScoredNegatives) -> Tensor:
        negative_terms = F.logsigmoid(-scored.negative) * scored.weights
        return (-F.logsigmoid(scored.positive) - negative_terms.sum(dim=1)).mean()
