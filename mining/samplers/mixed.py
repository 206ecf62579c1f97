"""Mixed-p negatives: p% hard (eq. 8), the rest uniform (Zhang & Stratos (2021) §6.3, default p = 50)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, take_first
from hnce.mining.samplers.hard import HardSampler
from hnce.mining.samplers.random import uniform_distinct
from hnce.mining.samplers.spec import SamplerSpec
from hnce.settings import Fraction, settings


def hard_count(hard_fraction: float, num_negatives: int) -> int:
    """Number of hard negatives: round(p·K) with halves rounded up (floor(p·K + 0.5)), so
    p = 0.5, K = 1 gives one hard negative and p = 0.5, K = 7 gives four."""
    return min(num_negatives, math.floor(hard_fraction * num_negatives + 0.5))


@dataclass
class MixedSampler:
    """Exactly ``hard_count(p, K)`` hard negatives (eq. 8, Gumbel-top-K over the candidates)
    followed by uniform negatives over the whole catalogue, all distinct and never positive.

    The random part excludes the hard negatives already drawn. If a mention has fewer than
    ``hard_count`` admissible candidates, the missing hard slots are filled with random
    negatives (``fill_with_random=True``, the default; ``hard`` marks which entries are hard)
    or left ``valid=False``. ``log_q`` is the per-slot mixture
    log((k_h·q_hard(y) + k_r·q_random(y)) / K), with q_hard the single-draw softmax over the
    candidates and q_random uniform (for eq. 10).

    Args:
        hard_fraction: p in [0, 1].
        temperature: τ of the hard part.
        fill_with_random: fill missing hard slots with random negatives.
    """

    hard_fraction: float = 0.5
    temperature: float = 1.0
    fill_with_random: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.hard_fraction <= 1.0:
            raise ValueError(
                f"{__file__}: hard_fraction must be in [0, 1], got {self.hard_fraction}"
            )

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        k = request.num_negatives
        k_hard = hard_count(self.hard_fraction, k)
        batch = request.batch_size
        if k_hard > 0:
            hard = HardSampler(self.temperature).sample(replace(request, num_negatives=k_hard))
            hard_ids, hard_valid = hard.ids, hard.valid
        else:
            hard_ids = torch.full((batch, 0), -1, dtype=torch.long)
            hard_valid = torch.zeros((batch, 0), dtype=torch.bool)
        exclusions = request.exclusions()
        for row in range(batch):
            exclusions[row] |= set(hard_ids[row][hard_valid[row]].tolist())
        random_ids, random_valid = uniform_distinct(
            request.num_entities, exclusions, k, request.generator
        )
        # Hard slots first; random negatives fill the rest (and missing hard slots, if allowed).
        if self.fill_with_random:
            pool = torch.cat([hard_ids.cpu(), random_ids], dim=1)
            keep = torch.cat([hard_valid.cpu(), random_valid], dim=1)
            ids, valid, source = take_first(pool, keep, k)
            is_hard = valid & (source < k_hard)
        else:
            rand_ids, rand_valid, _ = take_first(random_ids, random_valid, k - k_hard)
            ids = torch.cat([hard_ids.cpu(), rand_ids], dim=1)
            valid = torch.cat([hard_valid.cpu(), rand_valid], dim=1)
            is_hard = torch.zeros_like(valid)
            is_hard[:, :k_hard] = hard_valid.cpu()
        log_q = self._log_q(request, ids, valid, k_hard)
        return SampledNegatives(ids=ids, valid=valid, log_q=log_q, hard=is_hard)

    def _log_q(
        self,
        request: SamplingRequest,
        ids: torch.Tensor,
        valid: torch.Tensor,
        k_hard: int,
    ) -> torch.Tensor:
        k = request.num_negatives
        if k == 0:
            return torch.zeros_like(ids, dtype=torch.float32)
        eligible = torch.tensor(
            [
                max(1, request.num_entities - sum(1 for e in ex if 0 <= e < request.num_entities))
                for ex in request.exclusions()
            ],
            dtype=torch.float64,
        )
        q_random = (1.0 / eligible).unsqueeze(1).expand(-1, k)
        q_hard = torch.zeros_like(q_random)
        if k_hard > 0:
            cand_ids, keep, logits = HardSampler(self.temperature).logits(request, "mixed")
            probs = torch.softmax(logits, dim=1).nan_to_num(nan=0.0).cpu()
            if request.candidate_ids is None:
                q_hard = probs.gather(1, ids.clamp_min(0))
            else:
                match = ids.unsqueeze(2) == cand_ids.cpu().masked_fill(~keep.cpu(), -2).unsqueeze(1)
                q_hard = (match.double() * probs.unsqueeze(1)).sum(dim=2)
        mixture = (k_hard * q_hard + (k - k_hard) * q_random) / k
        return mixture.clamp_min(1e-300).log().float().masked_fill(~valid, 0.0)


@settings
class MixedOptions:
    """``negatives.mixed``: the mixed sampler's options.

    Attributes:
        hard_fraction: the share p of the K negatives that are hard (eq. 8, at
            ``negatives.hard.sampling_temperature``), the rest random (Zhang & Stratos' mixed-p).
    """

    hard_fraction: Fraction = 0.5


SPEC = SamplerSpec(
    name="mixed",
    sampler=MixedSampler,
    options=MixedOptions,
    candidates="index",
    build=lambda negatives, num_entities: MixedSampler(
        hard_fraction=negatives.mixed.hard_fraction, temperature=negatives.hard.sampling_temperature
    ),
)
