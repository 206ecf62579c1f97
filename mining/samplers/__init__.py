"""Negative samplers behind one interface (docs/math.md, "Negatives"), each declared once.

Every sampler module here ends with a ``SPEC`` (:class:`~hnce.mining.samplers.spec.SamplerSpec`);
:data:`SAMPLER_SPECS` collects them by name when the package is imported, so a new sampler is a
new module and nothing else. ``build_sampler(name, **options)`` builds a sampler by name with its
constructor's arguments, for use outside a recipe.
"""

from __future__ import annotations

from typing import Any

from hnce.mining.registry import build_by_name, collect_specs
from hnce.mining.samplers.base import NegativeSampler, SampledNegatives, SamplingRequest
from hnce.mining.samplers.spec import (
    LocalScores,
    LossColumns,
    ModelScoredSampler,
    SamplerSpec,
    TrainerSampler,
)

SAMPLER_SPECS: dict[str, SamplerSpec] = collect_specs(
    __name__, __path__, SamplerSpec, "sampler", frozenset({"base", "spec"})
)


def build_sampler(name: str, **options: Any) -> TrainerSampler:
    """A sampler by name with its constructor's ``options`` (e.g.
    ``build_sampler("mixed", hard_fraction=0.5)``)."""
    return build_by_name(
        "sampler", {name: spec.sampler for name, spec in SAMPLER_SPECS.items()}, name, options
    )


__all__ = [
    "SAMPLER_SPECS",
    "LocalScores",
    "LossColumns",
    "ModelScoredSampler",
    "NegativeSampler",
    "SampledNegatives",
    "SamplerSpec",
    "SamplingRequest",
    "TrainerSampler",
    "build_sampler",
]
