"""How old the vectors of the hard negatives a trainer drew were: what the payoff trigger reads
(:mod:`hnce.cluster.compute.refresh.triggers.payoff`) and the step log reports.

A hard negative's age is the steps since the vector it was scored by was computed: a negative
cache row's age (:mod:`hnce.pipeline.train.trainer_cache`), or the lag of the negatives version
it was mined from. :class:`NegativeFreshness` keeps running totals; each reader opens its own
:class:`DrawWindow` and takes what was drawn since its last look.

Example::

    freshness = NegativeFreshness()
    window = freshness.window()
    freshness.observe(hard, ages)          # after each micro-batch: flags [B, K], ages [B, K]
    window.take().mean_age                 # at a checkpoint: the mean age since the last take
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: a hard negative counts as fresh when its vector is younger than this many steps
FRESH_STEPS = 10


@dataclass(frozen=True)
class DrawnNegatives:
    """Counts of the hard negatives drawn over some steps: ``hard`` of them, ``fresh`` those whose
    vectors were younger than :data:`FRESH_STEPS` steps, and ``age_sum`` the sum of the ages
    (steps) of the ``aged`` ones whose vector's age is known."""

    hard: int = 0
    fresh: int = 0
    aged: int = 0
    age_sum: int = 0

    def __add__(self, more: DrawnNegatives) -> DrawnNegatives:
        return DrawnNegatives(
            self.hard + more.hard,
            self.fresh + more.fresh,
            self.aged + more.aged,
            self.age_sum + more.age_sum,
        )

    def __sub__(self, earlier: DrawnNegatives) -> DrawnNegatives:
        return DrawnNegatives(
            self.hard - earlier.hard,
            self.fresh - earlier.fresh,
            self.aged - earlier.aged,
            self.age_sum - earlier.age_sum,
        )

    @property
    def fresh_share(self) -> float | None:
        """The share of the hard negatives that were fresh (None when none was drawn)."""
        return self.fresh / self.hard if self.hard else None

    @property
    def mean_age(self) -> float | None:
        """The mean age in steps of the hard negatives' vectors (None when none is known)."""
        return self.age_sum / self.aged if self.aged else None


class NegativeFreshness:
    """How old the vectors of the hard negatives drawn so far were (a cache row's age, or the lag
    of the negatives version they were mined from), as running totals; each reader keeps its own
    :meth:`window` of them (the step log's, the refresh policy's)."""

    def __init__(self) -> None:
        self.totals = DrawnNegatives()

    def observe(self, hard: Tensor, ages: Tensor) -> None:
        """Hard-negative flags [B, K] and the age of each negative's vector [B, K] (-1: none)."""
        known = hard & (ages >= 0)
        counts = torch.stack(  # one read of the four counts a micro-batch, not four
            [
                hard.sum(),
                (known & (ages < FRESH_STEPS)).sum(),
                known.sum(),
                torch.where(known, ages, 0).sum(),
            ]
        ).tolist()
        self.totals = self.totals + DrawnNegatives(*counts)

    def window(self) -> DrawWindow:
        """A reader's view that counts from now on."""
        return DrawWindow(self, self.totals)


@dataclass
class DrawWindow:
    """One reader's counts of :class:`NegativeFreshness`: :meth:`take` returns what was drawn since
    its previous call (or since the window was opened)."""

    freshness: NegativeFreshness
    mark: DrawnNegatives

    def take(self) -> DrawnNegatives:
        """The hard negatives drawn since the last call."""
        now = self.freshness.totals
        drawn, self.mark = now - self.mark, now
        return drawn
