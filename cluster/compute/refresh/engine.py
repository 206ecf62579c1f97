"""One refresh: newest checkpoint → encode → index → mine → publish (docs/refresh.md).

:func:`run_refresh` does one refresh, orchestrating an ``EncoderPool`` of Ray actors that do the
work (the coordinator, :mod:`hnce.cluster.compute.refresh.coordinator`, keeps refreshing beside a
trainer; :mod:`hnce.cluster.compute.refresh.job` runs it under the run's lock, once or on a
schedule). A refresh:

1. picks the newest complete checkpoint ``<run>/checkpoints/step-<S>/`` (with its ``COMPLETE``
   marker, verified), skipping older ones not yet refreshed (stale);
2. makes sure the catalogue's token store exists for the model's tokenizer (built once, reused
   by every later refresh, the trainer and evaluation);
3. has the encoder actors index the catalogue shard by shard
   (:mod:`hnce.cluster.compute.index_build`); each finished shard is recorded, so a restarted
   refresh resumes; the version is published when every shard is in (a rename, then
   ``CURRENT``);
4. spreads the new version's shards over the same actors, scores the eval split's held-out
   recall against them when the plan asks (:mod:`hnce.cluster.compute.refresh.heldout`), mines
   the mention splits (:mod:`hnce.cluster.compute.miner`) and publishes the negatives version of
   the same number.

This process only orchestrates: it never holds the catalogue's vectors (the actors write and
hold the shards) and every wait on an actor has a deadline (:mod:`hnce.cluster.compute.actors`).
The summary line gives the time of each stage.

Example::

    summary = run_refresh(plan)                       # newest complete checkpoint
    negatives = plan.negatives_store.latest("train")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hnce.cluster.compute.actors import StopRequested
from hnce.cluster.compute.encoder_actor import ShardEncoded
from hnce.cluster.compute.encoder_pool import EncoderPool, KeptPool
from hnce.cluster.compute.index_build import IndexedModel, build_version, start_pool, timed
from hnce.cluster.compute.miner import mine_split
from hnce.cluster.compute.refresh.heldout import score_heldout
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.stores.checkpoints import checkpoints_root, complete_checkpoints
from hnce.cluster.stores.index_store import IndexVersion
from hnce.cluster.stores.refresh_log import HeldoutRecall
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.errors import InputError

logger = logging.getLogger(__name__)


class NoCheckpointError(InputError, FileNotFoundError):
    """The run has no complete checkpoint to refresh from."""


@dataclass
class RefreshSummary:
    """What a refresh did, with the seconds of each stage (also its one-line log)."""

    checkpoint: int
    index_version: int
    negatives_version: int
    num_entities: int = 0
    num_vectors: int = 0
    num_shards: int = 0
    resumed_shards: int = 0
    num_holders: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    skipped_checkpoints: list[int] = field(default_factory=list)
    recall: dict[str, float] = field(default_factory=dict)
    heldout: HeldoutRecall | None = None
    up_to_date: bool = False

    def line(self) -> str:
        if self.up_to_date:
            return (
                f"refresh: checkpoint step-{self.checkpoint} already published as index "
                f"v{self.index_version} / negatives v{self.negatives_version}; nothing to do"
            )
        index_seconds = self.seconds.get("index", 0.0)
        rate = f" at {self.num_entities / index_seconds:.1f} entities/s" if index_seconds else ""
        recall = ", ".join(
            f"{split} gold@top-N {value:.3f}" for split, value in self.recall.items()
        )
        stages = ", ".join(
            f"{stage} {value:.1f}s" for stage, value in self.seconds.items() if stage != "total"
        )
        skipped = (
            f"; skipped stale {', '.join(f'step-{s}' for s in self.skipped_checkpoints)}"
            if self.skipped_checkpoints
            else ""
        )
        return (
            f"refresh: step-{self.checkpoint} → index v{self.index_version} "
            f"({self.num_entities} entities, {self.num_vectors} vectors, {self.num_shards} shards, "
            f"{self.resumed_shards} resumed){rate}; held by {self.num_holders} actor(s); "
            f"negatives v{self.negatives_version} "
            f"({recall}); {stages}; total {self.seconds.get('total', 0.0):.1f}s{skipped}"
        )


def run_refresh(
    plan: RefreshPlan,
    step: int | None = None,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None = None,
    stopping: Callable[[], bool] | None = None,
    kept: KeptPool | None = None,
) -> RefreshSummary:
    """One refresh from checkpoint `step` (default: the newest complete one), on the encoder
    pool `kept` between refreshes when given (else on a pool of its own).

    `on_shard` is called in this process after each shard is indexed (for monitoring). Once
    `stopping()` is true the refresh stops (StopRequested) within a batch while it encodes, or
    before it mines; what it finished is recorded for the next refresh to resume. Raises
    NoCheckpointError when there is nothing to refresh from.
    """
    started = time.perf_counter()
    index_store = plan.index_store
    # The manifest alone says which checkpoint is live; no shard is loaded here.
    live = index_store.current()
    step, directory, skipped = _checkpoint_to_refresh(plan, step, live)
    if live is not None and live.checkpoint == step:
        if plan.negatives_store.current_version() == live.version:
            return RefreshSummary(step, live.version, live.version, up_to_date=True)
        logger.info("index v%d exists for step-%d; mining only", live.version, step)
    else:
        live = None
    summary = RefreshSummary(step, -1, -1, skipped_checkpoints=skipped)
    # Every split opened (its file and footer read) before the catalogue is encoded: a split
    # that cannot be read fails the refresh at once, not after the encoding it would waste.
    splits = {
        split: MentionSplit.open(mention_split_path(plan.data_dir, split))
        for split in plan.refresh.splits
    }
    model = IndexedModel.from_checkpoint(directory, step)
    encode = plan.data_dir if live is None else None
    pool, tokens = start_pool(model, plan.pool_settings(), encode, summary.seconds, kept)
    with pool if kept is None else kept.using():
        if tokens is not None:
            with timed(summary.seconds, "index"):
                report = build_version(
                    pool,
                    index_store,
                    model,
                    tokens,
                    plan.index,
                    plan.refresh.shard_size,
                    on_shard,
                    stopping,
                )
            live = report.version
            summary.num_shards, summary.resumed_shards = report.num_shards, report.resumed_shards
        if stopping is not None and stopping():
            raise StopRequested(f"stopped after publishing index v{live.version}, before mining")
        _mine(plan, pool, live, splits, summary)
    summary.seconds["total"] = time.perf_counter() - started
    logger.info(summary.line())
    return summary


def _checkpoint_to_refresh(
    plan: RefreshPlan, step: int | None, live: IndexVersion | None
) -> tuple[int, Path, list[int]]:
    """(step, directory, stale steps skipped) of the checkpoint this refresh encodes."""
    checkpoints = complete_checkpoints(plan.run_dir)
    if not checkpoints:
        raise NoCheckpointError(f"{checkpoints_root(plan.run_dir)}: no complete checkpoint")
    by_step = dict(checkpoints)
    if step is None:
        step = checkpoints[-1][0]
    if step not in by_step:
        raise NoCheckpointError(f"{checkpoints_root(plan.run_dir)}/step-{step}: not complete")
    live_step = -1 if live is None or live.checkpoint is None else live.checkpoint
    skipped = [s for s, _ in checkpoints if live_step < s < step]
    if skipped:
        logger.info("skipping stale checkpoints %s: step-%d is newer", skipped, step)
    return step, by_step[step], skipped


def _mine(
    plan: RefreshPlan,
    pool: EncoderPool,
    version: IndexVersion,
    splits: dict[str, MentionSplit],
    summary: RefreshSummary,
) -> None:
    """Hold `version` in the pool, mine every split, publish the negatives version."""
    summary.index_version = summary.negatives_version = version.version
    summary.num_entities, summary.num_vectors = version.num_entities, version.num_vectors
    with timed(summary.seconds, "hold"):
        held = pool.hold(version, plan.index.depth)
    summary.num_holders = len(held.holders)
    if plan.heldout is not None:
        with timed(summary.seconds, "heldout"):
            summary.heldout = score_heldout(
                plan.heldout, plan.data_dir, pool, held, version, summary.checkpoint
            )
        if summary.heldout is not None:
            logger.info(summary.heldout.line())
    mined = {}
    with timed(summary.seconds, "mine"):
        for split, mentions in splits.items():
            mined[split] = mine_split(
                pool,
                held,
                mentions,
                plan.refresh.top_n,
                description=f"mining {split}",
            )
            ranks = mined[split].gold_ranks
            summary.recall[split] = float((ranks >= 0).mean()) if len(ranks) else 0.0
    plan.negatives_store.publish(
        version.version,
        mined,
        summary.checkpoint,
        plan.refresh.top_n,
        version.num_entities,
        catalogue=version.manifest.catalogue,
    )
