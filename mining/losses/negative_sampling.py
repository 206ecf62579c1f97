"""Negative sampling (Mikolov et al. 2013), as contrasted with NCE in Dyer 2014."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hnce.mining.losses.masking import check_inputs


class NegativeSamplingLoss(nn.Module):
    """J = −log σ(s(x,y)) − Σ_j log σ(−s(x,y_j)), over the valid negatives.

    Binary NCE with k·q(y) replaced by 1 (Dyer 2014): cheaper and not consistent for the
    conditional distribution (s learns log p(y|x)/(k q(y))), but fine for representations.
    ``log_q`` is ignored.
    """

    def forward(
        self,
        positive_scores: Tensor,
        negative_scores: Tensor,
        valid: Tensor | None = None,
        log_q: Tensor | None = None,
    ) -> Tensor:
        check_inputs(positive_scores, negative_scores, valid, log_q)
        if valid is None:
            valid = torch.ones_like(negative_scores, dtype=torch.bool)
        negative_terms = F.logsigmoid(-negative_scores) * valid.to(negative_scores.dtype)
        return (-F.logsigmoid(positive_scores) - negative_terms.sum(dim=1)).mean()
