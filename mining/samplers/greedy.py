"""Greedy hard negatives: the K highest-scoring non-positive candidates (Gillick et al. 2019)."""

from __future__ import annotations

from dataclasses import dataclass

from hnce.mining.samplers.base import (
    SampledNegatives,
    SamplingRequest,
    admissible,
    candidates_of,
    gumbel_top_k,
)
from hnce.mining.samplers.spec import SamplerSpec


@dataclass
class GreedySampler:
    """Top-K admissible candidates by score: the τ → 0 limit of eq. 8 (Zhang & Stratos (2021) §3.1).

    Deterministic, so ``log_q`` is None. Rows with fewer than K admissible candidates are padded
    with id -1 and ``valid=False``.
    """

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        ids, scores = candidates_of(request, "greedy")
        keep = admissible(request, ids, scores)
        logits = scores.double().masked_fill(~keep, float("-inf"))
        columns, valid = gumbel_top_k(logits, request.num_negatives, None, noise=False)
        return SampledNegatives(ids=ids.gather(1, columns).masked_fill(~valid, -1), valid=valid)


SPEC = SamplerSpec(
    name="greedy",
    sampler=GreedySampler,
    candidates="index",
    build=lambda negatives, num_entities: GreedySampler(),
)
