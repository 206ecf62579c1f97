"""Bias-corrected sampled softmax with −log Q (Zhang & Stratos (2021) eq. 10; TensorFlow's candidate-sampling note)."""

from __future__ import annotations

from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives, gold_log_softmax


class SampledSoftmaxLoss(ContrastiveLoss):
    """Softmax over the gold and K negatives with each negative's score corrected by −log q:

    J = −log exp s(x,y) / (exp s(x,y) + Σ_k exp(s(x,y_k) − log q(y_k|x)))

    This is eq. 10 of Zhang & Stratos (2021) (Bengio & Senécal 2008): the corrected logit s̄(x,y') is
    s(x,y') for the gold and s(x,y') − log q(y'|x) for a negative, so Σ_k exp s̄ is an
    importance-sampling estimate of the partition sum over the negatives. TensorFlow's candidate-sampling note's
    "Sampled Softmax" subtracts log Q from the gold too; with the gold's log Q equal to a
    constant c (uniform Q) that is this loss applied to s(x,y) − c. With a uniform q the loss is
    NCE (eq. 5) with the gold logit shifted by the constant log q. ``sample_size_correction``
    subtracts log K as well (Σ_k exp s̄ / K estimates the mean, Rawat et al. 2019).

    Inputs: positive_scores [B], negative_scores [B, K], valid [B, K] (optional), log_q [B, K]
    (required: the sampler's ``SampledNegatives.log_q``).

    Example::

        loss = SampledSoftmaxLoss()(pos, neg, sampled.valid, sampled.log_q)
    """

    def __init__(self, temperature: float = 1.0, sample_size_correction: bool = False) -> None:
        super().__init__()
        self.temperature = temperature
        self.sample_size_correction = sample_size_correction

    def loss(self, scored: ScoredNegatives) -> Tensor:
        if scored.log_q is None:
            raise ValueError(
                f"{__file__}: sampled-softmax needs log_q from a sampler that reports its "
                f"proposal (random, hard, mixed, ance); got None"
            )
        negatives = scored.negative / self.temperature - scored.log_q.to(scored.negative.dtype)
        if self.sample_size_correction:
            count = scored.valid.sum(dim=1, keepdim=True).clamp_min(1)
            negatives = negatives - count.to(negatives.dtype).log()
        positive = scored.positive / self.temperature
        return -gold_log_softmax(positive, negatives, scored.valid).mean()
