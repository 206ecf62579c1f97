"""Hard negatives from the model distribution without replacement (Zhang & Stratos (2021) eq. 8)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hnce.mining.samplers.base import (
    SampledNegatives,
    SamplingRequest,
    admissible_candidates,
    draw_ids,
)
from hnce.mining.samplers.spec import SamplerSpec
from hnce.settings import PositiveReal, settings


@dataclass
class HardSampler:
    """K distinct negatives drawn without replacement with probability ∝ exp(s(x, y)/τ),
    excluding the gold and every known positive (Zhang & Stratos (2021) eq. 8, docs/math.md).

    Drawn by Gumbel-top-K: add iid Gumbel noise to ``score/τ`` and keep the K largest — exactly
    the successive-sampling (Plackett-Luce) distribution of eq. 8 restricted to the admissible
    set. The admissible set is the request's index candidates (top-N of the current index
    version), or the whole catalogue when ``candidate_scores`` covers every entity
    (``candidate_ids=None``), in which case the draw is exact. Candidates with ``-inf`` score,
    negative id, a positive id or a repeated id are never drawn; with fewer than K admissible
    candidates the row is padded with id -1 and ``valid=False``.

    ``log_q`` is the single-draw log-probability log softmax(score/τ) over the admissible
    candidates (the without-replacement inclusion probability has no closed form).

    Args:
        temperature: τ; τ → 0 approaches greedy top-K, τ → ∞ uniform over the candidates.
    """

    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"{__file__}: temperature must be > 0, got {self.temperature}")

    def logits(
        self, request: SamplingRequest, sampler: str = "hard"
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(candidate ids [B, N], admissible [B, N], logits score/τ [B, N] of eq. 8, ``-inf``
        off the admissible set); ``sampler`` names the caller in errors."""
        ids, scores, keep = admissible_candidates(request, sampler)
        return ids, keep, (scores.double() / self.temperature).masked_fill(~keep, float("-inf"))

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        ids, _, logits = self.logits(request)
        out, valid, columns = draw_ids(ids, logits, request.num_negatives, request.generator)
        log_probs = torch.log_softmax(logits, dim=1).nan_to_num(nan=0.0, neginf=0.0)
        log_q = log_probs.gather(1, columns).float().masked_fill(~valid, 0.0)
        return SampledNegatives(ids=out, valid=valid, log_q=log_q)


@settings
class HardOptions:
    """``negatives.hard``: the hard sampler's options (also those of ``mixed``'s hard part).

    Attributes:
        sampling_temperature: τ_h of eq. 8, which the stored scores are divided by when hard
            negatives are drawn (not the loss's ``loss.temperature``): small, nearly the top-K;
            large, nearly uniform over the candidates.
    """

    sampling_temperature: PositiveReal = 1.0


SPEC = SamplerSpec(
    name="hard",
    sampler=HardSampler,
    options=HardOptions,
    candidates="index",
    build=lambda negatives, num_entities: HardSampler(negatives.hard.sampling_temperature),
)
