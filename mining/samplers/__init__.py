"""Negative samplers behind one interface (docs/math.md).

``build_sampler(name, **options)`` builds any of them by name; each lives in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hnce.mining.registry import build_by_name
from hnce.mining.samplers.ance import AnceSampler
from hnce.mining.samplers.base import NegativeSampler, SampledNegatives, SamplingRequest
from hnce.mining.samplers.greedy import GreedySampler
from hnce.mining.samplers.hard import HardSampler
from hnce.mining.samplers.in_batch import InBatchSampler
from hnce.mining.samplers.lexical import LexicalSampler
from hnce.mining.samplers.mixed import MixedSampler, hard_count
from hnce.mining.samplers.momentum_queue import MomentumQueue, momentum_update
from hnce.mining.samplers.ohem import OhemSampler
from hnce.mining.samplers.random import RandomSampler

SAMPLERS: dict[str, Callable[..., NegativeSampler]] = {
    "random": RandomSampler,
    "hard": HardSampler,
    "greedy": GreedySampler,
    "mixed": MixedSampler,
    "in-batch": InBatchSampler,
    "ance": AnceSampler,
    "lexical": LexicalSampler,
    "ohem": OhemSampler,
    "momentum-queue": MomentumQueue,
}


def _adversarial(**options: Any) -> NegativeSampler:
    from hnce.mining.adversarial import AdversarialSampler

    return AdversarialSampler(**options)


SAMPLERS["adversarial"] = _adversarial


def build_sampler(name: str, **options: Any) -> NegativeSampler:
    """A sampler by name: random | hard | greedy | mixed | in-batch | ance | lexical | ohem |
    momentum-queue | adversarial. ``options`` are the sampler's constructor arguments (e.g.
    ``build_sampler("mixed", hard_fraction=0.5)``)."""
    return build_by_name("sampler", SAMPLERS, name, options)


__all__ = [
    "SAMPLERS",
    "AnceSampler",
    "GreedySampler",
    "HardSampler",
    "InBatchSampler",
    "LexicalSampler",
    "MixedSampler",
    "MomentumQueue",
    "NegativeSampler",
    "OhemSampler",
    "RandomSampler",
    "SampledNegatives",
    "SamplingRequest",
    "build_sampler",
    "hard_count",
    "momentum_update",
]
