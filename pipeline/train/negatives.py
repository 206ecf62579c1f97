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
  candidates come from, index or BM25 (``hnce.cluster.compute.lexical``), and whether it reads
  the current model's scores); a mention's known positives are never its negatives, nor are the
  candidates ``negatives.candidates`` rules out; ``negatives.schedule`` sets the sampler's
  options at each step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from hnce.cluster.compute.lexical import ensure_bm25
from hnce.cluster.stores.denoised import denoised_path, read_denoised
from hnce.cluster.stores.negatives_store import NegativesStore, NegativesVersion, check_catalogue
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import EntityCatalogue, catalogue_fingerprint
from hnce.cluster.stores.versioned_dir import version_dir_name
from hnce.mining.false_negatives import CandidateRules, FalseNegativeFilter
from hnce.mining.samplers import (
    SAMPLER_SPECS,
    LocalScores,
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
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.model_scores import EntityScores

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
            options = negatives.lexical
            lexical = ensure_bm25(Path(config.data.root), options.k1, options.b)
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
    ) -> SampledNegatives:
        """K negatives per mention: catalogue ids [B, K] (-1 where ``valid`` is False),
        ``valid`` [B, K] and the sampler's ``log_q`` [B, K] (or None). ``scores``: the current
        model's scores of these mentions, for the samplers that read them; ``step``: the
        optimizer step, at which the schedule sets the sampler's options."""
        gold = self._local(torch.tensor([m.gold for m in mentions], dtype=torch.long))
        positives = [
            set(self._local(torch.tensor(sorted(self.known_positives(m)))).tolist()) - {-1}
            for m in mentions
        ]
        candidate_ids = candidate_scores = None
        sampler = self.schedule.apply(self.sampler, step)
        if self.draws_candidates and source.current is None:
            sampler = self.random
        elif self.draws_candidates:
            global_ids, candidate_scores = source.current.lookup([m.mention_id for m in mentions])
            candidate_ids = self._local(global_ids)  # -1 outside the space: never drawn
        elif self.lexical is not None:
            queries = [m.mention for m in mentions]
            global_ids, candidate_scores = self.lexical.search(queries, self.lexical_top_n)
            candidate_ids = self._local(global_ids)
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
