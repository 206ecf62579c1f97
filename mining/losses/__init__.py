"""Contrastive losses (docs/math.md), one per module, built by name with ``build_loss``.

Every loss is an ``nn.Module`` called as
``loss(positive_scores [B], negative_scores [B, K], valid [B, K] | None, log_q [B, K] | None)``
and returns a scalar; entries with ``valid=False`` never contribute.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from hnce.mining.losses.binary_nce import BinaryNCELoss
from hnce.mining.losses.focal import FocalLoss
from hnce.mining.losses.nce import NCELoss
from hnce.mining.losses.negative_sampling import NegativeSamplingLoss
from hnce.mining.losses.positive_aware import PositiveAwareMask
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


#: the temperature a loss divides scores by when its recipe sets none: cosine scores (bounded by
#: 1) need a sharp softmax, sentence-transformers' scale 20; inner products are already scaled
COSINE_TEMPERATURE = 0.05


def takes_temperature(name: str) -> bool:
    """Whether loss ``name`` divides its scores by a temperature (nce, sampled-softmax, focal)."""
    return "temperature" in inspect.signature(LOSSES[name]).parameters


def loss_options(name: str, temperature: float | None, cosine: bool) -> dict[str, float]:
    """The arguments a recipe gives loss ``name``: its ``temperature`` (``loss.temperature``;
    unset, :data:`COSINE_TEMPERATURE` for ``cosine`` scores and 1 for inner products) when it
    has one. Its other arguments (triplet's ``margin``, focal's ``gamma``, sampled-softmax's
    ``sample_size_correction``) keep their defaults in a recipe: no measured figure moved them."""
    if not takes_temperature(name):
        return {}
    if temperature is None:
        temperature = COSINE_TEMPERATURE if cosine else 1.0
    return {"temperature": temperature}


def build_loss(name: str = "nce", positive_aware: float | None = None, **options: Any) -> nn.Module:
    """A loss by name: nce (default, eq. 5/11) | sampled-softmax (eq. 10) | binary-nce |
    negative-sampling | triplet | focal. ``options`` are the loss's constructor arguments;
    ``positive_aware``: wrapped in the positive-aware mask at that fraction of the gold score."""
    loss = build_by_name("loss", LOSSES, name, options)
    return loss if positive_aware is None else PositiveAwareMask(loss, positive_aware)


__all__ = [
    "LOSSES",
    "BinaryNCELoss",
    "FocalLoss",
    "NCELoss",
    "NegativeSamplingLoss",
    "PositiveAwareMask",
    "SampledSoftmaxLoss",
    "TripletLoss",
    "build_loss",
    "loss_options",
    "takes_temperature",
]
