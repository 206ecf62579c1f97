"""What every loss shares: its call signature, the input checks, and the gold-first softmax.

Every loss is a :class:`ContrastiveLoss`, called as ``loss(positive_scores [B],
negative_scores [B, K], valid [B, K] | None, log_q [B, K] | None)``; the base class checks the
shapes, fills a missing ``valid`` with True and hands the loss one :class:`ScoredNegatives`.
Entries with ``valid=False`` never contribute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ScoredNegatives:
    """A batch's scores as a loss sees them.

    Attributes:
        positive: [B] s(x, y) of each mention's gold.
        negative: [B, K] s(x, y_k) of its negatives.
        valid: [B, K] bool, False for padding.
        log_q: [B, K] the sampler's log-proposal of each negative, or None.
    """

    positive: Tensor
    negative: Tensor
    valid: Tensor
    log_q: Tensor | None

    @property
    def weights(self) -> Tensor:
        """``valid`` as 0/1 weights in the scores' dtype."""
        return self.valid.to(self.negative.dtype)


def check_inputs(
    positive_scores: Tensor, negative_scores: Tensor, valid: Tensor | None, log_q: Tensor | None
) -> None:
    """Raise ValueError (naming this file) unless positives are [B] and the rest [B, K]."""
    if positive_scores.dim() != 1 or negative_scores.dim() != 2:
        raise ValueError(
            f"{__file__}: positive_scores must be [B] and negative_scores [B, K], got "
            f"{tuple(positive_scores.shape)} and {tuple(negative_scores.shape)}"
        )
    if negative_scores.shape[0] != positive_scores.shape[0]:
        raise ValueError(
            f"{__file__}: batch sizes differ: {positive_scores.shape[0]} positives, "
            f"{negative_scores.shape[0]} negative rows"
        )
    for name, tensor in (("valid", valid), ("log_q", log_q)):
        if tensor is not None and tensor.shape != negative_scores.shape:
            raise ValueError(
                f"{__file__}: {name} must have the shape of negative_scores "
                f"{tuple(negative_scores.shape)}, got {tuple(tensor.shape)}"
            )


class ContrastiveLoss(nn.Module, ABC):
    """A loss over each mention's gold score and its K negatives' scores (module docstring)."""

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
        return self.loss(ScoredNegatives(positive_scores, negative_scores, valid, log_q))

    @abstractmethod
    def loss(self, scored: ScoredNegatives) -> Tensor:
        """The scalar loss of the batch."""


def gold_log_softmax(positive_logits: Tensor, negative_logits: Tensor, valid: Tensor) -> Tensor:
    """[B] log p of the gold under the softmax over [gold, valid negatives] of the given logits
    (invalid negatives leave the softmax): the log-likelihood of eq. 5/11."""
    negatives = negative_logits.masked_fill(~valid, float("-inf"))
    logits = torch.cat([positive_logits.unsqueeze(1), negatives], dim=1)
    return logits[:, 0] - torch.logsumexp(logits, dim=1)
