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

One optimizer step (:func:`train_step`) is ``gradient_accumulation`` such micro-batches on the
DeepSpeed engine :func:`start_engine` starts; the micro-batches come from wherever the caller
draws them (a worker's: :meth:`hnce.pipeline.train.negatives.TrainingData.micro_batches`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from torch import Tensor, nn

from hnce.encoders.biencoder import with_extra_entities
from hnce.pipeline.config import TrainingSettings
from hnce.pipeline.train.batch import ContrastiveBatch
from hnce.pipeline.train.checkpointing import use_weights_only_loading
from hnce.pipeline.train.deepspeed_config import build_deepspeed_config
from hnce.pipeline.train.distributed import Collectives

logger = logging.getLogger(__name__)


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
    worker's candidates in rank order; with ``keep_candidates`` (``negatives.cache``) this
    worker's candidate side is kept, detached, in ``candidate_vectors`` for the negative cache
    (:mod:`hnce.pipeline.train.trainer_cache`)."""

    def __init__(
        self,
        model: nn.Module,
        chunk_size: int = 0,
        gather: Collectives | None = None,
        keep_candidates: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.gather = gather
        self.keep_candidates = keep_candidates
        self.candidate_vectors: Tensor | None = None

    def forward(
        self,
        mentions: Mapping[str, Tensor],
        candidates: Mapping[str, Tensor],
        pairs: Tensor,
        queue_vectors: Tensor | None = None,
    ) -> Tensor:
        sides_apart = self.gather is not None or self.keep_candidates
        if not sides_apart and queue_vectors is None:  # the reranker takes no queue
            return self.model.score_matrix(mentions, candidates, pairs, self.chunk_size)
        if not sides_apart:
            return self.model.score_matrix(
                mentions, candidates, pairs, self.chunk_size, queue_vectors
            )
        model: GatheringModel = self.model
        mention_vectors, mention_kept = model.mention_side(mentions)
        entity_vectors, entity_kept = model.candidate_side(candidates, self.chunk_size)
        if self.keep_candidates:
            self.candidate_vectors = entity_vectors.detach()
        if self.gather is not None:
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


def train_step(
    engine: deepspeed.DeepSpeedEngine, micro_batches: Iterable[ContrastiveBatch], loss: nn.Module
) -> tuple[float, list[str]]:
    """One optimizer step: :func:`train_micro_batch` on each of ``micro_batches`` (already on
    the engine's device; DeepSpeed applies the optimizer after the last of the step's
    ``gradient_accumulation``); the mean of their losses and the mentions they held, in order.
    Each micro-batch is taken from ``micro_batches`` only once the one before is trained."""
    mention_ids: list[str] = []
    losses = []
    for batch in micro_batches:
        mention_ids += batch.mention_ids
        losses.append(train_micro_batch(engine, batch, loss))
    return sum(losses) / len(losses), mention_ids


def skip_shared_memory_op() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op (``deepspeed_shm_comm``).

    DeepSpeed's CPU backend JIT-loads that op at every process group it starts, under torch's
    lock file ``<torch extensions>/deepspeed_shm_comm/lock``. A process killed while it holds
    the lock (a worker lost mid-start: the fault tests kill them on purpose) leaves the file,
    and every later DeepSpeed start on the machine waits on it for ever. The op serves only
    ``deepspeed.comm.inference_all_reduce``, which training never calls, so it is marked
    incompatible and no start loads it. GPU accelerators have no such op: nothing changes
    there."""
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def flush_subnormal_floats() -> None:
    """Flush subnormal floats to zero in this process (x86's FTZ/DAZ, ``torch.set_flush_denormal``).

    Once a batch is well separated, the contrastive loss's gradients (and Adam's squared
    moments) underflow below fp32's smallest normal number (~1.2e-38), and a CPU computes on
    such subnormal numbers many times slower: sum-of-max with random negatives took 239.5 s for
    30 steps instead of 24.3 s on 2 threads (``benchmarks/subnormal_flush.py``). The flag is per
    thread and torch's intra-op threads take it from the thread that starts them, so it is set
    before the worker's first step. Zero instead of a subnormal changes
    no weight: added to weights of fp32 precision, such a value is far below their last bit."""
    if not torch.set_flush_denormal(True):
        logger.warning("this CPU cannot flush subnormal floats to zero: steps may slow down")


def start_engine(
    model: nn.Module,
    settings: TrainingSettings,
    device: torch.device,
    gather: Collectives | None = None,
    keep_candidates: bool = False,
) -> deepspeed.DeepSpeedEngine:
    """``deepspeed.initialize`` of the step's module on the worker's device, loading weights-only;
    ``gather``: the worker's collectives when candidates are shared across workers;
    ``keep_candidates``: keep each micro-batch's candidate vectors (the negative cache).

    A lone worker whose optimizer is torch's own (ZeRO 0, fp32) has no gradient to average:
    DeepSpeed's averaging would still flatten every gradient into buckets and copy it back each
    step (0.1 s of the demo's 1.6 s step on 2 cores), so it is switched off there."""
    module = ContrastiveScoring(model, settings.candidate_chunk_size, gather, keep_candidates)
    skip_shared_memory_op()
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=build_deepspeed_config(settings, device),
    )
    use_weights_only_loading(engine)
    if engine.dp_world_size == 1 and isinstance(engine.optimizer, torch.optim.Optimizer):
        engine.enable_backward_allreduce = False
    return engine
