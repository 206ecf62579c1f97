"""The one contrastive training step of hnce: encode, score, loss from ``hnce.mining.losses``, update.

Both trainable models, the bi-encoder (``hnce train``) and the joint reranker (``hnce rerank``),
go through it. The model's ``score_matrix`` gives scores [B, C] of a
:class:`~hnce.pipeline.train.batch.ContrastiveBatch` (the bi-encoder scores every pair, the
cross-encoder only the pairs the loss reads), and the loss is the configured one over each
mention's gold and its valid candidates; with the default ``nce`` it is exactly the paper's
hard-negative NCE (eq. 5/11):

    J = −log exp s(x,y) / (exp s(x,y) + Σ_{k valid} exp s(x,y_k)).

Which candidates are valid is ``negatives.share`` (:mod:`hnce.pipeline.train.batch`). Under
``global`` the bi-encoder's candidate side (the scorer's entity-side reduction) and the entity
ids are gathered from every worker between encoding and scoring (RocketQA's cross-batch
negatives): a mention is scored against every worker's candidates, gradients flow only to this
worker's (the others' are constants), and DeepSpeed averages the workers' gradients as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import deepspeed
import torch
from torch import Tensor, nn

from hnce.encoders.biencoder import with_extra_entities
from hnce.pipeline.train.batch import ContrastiveBatch
from hnce.pipeline.train.distributed import Collectives


class ScoringModel(Protocol):
    """What the step trains: a model with the shared scoring call."""

    def score_matrix(
        self,
        mention_batch: Mapping[str, Tensor],
        candidate_batch: Mapping[str, Tensor],
        pairs: Tensor,
        chunk_size: int = 0,
    ) -> Tensor: ...


class GatheringModel(ScoringModel, Protocol):
    """A model whose candidate side can be gathered between encoding and scoring (a bi-encoder
    with an indexable scorer: the entity-side vectors do not depend on the mention)."""

    scorer: nn.Module

    def mention_side(self, mention_batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]: ...

    def candidate_side(
        self, candidate_batch: Mapping[str, Tensor], chunk_size: int = 0
    ) -> tuple[Tensor, Tensor]: ...


class ContrastiveScoring(nn.Module):
    """The module DeepSpeed wraps: ``forward`` is the model's ``score_matrix`` with the run's
    ``training.candidate_chunk_size``; with ``gather`` (``negatives.share: global``) the
    candidate side is gathered from every worker first, and the scores' columns are every
    worker's candidates in rank order."""

    def __init__(
        self, model: nn.Module, chunk_size: int = 0, gather: Collectives | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.gather = gather

    def forward(
        self,
        mentions: Mapping[str, Tensor],
        candidates: Mapping[str, Tensor],
        pairs: Tensor,
        queue_vectors: Tensor | None = None,
    ) -> Tensor:
        if self.gather is None and queue_vectors is None:  # the reranker takes no queue
            return self.model.score_matrix(mentions, candidates, pairs, self.chunk_size)
        if self.gather is None:
            return self.model.score_matrix(
                mentions, candidates, pairs, self.chunk_size, queue_vectors
            )
        model: GatheringModel = self.model
        mention_vectors, mention_kept = model.mention_side(mentions)
        entity_vectors, entity_kept = model.candidate_side(candidates, self.chunk_size)
        entity_vectors, _ = self.gather.all_gather_rows(entity_vectors)
        entity_kept, _ = self.gather.all_gather_rows(entity_kept)
        entity_vectors, entity_kept = with_extra_entities(
            entity_vectors, entity_kept, queue_vectors
        )
        return model.scorer.score_reduced(
            mention_vectors, mention_kept, entity_vectors, entity_kept
        )


def contrastive_loss(scores: Tensor, batch: ContrastiveBatch, loss: nn.Module) -> Tensor:
    """``loss`` (a :mod:`hnce.mining.losses` module) of scores [B, C] (or [B, C + Q] with a queue):
    each mention's gold column is its positive, its ``valid`` columns its negatives (with
    ``log_q`` where the sampler gives it), then its ``queue_valid`` columns (log q = 0)."""
    positive = scores.gather(1, batch.gold[:, None]).squeeze(1)
    valid, log_q = batch.valid, batch.log_q
    if batch.queue_valid is not None:
        valid = torch.cat([valid, batch.queue_valid], dim=1)
        log_q = (
            None
            if log_q is None
            else torch.cat([log_q, log_q.new_zeros(batch.queue_valid.shape)], 1)
        )
    return loss(positive, scores, valid, log_q)


def train_micro_batch(
    engine: deepspeed.DeepSpeedEngine, batch: ContrastiveBatch, loss: nn.Module
) -> float:
    """Forward, loss, backward and DeepSpeed's step (which applies the optimizer only at a
    gradient-accumulation boundary) for one micro-batch already on the engine's device; when
    the engine's :class:`ContrastiveScoring` gathers (``share: global``), the loss is over every
    worker's candidate columns (then the queue's, with a momentum queue)."""
    scores = engine(batch.mentions, batch.candidates, batch.scored_pairs, batch.queue_vectors)
    scores = scores.float()
    if engine.module.gather is not None:
        batch = batch.across_workers(*engine.module.gather.all_gather_rows(batch.entity_ids))
    value = contrastive_loss(scores, batch, loss)
    engine.backward(value)
    engine.step()
    return float(value.detach())
