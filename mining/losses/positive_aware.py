"""The positive-aware mask (Moreira et al. 2024, *NV-Retriever: Improving text embedding models with
effective hard-negative mining*, TopK-PercPos): a negative scored above a fraction of its mention's
gold score is more likely an unlabelled positive than a negative, and leaves the loss.

NV-Retriever applies the threshold when it mines (negative score < 95% of the positive's under
the teacher). Here it applies to every column of the loss, under the weights being trained: the
mined or cached candidates, the step's shared candidates and any extra columns (the whole
catalogue of the negative cache) alike, so that no source of negatives escapes it. For each
mention b and column k

    keep[b, k] = s(x_b, y_k) ≤ f · s(x_b, y_b)

on the scores before the temperature, detached (the mask chooses columns; it carries no gradient),
and the wrapped loss sees ``valid & keep`` (docs/math.md, eq. (60)). A mention left with no
negative contributes what the wrapped loss gives an empty row (zero for NCE).

Example::

    loss = PositiveAwareMask(NCELoss(temperature=0.05), fraction=0.95)
    loss(torch.tensor([0.8]), torch.tensor([[0.79, 0.2]]))  # only 0.2 stays a negative
"""

from __future__ import annotations

from torch import Tensor, nn

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives


def positive_aware_keep(positive: Tensor, negative: Tensor, fraction: float) -> Tensor:
    """Bool [B, K]: the columns scored at most ``fraction`` of the row's gold score."""
    return negative.detach() <= fraction * positive.detach()[:, None]


class PositiveAwareMask(ContrastiveLoss):
    """``loss`` over the negatives that :func:`positive_aware_keep` keeps (module docs)."""

    def __init__(self, loss: nn.Module, fraction: float) -> None:
        super().__init__()
        self.inner = loss
        self.fraction = fraction

    def loss(self, scored: ScoredNegatives) -> Tensor:
        keep = positive_aware_keep(scored.positive, scored.negative, self.fraction)
        return self.inner(scored.positive, scored.negative, scored.valid & keep, scored.log_q)
