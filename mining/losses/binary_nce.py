"""Binary NCE with the log(k·q) correction (Dyer 2014; Mnih & Teh 2012)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hnce.mining.losses.base import ContrastiveLoss, ScoredNegatives


class BinaryNCELoss(ContrastiveLoss):
    """Logistic discrimination of the gold against k noise samples (Dyer 2014, the NCE objective):

    p(D=1 | x, y) = σ(s(x,y) − log(k·q(y)))
    J = −log σ(s(x,y) − log(k q(y))) − Σ_j log(1 − σ(s(x,y_j) − log(k q(y_j))))

    with k the number of valid negatives of the mention. Unlike negative sampling this is
    consistent: at the optimum s(x,y) → log p(y|x) (self-normalised). The noise distribution q
    is unconditional in Dyer's derivation; the gold's log q(y) is taken as the mean of its
    row's valid negative ``log_q`` (exact for uniform noise) unless ``num_entities`` is given,
    in which case q is uniform 1/M for every entity and ``log_q`` may be omitted.

    Inputs: positive_scores [B], negative_scores [B, K], valid [B, K], log_q [B, K].
    Returns the mean over mentions of J.
    """

    def __init__(self, num_entities: int | None = None) -> None:
        super().__init__()
        self.num_entities = num_entities

    def loss(self, scored: ScoredNegatives) -> Tensor:
        positive_scores, negative_scores, log_q = scored.positive, scored.negative, scored.log_q
        weights = scored.weights
        k = weights.sum(dim=1).clamp_min(1.0)
        if self.num_entities is not None:
            log_q = torch.full_like(negative_scores, -math.log(self.num_entities))
        elif log_q is None:
            raise ValueError(
                f"{__file__}: binary-nce needs log_q from the sampler or num_entities= (uniform q)"
            )
        log_q = log_q.to(negative_scores.dtype)
        positive_log_q = (log_q * weights).sum(dim=1) / k
        log_k = k.log()
        positive_logit = positive_scores - (log_k + positive_log_q)
        negative_logit = negative_scores - (log_k.unsqueeze(1) + log_q)
        loss = -F.logsigmoid(positive_logit) - (F.logsigmoid(-negative_logit) * weights).sum(dim=1)
        return loss.mean()
