"""MoCo's momentum queue in the worker loop (He et al. 2020).

A momentum copy of the entity tower (and its projection) follows the trained one by the EMA
θ_k ← m·θ_k + (1 − m)·θ_q after every optimizer step (MoCo eq. 2, ``mining.momentum_update``).
After each micro-batch it encodes the batch's candidate entities (no gradient, eval mode) and
pushes their vectors into a FIFO :class:`~hnce.mining.samplers.MomentumQueue` of ``size`` entries.
Before each micro-batch the queue's vectors join the step's candidates as extra negative columns
(``ContrastiveBatch.queue_vectors``): a queued entity is a negative of every mention for which it
is not a known positive, and its column carries no gradient. The NCE of eq. 5/11 is then over
the sampled negatives and the queue.

Memory per worker: the queue's keys, ``size × d × 4`` bytes (float32; 4096 × 384 × 4 = 6 MiB
for MiniLM), its ids (``size × 8`` bytes), and one copy of the entity tower. One vector per
entity: the dual scorer only (refused for others at config load). The queue and the momentum
tower are not checkpointed: a resumed run restarts the tower from the checkpoint's entity tower
with an empty queue.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from hnce.encoders.biencoder import BiEncoder
from hnce.mining.samplers import MomentumQueue, SamplingRequest, momentum_update
from hnce.pipeline.train.batch import ContrastiveBatch


def entity_side(model: BiEncoder) -> nn.ModuleList:
    """The modules that make an entity vector: the entity tower and its projection, if any."""
    projection = [model.entity_projection] if model.entity_projection is not None else []
    return nn.ModuleList([model.entity_tower, *projection])


class MomentumEntityQueue:
    """A momentum entity tower and the queue of vectors it fills; see the module docstring."""

    def __init__(self, model: BiEncoder, size: int, momentum: float, num_entities: int) -> None:
        self.model = model
        self.num_entities = num_entities
        self.momentum = momentum
        self.tower = copy.deepcopy(entity_side(model)).eval().requires_grad_(False)
        self.queue = MomentumQueue(model.output_size, size)

    @property
    def memory_bytes(self) -> int:
        """The queue's float32 keys: size × d × 4 bytes."""
        return self.queue.embeddings.numel() * 4

    def attach(self, batch: ContrastiveBatch, positives: Sequence[set[int]]) -> ContrastiveBatch:
        """``batch`` with the queue's vectors [Q, 1, d] as extra columns, valid [B, Q] where the
        queued entity is not one of the mention's ``positives`` (catalogue ids, gold included)."""
        request = SamplingRequest(
            gold=batch.entity_ids[batch.gold].cpu(),
            positives=[set(p) for p in positives],
            num_entities=self.num_entities,
            num_negatives=0,
        )
        keys, _, valid = self.queue.negatives(request)
        return dataclasses.replace(batch, queue_vectors=keys[:, None, :], queue_valid=valid)

    @torch.no_grad()
    def enqueue(self, batch: ContrastiveBatch) -> None:
        """Encode ``batch``'s candidates with the momentum tower and push them into the queue."""
        tower, *projection = self.tower
        hidden, mask = self.model.encode_with(
            tower,
            projection[0] if projection else None,
            batch.candidates["input_ids"],
            batch.candidates["attention_mask"],
        )
        vectors, _ = self.model.scorer.reduce_entities(hidden, mask)
        self.queue.enqueue(batch.entity_ids.cpu(), vectors[:, 0].float().cpu())

    def follow(self) -> None:
        """The EMA step of the momentum tower toward the trained entity side (after a step)."""
        momentum_update(self.tower, entity_side(self.model), self.momentum)
