"""Index shards held where the compute is: in the encoder actors (docs/refresh.md).

Mining and evaluation never load an index version into the process that orchestrates them. The
version's shards are spread over the encoder actors (`hnce.cluster.compute.encoder_actor`), which on a GPU
cluster hold the GPUs (FAISS fp16 flat shards there, `hnce.cluster.stores.faiss_device.resolve_faiss_device`)
and on a CPU cluster hold CPU shards, memory-mapped. A version of a scorer mined exactly (poly-m,
genpoly-m, general) is held on the CPU and scored by the holder's own model on its device
(`hnce.cluster.stores.exact_search`). A batch of query vectors goes to every
holder (as one Ray object, never through the orchestrating process when it comes from an encoder
actor); each returns the exact top-k entities of its shards and the orchestrator merges the lists
(`hnce.search.merge_entity_lists`), which is exact because every entity lies in exactly one
shard. The orchestrator therefore holds k candidates per query, never the catalogue's vectors.
:class:`HeldIndex` is a `hnce.search.Searcher` of query vectors, as is each holder.

A holder that dies is restarted by Ray and the search retried; every search names the shards it
expects (:class:`HoldSpec`), so a restarted holder loads them again before answering.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import ray

from hnce.cluster.compute.actors import Task, TaskClock
from hnce.cluster.stores.faiss_device import DeviceRequest, resolve_faiss_device
from hnce.cluster.stores.index_store import IndexVersion
from hnce.encoders.biencoder import BiEncoder
from hnce.progress import progress_bar
from hnce.search import Searcher, merge_entity_lists

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoldSpec:
    """Which shards of which version one holder holds, on which device, searched how."""

    version: IndexVersion
    shard_numbers: tuple[int, ...]
    device: DeviceRequest
    candidate_depth: int

    @property
    def key(self) -> tuple[str, int, tuple[int, ...], str, int]:
        return (
            str(self.version.path),
            self.version.version,
            self.shard_numbers,
            self.device,
            self.candidate_depth,
        )


@dataclass(frozen=True)
class HeldShards:
    """What a holder reports after loading its shards."""

    shard_numbers: tuple[int, ...]
    num_vectors: int
    device: str
    seconds: float
    pid: int


class ShardHolder:
    """What an actor that holds index shards does (a base of `EntityEncoderActor`, whose
    `model` scores the shards of a version mined exactly, `hnce.cluster.stores.exact_search`)."""

    model: BiEncoder
    _held: Searcher[np.ndarray] | None = None
    _held_key: tuple[str, int, tuple[int, ...], str, int] | None = None

    def hold(self, spec: HoldSpec) -> HeldShards:
        """Load (verify, memory-map, place) the shards of `spec`, replacing any held before."""
        started = time.perf_counter()
        if spec.version.mining == "exact":
            device = next(self.model.parameters()).device
            self._held = spec.version.load_exact(spec.shard_numbers, self.model.scorer, device)
            where = f"{device} (exact {self.model.scorer.name} scoring)"
        else:
            faiss_device = resolve_faiss_device(spec.device)
            self._held = spec.version.load(spec.shard_numbers, faiss_device, spec.candidate_depth)
            where = faiss_device.describe()
        self._held_key = spec.key
        logger.info(
            "holding shards %s of index v%d on %s",
            list(spec.shard_numbers),
            spec.version.version,
            where,
        )
        return HeldShards(
            spec.shard_numbers,
            self._held.ntotal,
            where,
            time.perf_counter() - started,
            os.getpid(),
        )

    def release(self) -> None:
        """Drop the shards held (their memory is freed)."""
        self._held = None
        self._held_key = None

    def search(
        self,
        queries: np.ndarray,
        k: int,
        *,
        spec: HoldSpec | None = None,
        allowed: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities of `queries` among the held shards (`hnce.search.Searcher`; see
        `ShardedSearcher.search`). `spec` names the shards expected: they are loaded first when
        they are not the ones held (this actor was restarted)."""
        if spec is not None and self._held_key != spec.key:
            self.hold(spec)
        if self._held is None:
            raise RuntimeError("no index shards held: hold() them, or name them with spec")
        return self._held.search(queries, k, allowed=allowed)


class HeldIndex(Searcher[np.ndarray]):
    """An index version whose shards are held by actors: fans queries out and merges.

    Build it with :meth:`start`; then :meth:`search_stream` turns a stream of query batches
    (object references or arrays) into merged top-k (entity ids, scores) per batch, in order,
    and :meth:`search` searches one batch.
    """

    def __init__(
        self,
        version: IndexVersion,
        holders: Sequence[tuple[ray.actor.ActorHandle, str, ray.ObjectRef]],
        clock: TaskClock,
    ) -> None:
        self.version = version
        self.holders = list(holders)
        self.clock = clock

    @classmethod
    def start(
        cls,
        version: IndexVersion,
        actors: Sequence[tuple[ray.actor.ActorHandle, str]],
        device: DeviceRequest,
        candidate_depth: int,
        clock: TaskClock,
    ) -> HeldIndex:
        """Spread `version`'s shards round-robin over `actors` and wait until each has loaded
        its share (actors left without a shard hold nothing and are not searched)."""
        num_shards = len(version.manifest.shards)
        holders, pending = [], {}
        for number, (actor, name) in enumerate(actors[:num_shards]):
            spec = HoldSpec(
                version, tuple(range(number, num_shards, len(actors))), device, candidate_depth
            )
            holders.append((actor, name, ray.put(spec)))
            pending[actor.hold.remote(holders[-1][2])] = Task(
                f"loading shards {spec.shard_numbers}", name
            )
        with progress_bar(
            total=num_shards,
            desc=f"loading index v{version.version}",
            unit="shards",
        ) as bar:
            while pending:
                done = clock.wait_next(pending)
                pending.pop(done)
                held: HeldShards = ray.get(done)
                clock.record(held.seconds)
                bar.update(len(held.shard_numbers))
        logger.info("index v%d held by %d actor(s)", version.version, len(holders))
        return cls(version, holders, clock)

    def search_stream(
        self,
        query_batches: Iterable[ray.ObjectRef | np.ndarray],
        k: int,
        allowed: np.ndarray | None = None,
        window: int = 4,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Merged top-k (entity ids int64 [B, k], scores float32 [B, k]) of each query batch, in
        order; up to `window` batches in flight. `allowed` restricts every search to those
        entity ids (a Zeshel world)."""
        allowed_ref = None if allowed is None else ray.put(np.asarray(allowed, np.int64))
        in_flight: list[tuple[list[ray.ObjectRef], Task]] = []
        for number, queries in enumerate(query_batches):
            reference = queries if isinstance(queries, ray.ObjectRef) else ray.put(queries)
            parts = [
                actor.search.remote(reference, k, spec=spec, allowed=allowed_ref)
                for actor, _, spec in self.holders
            ]
            names = ", ".join(name for _, name, _ in self.holders)
            in_flight.append((parts, Task(f"search of query batch {number}", names)))
            if len(in_flight) >= window:
                yield self._merged(*in_flight.pop(0), k)
        for parts, task in in_flight:
            yield self._merged(parts, task, k)

    def search(
        self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Merged top-k (entity ids int64 [B, k], scores float32 [B, k]) of one batch of query
        vectors (`hnce.search.Searcher`); `allowed` as in :meth:`search_stream`."""
        return next(self.search_stream([queries], k, allowed))

    def _merged(
        self, parts: list[ray.ObjectRef], task: Task, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return merge_entity_lists(self.clock.get(parts, task), k)
