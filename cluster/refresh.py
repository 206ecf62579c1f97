"""The asynchronous refresh: newest checkpoint → encode → index → mine → publish (DESIGN.md §5).

`run_refresh` does one refresh in the calling process, with an `EncoderPool` of Ray actors doing
the encoding; `cluster.coordinator.RefreshCoordinator` is the Ray actor the trainer starts to keep
refreshing as checkpoints appear, and `cluster.refresh_job` runs it as a scheduled job. The
``refresh`` section of a recipe is :class:`RefreshSettings`. A refresh:

1. picks the newest complete checkpoint `<run>/checkpoints/step-<S>/` (with its `COMPLETE`
   marker), skipping older ones not yet refreshed (stale);
2. streams the catalogue in shards to the encoder actors; each finished shard is indexed and
   recorded in the unfinished version's `progress.json`, so a restarted refresh resumes;
3. publishes the index version when every shard is in (a rename, then `CURRENT`);
4. mines the mention splits against it and publishes the negatives version of the same number.

Example::

    plan = RefreshPlan(run_dir, data_dir, RefreshSettings(), IndexSpec())
    summary = run_refresh(plan)                       # newest complete checkpoint
    negatives = plan.negatives_store.latest("train")
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import Field
from tqdm import tqdm

from cluster.checkpoints import (
    EXPORT_DIR,
    checkpoints_root,
    complete_checkpoints,
    verify_checkpoint,
)
from cluster.encoder_pool import EncoderPool, ShardEncoded, ShardTask
from cluster.index_store import BuildParameters, IndexBuilder, IndexStore, IndexVersion
from cluster.miner import mine_split
from cluster.negatives_store import NegativesStore
from cluster.sharded_index import IndexSpec, build_shard_index
from cluster.tables import EntityCatalogue, MentionSplit, mention_split_path
from encoders.biencoder import SCORER_FILE
from encoders.errors import InputError
from encoders.scorers import ScorerConfig
from encoders.settings import Flag, NonNegativeInt, PositiveInt, PositiveReal, Text, settings

logger = logging.getLogger(__name__)


class NoCheckpointError(InputError, FileNotFoundError):
    """The run has no complete checkpoint to refresh from."""


@settings
class RefreshSettings:
    """The ``refresh`` section of a recipe: re-encode the catalogue, index it, mine negatives.

    Attributes:
        enabled: ``hnce train`` runs a refresh coordinator beside the trainer.
        num_encoders: encoder actors (0: one per ``hnce_encoder`` slot the cluster advertises,
            else one per GPU, else 1).
        encoder_cpus: torch threads (and CPUs requested) per CPU encoder actor.
        batch_size: entities per forward pass.
        mention_batch_size: mentions per forward pass when mining.
        shard_size: catalogue rows per shard (one FAISS index file each).
        top_n: candidates kept per mention in a negatives version.
        splits: mention splits mined by every refresh (the train split at least, for training;
            add dev/test to rerank them with ``hnce rerank``).
        poll_seconds: how often the coordinator looks for a newer checkpoint.
        max_consecutive_failures: refreshes in a row that may fail before training stops.
    """

    enabled: Flag = True
    num_encoders: NonNegativeInt = 0
    encoder_cpus: PositiveInt = 1
    batch_size: PositiveInt = 128
    mention_batch_size: PositiveInt = 256
    shard_size: PositiveInt = 100_000
    top_n: PositiveInt = 64
    splits: list[Text] = Field(default_factory=lambda: ["train"], min_length=1)
    poll_seconds: PositiveReal = 2.0
    max_consecutive_failures: PositiveInt = 3


@dataclass(frozen=True)
class RefreshPlan:
    """What the refreshes of one run do: where (run and dataset directories) and how (the
    ``refresh`` and ``index`` sections)."""

    run_dir: Path
    data_dir: Path
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    index: IndexSpec = field(default_factory=IndexSpec)

    @property
    def index_store(self) -> IndexStore:
        return IndexStore(
            self.run_dir / "index", keep=self.index.keep_versions, device=self.index.faiss_device
        )

    @property
    def negatives_store(self) -> NegativesStore:
        return NegativesStore(self.run_dir / "negatives", keep=self.index.keep_versions)


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


def run_refresh(
    plan: RefreshPlan,
    step: int | None = None,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None = None,
) -> RefreshSummary:
    """One refresh from checkpoint `step` (default: the newest complete one).

    `on_shard` is called in this process after each shard is indexed (for monitoring). Raises
    NoCheckpointError when there is nothing to refresh from.
    """
    started = time.perf_counter()
    checkpoints = complete_checkpoints(plan.run_dir)
    if not checkpoints:
        raise NoCheckpointError(f"{checkpoints_root(plan.run_dir)}: no complete checkpoint")
    by_step = dict(checkpoints)
    if step is None:
        step = checkpoints[-1][0]
    if step not in by_step:
        raise NoCheckpointError(f"{checkpoints_root(plan.run_dir)}/step-{step}: not complete")
    verify_checkpoint(by_step[step])
    index_store, negatives_store = plan.index_store, plan.negatives_store
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
    pool = _pool(plan.refresh, export_dir)
    try:
        if mine_only:
            index_version, summary = index_store.open(live), RefreshSummary(step, live, live)
        else:
            index_version, summary = _build_index(
                plan, index_store, pool, step, export_dir, on_shard
            )
        summary.skipped_checkpoints = skipped
        mined = {}
        for split in plan.refresh.splits:
            mentions = MentionSplit.open(mention_split_path(plan.data_dir, split))
            mined[split] = mine_split(
                pool,
                index_version,
                mentions,
                plan.refresh.top_n,
                plan.refresh.mention_batch_size,
                description=f"mining {split}",
            )
            ranks = mined[split].gold_ranks
            summary.recall[split] = float((ranks >= 0).mean()) if len(ranks) else 0.0
        negatives_store.publish(index_version.version, mined, step, plan.refresh.top_n)
    finally:
        pool.shutdown()
    summary.total_seconds = time.perf_counter() - started
    logger.info(summary.line())
    return summary


def _pool(refresh: RefreshSettings, export_dir: Path) -> EncoderPool:
    return EncoderPool(
        export_dir,
        num_encoders=refresh.num_encoders,
        batch_size=refresh.batch_size,
        num_threads=refresh.encoder_cpus,
    )


def _build_index(
    plan: RefreshPlan,
    store: IndexStore,
    pool: EncoderPool,
    step: int,
    export_dir: Path,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None,
) -> tuple[IndexVersion, RefreshSummary]:
    """Encode and index every unfinished shard, then publish the version."""
    description = json.loads((export_dir / SCORER_FILE).read_text(encoding="utf-8"))
    if not ScorerConfig.from_dict(description["scorer"]).indexable:
        raise InputError(
            f"{export_dir / SCORER_FILE}: scorer {description['scorer']['name']!r} cannot be "
            f"indexed (its query depends on the entity); refresh needs dual, multi or som"
        )
    catalogue = EntityCatalogue.open(plan.data_dir)
    parameters = BuildParameters(
        checkpoint=step,
        checkpoint_path=str(export_dir),
        scorer=description["scorer"],
        dim=int(description["output_size"]),
        vectors_per_entity=description["vectors_per_entity"],
        num_entities=len(catalogue),
        index={**plan.index.to_json(), "shard_size": plan.refresh.shard_size},
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
        for number, rows in enumerate(catalogue.iter_batches(plan.refresh.shard_size, columns)):
            shard_count[0] = number + 1
            if number not in finished:
                vectors_path, ids_path = builder.embedding_paths(number)
                yield ShardTask(number, rows, str(vectors_path), str(ids_path))

    def index_shard(encoded: ShardEncoded) -> None:
        vectors_path, ids_path = builder.embedding_paths(encoded.shard_no)
        vectors = np.load(vectors_path, allow_pickle=False)
        ids = np.load(ids_path, allow_pickle=False)
        builder.add_shard(encoded.shard_no, build_shard_index(vectors, plan.index), ids)
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
