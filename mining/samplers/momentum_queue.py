"""MoCo momentum queue: recent entity embeddings reused as extra negatives (“Hard Negative Mining in NLP”, 2020)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, admissible, take_first


class MomentumQueue:
    """FIFO queue of the last ``size`` entity embeddings (from a momentum encoder, He et al.
    2020), scored against each mention as extra negatives at no encoding cost.

    ``enqueue`` pushes detached embeddings with their entity ids; ``negatives`` returns the
    queue newest first with a per-mention mask that drops empty slots, the mention's gold and
    known positives, and older copies of an entity queued twice. ``sample`` is the
    :class:`~hnce.mining.samplers.NegativeSampler` view: the K newest admissible queued ids (id -1 /
    ``valid=False`` when the queue holds fewer). Pair with :func:`momentum_update`.

    Example::

        queue = MomentumQueue(dim=64, size=4096)
        queue.enqueue(gold_ids, momentum_entity_embeddings)
        keys, ids, valid = queue.negatives(request)   # [Q, d], [Q], [B, Q]
        extra_scores = (mention_vectors @ keys.T).masked_fill(~valid, float("-inf"))
    """

    def __init__(self, dim: int, size: int) -> None:
        if size <= 0 or dim <= 0:
            raise ValueError(f"{__file__}: queue dim and size must be > 0, got {dim}, {size}")
        self.embeddings = torch.zeros(size, dim)
        self.ids = torch.full((size,), -1, dtype=torch.long)
        self.position = 0

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    def enqueue(self, entity_ids: Tensor, embeddings: Tensor) -> None:
        """Push [M] ids and [M, d] embeddings, overwriting the oldest entries."""
        if embeddings.shape != (entity_ids.shape[0], self.embeddings.shape[1]):
            raise ValueError(
                f"{__file__}: embeddings must be [{entity_ids.shape[0]}, "
                f"{self.embeddings.shape[1]}], got {tuple(embeddings.shape)}"
            )
        entity_ids, embeddings = entity_ids[-self.size :], embeddings[-self.size :]
        slots = (self.position + torch.arange(entity_ids.shape[0])) % self.size
        self.embeddings[slots] = embeddings.detach().to(self.embeddings)
        self.ids[slots] = entity_ids.long().cpu()
        self.position = int((self.position + entity_ids.shape[0]) % self.size)

    def newest_first(self) -> Tensor:
        """Slot indices [size], newest entry first."""
        return (self.position - 1 - torch.arange(self.size)) % self.size

    def negatives(self, request: SamplingRequest) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings [Q, d], entity ids [Q], valid [B, Q]), newest first."""
        order = self.newest_first()
        ids = self.ids[order]
        valid = admissible(request, ids.unsqueeze(0).expand(request.batch_size, -1).clone())
        return self.embeddings[order], ids, valid

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        _, ids, valid = self.negatives(request)
        rows = ids.unsqueeze(0).expand(request.batch_size, -1)
        out, out_valid, _ = take_first(rows, valid, request.num_negatives)
        return SampledNegatives(ids=out, valid=out_valid)


@torch.no_grad()
def momentum_update(target: nn.Module, source: nn.Module, momentum: float = 0.999) -> None:
    """MoCo key-encoder update θ_k ← m·θ_k + (1 − m)·θ_q (parameters matched by order)."""
    for key_param, query_param in zip(target.parameters(), source.parameters(), strict=True):
        key_param.mul_(momentum).add_(query_param.detach(), alpha=1.0 - momentum)
