"""Ray actors that encode the catalogue into index shards, hold those shards, and encode mentions
(docs/refresh.md).

Each `EntityEncoderActor` loads the bi-encoder from an `export/` directory once, when it starts
(so weights reach an actor once per refresh, not once per batch; the refresh coordinator's
`KeptPool` keeps its actors from one refresh to the next and reloads them), takes a GPU when
the cluster has them and the CPU otherwise, and runs every forward pass under `hnce.encoders.precision.autocast`
(bf16 on a GPU). For a shard of the catalogue it reads the entities' token rows from the
catalogue's token store (`hnce.cluster.stores.tokens`: tokenized once per tokenizer and length, memory-mapped,
so nothing is tokenized per refresh), groups entities of similar length into batches
(`length_sorted_batches`) to cut padding, builds the shard's FAISS index and writes it straight
into the version being built (`hnce.cluster.stores.index_store.write_shard`): the orchestrating process
never sees the vectors. An ``ivfpq`` version's shards share one IVF-PQ quantiser, which one
actor trains on a sample of the whole catalogue before the shards are dispatched
(:class:`QuantiserTask`). Precomputed vectors (BLINK's ``.t7``) are indexed the same way, read
memory-mapped. Once a version is published the same actors hold its shards and search them
(`hnce.cluster.compute.shard_holders`).

Actors are restarted by Ray when they die (`max_restarts`) and their queued and running calls are
retried (`max_task_retries`). A shard is a pure function of the checkpoint, the shard's token rows
and the batching, so a retried shard writes the same bytes as a clean run. Starting a pool the
cluster cannot place, and every wait on an actor, fail with a clear error instead of hanging
(`hnce.cluster.compute.actors`).

Example::

    with EncoderPool(export_dir, EncoderPoolSettings(num_encoders=2), token_store) as pool:
        pool.index_shards(tasks, on_done)
        held = pool.hold(index_version, "auto", candidate_depth=256)
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import ray
import torch

from hnce.cluster.compute.actors import (
    PlacementError,
    Task,
    TaskClock,
    actor_request,
    check_placeable,
)
from hnce.cluster.compute.gpu_sharing import encoders_on_gpus
from hnce.cluster.compute.model_pointer import ModelPointer, PoolModel
from hnce.cluster.compute.resources import ENCODER_RESOURCE, custom_resource_request
from hnce.cluster.compute.shard_holders import HeldIndex, ShardHolder
from hnce.cluster.stores.index_store import (
    IndexVersion,
    ShardRecord,
    read_quantiser,
    write_quantiser,
    write_shard,
)
from hnce.cluster.stores.sharded_index import (
    DeviceRequest,
    IndexSpec,
    add_token_codes,
    build_shard_index,
    train_index,
)
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder, load_biencoder
from hnce.encoders.formatting import length_sorted_batches, tokenizer_fingerprint
from hnce.encoders.precision import autocast
from hnce.errors import InputError

logger = logging.getLogger(__name__)

#: How long stopping early waits for the shard tasks it cancelled to end.
SETTLE_SECONDS = 60.0
#: Entities encoded at once into a compressed token shard (bounds its full-precision vectors)
COMPRESSED_CHUNK_ENTITIES = 1024
#: Seed of the sample a version's IVF-PQ quantiser trains on, and of its k-means
SAMPLE_SEED = 0


def torch_device() -> torch.device:
    """The device an encoder runs on: the GPU Ray assigned to this actor, else the CPU (logged).

    An actor given a GPU by Ray whose torch cannot use it raises instead of encoding on the CPU.
    """
    assigned = ray.get_gpu_ids() if ray.is_initialized() else []
    if assigned and not torch.cuda.is_available():
        raise RuntimeError(
            f"Ray assigned GPU {assigned} to this encoder but torch {torch.__version__} has no "
            "usable CUDA; install a CUDA torch build on GPU nodes"
        )
    device = torch.device("cuda" if assigned else "cpu")
    logger.info("entity encoder on %s (Ray GPU ids %s)", device, assigned or "none")
    return device


class ShardCancelled(RuntimeError):
    """A shard task stopped between batches because Ray cancelled it (``ray.cancel``)."""


def node_cores() -> int:
    """The cores this process may run on (its CPU affinity), which a local Ray instance's
    logical CPU count can exceed (it advertises a slot for every trainer and encoder)."""
    return len(os.sched_getaffinity(0))


@torch.inference_mode()
def encode_entities(
    model: BiEncoder,
    tokens: TokenStore,
    entity_ids: np.ndarray,
    batch_size: int,
    bucketed: bool = True,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Index vectors of `entity_ids` from their token-store rows, in entity order.

    Returns (vectors float32 [V, d], the entity id of each vector int64 [V], padded token count).
    `bucketed` groups entities of similar length into a batch, each padded to its longest;
    otherwise batches follow catalogue order padded to the entity length (the fixed-padding
    baseline of the benchmarks). `cancelled` is asked before each batch; ShardCancelled when
    it says yes (an abandoned refresh stops within one batch, not one shard).
    """
    device = next(model.entity_tower.parameters()).device
    entity_ids = np.asarray(entity_ids, dtype=np.int64)
    lengths = np.asarray(tokens.lengths[entity_ids])
    if bucketed:
        batches = length_sorted_batches(lengths, batch_size)
    else:
        order = np.arange(len(entity_ids))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    vectors, rows, padded = [], [], 0
    for batch in batches:
        if cancelled():
            raise ShardCancelled(f"cancelled after {sum(map(len, rows))} of {len(entity_ids)}")
        inputs = tokens.batch(entity_ids[batch])
        if not bucketed:
            inputs = {name: _pad_to(value, model.entity_length) for name, value in inputs.items()}
        padded += inputs["input_ids"].numel()
        with autocast(device):
            batch_vectors, batch_rows = model.entity_index_vectors(
                inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
            )
        vectors.append(batch_vectors.float().cpu().numpy())
        rows.append(batch[batch_rows.cpu().numpy()])
    if not vectors:
        return np.zeros((0, model.output_size), np.float32), np.zeros(0, np.int64), 0
    all_rows = np.concatenate(rows).astype(np.int64)
    order = np.argsort(all_rows, kind="stable")  # back to catalogue order, tokens in order
    return np.concatenate(vectors)[order], entity_ids[all_rows[order]], padded


@dataclass(frozen=True)
class BuiltShard:
    """A shard's CPU index, the entity id of each of its vectors, a compressed sum-of-max
    shard's standalone token codes (:func:`encode_compressed_tokens`; None otherwise), the
    padded tokens its encoding ran over, and a compressed multi-m shard's (or a compressed
    sum-of-max shard's with ``index.token_copy``) float16 copy of its vectors (None otherwise)."""

    index: faiss.Index
    ids: np.ndarray
    codes: np.ndarray | None = None
    padded_tokens: int = 0
    vectors: np.ndarray | None = None


def training_sample(lengths: np.ndarray, train_size: int, seed: int) -> np.ndarray:
    """Positions (sorted) of a seeded random sample of entities whose `lengths` (vectors: tokens
    for sum-of-max) add up to at least `train_size`, or all of them: what a version's IVF-PQ
    quantiser trains on."""
    shuffled = np.random.default_rng(seed).permutation(len(lengths))
    reach = np.cumsum(np.asarray(lengths)[shuffled])
    return np.sort(shuffled[: int(np.searchsorted(reach, train_size)) + 1])


def compress_tokens(
    trained: faiss.Index,
    chunks: Iterable[tuple[np.ndarray, np.ndarray, int]],
    spec: IndexSpec,
) -> BuiltShard:
    """A compressed sum-of-max shard: each chunk of (token vectors, their entity ids, padded
    tokens), in entity order, added to the IVF lists of a copy of the version's `trained`
    quantiser and encoded into standalone codes before the next chunk is asked for (ColBERTv2's
    indexing, Santhanam et al. 2022, §3.3); with `spec.token_copy`, kept as a float16 copy
    instead of codes (2·d bytes a token, held until the shard is written, as the codes are)."""
    index = faiss.clone_index(trained)
    rescored, ids, padded = [], [], 0
    for vectors, vector_ids, chunk_padded in chunks:
        if spec.token_copy:
            index.add(vectors)
            rescored.append(vectors.astype(np.float16))
        else:
            rescored.append(add_token_codes(index, vectors))
        ids.append(vector_ids)
        padded += chunk_padded
    kept = np.concatenate(rescored)
    codes, copy = (None, kept) if spec.token_copy else (kept, None)
    return BuiltShard(index, np.concatenate(ids), codes, padded, copy)


def encode_compressed_tokens(
    model: BiEncoder,
    tokens: TokenStore,
    entity_ids: np.ndarray,
    trained: faiss.Index,
    spec: IndexSpec,
    batch_size: int,
    cancelled: Callable[[], bool] = lambda: False,
    chunk_entities: int = COMPRESSED_CHUNK_ENTITIES,
) -> BuiltShard:
    """Sum-of-max token vectors of `entity_ids` straight into a compressed shard on the
    version's `trained` quantiser (:func:`compress_tokens`), so that no more than one chunk of
    `chunk_entities` entities is ever held at full precision."""
    entity_ids = np.asarray(entity_ids, dtype=np.int64)
    chunks = (
        encode_entities(
            model,
            tokens,
            entity_ids[start : start + chunk_entities],
            batch_size,
            cancelled=cancelled,
        )
        for start in range(0, len(entity_ids), chunk_entities)
    )
    return compress_tokens(trained, chunks, spec)


@torch.inference_mode()
def encode_mention_queries(
    model: BiEncoder,
    context_left: Sequence[str],
    mention: Sequence[str],
    context_right: Sequence[str],
) -> np.ndarray:
    """Query vectors float32 [B, Q, d] of a batch of mentions (Q = 1 for dual and multi-m)."""
    device = next(model.mention_tower.parameters()).device
    tokens = model.tokenize_mentions(context_left, mention, context_right)
    with autocast(device):
        queries = model.mention_query_vectors(
            tokens["input_ids"].to(device), tokens["attention_mask"].to(device)
        )
    return queries.float().cpu().numpy()


def _pad_to(tensor: torch.Tensor, width: int) -> torch.Tensor:
    if tensor.shape[1] >= width:
        return tensor[:, :width]
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))


def read_encodings(path: Path) -> torch.Tensor:
    """Precomputed entity vectors [N, d] (BLINK's ``all_entities_large.t7``: row i is entity i),
    memory-mapped (``torch.load(mmap=True, weights_only=True)``): nothing is read into memory
    until a shard's rows are taken."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such encodings file")
    try:
        encodings = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise InputError(
            f"{path}: cannot memory-map as a torch tensor file (torch.save zip format needed; "
            f"re-save a legacy file once with torch.save(torch.load(path), path)): {error}"
        ) from error
    if not isinstance(encodings, torch.Tensor) or encodings.dim() != 2:
        kind = tuple(encodings.shape) if isinstance(encodings, torch.Tensor) else type(encodings)
        raise InputError(f"{path}: expected a 2-d tensor [entities, dim], got {kind}")
    if encodings.dtype != torch.float32:
        raise InputError(f"{path}: expected float32 encodings, got {encodings.dtype}")
    return encodings


@dataclass(frozen=True)
class ShardTask:
    """One shard to index: entities [start, stop) into the version directory `directory`.

    Vectors come from encoding the entities' token rows, or, with `encodings`, from rows
    start..stop-1 of that precomputed file.
    """

    shard_no: int
    entities: tuple[int, int]
    directory: str
    spec: IndexSpec
    vectors_per_entity: int | None
    encodings: str | None = None

    @property
    def compressed_tokens(self) -> bool:
        """A compressed sum-of-max shard (`encode_compressed_tokens`)."""
        return self.vectors_per_entity is None and self.spec.kind == "ivfpq"

    @property
    def keeps_vector_copy(self) -> bool:
        """A compressed multi-m shard, which keeps a float16 copy of its vectors to rescore its
        candidates from (:mod:`hnce.cluster.stores.sharded_index`)."""
        return (self.vectors_per_entity or 1) > 1 and self.spec.kind != "flat"


@dataclass(frozen=True)
class QuantiserTask:
    """The one IVF-PQ quantiser of an ``ivfpq`` version being built in `directory`: trained on
    about `spec.train_size` vectors (sum-of-max: tokens) of entities sampled from the whole
    catalogue [0, `num_entities`), encoded from the token store or read from rows of
    `encodings`, and written there (``quantiser.faiss``) before any shard is dispatched. Every
    shard is a copy of it plus its own vectors, as ColBERTv2 and PLAID train one set of
    centroids for a whole collection (Santhanam et al. 2022, §3.3): the shards share one
    codebook, and a build trains once instead of once a shard."""

    directory: str
    spec: IndexSpec
    vectors_per_entity: int | None
    num_entities: int
    encodings: str | None = None


@dataclass(frozen=True)
class QuantiserTrained:
    """A trained quantiser: the vectors it trained on, the encoders that encoded them (one
    reads them where they come from precomputed encodings) and the wall time of both."""

    sample_vectors: int
    encoders: int
    seconds: float


@dataclass(frozen=True)
class ShardEncoded:
    """What an encoder reports for a finished shard (its files are in the version directory)."""

    shard_no: int
    record: ShardRecord
    num_entities: int
    seconds: float
    padded_tokens: int
    encoder_pid: int


class EntityEncoderActor(ShardHolder):
    """Holds one loaded bi-encoder; indexes catalogue shards, encodes mentions and holds index
    shards (a Ray actor).

    Args:
        model: the model it loads when it starts.
        batch_size: entities per forward pass.
        num_threads: torch threads (on a CPU actor; never more than its node's cores).
        pointer: the name of a kept pool's `ModelPointer`: on :meth:`reload`, and when Ray
            restarts the actor (with its first arguments), it loads the model the pointer names
            now (a name, not a handle: Ray keeps a handle argument in its object store, and a
            restart fails once that copy is gone).
    """

    def __init__(
        self, model: PoolModel, batch_size: int, num_threads: int, pointer: str | None = None
    ) -> None:
        torch.set_num_threads(min(num_threads, node_cores()))
        self.device = torch_device()
        self.batch_size = batch_size
        self.pointer = None if pointer is None else ray.get_actor(pointer)
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if self.pointer is not None and restarted:
            model = ray.get(self.pointer.get.remote())
        self.load(model)

    def load(self, model: PoolModel) -> None:
        """Load `model`'s weights and token store, dropping any index shards held."""
        self.model = load_biencoder(Path(model.export_dir), device=self.device).eval()
        self.tokens = None
        if model.token_store is not None:
            fingerprint = tokenizer_fingerprint(self.model.tokenizer)
            self.tokens = TokenStore.open(Path(model.token_store), fingerprint, verify=False)
        self.release()

    def reload(self) -> int:
        """Load the model the pool's `ModelPointer` names now (a kept pool's next refresh)."""
        if self.pointer is None:
            raise RuntimeError("only the actors of a kept pool reload their model")
        self.load(ray.get(self.pointer.get.remote()))
        return os.getpid()

    def ready(self) -> int:
        return os.getpid()

    def quantiser_sample(self, task: QuantiserTask, part: int, parts: int) -> np.ndarray:
        """Part `part` of `parts` of the vectors the version's quantiser trains on (see
        :class:`QuantiserTask`): the sample's entities are split into `parts` contiguous runs,
        one encoded by each encoder, so the parts concatenated in order are the whole sample in
        entity order. Read from `encodings`, the sample is one part."""
        if task.encodings is not None:
            rows = training_sample(np.ones(task.num_entities), task.spec.train_size, SAMPLE_SEED)
            return read_encodings(Path(task.encodings))[torch.from_numpy(rows)].numpy()
        tokens = self._token_store()
        per_entity = (
            tokens.lengths[: task.num_entities]
            if task.vectors_per_entity is None
            else np.full(task.num_entities, task.vectors_per_entity)
        )
        entities = training_sample(per_entity, task.spec.train_size, SAMPLE_SEED)
        vectors, _, _ = encode_entities(
            self.model,
            tokens,
            np.array_split(entities, parts)[part],
            self.batch_size,
            cancelled=ray.get_runtime_context().is_canceled,
        )
        return vectors

    def train_quantiser(self, task: QuantiserTask, sample_parts: list[ray.ObjectRef]) -> int:
        """Train the version's IVF-PQ quantiser on the sample's parts (:meth:`quantiser_sample`
        of each encoder, in order) and write it; returns the sample's size."""
        sample = np.concatenate(ray.get(sample_parts))
        write_quantiser(Path(task.directory), train_index(sample, task.spec, SAMPLE_SEED))
        return len(sample)

    def index_shard(self, task: ShardTask) -> ShardEncoded:
        """Encode (or read) one shard's vectors, build its FAISS index (an ``ivfpq`` shard: on
        the version's trained quantiser) and write it."""
        start = time.perf_counter()
        entity_ids = np.arange(*task.entities, dtype=np.int64)
        trained = read_quantiser(Path(task.directory)) if task.spec.kind == "ivfpq" else None
        if task.encodings is not None:
            vectors = read_encodings(Path(task.encodings))[task.entities[0] : task.entities[1]]
            index = build_shard_index(vectors.numpy(), task.spec, trained=trained)
            built = BuiltShard(index, entity_ids)
        elif task.compressed_tokens:
            built = encode_compressed_tokens(
                self.model,
                self._token_store(),
                entity_ids,
                trained,
                task.spec,
                self.batch_size,
                cancelled=ray.get_runtime_context().is_canceled,
            )
        else:
            vectors, vector_ids, padded = encode_entities(
                self.model,
                self._token_store(),
                entity_ids,
                self.batch_size,
                cancelled=ray.get_runtime_context().is_canceled,
            )
            copy = vectors.astype(np.float16) if task.keeps_vector_copy else None
            index = build_shard_index(vectors, task.spec, trained=trained)
            built = BuiltShard(index, vector_ids, None, padded, copy)
        record = write_shard(
            Path(task.directory),
            task.shard_no,
            built.index,
            built.ids,
            task.entities,
            task.vectors_per_entity,
            built.codes,
            built.vectors,
        )
        return ShardEncoded(
            shard_no=task.shard_no,
            record=record,
            num_entities=len(entity_ids),
            seconds=time.perf_counter() - start,
            padded_tokens=built.padded_tokens,
            encoder_pid=os.getpid(),
        )

    def _token_store(self) -> TokenStore:
        if self.tokens is None:
            raise RuntimeError("this encoder pool was started without a token store")
        return self.tokens

    def encode_mentions(
        self, context_left: list[str], mention: list[str], context_right: list[str]
    ) -> np.ndarray:
        """Query vectors [B, Q, d] for a batch of mentions (see `encode_mention_queries`)."""
        return encode_mention_queries(self.model, context_left, mention, context_right)

    def pid(self) -> int:
        return os.getpid()


@dataclass(frozen=True)
class EncoderPoolSettings:
    """How many encoder actors, how big, how patient (from the ``refresh`` section).

    `num_encoders` 0 means one per `hnce_encoder` slot when the cluster advertises them, else one
    per `gpus_per_actor` of the GPUs a trainer beside the pool leaves (`reserved_gpus`,
    :mod:`hnce.cluster.compute.gpu_sharing`), or 1 without GPUs. `num_threads` is each CPU actor's
    torch threads (and CPUs asked); with `free_cpus`, for a pool that runs with no trainer training
    beside it (version 0, evaluation, linking), each CPU actor instead takes an equal share of the
    CPUs Ray has free less `reserved_cpus` (those of a trainer that starts beside it and is not
    placed yet: version 0 of ``hnce train``), at least `num_threads`. `lent_threads`: torch threads
    a trainer that waits for this pool lends it (``refresh.mode: sync`` with ``training.cores:
    handover``, or version 0 of ``hnce train``), shared among the CPU actors on top of the CPUs they
    ask for. `wait_floor_seconds` is the least time any wait on an actor may take before it is
    reported as hung (`hnce.cluster.compute.actors.TaskClock`).
    """

    num_encoders: int = 0
    batch_size: int = 64
    num_threads: int = 1
    free_cpus: bool = False
    reserved_cpus: float = 0.0
    lent_threads: int = 0
    gpus_per_actor: float = 1.0
    reserved_gpus: float = 0.0
    wait_floor_seconds: float = 900.0
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
        starting.wait_started(
            [actor.ready.remote() for actor in self.actors], self.names, self.request
        )

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
        except BaseException:
            _settle(list(pending))
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
        except BaseException:
            _settle([reference, *parts])
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
