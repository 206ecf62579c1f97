"""Top-k entities of mentions under a model, through the cluster: evaluation, KILT predictions,
the reranker's retriever (docs/refresh.md); and the index version they search, for ``hnce
export`` to publish beside the model's towers (:func:`evaluation_version`).

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
(the ``index.keep_versions`` most recently used versions: each is stamped when found or built)
and its own lock, held while a version is found or built and loaded. A version is found by what
it holds, the model's and the catalogue's fingerprints (the catalogue's is its entities', so
datasets sharing a catalogue share its versions) and the index parameters.

Example::

    retrieved = retrieve(plan, IndexedModel.from_checkpoint(directory, step), mentions, k=64)
    retrieved.cands              # int64 [M, 64], best first
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.index_build import (
    IndexedModel,
    build_version,
    index_parameters,
    start_pool,
    timed,
)
from hnce.cluster.compute.miner import SEARCH_BATCH, search_catalogue
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.index_store import IndexStore, IndexVersion
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import catalogue_fingerprint
from hnce.cluster.stores.tokens import TokenStore
from hnce.search import Searcher

logger = logging.getLogger(__name__)

EVAL_INDEX_DIR = "eval-index"


def evaluation_store(plan: RefreshPlan) -> IndexStore:
    """`<run>/eval-index/`: versions built only to evaluate or predict (module docstring),
    keeping the most recently used: evaluations ask for versions of any checkpoint in any order,
    so the newest built is not the one asked for next."""
    return IndexStore(plan.run_dir / EVAL_INDEX_DIR, keep=plan.index.keep_versions, keep_used=True)


def version_key(plan: RefreshPlan, model: IndexedModel) -> tuple[str, str, dict[str, Any]]:
    """What finds a version of ``model`` over the plan's catalogue in a store
    (:meth:`IndexStore.find`): the model's and the catalogue's fingerprints, the index
    parameters."""
    index = index_parameters(plan.index, plan.refresh.shard_size)
    return model.fingerprint, catalogue_fingerprint(plan.data_dir), index


@contextlib.contextmanager
def locked_evaluation_store(plan: RefreshPlan) -> Iterator[IndexStore]:
    """The evaluation store (created if missing) under its lock: nothing else finds, builds or
    removes its versions meanwhile."""
    store = evaluation_store(plan)
    store.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(store.root / ".lock")):
        yield store


def find_version(plan: RefreshPlan, model: IndexedModel, store: IndexStore) -> IndexVersion | None:
    """A published version of ``model`` over the plan's catalogue: the refresh's (read only),
    else one of the evaluation store ``store`` (module docstring, steps 1 and 2); None when
    neither holds one."""
    wanted = version_key(plan, model)
    return plan.index_store.find(*wanted) or store.find(*wanted)


def build_evaluation_version(
    plan: RefreshPlan,
    model: IndexedModel,
    store: IndexStore,
    pool: EncoderPool,
    tokens: TokenStore,
) -> IndexVersion:
    """A new version of ``model`` in the evaluation store ``store`` (step 3), the catalogue of
    ``tokens`` encoded by ``pool`` (started with ``model`` and those tokens)."""
    return build_version(pool, store, model, tokens, plan.index, plan.refresh.shard_size).version


@contextlib.contextmanager
def evaluation_version(
    plan: RefreshPlan, model: IndexedModel, before_building: Callable[[], None]
) -> Iterator[IndexVersion]:
    """The version :func:`open_index` would search for ``model``, found or built once (by an
    encoder pool of its own, stopped before the block: for a caller that copies the version, not
    one that searches it); the evaluation store's lock is held through the block, so its
    retention cannot remove the version meanwhile. ``before_building`` is called only when no
    version exists yet, before any actor starts: the caller starts or joins Ray there."""
    with locked_evaluation_store(plan) as store:
        version = find_version(plan, model, store)
        if version is None:
            logger.info(
                "no index version of %s over %s in %s or %s: building one into %s",
                model.export_dir,
                plan.data_dir,
                plan.index_store.root,
                store.root,
                store.root,
            )
            before_building()
            pool, tokens = start_pool(model, plan.pool_settings(alone=True), plan.data_dir, {})
            with pool:
                assert tokens is not None
                version = build_evaluation_version(plan, model, store, pool, tokens)
        yield version


@dataclass
class Retrieved:
    """Candidates of each mention, the index version searched, and the seconds of each stage."""

    cands: np.ndarray  # int64 [M, k], -1 where fewer entities exist
    scores: np.ndarray  # float32 [M, k]
    index_version: IndexVersion
    built: bool  # True when the version was encoded for this call
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class OpenIndex(Searcher[Sequence[Mention]]):
    """An index version of a model loaded into a running encoder pool (:func:`open_index`):
    mentions are encoded and searched through it as often as needed, with nothing restarted.
    The first retrieval reports the opening's stages (and whether it built the version) as its
    own; later ones report only their search, also when several threads retrieve at once (the
    encoder actors serve their calls one at a time). A `hnce.search.Searcher` of mentions."""

    pool: EncoderPool
    held: HeldIndex
    version: IndexVersion
    data_dir: Path
    built: bool  # the version was encoded to open the index, not yet reported
    seconds: dict[str, float]  # the opening's stages, not yet reported
    _reporting: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def search(
        self,
        queries: Sequence[Mention],
        k: int,
        *,
        per_domain: bool = False,
        batch_size: int = SEARCH_BATCH,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids int64 [M, k], scores float32 [M, k]) of the mentions `queries`
        (`hnce.search.Searcher`); options as :meth:`retrieve`."""
        retrieved = self.retrieve(queries, k, per_domain, batch_size)
        return retrieved.cands, retrieved.scores

    def retrieve(
        self,
        mentions: Sequence[Mention],
        k: int,
        per_domain: bool = False,
        batch_size: int = SEARCH_BATCH,
    ) -> Retrieved:
        """Top-``k`` entities of ``mentions`` (``per_domain``: among their own domain's only),
        with the version searched and the seconds of each stage."""
        with self._reporting:  # the opening is one retrieval's, whichever thread comes first
            seconds, self.seconds = self.seconds, {}
            built, self.built = self.built, False
        with timed(seconds, "search"):
            cands, scores = search_catalogue(
                self.pool, self.held, self.data_dir, mentions, k, per_domain, batch_size
            )
        return Retrieved(cands, scores, self.version, built, seconds)


@contextlib.contextmanager
def open_index(plan: RefreshPlan, model: IndexedModel) -> Iterator[OpenIndex]:
    """Find (or build once) an index version of ``model`` (module docstring for where), start
    the encoder pool with the model and load the version into its shard holders; the pool stops
    on exit. The evaluation store's lock is held until the version is loaded, not longer: its
    retention may then remove the files, never what the holders already hold."""
    seconds: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with locked_evaluation_store(plan) as store:
            with timed(seconds, "find"):
                version = find_version(plan, model, store)
            encode = plan.data_dir if version is None else None
            pool, tokens = start_pool(model, plan.pool_settings(alone=True), encode, seconds)
            stack.enter_context(pool)
            if tokens is not None:
                with timed(seconds, "index"):
                    version = build_evaluation_version(plan, model, store, pool, tokens)
            assert version is not None
            logger.info("searching index v%d in %s", version.version, version.path.parent)
            with timed(seconds, "hold"):
                held = pool.hold(version, plan.index.depth)
        yield OpenIndex(pool, held, version, plan.data_dir, tokens is not None, seconds)


def retrieve(
    plan: RefreshPlan,
    model: IndexedModel,
    mentions: Sequence[Mention],
    k: int,
    per_domain: bool = False,
    batch_size: int = SEARCH_BATCH,
) -> Retrieved:
    """Top-`k` entities of `mentions` under `model` (module docstring for which index), in an
    index opened for this call only (:func:`open_index`).

    `per_domain` searches each mention among its own domain's entities only (Zeshel: a test
    world is linked against that world's documents).
    """
    with open_index(plan, model) as index:
        return index.retrieve(mentions, k, per_domain, batch_size)
