"""The asynchronous refresh: newest checkpoint → encode → index → mine → publish (DESIGN.md §5).

`run_refresh` does one refresh in the calling process (the coordinator), with an `EncoderPool` of
Ray actors doing the encoding; `RefreshCoordinator` is the Ray actor the trainer starts to keep
refreshing as checkpoints appear. A refresh:

1. picks the newest complete checkpoint `<run>/checkpoints/step-<S>/` (with its `COMPLETE`
   marker), skipping older ones not yet refreshed (stale);
2. streams the catalogue in shards to the encoder actors; each finished shard is indexed and
   recorded in the unfinished version's `progress.json`, so a restarted refresh resumes;
3. publishes the index version when every shard is in (a rename, then `CURRENT`);
4. mines the mention splits against it and publishes the negatives version of the same number.

Example (the trainer, inside a Ray job)::

    coordinator = RefreshCoordinator.remote(RefreshConfig(run_dir=run, data_dir=data))
    coordinator.watch.remote(poll_seconds=30)            # runs until coordinator.stop.remote()
    ...
    negatives = NegativesStore(run / "negatives").latest()   # switch when it changes
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
from tqdm import tqdm

from cluster.encoder_pool import EncoderPool, ShardEncoded, ShardTask
from cluster.index_store import BuildParameters, IndexBuilder, IndexStore, IndexVersion
from cluster.miner import mine_split
from cluster.negatives_store import NegativesStore
from cluster.sharded_index import DeviceRequest, IndexSpec, build_shard_index
from cluster.tables import EntityCatalogue, MentionSplit, mention_split_path
from encoders.biencoder import SCORER_FILE

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "COMPLETE"
EXPORT_DIR = "export"
_STEP_PATTERN = re.compile(r"^step-(\d+)$")


class NoCheckpointError(FileNotFoundError):
    """The run has no complete checkpoint to refresh from."""


@dataclass
class RefreshConfig:
    """Settings of a refresh of one run directory.

    Attributes:
        run_dir: the run (`checkpoints/`, `index/`, `negatives/` under it).
        data_dir: dataset directory in the Parquet contract (`entities/`, `mentions/`).
        splits: mention splits to mine negatives for.
        num_encoders: encoder actors (0 = one per GPU, or 1 without GPUs).
        encoder_threads: torch threads (and CPUs requested) per CPU encoder actor.
        batch_size: entities per forward pass.
        mention_batch_size: mentions per forward pass when mining.
        shard_size: catalogue rows per shard (one FAISS index file each).
        top_n: candidates kept per mention.
        index: how each shard is indexed (flat by default: exact top-N for mining).
        faiss_device: auto | cpu | gpu for searching while mining.
        keep: versions retained in each store.
    """

    run_dir: Path
    data_dir: Path
    splits: tuple[str, ...] = ("train",)
    num_encoders: int = 0
    encoder_threads: int = 1
    batch_size: int = 64
    mention_batch_size: int = 256
    shard_size: int = 100_000
    top_n: int = 64
    index: IndexSpec = field(default_factory=IndexSpec)
    faiss_device: DeviceRequest = "auto"
    keep: int = 3

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.data_dir = Path(self.data_dir)
        if self.shard_size < 1 or self.top_n < 1 or self.batch_size < 1:
            raise ValueError("shard_size, top_n and batch_size must be positive")

    @property
    def index_store(self) -> IndexStore:
        return IndexStore(self.run_dir / "index", keep=self.keep, device=self.faiss_device)

    @property
    def negatives_store(self) -> NegativesStore:
        return NegativesStore(self.run_dir / "negatives", keep=self.keep)


@dataclass
class RefreshSummary:
    """What a refresh did (also its one-line log)."""

    checkpoint: int
    index_version: int
    negatives_version: int
    num_entities: int = 0
    num_vectors: int = 0
    num_shards: int = 0
    resumed_shards: int = 0
    encode_seconds: float = 0.0
    total_seconds: float = 0.0
    skipped_checkpoints: list[int] = field(default_factory=list)
    recall: dict[str, float] = field(default_factory=dict)
    up_to_date: bool = False

    def line(self) -> str:
        if self.up_to_date:
            return (
                f"refresh: checkpoint step-{self.checkpoint} already published as index "
                f"v{self.index_version} / negatives v{self.negatives_version}; nothing to do"
            )
        rate = self.num_entities / self.encode_seconds if self.encode_seconds else 0.0
        recall = ", ".join(
            f"{split} gold@top-N {value:.3f}" for split, value in self.recall.items()
        )
        skipped = (
            f"; skipped stale {', '.join(f'step-{s}' for s in self.skipped_checkpoints)}"
            if self.skipped_checkpoints
            else ""
        )
        return (
            f"refresh: step-{self.checkpoint} → index v{self.index_version} "
            f"({self.num_entities} entities, {self.num_vectors} vectors, {self.num_shards} shards, "
            f"{self.resumed_shards} resumed) encoded at {rate:.1f} entities/s; negatives "
            f"v{self.negatives_version} ({recall}) in {self.total_seconds:.1f}s{skipped}"
        )


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint with its COMPLETE marker, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_PATTERN.match(entry.name)
        if match and (entry / COMPLETE_MARKER).is_file() and (entry / EXPORT_DIR).is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def run_refresh(
    config: RefreshConfig,
    step: int | None = None,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None = None,
) -> RefreshSummary:
    """One refresh from checkpoint `step` (default: the newest complete one).

    `on_shard` is called in this process after each shard is indexed (for monitoring). Raises
    NoCheckpointError when there is nothing to refresh from.
    """
    started = time.perf_counter()
    checkpoints = complete_checkpoints(config.run_dir)
    if not checkpoints:
        raise NoCheckpointError(f"{config.run_dir / CHECKPOINTS_DIR}: no complete checkpoint")
    by_step = dict(checkpoints)
    if step is None:
        step = checkpoints[-1][0]
    if step not in by_step:
        raise NoCheckpointError(f"{config.run_dir / CHECKPOINTS_DIR}/step-{step}: not complete")
    index_store, negatives_store = config.index_store, config.negatives_store
    # The manifest alone says which checkpoint is live; the index is loaded only when needed.
    live = index_store.current_version()
    live_step = index_store.read_manifest(live)["checkpoint"] if live is not None else -1
    skipped = [s for s, _ in checkpoints if live_step < s < step]
    if skipped:
        logger.info("skipping stale checkpoints %s: step-%d is newer", skipped, step)
    export_dir = by_step[step] / EXPORT_DIR
    mine_only = live is not None and live_step == step
    if mine_only:
        if negatives_store.current_version() == live:
            return RefreshSummary(step, live, live, up_to_date=True)
        logger.info("index v%d exists for step-%d; mining only", live, step)
    pool = _pool(config, export_dir)
    try:
        if mine_only:
            index_version, summary = index_store.open(live), RefreshSummary(step, live, live)
        else:
            index_version, summary = _build_index(
                config, index_store, pool, step, export_dir, on_shard
            )
        summary.skipped_checkpoints = skipped
        mined = {}
        for split in config.splits:
            mentions = MentionSplit.open(mention_split_path(config.data_dir, split))
            mined[split] = mine_split(
                pool,
                index_version,
                mentions,
                config.top_n,
                config.mention_batch_size,
                description=f"mining {split}",
            )
            ranks = mined[split].gold_ranks
            summary.recall[split] = float((ranks >= 0).mean()) if len(ranks) else 0.0
        negatives_store.publish(index_version.version, mined, step, config.top_n)
    finally:
        pool.shutdown()
    summary.total_seconds = time.perf_counter() - started
    logger.info(summary.line())
    return summary


def _pool(config: RefreshConfig, export_dir: Path) -> EncoderPool:
    return EncoderPool(
        export_dir,
        num_encoders=config.num_encoders,
        batch_size=config.batch_size,
        num_threads=config.encoder_threads,
    )


def _build_index(
    config: RefreshConfig,
    store: IndexStore,
    pool: EncoderPool,
    step: int,
    export_dir: Path,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None,
) -> tuple[IndexVersion, RefreshSummary]:
    """Encode and index every unfinished shard, then publish the version."""
    description = json.loads((export_dir / SCORER_FILE).read_text(encoding="utf-8"))
    if not description.get("indexable", False):
        raise ValueError(
            f"{export_dir / SCORER_FILE}: scorer {description['scorer']['name']!r} cannot be "
            f"indexed (its query depends on the entity); refresh needs dual, multi or som"
        )
    catalogue = EntityCatalogue.open(config.data_dir)
    parameters = BuildParameters(
        checkpoint=step,
        checkpoint_path=str(export_dir),
        scorer=description["scorer"],
        dim=int(description["output_size"]),
        vectors_per_entity=description["vectors_per_entity"],
        num_entities=len(catalogue),
        index={**config.index.to_json(), "shard_size": config.shard_size},
    )
    builder = store.begin(parameters)
    summary = RefreshSummary(step, builder.version, builder.version)
    finished = builder.finished_shards
    summary.resumed_shards = len(finished)
    bar = tqdm(total=len(catalogue), desc=f"encoding step-{step}", unit="entities", unit_scale=True)
    bar.update(sum(_shard_entities(builder, number) for number in finished))
    encode_started = time.perf_counter()
    shard_count = [0]

    def tasks() -> Iterator[ShardTask]:
        columns = ["entity_id", "title", "text"]
        for number, rows in enumerate(catalogue.iter_batches(config.shard_size, columns)):
            shard_count[0] = number + 1
            if number not in finished:
                vectors_path, ids_path = builder.embedding_paths(number)
                yield ShardTask(number, rows, str(vectors_path), str(ids_path))

    def index_shard(encoded: ShardEncoded) -> None:
        vectors_path, ids_path = builder.embedding_paths(encoded.shard_no)
        vectors = np.load(vectors_path, allow_pickle=False)
        ids = np.load(ids_path, allow_pickle=False)
        builder.add_shard(encoded.shard_no, build_shard_index(vectors, config.index), ids)
        vectors_path.unlink()
        ids_path.unlink()
        bar.update(encoded.num_entities)
        if on_shard is not None:
            on_shard(encoded, pool)

    with bar:
        pool.encode_shards(tasks(), index_shard)
    summary.encode_seconds = time.perf_counter() - encode_started
    summary.num_entities = len(catalogue)
    summary.num_shards = shard_count[0]
    version = builder.publish(summary.num_shards)
    summary.num_vectors = version.searcher.ntotal
    return version, summary


def _shard_entities(builder: IndexBuilder, shard_no: int) -> int:
    """Distinct entities of a finished shard (for the progress bar of a resumed refresh)."""
    ids_path = builder.directory / builder.finished_shards[shard_no].ids
    return len(np.unique(np.load(ids_path, allow_pickle=False)))


@ray.remote(max_restarts=3, max_task_retries=3, num_cpus=0, max_concurrency=4)
class RefreshCoordinator:
    """Ray actor that refreshes whenever a newer complete checkpoint appears.

    Restarted by Ray if it dies; a restarted refresh resumes from the recorded shards. Runs its
    loop in a thread so `stop`, `status` and `refresh` calls are served meanwhile.
    """

    def __init__(self, config: RefreshConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.summaries: list[RefreshSummary] = []
        self.last_error: str | None = None

    def refresh(self, step: int | None = None) -> RefreshSummary:
        """One refresh now (newest checkpoint unless `step` is given)."""
        with self._lock:
            summary = run_refresh(self.config, step)
            self.summaries.append(summary)
            return summary

    def watch(self, poll_seconds: float = 30.0) -> int:
        """Refresh each time a newer checkpoint is complete, until `stop`; returns refreshes done."""
        done = 0
        while not self._stop.is_set():
            checkpoints = complete_checkpoints(self.config.run_dir)
            current = self.config.index_store.current_version()
            newest = checkpoints[-1][0] if checkpoints else None
            published = (
                self.config.index_store.read_manifest(current)["checkpoint"]
                if current is not None
                else None
            )
            negatives = self.config.negatives_store.current_version()
            if newest is not None and (newest != published or negatives != current):
                try:
                    self.refresh(newest)
                    done += 1
                except Exception as error:  # reported through status(); the loop keeps watching
                    logger.exception("refresh of step-%s failed", newest)
                    self.last_error = f"step-{newest}: {error!r}"
            self._stop.wait(poll_seconds)
        return done

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, object]:
        """Last summary line and error (for the trainer's logs)."""
        return {
            "refreshes": len(self.summaries),
            "last": self.summaries[-1].line() if self.summaries else None,
            "error": self.last_error,
        }
