"""ANCE negatives: uniform over the top-N candidates of the current index (Xiong et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hnce.mining.samplers.base import (
    SampledNegatives,
    SamplingRequest,
    admissible_candidates,
    draw_ids,
)
from hnce.mining.samplers.spec import SamplerSpec


@dataclass
class AnceSampler:
    """K distinct negatives uniformly from the ``top_n`` highest-scoring admissible candidates
    of the (asynchronously refreshed) index, as ANCE does; ``top_n=None`` uses every candidate.

    ``log_q = −log n`` with n the admissible candidates kept. Rows with fewer than K of them are
    padded with id -1 and ``valid=False``.
    """

    top_n: int | None = None

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        ids, scores, keep = admissible_candidates(request, "ance")
        if self.top_n is not None and self.top_n < ids.shape[1]:
            ranked = scores.double().masked_fill(~keep, float("-inf"))
            top = ranked.topk(self.top_n, dim=1).indices
            in_top = torch.zeros_like(keep).scatter(1, top, True)
            keep &= in_top
        logits = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
        logits = logits.masked_fill(~keep, float("-inf"))
        out, valid, _ = draw_ids(ids, logits, request.num_negatives, request.generator)
        count = keep.sum(dim=1, keepdim=True).clamp_min(1).double()
        log_q = (-count.log()).float().expand_as(out).masked_fill(~valid, 0.0)
        return SampledNegatives(ids=out, valid=valid, log_q=log_q)


SPEC = SamplerSpec(
    name="ance",
    sampler=AnceSampler,
    candidates="index",
    build=lambda negatives, num_entities: AnceSampler(),
)
