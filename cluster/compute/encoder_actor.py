"""The entity encoder, a Ray actor: it encodes the catalogue into index shards, holds those
shards, and encodes mentions (docs/refresh.md).

Each `EntityEncoderActor` loads the bi-encoder from an `export/` directory once, when it starts
(so weights reach an actor once per refresh, not once per batch; the refresh coordinator's
`KeptPool` keeps its actors from one refresh to the next and reloads them), takes a GPU when
the cluster has them and the CPU otherwise, and runs every forward pass under
`hnce.encoders.precision.autocast` (bf16 on a GPU). For a shard of the catalogue it reads the
entities' token rows from the catalogue's token store (`hnce.cluster.stores.tokens`: tokenized
once per tokenizer and length, memory-mapped, so nothing is tokenized per refresh), groups
entities of similar length into batches (`length_sorted_batches`) to cut padding
(`hnce.cluster.compute.entity_encoding`), builds the shard's FAISS index and writes it straight
into the version being built (`hnce.cluster.stores.shard_files.write_shard`): the orchestrating
process never sees the vectors. An ``ivfpq`` version's shards share one IVF-PQ quantiser, which
one actor trains on a sample of the whole catalogue before the shards are dispatched
(:class:`QuantiserTask`). Precomputed vectors (BLINK's ``.t7``) are indexed the same way, read
memory-mapped. Once a version is published the same actors hold its shards and search them
(`hnce.cluster.compute.shard_holders`). The pool that starts them and hands them their tasks is
`hnce.cluster.compute.encoder_pool`.

A shard is a pure function of the checkpoint, the shard's token rows and the batching, so a
retried shard writes the same bytes as a clean run.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import torch

from hnce.cluster.compute.entity_encoding import (
    BuiltShard,
    encode_compressed_tokens,
    encode_entities,
    encode_mention_queries,
    read_encodings,
    training_sample,
)
from hnce.cluster.compute.model_pointer import PoolModel
from hnce.cluster.compute.shard_holders import ShardHolder
from hnce.cluster.stores.faiss_index import build_shard_index, train_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.shard_files import (
    ShardRecord,
    read_quantiser,
    write_quantiser,
    write_shard,
)
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder, load_biencoder
from hnce.encoders.formatting import tokenizer_fingerprint
from hnce.errors import InputError

logger = logging.getLogger(__name__)

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


def node_cores() -> int:
    """The cores this process may run on (its CPU affinity), which a local Ray instance's
    logical CPU count can exceed (it advertises a slot for every trainer and encoder)."""
    return len(os.sched_getaffinity(0))


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
        """A compressed sum-of-max shard, or any plaid shard (`encode_compressed_tokens`)."""
        if self.spec.kind == "plaid":
            return True
        return self.vectors_per_entity is None and self.spec.kind == "ivfpq"

    @property
    def keeps_vector_copy(self) -> bool:
        """A compressed multi-m shard, which keeps a float16 copy of its vectors to rescore its
        candidates from (:mod:`hnce.cluster.stores.sharded_searcher`)."""
        return (self.vectors_per_entity or 1) > 1 and self.spec.kind not in ("flat", "plaid")


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
        self.start_error: InputError | None = None
        try:
            self.load(model)
        except InputError as error:
            # Ray hands the driver only the text of what a constructor raised (ActorDiedError);
            # raised from a method, the InputError itself reaches the user (docs/failures.md).
            self.start_error = error

    @property
    def model(self) -> BiEncoder:
        """The loaded bi-encoder; the error that kept it from loading, raised again."""
        if self.start_error is not None:
            raise self.start_error
        return self._model

    def load(self, model: PoolModel) -> None:
        """Load `model`'s weights and token store, dropping any index shards held."""
        self._model = load_biencoder(Path(model.export_dir), device=self.device).eval()
        self.start_error = None
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
        """The actor's pid once its model is loaded (the error that kept it from loading)."""
        if self.start_error is not None:
            raise self.start_error
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
            pool_factor=task.spec.token_pool_factor,
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
        trained = read_quantiser(Path(task.directory)) if task.spec.quantised else None
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
                pool_factor=task.spec.token_pool_factor,
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
