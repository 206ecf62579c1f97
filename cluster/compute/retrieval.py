"""Top-k entities of mentions under a model, through the cluster: evaluation, KILT predictions,
the reranker's retriever (docs/refresh.md).

The mentions are encoded by the model's mention tower in the encoder actors and searched in an
index version of the *same* model held by those actors (`hnce.cluster.compute.shard_holders`); this process
gets k candidates per mention, never the catalogue's vectors. The version is found, in order:

1. in the run's refresh store `<run>/index/` (read only): a published version whose model and
   catalogue fingerprints and index parameters match (`IndexStore.find`) — evaluating the
   checkpoint the refresh last indexed costs no encoding at all;
2. in the run's evaluation store `<run>/eval-index/`, built by an earlier evaluation;
3. otherwise it is built now into `<run>/eval-index/` (`hnce.cluster.compute.index_build`), once.

Why a separate store for versions built to evaluate: the trainer, the refresh coordinator and
`hnce refresh` only ever follow `<run>/index/CURRENT` and pair index vN with negatives vN, so a
version encoded for an old checkpoint or for the untrained model must never land there — it
would become "live" or shift the refresh's numbering, and the refresh's builder removes
unfinished builds of other parameters from its own store (an evaluation building there could be
deleted by, or delete, a running refresh's build). `<run>/eval-index/` has its own retention
(``index.keep_versions``) and its own lock, held while a version is found or built and loaded.

Example::

    retrieved = retrieve(plan, IndexedModel.from_checkpoint(directory, step), mentions, k=64)
    retrieved.cands              # int64 [M, 64], best first
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc
from filelock import FileLock

from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.index_build import (
    IndexedModel,
    build_version,
    index_parameters,
    start_pool,
    timed,
)
from hnce.cluster.compute.miner import search_mentions
from hnce.cluster.compute.refresh import RefreshPlan
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.index_store import IndexStore, IndexVersion
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import EntityCatalogue, catalogue_fingerprint
from hnce.encoders.progress import progress_bar

logger = logging.getLogger(__name__)

EVAL_INDEX_DIR = "eval-index"


def evaluation_store(plan: RefreshPlan) -> IndexStore:
    """`<run>/eval-index/`: versions built only to evaluate or predict (module docstring)."""
    return IndexStore(plan.run_dir / EVAL_INDEX_DIR, keep=plan.index.keep_versions)


@dataclass
class Retrieved:
    """Candidates of each mention, the index version searched, and the seconds of each stage."""

    cands: np.ndarray  # int64 [M, k], -1 where fewer entities exist
    scores: np.ndarray  # float32 [M, k]
    index_version: IndexVersion
    built: bool  # True when the version was encoded for this call
    seconds: dict[str, float] = field(default_factory=dict)


def retrieve(
    plan: RefreshPlan,
    model: IndexedModel,
    mentions: Sequence[Mention],
    k: int,
    per_domain: bool = False,
    batch_size: int = 256,
) -> Retrieved:
    """Top-`k` entities of `mentions` under `model` (module docstring for which index).

    `per_domain` searches each mention among its own domain's entities only (Zeshel: a test
    world is linked against that world's documents).
    """
    seconds: dict[str, float] = {}
    store = evaluation_store(plan)
    store.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(store.root / ".lock")):
        with timed(seconds, "find"):
            catalogue = catalogue_fingerprint(plan.data_dir)
            wanted = (
                model.fingerprint,
                catalogue,
                index_parameters(plan.index, plan.refresh.shard_size),
            )
            version = plan.index_store.find(*wanted) or store.find(*wanted)
        encode = plan.data_dir if version is None else None
        pool, tokens = start_pool(model, plan.pool_settings, encode, seconds)
        with pool:
            built = tokens is not None
            if tokens is not None:
                with timed(seconds, "index"):
                    version = build_version(
                        pool,
                        store,
                        model,
                        tokens,
                        plan.index,
                        plan.refresh.shard_size,
                    ).version
            assert version is not None
            logger.info("searching index v%d in %s", version.version, version.path.parent)
            with timed(seconds, "hold"):
                held = pool.hold(version, plan.index.candidate_depth)
            with timed(seconds, "search"):
                cands, scores = _search(plan, pool, held, mentions, k, per_domain, batch_size)
    return Retrieved(cands, scores, version, built, seconds)


def _search(
    plan: RefreshPlan,
    pool: EncoderPool,
    held: HeldIndex,
    mentions: Sequence[Mention],
    k: int,
    per_domain: bool,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Search every mention (per domain: each group restricted to its domain's entities)."""
    cands = np.full((len(mentions), k), -1, dtype=np.int64)
    scores = np.full((len(mentions), k), -np.inf, dtype=np.float32)
    groups: list[tuple[np.ndarray, np.ndarray | None]] = [(np.arange(len(mentions)), None)]
    if per_domain:
        groups = list(_domain_groups(plan, mentions))
    with progress_bar(total=len(mentions), desc="retrieve", unit="mentions") as bar:
        for rows, allowed in groups:
            batches = (
                [mentions[row] for row in rows[start : start + batch_size]]
                for start in range(0, len(rows), batch_size)
            )
            if allowed is not None and allowed.size == 0:
                bar.update(len(rows))
                continue
            found, found_scores = search_mentions(pool, held, batches, k, allowed, bar)
            cands[rows], scores[rows] = found, found_scores
    return cands, scores


def _domain_groups(
    plan: RefreshPlan, mentions: Sequence[Mention]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(mention rows, entity ids) of each domain the mentions come from."""
    entity_domains = EntityCatalogue.open(plan.data_dir).domain_of()
    mention_domains = np.asarray([mention.domain for mention in mentions])
    for domain in sorted(set(mention_domains.tolist())):
        allowed = pc.equal(entity_domains, domain).to_numpy()
        yield np.flatnonzero(mention_domains == domain), np.flatnonzero(allowed)
