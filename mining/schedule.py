"""Sampler options as functions of the training step (``negatives.schedule``, docs/math.md eq. (59)).

A curriculum of hardness: start on easy (random) negatives and let the share of hard ones grow
(Zhang & Stratos (2021) §6.3 compare fixed mixed-p shares; ANCE and RocketQA warm up on BM25 or
random negatives before hard ones), or anneal the hard sampler's temperature τ of eq. 8 from flat
to sharp. A schedule is a piecewise-linear function of the optimizer step given by its points
``[[step, value], ...]``; it is a pure function of the step, so a resumed run draws with the
values an uninterrupted run would (every random draw stays seeded by step and rank).

Example::

    schedule = SamplerSchedule(hard_fraction_by_step=[(0, 0.0), (200, 0.5)])
    schedule.options_at(100)           # {"hard_fraction": 0.25}
    schedule.apply(MixedSampler(), 300)  # MixedSampler(hard_fraction=0.5, ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import pairwise
from typing import Annotated, Any

from pydantic import Field, field_validator

from hnce.settings import NonNegativeInt, Real, settings

Points = Annotated[list[tuple[NonNegativeInt, Real]], Field(min_length=1)]

#: Each key of ``negatives.schedule`` and the sampler field it sets.
SCHEDULED_FIELDS = {
    "hard_fraction_by_step": "hard_fraction",
    "sampling_temperature_by_step": "temperature",
}


def piecewise_linear(points: Sequence[tuple[int, float]], step: int) -> float:
    """The value at ``step`` of the piecewise-linear function through ``points`` (steps strictly
    increasing): the first value before the first point, the last after the last (a single
    point is a constant, two points a linear ramp, two points one step apart a step)."""
    if step <= points[0][0]:
        return float(points[0][1])
    for (start, begin), (end, finish) in pairwise(points):
        if step <= end:
            share = (step - start) / (end - start)
            return float(begin * (1 - share) + finish * share)  # exact at both ends
    return float(points[-1][1])


@settings
class SamplerSchedule:
    """``negatives.schedule``: sampler options that follow the training step.

    Each key gives the points ``[[step, value], ...]`` of one sampler option (steps strictly
    increasing, values linearly interpolated between them, held before the first and after the
    last; :data:`SCHEDULED_FIELDS` names the sampler field each sets); None keeps the recipe's
    fixed option.

    Attributes:
        hard_fraction_by_step: points ``[[step, p], ...]`` of the ``mixed`` sampler's share of
            hard negatives p by step (``negatives.mixed.hard_fraction`` when unset).
        sampling_temperature_by_step: points ``[[step, τ_h], ...]`` of the ``hard`` and
            ``mixed`` samplers' τ_h of eq. 8 by step (``negatives.hard.sampling_temperature``
            when unset).
    """

    hard_fraction_by_step: Points | None = None
    sampling_temperature_by_step: Points | None = None

    @field_validator("hard_fraction_by_step", "sampling_temperature_by_step")
    @classmethod
    def _steps_increase(cls, points: Points | None) -> Points | None:
        steps = [step for step, _ in points or []]
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ValueError("steps must strictly increase")
        return points

    @field_validator("hard_fraction_by_step")
    @classmethod
    def _fractions(cls, points: Points | None) -> Points | None:
        if any(not 0.0 <= value <= 1.0 for _, value in points or []):
            raise ValueError("every hard fraction must lie in [0, 1]")
        return points

    @field_validator("sampling_temperature_by_step")
    @classmethod
    def _positive(cls, points: Points | None) -> Points | None:
        if any(value <= 0.0 for _, value in points or []):
            raise ValueError("every sampling temperature must be > 0")
        return points

    @property
    def scheduled(self) -> list[str]:
        """The keys of this schedule that are set."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def options_at(self, step: int) -> dict[str, float]:
        """Each scheduled sampler field's value at optimizer step ``step``."""
        return {
            SCHEDULED_FIELDS[key]: piecewise_linear(getattr(self, key), step)
            for key in self.scheduled
        }

    def apply(self, sampler: Any, step: int) -> Any:
        """``sampler`` (a dataclass) with its scheduled fields set to their values at ``step``;
        the sampler itself when nothing is scheduled."""
        options = self.options_at(step)
        return dataclasses.replace(sampler, **options) if options else sampler
