"""Focal loss on the NCE softmax (Lin et al. 2017)."""

from __future__ import annotations

from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives, gold_log_softmax


class FocalLoss(ContrastiveLoss):
    """J = −(1 − p)^γ log p with p = exp s(x,y) / (exp s(x,y) + Σ_k exp s(x,y_k)) (eq. 5's
    softmax). γ = 0 is exactly hard-negative NCE; γ > 0 down-weights mentions already ranked
    confidently, focusing on the hard ones (“Hard Negative Mining in NLP”, 2020). Invalid negatives leave the softmax.
    ``log_q`` is ignored.
    """

    def __init__(self, gamma: float = 2.0, temperature: float = 1.0) -> None:
        super().__init__()
        self.gamma = gamma
        self.temperature = temperature

    def loss(self, scored: ScoredNegatives) -> Tensor:
        positive, negative = scored.positive / self.temperature, scored.negative / self.temperature
        log_p = gold_log_softmax(positive, negative, scored.valid)
        return (-((1.0 - log_p.exp()) ** self.gamma) * log_p).mean()
