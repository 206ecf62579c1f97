"""Greedy hard negatives: the K highest-scoring non-positive candidates (Gillick et al. 2019)."""

from __future__ import annotations

from dataclasses import dataclass

from hnce.mining.samplers.base import (
    SampledNegatives,
    SamplingRequest,
    admissible_candidates,
    draw_ids,
)
from hnce.mining.samplers.spec import SamplerSpec


@dataclass
class GreedySampler:
    """Top-K admissible candidates by score: the τ → 0 limit of eq. 8 (Zhang & Stratos (2021) §3.1).

    Deterministic, so ``log_q`` is None. Rows with fewer than K admissible candidates are padded
    with id -1 and ``valid=False``.
    """

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        ids, scores, keep = admissible_candidates(request, "greedy")
        logits = scores.double().masked_fill(~keep, float("-inf"))
        out, valid, _ = draw_ids(ids, logits, request.num_negatives, None, noise=False)
        return SampledNegatives(ids=out, valid=valid)


SPEC = SamplerSpec(
    name="greedy",
    sampler=GreedySampler,
    candidates="index",
    build=lambda negatives, num_entities: GreedySampler(),
)
