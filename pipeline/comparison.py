"""Paired comparison of two recipes' recall: the difference, its 95% confidence interval, and the
smallest difference the comparison could have detected.

Both recipes are evaluated on the same mentions, once per seed, the seeds paired (the same data;
a seed changes only the order, the draws and dropout). The statistic is the mean over seeds and
mentions of ``hit_a - hit_b`` at a cutoff k. Its spread comes from a two-level bootstrap
(Efron & Tibshirani, *An Introduction to the Bootstrap*, ch. 6; the hierarchical form resamples
seeds and mentions independently, the same mentions for every seed since all seeds share them):
the confidence interval is the 2.5th and 97.5th percentiles of the resampled means. With one
seed it is the paired bootstrap over mentions alone. The minimum detectable difference is the
true difference a two-sided 5% test would find with 80% power, ``(z_0.975 + z_0.8) · se``
(about 2.8 standard errors), se the resampled means' standard deviation: a difference smaller
than it may well exist and go unseen.

Example::

    hits_a = np.array([[1, 0, 1], [1, 1, 1]], bool)   # [seeds, mentions] at one k
    hits_b = np.array([[0, 0, 1], [1, 0, 1]], bool)
    paired_difference(hits_a, hits_b).interval          # (low, high)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: z_0.975 + z_0.8: a two-sided 5% test that finds this many standard errors 80% of the time
DETECTABLE_Z = 1.959964 + 0.841621
REPLICATES = 2000


@dataclass(frozen=True)
class PairedDifference:
    """Mean of ``a - b`` over seeds and mentions, its 95% interval and minimum detectable size."""

    mean: float
    low: float
    high: float
    standard_error: float
    seeds: int
    mentions: int

    @property
    def interval(self) -> tuple[float, float]:
        return self.low, self.high

    @property
    def detectable(self) -> float:
        """The minimum detectable difference (5% two-sided, 80% power)."""
        return DETECTABLE_Z * self.standard_error

    @property
    def verdict(self) -> str:
        """``above 0``, ``below 0`` or ``includes 0``: where the interval lies."""
        if self.low > 0:
            return "above 0"
        if self.high < 0:
            return "below 0"
        return "includes 0"

    def cell(self) -> str:
        """``+0.012 [+0.004, +0.020]``: the mean and its interval, for a table."""
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def paired_difference(
    hits_a: np.ndarray, hits_b: np.ndarray, replicates: int = REPLICATES, seed: int = 0
) -> PairedDifference:
    """The paired difference of two hit matrices [seeds, mentions] (or [mentions]) at one k."""
    a = np.atleast_2d(np.asarray(hits_a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(hits_b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired hits differ in shape: {a.shape} and {b.shape}")
    seeds, mentions = a.shape
    if mentions == 0:
        raise ValueError("no mentions to compare")
    difference = a - b
    rng = np.random.default_rng(seed)
    means = np.empty(replicates)
    for replicate in range(replicates):
        rows = rng.integers(0, seeds, seeds) if seeds > 1 else np.zeros(1, dtype=np.int64)
        columns = rng.integers(0, mentions, mentions)
        # mean over the resampled seeds of each seed's mean over the resampled mentions
        means[replicate] = difference[rows][:, columns].mean()
    low, high = np.percentile(means, [2.5, 97.5])
    return PairedDifference(
        float(difference.mean()), float(low), float(high), float(means.std(ddof=1)), seeds, mentions
    )
