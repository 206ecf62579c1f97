"""Online hard example mining: keep the highest-loss negatives of a larger draw (“Hard Negative Mining in NLP”, 2020)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from hnce.mining.samplers.ance import AnceSampler
from hnce.mining.samplers.base import (
    NegativeSampler,
    SampledNegatives,
    SamplingRequest,
    candidates_of,
    draw_ids,
)
from hnce.mining.samplers.greedy import GreedySampler
from hnce.mining.samplers.spec import LocalScores, SamplerSpec
from hnce.settings import PositiveInt, settings

ScoreFn = Callable[[Tensor, Tensor], Tensor]
"""(gold [B], negative ids [B, P]) -> current-model scores s(x, y) [B, P]."""


@dataclass
class OhemSampler:
    """Draw ``pool_size`` negatives with ``base``, score them with the current model, keep the K
    with the highest loss (OHEM, Shrivastava et al. 2016).

    For every loss in :mod:`hnce.mining.losses` a negative's loss contribution increases with its
    score s(x, y_k) (the gold fixed), so "highest loss" is "highest current score". Scores come
    from ``score_fn`` (a callback running the model being trained, e.g. the trainer's
    bi-encoder on the pool); without one, the request's index ``candidate_scores`` are used,
    which requires the pool to come from the candidates (the default base, uniform over the
    index's top-N like ANCE). Rows with fewer than K valid pool entries are padded with id -1
    and ``valid=False``. Deterministic given the pool, so ``log_q`` is None.

    Args:
        pool_size: the larger draw, ≥ K.
        base: sampler of the pool (default :class:`AnceSampler`).
        score_fn: scoring callback; None = index candidate scores.
    """

    pool_size: int = 32
    base: NegativeSampler = field(default_factory=AnceSampler)
    score_fn: ScoreFn | None = None

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        k = request.num_negatives
        pool = self.base.sample(replace(request, num_negatives=max(self.pool_size, k)))
        safe_ids = pool.ids.clamp_min(0)
        if self.score_fn is not None:
            scores = self.score_fn(request.gold, safe_ids).detach().double()
        else:
            scores = self._index_scores(request, pool.ids)
        scores = scores.masked_fill(~pool.valid.to(scores.device), float("-inf")).cpu()
        ids, valid, _ = draw_ids(pool.ids, scores, k, None, noise=False)
        return SampledNegatives(ids=ids, valid=valid)

    def sample_scored(self, request: SamplingRequest, scores: LocalScores) -> SampledNegatives:
        """:meth:`sample` with the current model's ``scores`` of the pool (in the trainer, where
        the index's scores are those of an older checkpoint)."""
        return replace(self, score_fn=lambda _gold, ids: scores(ids)).sample(request)

    @staticmethod
    def _index_scores(request: SamplingRequest, ids: Tensor) -> Tensor:
        cand_ids, cand_scores = candidates_of(request, "ohem")
        match = ids.unsqueeze(2).to(cand_ids.device) == cand_ids.unsqueeze(1)
        found = match.any(dim=2)
        picked = torch.where(match, cand_scores.double().unsqueeze(1), float("-inf")).amax(dim=2)
        return picked.masked_fill(~found, float("-inf"))


@settings
class OhemOptions:
    """``negatives.ohem``: the OHEM sampler's options.

    Attributes:
        pool_size: each mention's top index candidates the current model rescores, keeping the
            K it scores highest (the negatives with the highest loss now).
    """

    pool_size: PositiveInt = 32


SPEC = SamplerSpec(
    name="ohem",
    sampler=OhemSampler,
    options=OhemOptions,
    candidates="index",
    scores_online=True,
    build=lambda negatives, num_entities: OhemSampler(
        pool_size=negatives.ohem.pool_size, base=GreedySampler()
    ),
)
