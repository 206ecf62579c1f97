"""Focal loss on the NCE softmax (Lin et al. 2017)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hnce.mining.losses.masking import check_inputs, gold_first_logits


class FocalLoss(nn.Module):
    """J = −(1 − p)^γ log p with p = exp s(x,y) / (exp s(x,y) + Σ_k exp s(x,y_k)) (eq. 5's
    softmax). γ = 0 is exactly hard-negative NCE; γ > 0 down-weights mentions already ranked
    confidently, focusing on the hard ones (“Hard Negative Mining in NLP”, 2020). Invalid negatives leave the softmax.
    ``log_q`` is ignored.
    """

    def __init__(self, gamma: float = 2.0, temperature: float = 1.0) -> None:
        super().__init__()
        self.gamma = gamma
        self.temperature = temperature

    def forward(
        self,
        positive_scores: Tensor,
        negative_scores: Tensor,
        valid: Tensor | None = None,
        log_q: Tensor | None = None,
    ) -> Tensor:
        check_inputs(positive_scores, negative_scores, valid, log_q)
        logits = gold_first_logits(
            positive_scores, negative_scores / self.temperature, valid, self.temperature
        )
        log_p = logits[:, 0] - torch.logsumexp(logits, dim=1)
        return (-((1.0 - log_p.exp()) ** self.gamma) * log_p).mean()
