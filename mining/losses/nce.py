"""Hard-negative NCE: softmax cross entropy over the gold and K negatives (Zhang & Stratos (2021) eq. 5/11)."""

from __future__ import annotations

from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives, gold_log_softmax


class NCELoss(ContrastiveLoss):
    """J = −log exp s(x,y) / (exp s(x,y) + Σ_k exp s(x,y_k)), averaged over the batch.

    Paper 000 eq. 5 (population form) and eq. 11 (the per-example estimate used in training);
    docs/math.md. The negatives may come from any distribution, conditional on x and correlated
    (hard negatives, eq. 8). Entries with ``valid=False`` are left out of the normaliser, so a
    mention with no valid negative contributes zero loss (−log 1). ``log_q`` is accepted for
    interface compatibility and ignored: this loss has no proposal correction (see
    :class:`~hnce.mining.losses.sampled_softmax.SampledSoftmaxLoss` for eq. 10).

    Args:
        temperature: scores are divided by it before the softmax.

    Inputs:
        positive_scores: [B] s(x, y) of the gold.
        negative_scores: [B, K] s(x, y_k).
        valid: [B, K] bool, False for padding (optional, default all valid).

    Example::

        loss = NCELoss()(torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]))
        # = −log(e² / (e² + e¹ + e⁰)) ≈ 0.4076
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = temperature

    def loss(self, scored: ScoredNegatives) -> Tensor:
        positive, negative = scored.positive / self.temperature, scored.negative / self.temperature
        return -gold_log_softmax(positive, negative, scored.valid).mean()
