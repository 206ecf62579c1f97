"""In-batch negatives: the golds of the other mentions in the batch (“Hard Negative Mining in NLP”, 2020)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, admissible, take_first
from hnce.mining.samplers.spec import SamplerSpec


@dataclass
class InBatchSampler:
    """K negatives per mention from the other mentions' golds, in random order.

    Golds that are a known positive of the mention (or its own gold, or a repeat) are skipped;
    with a batch too small to supply K distinct admissible golds the row is padded with id -1
    and ``valid=False``. Free (no extra entity encodings) but the negatives follow the gold
    distribution and their number is capped by the batch size.
    """

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        batch = request.batch_size
        golds = request.gold.long().cpu().unsqueeze(0).expand(batch, -1)
        order = torch.rand((batch, batch), generator=request.generator).argsort(dim=1)
        shuffled = golds.gather(1, order)
        keep = admissible(request, shuffled)
        ids, valid, _ = take_first(shuffled, keep, request.num_negatives)
        return SampledNegatives(ids=ids, valid=valid)


SPEC = SamplerSpec(
    name="in-batch",
    sampler=InBatchSampler,
    build=lambda negatives, num_entities: InBatchSampler(),
)
