"""The pool of entity encoder actors (``hnce.cluster.compute.encoder_actor``) of one refresh,
evaluation or index build, and the pool the refresh coordinator keeps between refreshes
(docs/refresh.md).

An `EncoderPool` sizes and starts its actors (one per encoder slot or per GPU share, or CPU actors
of ``refresh.encoder_cpus`` or an equal share of the free CPUs), spreads shard, quantiser and
mention tasks over them, and stops them on exit; `KeptPool` keeps one pool from one refresh to
the next and reloads its actors with each checkpoint.

Actors are restarted by Ray when they die (`max_restarts`) and their queued and running calls are
retried (`max_task_retries`). Starting a pool the cluster cannot place, and every wait on an
actor, fail with a clear error instead of hanging (`hnce.cluster.compute.actors`).

Example::

    with EncoderPool(export_dir, EncoderPoolSettings(num_encoders=2), token_store) as pool:
        pool.index_shards(tasks, on_done)
        held = pool.hold(index_version, candidate_depth=256)
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from hnce.cluster.compute.actors import (
    PlacementError,
    Task,
    TaskClock,
    TaskTimeout,
    actor_request,
    check_placeable,
)
from hnce.cluster.compute.encoder_actor import (
    EntityEncoderActor,
    QuantiserTask,
    QuantiserTrained,
    ShardEncoded,
    ShardTask,
)
from hnce.cluster.compute.gpu_sharing import encoders_on_gpus
from hnce.cluster.compute.model_pointer import ModelPointer, PoolModel
from hnce.cluster.compute.resources import ENCODER_RESOURCE, custom_resource_request
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.faiss_device import DeviceRequest
from hnce.cluster.stores.index_store import IndexVersion

logger = logging.getLogger(__name__)

#: How long stopping early waits for the shard tasks it cancelled to end.
SETTLE_SECONDS = 60.0


#: the least time a wait on an encoder actor (its start, a shard, a search) may take before it is
#: reported as hung; later waits also allow 10x the slowest task measured. 15 minutes covers a
#: model's first load and a 100,000-entity shard encoded on one CPU thread, so only a hung actor
#: reaches it
WAIT_FLOOR_SECONDS = 900.0


@dataclass(frozen=True)
class EncoderPoolSettings:
    """How many encoder actors, how big, how patient (from the ``refresh`` section).

    `num_encoders` 0 means one per `hnce_encoder` slot when the cluster advertises them, else one
    per `gpus_per_actor` of the GPUs a trainer beside the pool leaves (`reserved_gpus`,
    :mod:`hnce.cluster.compute.gpu_sharing`), or 1 without GPUs. `num_threads` is each CPU actor's
    torch threads (and CPUs asked); with `free_cpus`, for a pool that runs with no trainer training
    beside it (the initial negatives, evaluation, linking), each CPU actor instead takes an equal share of the
    CPUs Ray has free less `reserved_cpus` (those of a trainer that starts beside it and is not
    placed yet: the initial negatives of ``hnce train``), at least `num_threads`. `lent_threads`: torch threads
    a trainer that waits for this pool lends it (``refresh.mode: sync`` with ``training.cores:
    handover``, or the initial negatives of ``hnce train``), shared among the CPU actors on top of the CPUs they
    ask for. `wait_floor_seconds` is the least time any wait on an actor may take before it is
    reported as hung (`hnce.cluster.compute.actors.TaskClock`; :data:`WAIT_FLOOR_SECONDS`).
    """

    num_encoders: int = 0
    batch_size: int = 64
    num_threads: int = 1
    free_cpus: bool = False
    reserved_cpus: float = 0.0
    lent_threads: int = 0
    gpus_per_actor: float = 1.0
    reserved_gpus: float = 0.0
    wait_floor_seconds: float = WAIT_FLOOR_SECONDS
    faiss_device: DeviceRequest = "auto"
    max_restarts: int = 3
    max_task_retries: int = 3


class EncoderPool:
    """A pool of `EntityEncoderActor`s for one refresh, evaluation or index build (a context
    manager that stops the actors on exit).

    Args:
        export_dir: the model's `export/` directory (export_biencoder format).
        settings: pool size, batching and patience.
        token_store: the catalogue's token store (needed to index shards by encoding).
        reloadable: the actors read their model from a `ModelPointer`, so that :meth:`reload`
            can give them the next one (:class:`KeptPool`).
    """

    def __init__(
        self,
        export_dir: Path,
        settings: EncoderPoolSettings,
        token_store: Path | None = None,
        reloadable: bool = False,
    ) -> None:
        self.settings = settings
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        custom = custom_resource_request(ENCODER_RESOURCE, resources)
        # With the launcher's encoder slots, one actor per slot (trainer GPUs are not ours).
        slots = (
            int(resources[ENCODER_RESOURCE])
            if custom
            else encoders_on_gpus(gpus, settings.reserved_gpus, settings.gpus_per_actor)
        )
        self.num_encoders = settings.num_encoders or slots
        if settings.faiss_device == "gpu" and not gpus:
            raise PlacementError(
                "index.faiss_device is gpu but the cluster offers no GPU for the shard holders"
            )
        cpus, why = self._cpus_per_actor(gpus, bool(custom))
        actor_gpus = settings.gpus_per_actor if gpus else 0.0
        self.request = actor_request(cpus, actor_gpus, custom)
        check_placeable(self.request, self.num_encoders, "encoder")
        threads = cpus if gpus else cpus + settings.lent_threads // self.num_encoders
        if threads > cpus:
            why += f"; {threads - cpus} more torch thread(s) lent by the waiting trainer"
        logger.info(
            "starting %d entity encoder actor(s), each %s (%s)",
            self.num_encoders,
            ", ".join(f"{name} {amount:g}" for name, amount in self.request.items()),
            why,
        )
        remote_class = ray.remote(EntityEncoderActor)
        pool_id = uuid.uuid4().hex[:8]
        self.names = [f"hnce-encoder-{pool_id}-{n}" for n in range(self.num_encoders)]
        model = PoolModel(str(export_dir), _text(token_store))
        pointer_name = f"hnce-encoder-{pool_id}-model" if reloadable else None
        self.pointer = (
            ray.remote(ModelPointer).options(name=pointer_name, num_cpus=0).remote(model)
            if reloadable
            else None
        )
        self.actors = [
            remote_class.options(
                name=name,
                max_restarts=settings.max_restarts,
                max_task_retries=settings.max_task_retries,
                num_cpus=cpus,
                num_gpus=actor_gpus,
                resources=custom,
            ).remote(model, settings.batch_size, threads, pointer_name)
            for name in self.names
        ]
        starting = TaskClock(settings.wait_floor_seconds, "encoder start")
        try:
            starting.wait_started(
                [actor.ready.remote() for actor in self.actors], self.names, self.request
            )
        except BaseException:
            self.shutdown()  # a pool that did not start holds no CPUs and no model
            raise

    def _cpus_per_actor(self, gpus: float, slots: bool) -> tuple[int, str]:
        """CPUs (and torch threads) each actor asks for, and why (logged). A share of the free
        CPUs never exceeds the largest node's; encoder slots of a launched cluster keep
        ``refresh.encoder_cpus`` (their nodes are sized for it)."""
        if gpus:
            return 1, f"{self.settings.gpus_per_actor:g} GPU each"
        if not self.settings.free_cpus or slots:
            return self.settings.num_threads, "refresh.encoder_cpus"
        largest = max(node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"])
        available = ray.available_resources().get("CPU", 0) - self.settings.reserved_cpus
        free = int(min(available / self.num_encoders, largest))
        if free <= self.settings.num_threads:
            return self.settings.num_threads, "refresh.encoder_cpus; no more CPUs free"
        return free, "no trainer beside it: an equal share of the CPUs Ray has free"

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def clock(self, what: str) -> TaskClock:
        """A fresh deadline keeper for one kind of task on this pool."""
        return TaskClock(self.settings.wait_floor_seconds, what)

    def index_shards(
        self,
        tasks: Iterable[ShardTask],
        on_done: Callable[[ShardEncoded], None],
        max_in_flight_per_encoder: int = 2,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        """Index `tasks` across the actors, calling `on_done` (in this process) as shards finish.

        At most `max_in_flight_per_encoder` shards per actor are queued. A wait that passes its
        deadline (derived from the slowest shard so far) raises TaskTimeout naming the shard
        and the actor. Once `stopping()` is true, StopRequested: queued shards are cancelled and
        running ones stop at their next batch (finished shards were already handed to
        `on_done`).
        """
        clock = self.clock("entity shard")
        pending: dict[ray.ObjectRef, tuple[int, Task]] = {}
        load = [0] * len(self.actors)
        limit = max_in_flight_per_encoder * len(self.actors)
        try:
            for task in tasks:
                while len(pending) >= limit:
                    self._finish_one(clock, pending, load, on_done, stopping)
                actor = int(np.argmin(load))
                reference = self.actors[actor].index_shard.remote(task)
                pending[reference] = (actor, Task(f"shard {task.shard_no}", self.names[actor]))
                load[actor] += 1
            while pending:
                self._finish_one(clock, pending, load, on_done, stopping)
        except BaseException as error:
            self._stop_tasks(list(pending), error)
            raise

    def train_quantiser(
        self, task: QuantiserTask, stopping: Callable[[], bool] | None = None
    ) -> QuantiserTrained:
        """Train `task`'s quantiser (no shard can start without it): every encoder encodes its
        part of the sample, the first trains on them all (vectors pass from actor to actor,
        never through this process); a wait past its deadline raises TaskTimeout, `stopping()`
        StopRequested, as for shards."""
        start = time.perf_counter()
        encoders = 1 if task.encodings is not None else len(self.actors)
        parts = [
            actor.quantiser_sample.remote(task, part, encoders)
            for part, actor in enumerate(self.actors[:encoders])
        ]
        reference = self.actors[0].train_quantiser.remote(task, parts)
        try:
            self.clock("quantiser").wait_next(
                {reference: Task("IVF-PQ quantiser", self.names[0])}, stopping
            )
        except BaseException as error:
            self._stop_tasks([reference, *parts], error)
            raise
        return QuantiserTrained(ray.get(reference), encoders, time.perf_counter() - start)

    @staticmethod
    def _finish_one(
        clock: TaskClock,
        pending: dict[ray.ObjectRef, tuple[int, Task]],
        load: list[int],
        on_done: Callable[[ShardEncoded], None],
        stopping: Callable[[], bool] | None,
    ) -> None:
        tasks = {reference: task for reference, (_, task) in pending.items()}
        ready = clock.wait_next(tasks, stopping)
        actor, _ = pending.pop(ready)
        load[actor] -= 1
        encoded: ShardEncoded = ray.get(ready)
        clock.record(encoded.seconds)
        on_done(encoded)

    def mention_queries(
        self, batches: Iterable[tuple[list[str], list[str], list[str]]]
    ) -> Iterator[ray.ObjectRef]:
        """A reference to the query vectors of each (left, mention, right) batch, spread over the
        actors; the vectors go from the encoder to the shard holders without passing here."""
        for number, (left, mention, right) in enumerate(batches):
            actor = self.actors[number % len(self.actors)]
            yield actor.encode_mentions.remote(left, mention, right)

    def hold(self, version: IndexVersion, candidate_depth: int) -> HeldIndex:
        """Spread `version`'s shards over the actors (see `hnce.cluster.compute.shard_holders`)."""
        return HeldIndex.start(
            version,
            list(zip(self.actors, self.names, strict=True)),
            self.settings.faiss_device,
            candidate_depth,
            self.clock("index search"),
        )

    def reload(self, export_dir: Path, token_store: Path | None) -> None:
        """Give every actor the model of `export_dir` (and `token_store`), replacing the one it
        holds, and drop the shards it held (a `reloadable` pool)."""
        if self.pointer is None:
            raise RuntimeError("reload needs a pool started with reloadable=True")
        ray.get(self.pointer.set.remote(PoolModel(str(export_dir), _text(token_store))))
        self._on_every_actor("reload")

    def release(self) -> None:
        """Every actor drops the index shards it holds (their memory is freed)."""
        self._on_every_actor("release")

    def _on_every_actor(self, method: str) -> None:
        """Call `method` on every actor and wait for all of them, within a deadline."""
        calls = [getattr(actor, method).remote() for actor in self.actors]
        self.clock(f"encoder {method}").get(calls, Task(method, ", ".join(self.names)))

    def _stop_tasks(self, references: list[ray.ObjectRef], error: BaseException) -> None:
        """Work stopped early by `error`: its tasks settled (:func:`_settle`), or, when an actor
        is hung (TaskTimeout), the pool's actors killed at once, since a hung actor answers no
        cancel and settling would wait out :data:`SETTLE_SECONDS` for it."""
        if isinstance(error, TaskTimeout):
            self.shutdown()
        else:
            _settle(references)

    def shutdown(self) -> None:
        """Stop the actors (their weights and shards are freed)."""
        for actor in [*self.actors, *([] if self.pointer is None else [self.pointer])]:
            ray.kill(actor, no_restart=True)


class KeptPool:
    """One encoder pool kept from one refresh to the next (the refresh coordinator's).

    Starting an encoder actor (a Ray worker process, its imports, the model moved to its device)
    took 7-30 s of a refresh's 7-33 s on 2 CPU cores and 16-19 s of 23-28 s on a shared H200
    (BENCHMARKS.md, "GPU paths"). A kept pool starts once; each later refresh with the same pool
    settings only loads the new checkpoint's weights into the running actors
    (:meth:`EncoderPool.reload`: 0.6 s against 7.4 s to start on 2 cores, BENCHMARKS.md "Kept
    encoder pool"; 1.8 s against 18.3 s on the H200).
    A refresh that fails or is stopped closes the pool (its actors may be broken or busy), and
    the next refresh starts a new one.
    """

    def __init__(self) -> None:
        self.pool: EncoderPool | None = None
        self.settings: EncoderPoolSettings | None = None

    def reuses(self, settings: EncoderPoolSettings) -> bool:
        """Whether :meth:`pool_for` with `settings` reloads the kept pool (else it starts one)."""
        return self.pool is not None and self.settings == settings

    def pool_for(
        self, export_dir: Path, settings: EncoderPoolSettings, token_store: Path | None
    ) -> EncoderPool:
        """The kept pool, loaded with `export_dir`; a new pool when there is none or its settings
        differ."""
        if self.reuses(settings):
            try:
                self.pool.reload(export_dir, token_store)
            except BaseException:
                self.close()
                raise
            return self.pool
        self.close()
        self.pool = EncoderPool(export_dir, settings, token_store, reloadable=True)
        self.settings = settings
        return self.pool

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Around one refresh: on success the actors drop the shards they held and stay (a
        pool that cannot is closed, logged: the refresh itself is done); on any error (a stop
        included) the pool is closed."""
        try:
            yield
        except BaseException:
            self.close()
            raise
        if self.pool is None:
            return
        try:
            self.pool.release()
        except Exception as error:
            logger.warning(
                "closing the kept encoder pool: its actors kept their shards (%s)", error
            )
            self.close()

    def close(self) -> None:
        """Stop the kept pool's actors, if any."""
        if self.pool is not None:
            self.pool.shutdown()
        self.pool = self.settings = None


def _settle(references: list[ray.ObjectRef]) -> None:
    """When indexing stops early (a refresh abandoned, an error): cancel every shard task (a
    queued one never starts, a running one stops at its next batch: `ShardCancelled`), wait for
    them (at most :data:`SETTLE_SECONDS`) and read every outcome, so that stopping the actors
    afterwards fails no task of theirs (Ray would report it as a task failure, and retry it, at
    the end of a normal run)."""
    for reference in references:
        with contextlib.suppress(Exception):
            ray.cancel(reference)
    with contextlib.suppress(Exception):
        ray.wait(references, num_returns=len(references), timeout=SETTLE_SECONDS)
    for reference in references:
        with contextlib.suppress(Exception):
            ray.get(reference, timeout=0)


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)
