"""Online hard-example mining in the worker (OHEM, Shrivastava et al. 2016).

The index's scores are those of the checkpoint that mined them, steps behind the model being
trained. OHEM here takes each mention's top ``pool_size`` admissible index candidates (by the
index's score: a bounded pool), rescores them with the current model
(:class:`~hnce.pipeline.train.model_scores.CurrentModelScores`, no gradient, on the worker's device)
and keeps the K it scores highest: the negatives with the highest loss under eq. 5/11 now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from hnce.mining.samplers import GreedySampler, OhemSampler, SampledNegatives, SamplingRequest

LocalScores = Callable[[Tensor], Tensor]
"""Sampler-space entity ids [B, P] (≥ 0) -> the current model's scores [B, P]."""


@dataclass
class OnlineHardExamples:
    """The K highest-scoring (current model) of each mention's top ``pool_size`` candidates."""

    pool_size: int

    def sample_scored(self, request: SamplingRequest, scores: LocalScores) -> SampledNegatives:
        sampler = OhemSampler(
            pool_size=self.pool_size,
            base=GreedySampler(),
            score_fn=lambda _gold, ids: scores(ids),
        )
        return sampler.sample(request)
