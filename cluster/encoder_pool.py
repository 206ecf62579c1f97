"""Ray actors that turn catalogue shards into index vectors, and mentions into query vectors (DESIGN.md §5).

Each `EntityEncoderActor` loads the bi-encoder from a checkpoint's `export/` directory once, when
it starts (so weights reach an actor once per refresh, not once per batch), takes a GPU when the
cluster has them and the CPU otherwise, and encodes whole shards: it tokenizes the shard once,
groups entities of similar length into batches (`length_sorted_batches`) to cut padding, and
writes the shard's index vectors with their entity ids as two `.npy` arrays (never pickled).

Actors are restarted by Ray when they die (`max_restarts`) and their queued and running calls are
retried (`max_task_retries`). Encoding a shard is a pure function of the checkpoint, the shard's
rows and the batching, so a retried shard writes the same bytes as a clean run.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray
import torch

from cluster.files import AtomicPath
from cluster.resources import ENCODER_RESOURCE, custom_resource_request
from encoders.biencoder import BiEncoder, load_biencoder
from encoders.formatting import length_sorted_batches

logger = logging.getLogger(__name__)


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


@torch.inference_mode()
def encode_entity_texts(
    model: BiEncoder,
    titles: Sequence[str | None],
    texts: Sequence[str],
    batch_size: int,
    bucketed: bool = True,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Index vectors of a list of entities, in entity order.

    Returns (vectors float32 [V, d], rows int64 [V] — each vector's position in `titles`, padded
    token count). `bucketed` groups entities of similar length into a batch; otherwise batches
    follow catalogue order and are padded to the entity length (the fixed-padding baseline).
    """
    device = next(model.entity_tower.parameters()).device
    tokens = model.tokenize_entities(titles, texts)
    input_ids, attention_mask = tokens["input_ids"], tokens["attention_mask"]
    lengths = attention_mask.sum(dim=1).numpy()
    if bucketed:
        batches = length_sorted_batches(lengths, batch_size)
    else:
        order = np.arange(len(lengths))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    vectors, rows, padded = [], [], 0
    for batch in batches:
        width = int(lengths[batch].max()) if bucketed else model.entity_length
        batch_ids = _pad_to(input_ids[batch], width)
        batch_mask = _pad_to(attention_mask[batch], width)
        padded += batch_ids.numel()
        batch_vectors, batch_rows = model.entity_index_vectors(
            batch_ids.to(device), batch_mask.to(device)
        )
        vectors.append(batch_vectors.float().cpu().numpy())
        rows.append(batch[batch_rows.cpu().numpy()])
    if not vectors:
        return np.zeros((0, model.output_size), np.float32), np.zeros(0, np.int64), 0
    all_rows = np.concatenate(rows).astype(np.int64)
    order = np.argsort(all_rows, kind="stable")  # back to catalogue order, tokens in order
    return np.concatenate(vectors)[order], all_rows[order], padded


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
    queries = model.mention_query_vectors(
        tokens["input_ids"].to(device), tokens["attention_mask"].to(device)
    )
    return queries.float().cpu().numpy()


def _pad_to(tensor: torch.Tensor, width: int) -> torch.Tensor:
    if tensor.shape[1] >= width:
        return tensor[:, :width]
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))


@dataclass(frozen=True)
class ShardTask:
    """One shard to encode: catalogue rows (entity_id, title, text) and where its arrays go."""

    shard_no: int
    rows: pa.RecordBatch
    vectors_path: str
    ids_path: str


@dataclass(frozen=True)
class ShardEncoded:
    """What an encoder reports for a finished shard (the arrays are on disk)."""

    shard_no: int
    num_entities: int
    num_vectors: int
    seconds: float
    padded_tokens: int
    encoder_pid: int


class EntityEncoderActor:
    """Holds one loaded bi-encoder; encodes entity shards and mention batches (a Ray actor)."""

    def __init__(self, export_dir: str, batch_size: int, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        self.model = load_biencoder(Path(export_dir), device=torch_device()).eval()
        self.batch_size = batch_size

    def encode_shard(self, task: ShardTask) -> ShardEncoded:
        """Encode one shard and write `<vectors_path>` (float32 [V, d]) and `<ids_path>` (int64 [V])."""
        start = time.perf_counter()
        entity_ids = task.rows.column("entity_id").to_numpy()
        vectors, rows, padded = encode_entity_texts(
            self.model,
            task.rows.column("title").to_pylist(),
            task.rows.column("text").to_pylist(),
            self.batch_size,
        )
        _save_array(Path(task.vectors_path), vectors)
        _save_array(Path(task.ids_path), entity_ids[rows].astype(np.int64))
        return ShardEncoded(
            shard_no=task.shard_no,
            num_entities=len(entity_ids),
            num_vectors=len(vectors),
            seconds=time.perf_counter() - start,
            padded_tokens=padded,
            encoder_pid=os.getpid(),
        )

    def encode_mentions(
        self, context_left: list[str], mention: list[str], context_right: list[str]
    ) -> np.ndarray:
        """Query vectors [B, Q, d] for a batch of mentions (see `encode_mention_queries`)."""
        return encode_mention_queries(self.model, context_left, mention, context_right)

    def pid(self) -> int:
        return os.getpid()


def _save_array(path: Path, array: np.ndarray) -> None:
    """`np.save` without pickling, published atomically so a half-written file never shows."""
    with AtomicPath(path) as temporary, open(temporary, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)


class EncoderPool:
    """A pool of `EntityEncoderActor`s for one refresh.

    Args:
        export_dir: the checkpoint's `export/` directory (export_biencoder format).
        num_encoders: actors; 0 means one per `hnce_encoder` slot when the cluster advertises
            them, else one per GPU, or 1 without GPUs.
        batch_size: entities per forward pass.
        num_threads: torch threads per actor on CPU (also its `num_cpus` request).
        max_restarts, max_task_retries: Ray fault tolerance for the actors.
    """

    def __init__(
        self,
        export_dir: Path,
        num_encoders: int = 0,
        batch_size: int = 64,
        num_threads: int = 1,
        max_restarts: int = 3,
        max_task_retries: int = 3,
    ) -> None:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        custom = custom_resource_request(ENCODER_RESOURCE, resources)
        # With the launcher's encoder slots, one actor per slot (trainer GPUs are not ours).
        slots = int(resources[ENCODER_RESOURCE]) if custom else max(1, gpus)
        self.num_encoders = num_encoders or slots
        request: dict[str, object] = (
            {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_cpus": num_threads}
        )
        if custom:
            request["resources"] = custom
        logger.info(
            "starting %d entity encoder actor(s) on %s%s",
            self.num_encoders,
            "GPU" if gpus else "CPU",
            f" with {custom}" if custom else "",
        )
        remote_class = ray.remote(EntityEncoderActor)
        self.pool_id = uuid.uuid4().hex[:8]
        self.actors = [
            remote_class.options(
                name=f"hnce-encoder-{self.pool_id}-{number}",
                max_restarts=max_restarts,
                max_task_retries=max_task_retries,
                **request,
            ).remote(str(export_dir), batch_size, num_threads)
            for number in range(self.num_encoders)
        ]

    def encode_shards(
        self,
        tasks: Iterable[ShardTask],
        on_done: Callable[[ShardEncoded], None],
        max_in_flight_per_encoder: int = 2,
    ) -> None:
        """Encode `tasks` across the actors, calling `on_done` (in this process) as shards finish.

        At most `max_in_flight_per_encoder` shards per actor are queued, so the catalogue is
        streamed rather than loaded at once.
        """
        pending: dict[ray.ObjectRef, int] = {}
        load = [0] * len(self.actors)
        limit = max_in_flight_per_encoder * len(self.actors)
        for task in tasks:
            while len(pending) >= limit:
                self._finish_one(pending, load, on_done)
            actor = int(np.argmin(load))
            pending[self.actors[actor].encode_shard.remote(task)] = actor
            load[actor] += 1
        while pending:
            self._finish_one(pending, load, on_done)

    @staticmethod
    def _finish_one(
        pending: dict[ray.ObjectRef, int],
        load: list[int],
        on_done: Callable[[ShardEncoded], None],
    ) -> None:
        (ready,), _ = ray.wait(list(pending), num_returns=1)
        load[pending.pop(ready)] -= 1
        on_done(ray.get(ready))

    def encode_mentions(
        self, batches: Iterable[tuple[list[str], list[str], list[str]]]
    ) -> Iterable[np.ndarray]:
        """Query vectors per mention batch, in input order, spread over the actors."""
        window: list[ray.ObjectRef] = []
        for number, (left, mention, right) in enumerate(batches):
            actor = self.actors[number % len(self.actors)]
            window.append(actor.encode_mentions.remote(left, mention, right))
            if len(window) > 2 * len(self.actors):
                yield ray.get(window.pop(0))
        for reference in window:
            yield ray.get(reference)

    def shutdown(self) -> None:
        """Stop the actors (their weights are freed)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
