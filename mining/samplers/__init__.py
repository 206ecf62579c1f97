"""Negative samplers behind one interface (docs/math.md, "Negatives"), each declared once.

Every sampler module here ends with a ``SPEC`` (:class:`~hnce.mining.samplers.spec.SamplerSpec`);
:data:`SAMPLER_SPECS` collects them by name when the package is imported, so a new sampler is a
new module and nothing else. ``build_sampler(name, **options)`` builds a sampler by name with its
constructor's arguments, for use outside a recipe.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from hnce.mining.registry import build_by_name
from hnce.mining.samplers.base import NegativeSampler, SampledNegatives, SamplingRequest
from hnce.mining.samplers.spec import (
    LocalScores,
    LossColumns,
    ModelScoredSampler,
    SamplerSpec,
    TrainerSampler,
)

_NOT_SAMPLERS = {"base", "spec"}


def _collect_specs() -> dict[str, SamplerSpec]:
    specs: dict[str, SamplerSpec] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name in _NOT_SAMPLERS:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, SamplerSpec):
            raise TypeError(
                f"{module.__file__}: a sampler module must end with SPEC = SamplerSpec(...)"
            )
        if spec.name in specs:
            raise TypeError(f"{module.__file__}: sampler {spec.name!r} is declared twice")
        specs[spec.name] = spec
    return dict(sorted(specs.items()))


SAMPLER_SPECS: dict[str, SamplerSpec] = _collect_specs()


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
