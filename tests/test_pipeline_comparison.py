"""The paired comparison of two recipes' hits (``hnce.pipeline.comparison``): its mean, its
interval where the answer is known, and the detectable difference that more mentions shrink."""

from __future__ import annotations

import numpy as np
import pytest

from hnce.pipeline.comparison import DETECTABLE_Z, paired_difference


def test_identical_runs_differ_by_exactly_zero_with_a_zero_width_interval() -> None:
    hits = np.random.default_rng(0).random((5, 300)) < 0.6
    paired = paired_difference(hits, hits)
    assert (paired.mean, paired.low, paired.high, paired.detectable) == (0.0, 0.0, 0.0, 0.0)
    assert paired.verdict == "includes 0"


def test_a_uniform_gain_is_its_own_mean_and_an_interval_above_zero() -> None:
    rng = np.random.default_rng(1)
    baseline = rng.random((5, 2000)) < 0.5
    better = baseline | (rng.random((5, 2000)) < 0.1)  # ~5% more hits, never fewer
    paired = paired_difference(better, baseline)
    assert paired.mean == pytest.approx((better.mean() - baseline.mean()), abs=1e-12)
    assert 0 < paired.low < paired.mean < paired.high
    assert paired.verdict == "above 0"
    assert paired_difference(baseline, better).verdict == "below 0"
    assert paired.detectable == pytest.approx(DETECTABLE_Z * paired.standard_error)


def test_the_interval_covers_the_binomial_one_of_a_single_seed_and_shrinks_with_mentions() -> None:
    """One seed: the paired bootstrap over mentions, whose standard error is the discordant
    pairs' binomial one, sqrt(var(d) / M)."""
    rng = np.random.default_rng(2)
    widths = []
    for mentions in (400, 4000):
        a = rng.random(mentions) < 0.6
        b = rng.random(mentions) < 0.55
        paired = paired_difference(a, b, replicates=4000)
        difference = a.astype(float) - b
        assert paired.standard_error == pytest.approx(
            difference.std(ddof=1) / np.sqrt(mentions), rel=0.1
        )
        widths.append(paired.high - paired.low)
    assert widths[1] < widths[0] / 2.5  # ~sqrt(10) narrower


def test_hits_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        paired_difference(np.ones((2, 3), bool), np.ones((3, 3), bool))
