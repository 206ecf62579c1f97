"""Contrastive losses (docs/math.md), one per module, built by name with ``build_loss``.

Every loss is an ``nn.Module`` called as
``loss(positive_scores [B], negative_scores [B, K], valid [B, K] | None, log_q [B, K] | None)``
and returns a scalar; entries with ``valid=False`` never contribute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from hnce.mining.losses.binary_nce import BinaryNCELoss
from hnce.mining.losses.focal import FocalLoss
from hnce.mining.losses.nce import NCELoss
from hnce.mining.losses.negative_sampling import NegativeSamplingLoss
from hnce.mining.losses.sampled_softmax import SampledSoftmaxLoss
from hnce.mining.losses.triplet import TripletLoss
from hnce.mining.registry import build_by_name

LOSSES: dict[str, Callable[..., nn.Module]] = {
    "nce": NCELoss,
    "sampled-softmax": SampledSoftmaxLoss,
    "binary-nce": BinaryNCELoss,
    "negative-sampling": NegativeSamplingLoss,
    "triplet": TripletLoss,
    "focal": FocalLoss,
}


def build_loss(name: str = "nce", **options: Any) -> nn.Module:
    """A loss by name: nce (default, eq. 5/11) | sampled-softmax (eq. 10) | binary-nce |
    negative-sampling | triplet | focal. ``options`` are the loss's constructor arguments."""
    return build_by_name("loss", LOSSES, name, options)


__all__ = [
    "LOSSES",
    "BinaryNCELoss",
    "FocalLoss",
    "NCELoss",
    "NegativeSamplingLoss",
    "SampledSoftmaxLoss",
    "TripletLoss",
    "build_loss",
]
