"""A worker's negative cache (``negatives.cache.enabled``; :mod:`hnce.mining.negative_cache`,
Lindgren et al. 2021): where its hard candidates come from instead of the mined lists.

- Placement: one cache in each trainer process, on the worker's device, over the entity space
  its drawer draws from (the training mentions' domains). Every rank writes the same rows in the
  same order (each micro-batch's entity ids and vectors are all-gathered first), so every rank
  holds the same cache and no rank waits on another to search it. docs/negatives.md states the
  memory (rows x vectors an entity x d x bytes) and ``hnce plan`` prints it for the recipe.
- Filling: whenever the worker switches to a negatives version (``TrainingData.switch``), the
  cache takes the index version of the same number (``<run>/index/v<N>``, what that version was
  mined from) where its rows are older than the version's checkpoint (:meth:`fill_from`).
- Searching: before a micro-batch is drawn, its mentions are encoded by the current weights
  (eval mode, no gradient: B mention-tower passes, beside the step's B·(K+1) entity passes) and
  the top ``refresh.top_n`` rows under the scorer are the mentions' candidates
  (:meth:`candidates`).
- Scoring whole (``whole_catalogue``): every written row is a constant negative column of every
  mention's softmax, but the step's own candidates and the mention's known positives
  (:meth:`catalogue_columns`).
- Writing: after each micro-batch, the entity vectors its forward computed (the scorer's entity
  side, detached: :class:`~hnce.pipeline.train.step.ContrastiveScoring` keeps them) replace their
  rows (:meth:`observe`); with ``refresh_rows`` > 0 the oldest rows are re-encoded after each
  optimizer step, split over the ranks (:meth:`refresh_oldest`).
- Resuming: a checkpoint keeps the rows steps wrote since the last fill (beside the DeepSpeed
  state: :data:`~hnce.cluster.stores.checkpoints.NEGATIVE_CACHE_FILE`), and a resumed worker puts
  them back before its first switch refills the rest, so it draws what an uninterrupted run
  would (:meth:`save`, :meth:`restore`). The file has one reader, which checks its content
  (:mod:`hnce.cluster.stores.checkpoint_cache`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from hnce.cluster.stores.checkpoint_cache import cache_rows_path, read_cache_rows, write_cache_rows
from hnce.cluster.stores.index_store import INDEX_DIR, IndexStore
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.encoders.biencoder import BiEncoder
from hnce.errors import InputError
from hnce.events import RunEvent
from hnce.mining.negative_cache import NegativeCache
from hnce.pipeline.config import Config
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.current_scores import eval_mode
from hnce.pipeline.train.deepspeed_config import use_bf16
from hnce.pipeline.train.distributed import Collectives

logger = logging.getLogger(__name__)


class CandidateVectors(Protocol):
    """Whatever keeps the entity side of the last micro-batch's forward (the step's
    :class:`~hnce.pipeline.train.step.ContrastiveScoring` with ``keep_candidates``)."""

    candidate_vectors: Tensor | None


class TrainerCache:
    """The negative cache of one worker (module docs) over the entity space ``space``
    (catalogue ids, one cache row each), searched and written with ``model``."""

    def __init__(
        self,
        cache: NegativeCache,
        space: Tensor,
        num_catalogue: int,
        model: BiEncoder,
        mentions: MentionTokens,
        store: TokenStore,
        index_root: Path,
        collectives: Collectives,
        top_n: int,
        scoring: CandidateVectors,
        refresh_rows: int = 0,
        whole_catalogue: bool = False,
    ) -> None:
        self.cache = cache
        self.space = space.long().cpu()
        self.to_row = torch.full((num_catalogue,), -1, dtype=torch.long)
        self.to_row[self.space] = torch.arange(len(self.space))
        self.model = model
        self.mentions = mentions
        self.store = store
        self.index_root = Path(index_root)
        self.collectives = collectives
        self.top_n = top_n
        self.scoring = scoring
        self.refresh_rows = refresh_rows
        self.whole_catalogue = whole_catalogue
        self.filled_version = -1

    @classmethod
    def build(
        cls,
        config: Config,
        model: BiEncoder,
        space: np.ndarray,
        num_catalogue: int,
        mentions: MentionTokens,
        store: TokenStore,
        collectives: Collectives,
        device: torch.device,
        scoring: CandidateVectors,
    ) -> TrainerCache:
        """The cache ``negatives.cache`` describes, empty, on ``device``, for ``model``'s scorer
        (one with a fixed number of vectors an entity: not sum-of-max), written with what
        ``scoring`` keeps of each micro-batch."""
        per_entity = model.scorer.vectors_per_entity
        if per_entity is None:
            raise InputError(
                f"negatives.cache: scorer {model.scorer.config.name!r} keeps a varying number of "
                f"vectors an entity, which a cache of fixed rows cannot hold (dual, multi-m and "
                f"poly can)"
            )
        options = config.negatives.cache
        # rows at the precision the towers compute them in: no more is known of a vector
        dtype = torch.bfloat16 if use_bf16(config.training, device) else torch.float32
        cache = NegativeCache(len(space), per_entity, model.output_size, dtype, device)
        logger.info(
            "rank %d: negative cache of %d entities x %d x %d (%s) on %s: %.1f MiB",
            collectives.rank,
            len(space),
            per_entity,
            model.output_size,
            dtype,
            device,
            cache.memory_bytes / 2**20,
        )
        return cls(
            cache,
            torch.from_numpy(np.asarray(space, dtype=np.int64)),
            num_catalogue,
            model,
            mentions,
            store,
            Path(config.run_dir) / INDEX_DIR,
            collectives,
            config.refresh.top_n,
            scoring,
            options.refresh_rows,
            options.whole_catalogue,
        )

    @property
    def empty(self) -> bool:
        return self.cache.empty

    def fill_from(self, version: int, step: int, log: EventLog | None) -> None:
        """Fill the cache from index version ``version`` (module docs), at optimizer ``step``,
        logging a ``negative_cache`` event."""
        started = time.perf_counter()
        store = IndexStore(self.index_root)
        if version not in store.versions():
            # the initial negatives from BM25 (negatives.initial: lexical) have no index: the
            # cache fills from the steps alone until a refresh publishes vectors
            logger.warning(
                "negative cache: negatives v%d has no index version in %s to fill from; the "
                "cache keeps what the steps wrote",
                version,
                self.index_root,
            )
            if log is not None:
                log.write(RunEvent.NEGATIVE_CACHE, step=step, version=version, replaced=0)
            return
        opened = store.open(version)
        checkpoint_step = max(0, opened.checkpoint or 0)
        replaced = 0
        for entity_ids, vectors in opened.entity_vectors():
            rows = self.to_row[torch.tensor(entity_ids)]
            inside = rows >= 0
            replaced += self.cache.fill(
                rows[inside], torch.from_numpy(vectors)[inside], checkpoint_step
            )
        self.filled_version = version
        seconds = time.perf_counter() - started
        if log is not None:
            log.write(
                RunEvent.NEGATIVE_CACHE,
                step=step,
                version=version,
                checkpoint_step=checkpoint_step,
                replaced=replaced,
                seconds=seconds,
            )
        logger.info(
            "negative cache: %d of %d rows from index v%d (checkpoint %d) in %.1f s",
            replaced,
            self.cache.num_rows,
            version,
            checkpoint_step,
            seconds,
        )

    @torch.no_grad()
    def candidates(self, rows: np.ndarray) -> tuple[Tensor, Tensor]:
        """The cached top ``top_n`` of the training mentions at ``rows`` under the current weights:
        catalogue ids [B, N] (-1 where fewer rows were ever written) and scores [B, N]."""
        device = self.cache.vectors.device
        batch = {k: v.to(device) for k, v in self.mentions.batch(rows).items()}
        with eval_mode(self.model):
            vectors, kept = self.model.mention_side(batch)
        found, scores = self.cache.top_candidates(
            vectors, kept, self.model.scorer.score_reduced, self.top_n
        )
        ids = torch.where(found >= 0, self.space[found.clamp(min=0)], -1)
        return ids, scores

    def catalogue_columns(
        self, candidate_ids: Tensor, positives: list[set[int]]
    ) -> tuple[Tensor, Tensor]:
        """The whole cache as loss columns of a micro-batch whose candidates are the catalogue
        ids ``candidate_ids`` [C] and whose mentions' known positives are ``positives``:
        vectors [rows, b, d] and valid [B, rows] (:meth:`NegativeCache.catalogue_columns`)."""
        own = self.to_row[candidate_ids.long().cpu().clamp(min=0)]
        own = own.masked_fill(candidate_ids.cpu() < 0, -1)
        positive_rows = [self.to_row[torch.tensor(sorted(p), dtype=torch.long)] for p in positives]
        return self.cache.catalogue_columns(own, positive_rows)

    def observe_batch(self, entity_ids: Tensor, step: int) -> None:
        """Write the entity vectors the last micro-batch's forward kept, for its candidates'
        catalogue ids [C] (:meth:`observe`)."""
        vectors = self.scoring.candidate_vectors
        if vectors is None:
            raise RuntimeError("the step kept no candidate vectors for the negative cache")
        self.observe(entity_ids, vectors, step)

    def observe(self, entity_ids: Tensor, vectors: Tensor, step: int) -> None:
        """Write the entity vectors [C, b, d] a micro-batch of optimizer step ``step`` computed
        for catalogue ids [C] (-1: padding), every rank's gathered first (a collective)."""
        entity_ids, _ = self.collectives.all_gather_rows(entity_ids.to(self.collectives.device))
        vectors, _ = self.collectives.all_gather_rows(vectors.detach())
        entity_ids = entity_ids.long().cpu()
        rows = torch.where(entity_ids >= 0, self.to_row[entity_ids.clamp(min=0)], -1)
        self.cache.write(rows, vectors, step)

    @torch.no_grad()
    def refresh_oldest(self, step: int) -> None:
        """Re-encode the ``refresh_rows`` oldest rows with the weights of ``step`` (eval mode),
        each rank a share of them, and write them (a collective)."""
        if self.refresh_rows == 0:
            return
        rank, world = self.collectives.rank, self.collectives.world_size
        rows = self.cache.oldest(self.refresh_rows)[rank::world]
        entity_ids = self.space[rows]
        device = self.cache.vectors.device
        tokens = {k: v.to(device) for k, v in self.store.batch(entity_ids.numpy()).items()}
        with eval_mode(self.model):
            vectors, _ = self.model.candidate_side(tokens)
        self.observe(entity_ids, vectors, step)

    def ages(self, entity_ids: Tensor, step: int) -> Tensor:
        """Steps since the cached vector of each catalogue id [...] was written (-1: never, or
        outside the space)."""
        rows = self.to_row[entity_ids.long().clamp(min=0).cpu()]
        ages = self.cache.ages(rows, step)
        return ages.masked_fill((rows < 0) | (entity_ids.cpu() < 0), -1)

    def save(self, checkpoint: Path) -> None:
        """Keep the rows steps wrote since the last fill in ``checkpoint`` (rank 0; every rank
        holds the same), beside its DeepSpeed state."""
        if self.collectives.rank != 0:
            return
        write_cache_rows(checkpoint, self.cache.written_rows(), self.filled_version)

    def restore(self, checkpoint: Path, step: int, log: EventLog | None) -> None:
        """Put back the rows checkpoint ``checkpoint`` of optimizer step ``step`` kept (its next
        switch fills the rest from the index version in use then), read through their one
        reader, which refuses a file the cache cannot take
        (:func:`~hnce.cluster.stores.checkpoint_cache.read_cache_rows`); nothing when it kept
        none (a checkpoint of a run without cache)."""
        rows, per_entity, dim = self.cache.vectors.shape
        kept = read_cache_rows(checkpoint, (rows, per_entity, dim), step)
        if kept is None:
            return
        restored = self.cache.restore(kept)
        if log is not None:
            path = str(cache_rows_path(checkpoint))
            log.write(RunEvent.NEGATIVE_CACHE, restored=restored, path=path)
