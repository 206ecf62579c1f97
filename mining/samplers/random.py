"""Global uniform negatives over the whole catalogue (Zhang & Stratos (2021) §6.3; docs/math.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, take_first
from hnce.mining.samplers.spec import SamplerSpec

# Below this many entities an exact draw (one key per entity) is cheaper than rejection.
EXACT_DRAW_MAX_ENTITIES = 1 << 16


def _log_eligible(num_entities: int, exclusions: list[set[int]]) -> Tensor:
    """log of the number of admissible entities per mention [B] (float)."""
    counts = [num_entities - sum(1 for e in excl if 0 <= e < num_entities) for excl in exclusions]
    return torch.tensor([math.log(c) if c > 0 else 0.0 for c in counts], dtype=torch.float32)


def _exact(num_entities: int, exclusions: list[set[int]], k: int, generator) -> Tensor:
    """[B, min(k, M)] distinct ids: a uniformly random ordering of each row's admissible set."""
    keys = torch.rand((len(exclusions), num_entities), generator=generator)
    for row, excl in enumerate(exclusions):
        inside = [e for e in excl if 0 <= e < num_entities]
        if inside:
            keys[row, inside] = -1.0
    values, ids = keys.topk(min(k, num_entities), dim=1)
    return ids.masked_fill(values < 0, -1)


def uniform_distinct(
    num_entities: int,
    exclusions: list[set[int]],
    k: int,
    generator: torch.Generator | None,
    shared: bool = False,
) -> tuple[Tensor, Tensor]:
    """K distinct ids per row uniformly from 0..M-1 minus that row's ``exclusions``.

    Rejection from iid draws keeps the first K distinct admissible ids (a uniform random
    K-subset in random order); small catalogues are drawn exactly. With ``shared=True`` one
    pool of ``K + max|exclusions|`` distinct ids is drawn for the batch and each row keeps its
    first K admissible ones (batchwise sampling, TensorFlow's candidate-sampling note), so rows share almost all negatives.
    Returns (ids [B, K] with -1 padding, valid [B, K]).
    """
    batch = len(exclusions)
    if shared and batch > 0:
        widest = max(len(e) for e in exclusions)
        pool = uniform_distinct(num_entities, [set()], k + widest, generator)[0]
        ids = pool.expand(batch, -1)
        keep = ids >= 0
        for row, excl in enumerate(exclusions):
            if excl:
                keep[row] &= ~torch.isin(ids[row], torch.tensor(sorted(excl)))
        out, valid, _ = take_first(ids, keep.clone(), k)
        return out, valid
    widest = max((len(e) for e in exclusions), default=0)
    if num_entities <= max(EXACT_DRAW_MAX_ENTITIES, 4 * (k + widest)):
        ids = _exact(num_entities, exclusions, k, generator)
        out, valid, _ = take_first(ids, ids >= 0, k)
        return out, valid
    out = torch.full((batch, k), -1, dtype=torch.long)
    valid = torch.zeros((batch, k), dtype=torch.bool)
    pending = list(range(batch))
    draws = 2 * (k + widest) + 16
    while pending:
        ids = torch.randint(num_entities, (len(pending), draws), generator=generator)
        keep = torch.ones_like(ids, dtype=torch.bool)
        for row, mention in enumerate(pending):
            if exclusions[mention]:
                keep[row] &= ~torch.isin(ids[row], torch.tensor(sorted(exclusions[mention])))
        # First occurrence only: sort-based duplicate detection per row.
        sorted_ids, order = ids.sort(dim=1, stable=True)
        dup = torch.zeros_like(keep)
        dup[:, 1:] = sorted_ids[:, 1:] == sorted_ids[:, :-1]
        keep &= ~torch.zeros_like(keep).scatter(1, order, dup)
        got, got_valid, _ = take_first(ids, keep, k)
        done = got_valid.all(dim=1)
        rows = torch.tensor(pending)
        out[rows[done]] = got[done]
        valid[rows[done]] = True
        pending = [m for m, d in zip(pending, done.tolist(), strict=True) if not d]
        draws *= 2
    return out, valid


@dataclass
class RandomSampler:
    """Uniform negatives over the whole catalogue, distinct, never a positive.

    Global uniform sampling (not in-batch) is what Zhang & Stratos (2021) §6.3 uses for random negatives:
    "sampled uniformly at random from all entities in training data". ``shared=True`` draws one
    set for the whole batch (batchwise sampling, TensorFlow's candidate-sampling note), each mention dropping its own
    positives from it. ``log_q = −log |admissible entities|`` (uniform proposal, eq. 10).
    If the catalogue holds fewer than K admissible entities, the rest of the row is
    ``valid=False`` with id -1.

    Example::

        sampler = RandomSampler()
        out = sampler.sample(SamplingRequest(gold=torch.tensor([3]), positives=[{3}],
                                             num_entities=1000, num_negatives=8))
    """

    shared: bool = False

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        exclusions = request.exclusions()
        ids, valid = uniform_distinct(
            request.num_entities,
            exclusions,
            request.num_negatives,
            request.generator,
            shared=self.shared,
        )
        log_q = -_log_eligible(request.num_entities, exclusions)
        log_q = log_q.unsqueeze(1).expand(-1, request.num_negatives).clone()
        return SampledNegatives(ids=ids, valid=valid, log_q=log_q.masked_fill(~valid, 0.0))


SPEC = SamplerSpec(
    name="random",
    sampler=RandomSampler,
    build=lambda negatives, num_entities: RandomSampler(),
)
