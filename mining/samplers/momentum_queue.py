"""MoCo's momentum queue (He et al. 2020): recent entity vectors reused as extra negatives
(docs/math.md, eqs. (37)–(38)).

:class:`MomentumQueue` is the FIFO of vectors itself. :class:`MomentumEntityQueue` is what the
trainer runs with ``negatives.sampler: momentum-queue``: a momentum copy of the entity tower
(and its projection) follows the trained one by the EMA θ_k ← m·θ_k + (1 − m)·θ_q after every
optimizer step (MoCo eq. 2, :func:`momentum_update`); after each micro-batch it encodes the
batch's candidate entities (no gradient, eval mode) and pushes their vectors into the queue;
before each micro-batch the queue's vectors join the step's candidates as extra negative columns
(:meth:`MomentumEntityQueue.columns`): a queued entity is a negative of every mention for which
it is not a known positive, and its column carries no gradient. The NCE of eq. 5/11 is then over
the sampled negatives (random) and the queue.

Memory per worker: the queue's keys, ``size × d × 4`` bytes (float32; 4096 × 384 × 4 = 6 MiB
for MiniLM), its ids (``size × 8`` bytes), and one copy of the entity tower. One vector per
entity: the dual scorer only. The queue and the momentum tower are not checkpointed: a resumed
run restarts the tower from the checkpoint's entity tower with an empty queue.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, admissible, take_first
from hnce.mining.samplers.random import RandomSampler
from hnce.mining.samplers.spec import SamplerSpec
from hnce.settings import PositiveInt, settings

if TYPE_CHECKING:  # a type only: importing samplers must not pull in transformers
    from hnce.encoders.biencoder import BiEncoder

#: m of the momentum tower's update θ_k ← m·θ_k + (1 − m)·θ_q: MoCo's value (He et al. 2020,
#: whose ablation found 0.99 to 0.9999 alike and smaller values worse); no figure here moved it.
MOMENTUM = 0.999


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
def momentum_update(target: nn.Module, source: nn.Module, momentum: float = MOMENTUM) -> None:
    """MoCo key-encoder update θ_k ← m·θ_k + (1 − m)·θ_q (parameters matched by order)."""
    for key_param, query_param in zip(target.parameters(), source.parameters(), strict=True):
        key_param.mul_(momentum).add_(query_param.detach(), alpha=1.0 - momentum)


def entity_side(model: BiEncoder) -> nn.ModuleList:
    """The modules that make an entity vector: the entity tower and its projection, if any."""
    projection = [model.entity_projection] if model.entity_projection is not None else []
    return nn.ModuleList([model.entity_tower, *projection])


class MomentumEntityQueue:
    """A momentum entity tower and the queue of vectors it fills (the trainer's
    :class:`~hnce.mining.samplers.spec.LossColumns` for ``momentum-queue``; module docstring)."""

    def __init__(
        self, model: BiEncoder, size: int, num_entities: int, momentum: float = MOMENTUM
    ) -> None:
        self.model = model
        self.num_entities = num_entities
        self.momentum = momentum
        self.tower = copy.deepcopy(entity_side(model)).eval().requires_grad_(False)
        self.queue = MomentumQueue(model.output_size, size)

    @property
    def memory_bytes(self) -> int:
        """The queue's float32 keys: size × d × 4 bytes."""
        return self.queue.embeddings.numel() * 4

    def columns(self, gold: Tensor, positives: list[set[int]]) -> tuple[Tensor, Tensor]:
        """The queue's vectors [Q, 1, d] and valid [B, Q]: where the queued entity is not one
        of the mention's ``positives`` (catalogue ids) nor its ``gold``."""
        request = SamplingRequest(
            gold=gold.cpu(),
            positives=[set(p) for p in positives],
            num_entities=self.num_entities,
            num_negatives=0,
        )
        keys, _, valid = self.queue.negatives(request)
        return keys[:, None, :], valid

    @torch.no_grad()
    def observe(self, entity_ids: Tensor, input_ids: Tensor, attention_mask: Tensor) -> None:
        """Encode a micro-batch's candidates with the momentum tower and push them."""
        tower, *projection = self.tower
        hidden, mask = self.model.encode_with(
            tower, projection[0] if projection else None, input_ids, attention_mask
        )
        vectors, _ = self.model.scorer.reduce_entities(hidden, mask)
        self.queue.enqueue(entity_ids.cpu(), vectors[:, 0].float().cpu())

    def after_step(self) -> None:
        """The EMA step of the momentum tower toward the trained entity side."""
        momentum_update(self.tower, entity_side(self.model), self.momentum)


@settings
class MomentumQueueOptions:
    """``negatives.momentum_queue``: the momentum queue's options; the K sampled negatives of
    each mention are random.

    Attributes:
        size: entity vectors the FIFO queue holds, from a momentum copy of the entity tower
            (momentum :data:`MOMENTUM`), each a negative column of every mention: size × d × 4
            bytes per worker.
    """

    size: PositiveInt = 4096


SPEC = SamplerSpec(
    name="momentum-queue",
    sampler=MomentumQueue,
    options=MomentumQueueOptions,
    build=lambda negatives, num_entities: RandomSampler(),
    loss_columns=lambda model, negatives, num_entities: MomentumEntityQueue(
        model, negatives.momentum_queue.size, num_entities
    ),
    resumes_exactly=False,
)
