"""Where a worker's negatives come from: candidates (refreshed or fixed) and the sampler over them.

- :class:`RefreshedNegatives`: the newest published negatives version of the run. Every C steps
  rank 0 reads ``<run>/negatives/CURRENT`` and broadcasts the version number, so all workers
  switch at the same step without waiting for a refresh (docs/refresh.md). Until the first version
  is published :attr:`~RefreshedNegatives.current` is None and the trainer draws random
  negatives. The lag of a version is the number of steps between the checkpoint whose model
  mined it and the step that uses it.
- :class:`FixedNegatives`: one version for the whole run (the reranker's retriever candidates,
  paper §6.3 "Training a reranker").
- :class:`NegativeDrawer`: K negatives per mention from the configured sampler over those
  candidates, as its spec says (:data:`hnce.mining.samplers.SAMPLER_SPECS`: where its
  candidates come from, index or BM25 (``hnce.cluster.stores.bm25_store``), and whether it reads
  the current model's scores); a mention's known positives are never its negatives, nor are the
  candidates ``negatives.candidates`` rules out; ``negatives.schedule`` sets the sampler's
  options at each step.
- :class:`TrainingData`: what a worker draws its micro-batches from (the training mentions in the
  run's data order, their tokens, the catalogue's token store, the drawer and its source), built
  by :func:`load_training_data`. The micro-batch of a micro-step, negatives and dropout seed
  included, is a function of (seed, micro-step, rank) alone (:func:`micro_step_seed`), so a
  resumed run draws what an uninterrupted one would; :meth:`TrainingData.switch` moves every
  rank to the newest negatives version together.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from hnce.cluster.compute.refresh.drawn import NegativeFreshness
from hnce.cluster.stores.bm25_store import ensure_bm25
from hnce.cluster.stores.denoised import denoised_path, read_denoised
from hnce.cluster.stores.negatives_store import (
    NEGATIVES_DIR,
    NegativesStore,
    NegativesVersion,
    check_catalogue,
)
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.cluster.stores.versioned_dir import version_dir_name
from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.reranker import JointReranker
from hnce.events import RunEvent
from hnce.mining.false_negatives import CandidateRules, FalseNegativeFilter
from hnce.mining.samplers import (
    SAMPLER_SPECS,
    LocalScores,
    LossColumns,
    NegativeSampler,
    SampledNegatives,
    SamplingRequest,
    TrainerSampler,
    build_sampler,
)
from hnce.mining.samplers.base import restricted
from hnce.mining.samplers.lexical import Bm25Index
from hnce.mining.schedule import SamplerSchedule
from hnce.pipeline.config import Config
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.batch import ContrastiveBatch, ShareMode, assemble_batch
from hnce.pipeline.train.current_scores import CurrentModelScores, EntityScores
from hnce.pipeline.train.data_order import MentionOrder
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.trainer_cache import CandidateVectors, TrainerCache
from hnce.progress import quiet

logger = logging.getLogger(__name__)


class CandidateSource(Protocol):
    """The negatives version a worker draws from, and when it changes."""

    current: NegativesVersion | None

    @property
    def version(self) -> int: ...

    def lag(self, step: int) -> int | None: ...

    def poll(self) -> bool: ...


class RefreshedNegatives:
    """Holds the negatives version in use and switches when a newer one is published."""

    def __init__(
        self, root: Path, split: str, collectives: Collectives, data_root: Path | None = None
    ) -> None:
        self.store = NegativesStore(root)
        self.split = split
        self.collectives = collectives
        self.current: NegativesVersion | None = None
        self.catalogue = _CatalogueCheck(data_root)

    @property
    def version(self) -> int:
        """Version number in use, -1 before the first refresh."""
        return -1 if self.current is None else self.current.version

    def lag(self, step: int) -> int | None:
        """Steps between the checkpoint the negatives were mined with and ``step``."""
        return None if self.current is None else step - self.current.checkpoint_step

    def poll(self) -> bool:
        """Switch to the newest published version if it changed; True when it switched.

        A collective (every rank calls it): rank 0's view of ``CURRENT`` is broadcast.
        """
        newest = self.store.current_version()
        version = self.collectives.broadcast_int(-1 if newest is None else newest)
        if version < 0 or version == self.version:
            return False
        path = self.store.root / version_dir_name(version) / f"{self.split}.parquet"
        try:
            opened = NegativesVersion(path)
        except FileNotFoundError:
            # Retention removed it between the read and the open; the next poll sees a newer one.
            return False
        self.current = self.catalogue(opened)
        return True


class _CatalogueCheck:
    """Refuses a negatives version mined over another catalogue than ``data_root``'s (none
    given: every version is taken as is)."""

    def __init__(self, data_root: Path | None) -> None:
        self.data_root = data_root
        self.fingerprint = None if data_root is None else catalogue_fingerprint(data_root)

    def __call__(self, version: NegativesVersion) -> NegativesVersion:
        if self.data_root is not None and self.fingerprint is not None:
            check_catalogue(version, self.fingerprint, self.data_root)
        return version


class FixedNegatives:
    """One negatives version for a whole run: polling never switches."""

    def __init__(self, path: Path, data_root: Path | None = None) -> None:
        self.current: NegativesVersion | None = _CatalogueCheck(data_root)(NegativesVersion(path))

    @property
    def version(self) -> int:
        return -1 if self.current is None else self.current.version

    def lag(self, step: int) -> int | None:
        return None

    def poll(self) -> bool:
        return False


def training_entities(catalogue: EntityCatalogue, mentions: Sequence[Mention]) -> np.ndarray:
    """Entity ids negatives are drawn from: the entities of the training mentions' domains.

    Zeshel-style data trains on some domains and tests on others; negatives from the test
    domains would let the model separate domains instead of entities (paper §6.3: "sampled
    uniformly at random from all entities in training data"). Without domains: every entity.
    """
    domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
    training_domains = sorted({m.domain for m in mentions})
    return np.flatnonzero(np.isin(domains, training_domains)).astype(np.int64)


class NegativeDrawer:
    """K negatives per mention from ``sampler`` over a :class:`CandidateSource` (``random``
    while a refreshed source has no version yet), within an entity space.

    Samplers work in a local id space 0..M-1 over ``entity_ids`` (the retriever's training
    domains, :func:`training_entities`; the whole catalogue for the reranker); candidates
    outside it are masked and drawn ids are mapped back to catalogue ids. With
    ``filter_false_negatives`` every known positive of a mention (its ``golds``, kept in a
    :class:`~hnce.mining.false_negatives.FalseNegativeFilter`) is excluded; without it only the gold.
    ``flagged`` pairs (the reranker's false negatives) join the known positives either way;
    ``rules`` leave candidates out of every draw (:func:`~hnce.mining.samplers.base.restricted`)
    and ``schedule`` sets the sampler's options at each step.
    """

    def __init__(
        self,
        sampler: TrainerSampler,
        num_negatives: int,
        entity_ids: np.ndarray,
        num_catalogue: int,
        mentions: Sequence[Mention],
        filter_false_negatives: bool,
        draws_candidates: bool,
        lexical: Bm25Index | None = None,
        lexical_top_n: int = 0,
        rules: CandidateRules | None = None,
        schedule: SamplerSchedule | None = None,
        flagged: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.sampler = sampler
        self.rules = rules or CandidateRules()
        self.schedule = schedule or SamplerSchedule()
        self.lexical = lexical
        self.lexical_top_n = lexical_top_n
        self.random = build_sampler("random")
        self.num_negatives = num_negatives
        self.entity_ids = torch.from_numpy(np.asarray(entity_ids, dtype=np.int64))
        self.to_local = torch.full((num_catalogue,), -1, dtype=torch.long)
        self.to_local[self.entity_ids] = torch.arange(len(self.entity_ids))
        self.draws_candidates = draws_candidates
        self.filter = FalseNegativeFilter(
            (m.mention_id, g) for m in mentions for g in m.golds if filter_false_negatives
        )
        for mention_id, entity_id in flagged:
            self.filter.add(mention_id, entity_id)

    @classmethod
    def for_retriever(
        cls, config: Config, catalogue: EntityCatalogue, mentions: Sequence[Mention]
    ) -> NegativeDrawer:
        """``hnce train``: the configured sampler over the refreshed index candidates, within
        the training mentions' domains."""
        negatives = config.negatives
        spec = SAMPLER_SPECS[negatives.sampler]
        entity_ids = training_entities(catalogue, mentions)
        lexical = None
        if spec.candidates == "lexical":
            lexical = ensure_bm25(Path(config.data.root))
        flagged = []
        if negatives.candidates.denoised:
            data_root = Path(config.data.root)
            path = denoised_path(config.run_dir)
            pairs = read_denoised(path, len(catalogue), catalogue_fingerprint(data_root))
            flagged = pairs.flagged()
            logger.info(
                "negatives: %d (mention, entity) pairs of %d mentions never drawn, flagged by the "
                "reranker of step %d within %g of the gold (%s)",
                len(flagged),
                len(pairs.pairs),
                pairs.reranker_step,
                pairs.margin,
                path,
            )
        return cls(
            spec.build(negatives, len(entity_ids)),
            negatives.num_negatives,
            entity_ids,
            len(catalogue),
            mentions,
            negatives.filter_false_negatives,
            draws_candidates=negatives.source == "index",
            lexical=lexical,
            lexical_top_n=negatives.lexical.top_n,
            rules=negatives.candidates,
            schedule=negatives.schedule,
            flagged=flagged,
        )

    @classmethod
    def for_reranker(
        cls, config: Config, num_catalogue: int, mentions: Sequence[Mention]
    ) -> NegativeDrawer:
        """``hnce rerank``: the retriever's top ``num_candidates - 1`` non-positive candidates
        (greedy over its scores), from the whole catalogue."""
        return cls(
            build_sampler("greedy"),
            config.rerank.num_candidates - 1,
            np.arange(num_catalogue),
            num_catalogue,
            mentions,
            filter_false_negatives=True,
            draws_candidates=True,
        )

    def _local_scores(self, scores: EntityScores | None) -> LocalScores:
        """``scores`` over sampler-space ids (mapped to catalogue ids)."""
        if scores is None:
            raise ValueError(f"{type(self.sampler).__name__} needs the current model's scores")
        return lambda ids: scores(self.entity_ids[ids])

    def _local(self, ids: Tensor) -> Tensor:
        return torch.where(ids >= 0, self.to_local[ids.clamp(min=0)], -1)

    def known_positives(self, mention: Mention) -> set[int]:
        """Catalogue ids that are never negatives of ``mention``: its gold (and its aliases)."""
        return self.filter.positives(mention.mention_id) | {mention.gold}

    @property
    def scores_online(self) -> bool:
        """Whether :meth:`draw` needs the current model's scores (``scores``)."""
        return hasattr(self.sampler, "sample_scored")

    def draw(
        self,
        mentions: Sequence[Mention],
        source: CandidateSource,
        generator: torch.Generator,
        scores: EntityScores | None = None,
        step: int = 0,
        candidates: tuple[Tensor, Tensor] | None = None,
    ) -> SampledNegatives:
        """K negatives per mention: catalogue ids [B, K] (-1 where ``valid`` is False),
        ``valid`` [B, K] and the sampler's ``log_q`` [B, K] (or None). ``scores``: the current
        model's scores of these mentions, for the samplers that read them; ``step``: the
        optimizer step, at which the schedule sets the sampler's options; ``candidates``: the
        mentions' candidates (catalogue ids [B, N], -1 for none, and scores [B, N]) when they
        come from elsewhere than ``source`` (the negative cache)."""
        gold = self._local(torch.tensor([m.gold for m in mentions], dtype=torch.long))
        positives = [
            set(self._local(torch.tensor(sorted(self.known_positives(m)))).tolist()) - {-1}
            for m in mentions
        ]
        candidate_ids = candidate_scores = None
        sampler = self.schedule.apply(self.sampler, step)
        if candidates is not None:
            candidate_ids, candidate_scores = self._local(candidates[0]), candidates[1]
        elif self.draws_candidates and source.current is None:
            sampler = self.random
        elif self.draws_candidates:
            global_ids, candidate_scores = source.current.lookup([m.mention_id for m in mentions])
            candidate_ids = self._local(global_ids)  # -1 outside the space: never drawn
        elif self.lexical is not None:
            queries = [m.mention for m in mentions]
            found, found_scores = self.lexical.search(queries, self.lexical_top_n)
            candidate_ids = self._local(torch.from_numpy(found))
            candidate_scores = torch.from_numpy(found_scores)
        request = SamplingRequest(
            gold=gold,
            positives=positives,
            num_entities=len(self.entity_ids),
            num_negatives=self.num_negatives,
            candidate_ids=candidate_ids,
            candidate_scores=candidate_scores,
            generator=generator,
        )
        request = restricted(request, self.rules)
        if isinstance(sampler, NegativeSampler):
            sampled = sampler.sample(request)
        else:
            sampled = sampler.sample_scored(request, self._local_scores(scores))
        ids = self.entity_ids[sampled.ids.clamp(min=0, max=len(self.entity_ids) - 1)]
        return SampledNegatives(
            ids=ids.masked_fill(~sampled.valid, -1),
            valid=sampled.valid,
            log_q=sampled.log_q,
            hard=sampled.hard,
        )


def trainable_mentions(config: Config) -> tuple[list[Mention], int]:
    """The training split without the mentions whose gold is missing from the catalogue
    (nothing to train towards); and how many were left out."""
    split = MentionSplit.open(mention_split_path(Path(config.data.root), config.data.train_split))
    mentions = split.read_all()
    kept = [m for m in mentions if m.gold >= 0]
    return kept, len(mentions) - len(kept)


def micro_step_seed(seed: int, micro_step: int, rank: int) -> int:
    """The seed of every random draw of one micro-step on one rank (negatives and dropout)."""
    return ((seed * 1_000_003 + micro_step) * 1009 + rank) % (2**63)


@dataclass
class TrainingData:
    """What one rank draws its micro-batches from (module docs): ``seed`` the run's, ``rank``
    this worker's, ``accumulation`` micro-batches per optimizer step, ``share`` which candidates
    are a mention's negatives (``negatives.share``, :mod:`hnce.pipeline.train.batch`)."""

    mentions: list[Mention]
    tokens: MentionTokens
    store: TokenStore
    order: MentionOrder
    drawer: NegativeDrawer
    source: CandidateSource
    seed: int
    rank: int
    accumulation: int
    share: ShareMode
    scores: CurrentModelScores | None = None  # for the samplers that read the current model
    loss_columns: LossColumns | None = None  # for the samplers that add columns to the loss
    cache: TrainerCache | None = None  # negatives.cache: candidates from the negative cache
    freshness: NegativeFreshness = dataclasses.field(default_factory=NegativeFreshness)

    def _candidates(self, rows: np.ndarray) -> tuple[Tensor, Tensor] | None:
        """The cache's candidates of the mentions at ``rows``; None without a cache, or before
        anything was written to it (the drawer then reads ``source``)."""
        if self.cache is None or self.cache.empty:
            return None
        return self.cache.candidates(rows)

    def _observe_freshness(self, negatives: SampledNegatives, cached: bool, step: int) -> None:
        """Count the hard negatives just drawn and those whose vectors are fresh: a cache row's
        age, or the lag of the negatives version they were mined from."""
        if cached and self.cache is not None:
            ages = self.cache.ages(negatives.ids, step)
        elif self.drawer.draws_candidates and self.source.current is not None:
            ages = torch.full_like(negatives.ids, self.source.lag(step) or 0)
        else:
            return
        hard = negatives.valid if negatives.hard is None else negatives.hard
        self.freshness.observe(hard.cpu(), ages)

    def micro_batch(self, micro_step: int) -> ContrastiveBatch:
        """This rank's mentions at ``micro_step`` with their negatives, seeded by the micro-step
        (torch's global seed too, for dropout) and with the sampler's options at its optimizer
        step (``negatives.schedule``), so a resumed run draws what an uninterrupted one would."""
        seed = micro_step_seed(self.seed, micro_step, self.rank)
        torch.manual_seed(seed)
        rows = self.order.batch(micro_step, self.rank)
        mentions = [self.mentions[i] for i in rows]
        scores = self.scores.for_rows(rows) if self.scores is not None else None
        step = micro_step // self.accumulation
        generator = torch.Generator().manual_seed(seed)
        candidates = self._candidates(rows)
        negatives = self.drawer.draw(mentions, self.source, generator, scores, step, candidates)
        self._observe_freshness(negatives, candidates is not None, step)
        positives = [self.drawer.known_positives(m) for m in mentions]
        batch = assemble_batch(
            mentions, rows, self.tokens, negatives, self.store, positives, self.share
        )
        if self.loss_columns is not None:
            vectors, valid = self.loss_columns.columns(batch.entity_ids[batch.gold], positives)
            batch = dataclasses.replace(batch, queue_vectors=vectors, queue_valid=valid)
        elif self.cache is not None and self.cache.whole_catalogue and not self.cache.empty:
            vectors, valid = self.cache.catalogue_columns(batch.entity_ids, positives)
            batch = dataclasses.replace(batch, queue_vectors=vectors, queue_valid=valid)
        return batch

    def micro_batches(self, step: int, device: torch.device) -> Iterator[ContrastiveBatch]:
        """The micro-batches of optimizer step ``step``, on ``device``, drawn one at a time: the
        next is drawn only once the consumer asks for it, after training on this one, whose
        candidates then enter the loss columns (which end the step after the last). Read it to
        the end."""
        for micro in range(self.accumulation):
            batch = self.micro_batch(step * self.accumulation + micro).to(device)
            yield batch
            if self.loss_columns is not None:
                candidates = batch.candidates
                self.loss_columns.observe(
                    batch.entity_ids, candidates["input_ids"], candidates["attention_mask"]
                )
            if self.cache is not None:
                self.cache.observe_batch(batch.entity_ids, step)
        if self.loss_columns is not None:
            self.loss_columns.after_step()
        if self.cache is not None:
            self.cache.refresh_oldest(step + 1)

    def switch(self, step: int, log: EventLog | None) -> None:
        """Switch to the newest published negatives version (a collective: every rank calls
        it), logging a switch (``negatives`` event) in ``log``."""
        source = self.source
        if not source.poll() or source.current is None:
            return
        if self.cache is not None:
            self.cache.fill_from(source.version, step, log)
        if log is not None:
            log.write(
                RunEvent.NEGATIVES,
                step=step,
                version=source.version,
                checkpoint_step=source.current.checkpoint_step,
                lag=source.lag(step),
            )

    def start_cache(
        self,
        config: Config,
        task: TrainingTask,
        model: BiEncoder | JointReranker,
        scoring: CandidateVectors,
        collectives: Collectives,
        device: torch.device,
    ) -> None:
        """With ``negatives.cache.enabled`` (a retriever): start the worker's negative cache
        (:mod:`hnce.pipeline.train.trainer_cache`), empty, written with the candidate vectors
        ``scoring`` keeps of each micro-batch."""
        if not task.caches_negatives(config):
            return
        assert isinstance(model, BiEncoder)
        self.cache = TrainerCache.build(
            config,
            model,
            self.drawer.entity_ids.numpy(),
            len(self.store),
            self.tokens,
            self.store,
            collectives,
            device,
            scoring,
        )

    def start_loss_columns(
        self,
        config: Config,
        task: TrainingTask,
        model: BiEncoder | JointReranker,
        log: EventLog | None,
    ) -> None:
        """When the retriever's sampler adds columns to the loss (its spec's ``loss_columns``,
        e.g. the momentum queue): start them from ``model`` (the resumed one), logging their
        memory."""
        spec = SAMPLER_SPECS[config.negatives.sampler]
        if task.kind != "retriever" or spec.loss_columns is None:
            return
        assert isinstance(model, BiEncoder)
        columns = spec.loss_columns(model, config.negatives, len(self.store))
        self.loss_columns = columns
        logger.info(
            "rank %d: %s adds loss columns: %.1f MiB",
            self.rank,
            spec.name,
            columns.memory_bytes / 2**20,
        )
        if log is not None:
            log.write(RunEvent.LOSS_COLUMNS, sampler=spec.name, bytes=columns.memory_bytes)


def load_training_data(
    config: Config,
    task: TrainingTask,
    model: BiEncoder | JointReranker,
    collectives: Collectives,
    world_size: int,
    device: torch.device,
) -> tuple[TrainingData, int]:
    """Mentions (tokenized once), the catalogue's token store (built by whichever rank gets its
    lock first), the data order, the negative drawer and its candidate source (with the current
    model's scores when the sampler reads them, on ``device``); and how many mentions were left
    out (no gold in the catalogue)."""
    data_root = Path(config.data.root)
    catalogue = EntityCatalogue.open(data_root)
    mentions, skipped = trainable_mentions(config)
    settings = task.settings(config)
    if task.kind == "retriever":
        drawer = NegativeDrawer.for_retriever(config, catalogue, mentions)
        source: CandidateSource = RefreshedNegatives(
            config.run_dir / NEGATIVES_DIR, config.data.train_split, collectives, data_root
        )
    else:
        assert task.candidates is not None
        drawer = NegativeDrawer.for_reranker(config, len(catalogue), mentions)
        source = FixedNegatives(task.candidates, data_root)
    with quiet(collectives.rank != 0):  # whichever rank builds it, rank 0 reports
        store = TokenStore.ensure(data_root, model.tokenizer, model.entity_length)
    data = TrainingData(
        mentions=mentions,
        tokens=MentionTokens.tokenize(model, mentions),
        store=store,
        order=MentionOrder(len(mentions), settings.batch_size, world_size, config.run.seed),
        drawer=drawer,
        source=source,
        seed=config.run.seed,
        rank=collectives.rank,
        accumulation=settings.gradient_accumulation,
        share=task.share(config),
    )
    if drawer.scores_online:
        assert isinstance(model, BiEncoder)
        data.scores = CurrentModelScores(model, data.tokens, store, device)
    return data, skipped
