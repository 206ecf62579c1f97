"""The asynchronous refresh: newest checkpoint → encode → index → mine → publish (docs/refresh.md).

`run_refresh` does one refresh, orchestrating an `EncoderPool` of Ray actors that do the work;
`hnce.cluster.compute.coordinator.RefreshCoordinator` is the Ray actor the trainer starts to keep refreshing
as checkpoints appear, and `hnce.cluster.compute.refresh_job` runs it as a scheduled job. The ``refresh``
section of a recipe is :class:`RefreshSettings`. A refresh:

1. picks the newest complete checkpoint `<run>/checkpoints/step-<S>/` (with its `COMPLETE`
   marker, verified), skipping older ones not yet refreshed (stale);
2. makes sure the catalogue's token store exists for the model's tokenizer (built once, reused
   by every later refresh, the trainer and evaluation);
3. has the encoder actors index the catalogue shard by shard (`hnce.cluster.compute.index_build`); each
   finished shard is recorded, so a restarted refresh resumes; the version is published when
   every shard is in (a rename, then `CURRENT`);
4. spreads the new version's shards over the same actors, scores the eval split's held-out
   recall against them when the plan asks (`hnce.cluster.compute.heldout`), mines the mention
   splits (`hnce.cluster.compute.miner`) and publishes the negatives version of the same number.

This process only orchestrates: it never holds the catalogue's vectors (the actors write and
hold the shards) and every wait on an actor has a deadline (`hnce.cluster.compute.actors`). The summary line
gives the time of each stage.

Example::

    plan = RefreshPlan(run_dir, data_dir, RefreshSettings(), IndexSpec())
    summary = run_refresh(plan)                       # newest complete checkpoint
    negatives = plan.negatives_store.latest("train")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from hnce.cluster.compute.actors import StopRequested
from hnce.cluster.compute.encoder_actor import ShardEncoded
from hnce.cluster.compute.encoder_pool import EncoderPool, EncoderPoolSettings, KeptPool
from hnce.cluster.compute.heldout import HeldoutSpec, score_heldout
from hnce.cluster.compute.index_build import IndexedModel, build_version, start_pool, timed
from hnce.cluster.compute.miner import mine_split
from hnce.cluster.stores.checkpoints import checkpoints_root, complete_checkpoints
from hnce.cluster.stores.index_store import INDEX_DIR, IndexStore, IndexVersion
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR, NegativesStore
from hnce.cluster.stores.refresh_log import HeldoutRecall
from hnce.cluster.stores.sharded_index import IndexSpec
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.errors import InputError
from hnce.settings import (
    Flag,
    Fraction,
    NonNegativeInt,
    PositiveInt,
    PositiveReal,
    Text,
    settings,
)

logger = logging.getLogger(__name__)


class NoCheckpointError(InputError, FileNotFoundError):
    """The run has no complete checkpoint to refresh from."""


@settings
class RefreshSettings:
    """The ``refresh`` section of a recipe: re-encode the catalogue, index it, mine negatives.

    Attributes:
        enabled: ``hnce train`` refreshes the negatives it trains on (``mode`` says how).
        mode: ``async`` (default): a coordinator refreshes beside the trainer, which never
            waits (ANCE's asynchronous refresh, docs/refresh.md). ``sync``: every ``sync_every``
            steps the trainer publishes a checkpoint and waits until the negatives mined with it
            are live (the paper's own code, EntQA); only those checkpoints are refreshed.
            Negatives mined once and never refreshed are ``negatives.initial`` with
            ``enabled: false``.
        sync_every: steps between the synchronous refreshes of ``mode: sync``.
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
        wait_floor_seconds: the least time any wait on an encoder actor (its start, a shard, a
            search) may take before it is reported as hung; later waits also allow 10x the
            slowest task measured. Raise it for big shards encoded on CPUs.
        trigger: which checkpoints the coordinator refreshes. ``checkpoints``: each newest
            checkpoint, every ``training.checkpoint_every`` steps. ``stale``: only those
            the trainer publishes because its negatives went stale (the loss ratio of
            :mod:`hnce.pipeline.train.staleness`); the other checkpoints are kept for resuming.
            ``payoff`` (default; ``checkpoints`` under ``mode: sync`` unless set): only those
            whose hard negatives have aged and whose refresh would publish with enough steps
            left to train on it
            (:mod:`hnce.pipeline.train.refresh_payoff`; each checkpoint's decision is a
            ``refresh_decision`` event with its numbers). With ``mode: async`` only.
        max_negative_age: ``trigger: payoff`` asks for a refresh only when the hard negatives
            drawn since the previous checkpoint were scored by vectors at least this many steps
            old on average (a negative cache row's age, or the lag of the mined version), and
            only when the refresh would then be trained on for at least as many steps.
        stale_loss_ratio: ``trigger: stale`` asks for a refresh when the mean loss of the last
            ``stale_window`` steps on a negatives version is at most this share of the mean
            loss of its first ``stale_window`` steps.
        stale_window: steps in each of the two windows of ``stale_loss_ratio``.
        heldout_recall: after building its index, each refresh scores the eval split
            (``data.eval_split``, at most ``data.max_eval_mentions``) against it and logs
            recall@``eval.ks`` (a ``heldout_recall`` line in the refresh log), as ``hnce eval``
            of that checkpoint would report it; skipped, with one log line, when the dataset
            has no such split.
    """

    enabled: Flag = True
    mode: Literal["async", "sync"] = "async"
    sync_every: PositiveInt = 100
    num_encoders: NonNegativeInt = 0
    encoder_cpus: PositiveInt = 1
    batch_size: PositiveInt = 128
    mention_batch_size: PositiveInt = 256
    shard_size: PositiveInt = 100_000
    top_n: PositiveInt = 32
    splits: list[Text] = Field(default_factory=lambda: ["train"], min_length=1)
    poll_seconds: PositiveReal = 2.0
    max_consecutive_failures: PositiveInt = 3
    wait_floor_seconds: PositiveReal = 900.0
    trigger: Literal["checkpoints", "stale", "payoff"] = "payoff"
    max_negative_age: PositiveInt = 20
    stale_loss_ratio: Fraction = 0.8
    stale_window: PositiveInt = 10
    heldout_recall: Flag = True


@dataclass(frozen=True)
class RefreshPlan:
    """What the refreshes of one run do: where (run and dataset directories), how (the
    ``refresh`` and ``index`` sections), which held-out mentions each scores (None: none), how
    many torch threads a trainer waiting for each refresh lends its encoders (``lent_threads``,
    :class:`hnce.cluster.compute.encoder_pool.EncoderPoolSettings`), and, on GPUs, the share of a
    GPU each encoder actor takes and the GPUs the trainer beside it holds (``encoder_gpus``,
    ``trainer_gpus``: :mod:`hnce.cluster.compute.gpu_sharing`)."""

    run_dir: Path
    data_dir: Path
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    index: IndexSpec = field(default_factory=IndexSpec)
    heldout: HeldoutSpec | None = None
    lent_threads: int = 0
    encoder_gpus: float = 1.0
    trainer_gpus: float = 0.0

    @property
    def index_store(self) -> IndexStore:
        return IndexStore(self.run_dir / INDEX_DIR, keep=self.index.keep_versions)

    @property
    def negatives_store(self) -> NegativesStore:
        return NegativesStore(self.run_dir / NEGATIVES_DIR, keep=self.index.keep_versions)

    def pool_settings(self, alone: bool = False) -> EncoderPoolSettings:
        """The encoder pool of this plan; ``alone`` for a pool with no trainer beside it
        (version 0, evaluation, linking), which uses the CPUs Ray has free."""
        return EncoderPoolSettings(
            num_encoders=self.refresh.num_encoders,
            batch_size=self.refresh.batch_size,
            num_threads=self.refresh.encoder_cpus,
            free_cpus=alone,
            lent_threads=0 if alone else self.lent_threads,
            gpus_per_actor=self.encoder_gpus,
            reserved_gpus=0.0 if alone else self.trainer_gpus,
            wait_floor_seconds=self.refresh.wait_floor_seconds,
            faiss_device=self.index.faiss_device,
        )


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
        _mine(plan, pool, live, summary)
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
    summary: RefreshSummary,
) -> None:
    """Hold `version` in the pool, mine every split, publish the negatives version."""
    summary.index_version = summary.negatives_version = version.version
    summary.num_entities, summary.num_vectors = version.num_entities, version.num_vectors
    with timed(summary.seconds, "hold"):
        held = pool.hold(version, plan.index.candidate_depth)
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
        for split in plan.refresh.splits:
            mentions = MentionSplit.open(mention_split_path(plan.data_dir, split))
            mined[split] = mine_split(
                pool,
                held,
                mentions,
                plan.refresh.top_n,
                plan.refresh.mention_batch_size,
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
