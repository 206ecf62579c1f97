"""What each Ray Train worker runs: the one contrastive training loop, for either task.

Each optimizer step takes ``gradient_accumulation`` micro-batches. A micro-batch is B training
mentions in the run's data order (:mod:`hnce.pipeline.train.data_order`), K negatives per mention
from the task's :class:`~hnce.pipeline.train.negatives.NegativeDrawer`, assembled from the token
stores (:mod:`hnce.pipeline.train.batch`) and trained by the one step (:mod:`hnce.pipeline.train.step`,
hard-negative NCE, eq. 5/11, by default). Every R steps a checkpoint is published; every C steps
the newest negatives version is picked up without waiting. A restarted worker group resumes from
the newest complete checkpoint (verified, loaded weights-only) and replays exactly what an
uninterrupted run would have done: every random draw (negatives, dropout) is a function of
(seed, micro-step, rank).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import ray.train
import torch
from deepspeed.accelerator import get_accelerator
from torch import nn

from hnce.cluster.compute.encoder_pool import node_cores
from hnce.cluster.compute.index_build import timed
from hnce.cluster.stores.checkpoints import REFRESH_REQUEST, REFRESHES_END, TRAINING_ENDS_AT
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.reranker import JointReranker
from hnce.events import RunEvent
from hnce.mining.losses import build_loss
from hnce.mining.samplers import SAMPLER_SPECS, LossColumns
from hnce.pipeline.config import Config, CoresMode, TrainingSettings, config_from_dict
from hnce.pipeline.train.batch import ContrastiveBatch, MentionTokens, assemble_batch
from hnce.pipeline.train.checkpointing import (
    agreed_resume_step,
    load_training_state,
    publish_checkpoint,
    report_checkpoint,
    reported_checkpoint_step,
    use_weights_only_loading,
)
from hnce.pipeline.train.cores import TrainerThreads
from hnce.pipeline.train.data_order import MentionOrder
from hnce.pipeline.train.deepspeed_config import build_deepspeed_config
from hnce.pipeline.train.distributed import Collectives, worker_device
from hnce.pipeline.train.events import EventLog
from hnce.pipeline.train.model import build_trainable
from hnce.pipeline.train.model_scores import CurrentModelScores
from hnce.pipeline.train.negatives import (
    CandidateSource,
    FixedNegatives,
    NegativeDrawer,
    RefreshedNegatives,
)
from hnce.pipeline.train.nonfinite import (
    loss_cause,
    nonfinite_ranks,
    weights_are_finite,
    weights_cause,
)
from hnce.pipeline.train.refresh_health import RefreshHealth
from hnce.pipeline.train.refresh_payoff import RefreshPayoff
from hnce.pipeline.train.staleness import StalenessMonitor
from hnce.pipeline.train.step import ContrastiveScoring, train_micro_batch
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.version_zero import initial_negatives_error
from hnce.progress import quiet

logger = logging.getLogger(__name__)


def trainable_mentions(config: Config, task: TrainingTask) -> tuple[list[Mention], int]:
    """The training split (its first ``max_mentions`` when set) without the mentions whose gold
    is missing from the catalogue (nothing to train towards); and how many were left out."""
    split = MentionSplit.open(mention_split_path(Path(config.data.root), config.data.train_split))
    mentions = split.read_all()
    limit = task.max_mentions(config)
    mentions = mentions[:limit] if limit > 0 else mentions
    kept = [m for m in mentions if m.gold >= 0]
    return kept, len(mentions) - len(kept)


def micro_step_seed(seed: int, micro_step: int, rank: int) -> int:
    """The seed of every random draw of one micro-step on one rank (negatives and dropout)."""
    return ((seed * 1_000_003 + micro_step) * 1009 + rank) % (2**63)


@dataclass
class TrainingData:
    """What a worker draws micro-batches from."""

    mentions: list[Mention]
    tokens: MentionTokens
    store: TokenStore
    order: MentionOrder
    drawer: NegativeDrawer
    source: CandidateSource
    scores: CurrentModelScores | None = None  # for the samplers that read the current model
    loss_columns: LossColumns | None = None  # for the samplers that add columns to the loss


def load_training_data(
    config: Config,
    task: TrainingTask,
    model: BiEncoder | JointReranker,
    collectives: Collectives,
    world_size: int,
    device: torch.device,
) -> tuple[TrainingData, int]:
    """Mentions (tokenized once), the catalogue's token store (built by whichever rank gets its
    lock first), the data order, the negative drawer and its candidate source (with the current
    model's scores or the momentum queue when the sampler needs them, on ``device``); and how
    many mentions were left out (no gold in the catalogue)."""
    data_root = Path(config.data.root)
    catalogue = EntityCatalogue.open(data_root)
    mentions, skipped = trainable_mentions(config, task)
    settings = task.settings(config)
    if task.kind == "retriever":
        drawer = NegativeDrawer.for_retriever(config, catalogue, mentions)
        source: CandidateSource = RefreshedNegatives(
            config.run_dir / "negatives", config.data.train_split, collectives, data_root
        )
    else:
        assert task.candidates is not None
        drawer = NegativeDrawer.for_reranker(config, len(catalogue), mentions)
        source = FixedNegatives(task.candidates, data_root)
    with quiet(collectives.rank != 0):  # whichever rank builds it, rank 0 reports
        store = TokenStore.ensure(data_root, model.tokenizer, model.entity_length)
    data = TrainingData(
        mentions=mentions,
        tokens=MentionTokens.tokenize(model, mentions),
        store=store,
        order=MentionOrder(len(mentions), settings.batch_size, world_size, config.run.seed),
        drawer=drawer,
        source=source,
    )
    if drawer.scores_online:
        assert isinstance(model, BiEncoder)
        data.scores = CurrentModelScores(model, data.tokens, store, device)
    return data, skipped


def skip_shared_memory_op() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op (``deepspeed_shm_comm``).

    DeepSpeed's CPU backend JIT-loads that op at every process group it starts, under torch's
    lock file ``<torch extensions>/deepspeed_shm_comm/lock``. A process killed while it holds
    the lock (a worker lost mid-start: the fault tests kill them on purpose) leaves the file,
    and every later DeepSpeed start on the machine waits on it for ever. The op serves only
    ``deepspeed.comm.inference_all_reduce``, which training never calls, so it is marked
    incompatible and no start loads it. GPU accelerators have no such op: nothing changes
    there."""
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def flush_subnormal_floats() -> None:
    """Flush subnormal floats to zero in this process (x86's FTZ/DAZ, ``torch.set_flush_denormal``).

    Once a batch is well separated, the contrastive loss's gradients (and Adam's squared
    moments) underflow below fp32's smallest normal number (~1.2e-38), and a CPU computes on
    such subnormal numbers many times slower: sum-of-max with random negatives took 239.5 s for
    30 steps instead of 24.3 s on 2 threads (``benchmarks/subnormal_flush.py``). The flag is per
    thread and torch's intra-op threads take it from the thread that starts them, so it is set
    before the worker's first step. Zero instead of a subnormal changes
    no weight: added to weights of fp32 precision, such a value is far below their last bit."""
    if not torch.set_flush_denormal(True):
        logger.warning("this CPU cannot flush subnormal floats to zero: steps may slow down")


def start_engine(
    model: nn.Module,
    settings: TrainingSettings,
    device: torch.device,
    gather: Collectives | None = None,
) -> deepspeed.DeepSpeedEngine:
    """``deepspeed.initialize`` of the step's module on the worker's device, loading weights-only;
    ``gather``: the worker's collectives when candidates are shared across workers.

    A lone worker whose optimizer is torch's own (ZeRO 0, fp32) has no gradient to average:
    DeepSpeed's averaging would still flatten every gradient into buckets and copy it back each
    step (0.1 s of the demo's 1.6 s step on 2 cores), so it is switched off there."""
    module = ContrastiveScoring(model, settings.candidate_chunk_size, gather)
    skip_shared_memory_op()
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=build_deepspeed_config(settings, device),
    )
    use_weights_only_loading(engine)
    if engine.dp_world_size == 1 and isinstance(engine.optimizer, torch.optim.Optimizer):
        engine.enable_backward_allreduce = False
    return engine


CheckpointReport = Callable[[int, float, int], None]


class WorkerRun:
    """One worker's training run of one task: set up by :meth:`start` (inside Ray Train) or
    :meth:`build` (any initialised process group), run by :meth:`train`."""

    def __init__(
        self,
        config: Config,
        task: TrainingTask,
        collectives: Collectives,
        model: BiEncoder | JointReranker,
        engine: deepspeed.DeepSpeedEngine,
        data: TrainingData,
        report: CheckpointReport,
        threads: TrainerThreads,
    ) -> None:
        self.config = config
        self.task = task
        self.settings = task.settings(config)
        self.collectives = collectives
        self.rank = collectives.rank
        self.model = model
        self.engine = engine
        self.data = data
        self.report = report
        self.threads = threads
        self.device = engine.device
        self.loss = build_loss(config.loss.name, **config.loss.options)
        self.log = EventLog(task.run_dir, tensorboard=True) if self.rank == 0 else None
        self.health = (
            RefreshHealth(task.run_dir, config.refresh.max_consecutive_failures, self.rank)
            if task.refreshes(config)
            else None
        )
        self.waits_for_refreshes = task.waits_for_refreshes(config)
        refresh = config.refresh
        self.staleness = (
            StalenessMonitor(refresh.stale_loss_ratio, refresh.stale_window)
            if task.refreshes_when_stale(config)
            else None
        )
        self.payoff = (
            RefreshPayoff(task.run_dir, self.settings.steps)
            if task.refreshes(config) and not self.waits_for_refreshes
            else None
        )
        self.refreshes_ended = False
        self.start_step = 0
        self.setup_seconds: dict[str, float] = {}
        self.initial_negatives_since: float | None = None

    @classmethod
    def start(
        cls,
        config: Config,
        task: TrainingTask,
        cores: CoresMode,
        initial_negatives_since: float | None = None,
    ) -> WorkerRun:
        """Inside a Ray Train worker: its device, world size and reported checkpoint;
        ``initial_negatives_since``: the start of the driver that prepares negatives version 0
        beside the workers' start-up (:meth:`wait_for_initial_negatives`), None when it is ready."""
        device = worker_device(config.cluster.use_gpu)
        world_size = ray.train.get_context().get_world_size()
        run = cls.build(
            config, task, device, world_size, report_checkpoint, reported_checkpoint_step(), cores
        )
        run.initial_negatives_since = initial_negatives_since
        return run

    @classmethod
    def build(
        cls,
        config: Config,
        task: TrainingTask,
        device: torch.device,
        world_size: int,
        report: CheckpointReport,
        reported_step: int | None = None,
        cores: CoresMode = "reserved",
    ) -> WorkerRun:
        """Model and engine on ``device``, resume point and data, in the initialised process
        group; ``report`` hears of every published checkpoint (step, loss, rank); ``cores``:
        the run's resolved ``training.cores`` (:mod:`hnce.pipeline.train.cores`)."""
        settings = task.settings(config)
        threads = TrainerThreads.for_worker(
            task.run_dir,
            cores,
            settings.cpus_per_worker,
            node_cores(),
            settings.num_workers,
            task.waits_for_refreshes(config),
        )
        threads.for_step()
        if device.type == "cpu":
            flush_subnormal_floats()
        seconds: dict[str, float] = {}
        with timed(seconds, "process group"):
            collectives = Collectives(device)
            skip_shared_memory_op()
            deepspeed.init_distributed(dist_backend=collectives.backend)
        pids = task.run_dir / "workers"
        pids.mkdir(parents=True, exist_ok=True)
        (pids / f"rank-{collectives.rank}.pid").write_text(str(os.getpid()))
        torch.manual_seed(config.run.seed)  # weights a checkpoint does not give (codes, heads)
        with timed(seconds, "model"):
            model = build_trainable(config, task.kind)
        gather = collectives if task.share(config) == "global" else None
        with timed(seconds, "engine"):
            engine = start_engine(model, settings, device, gather)
        with timed(seconds, "data"):
            data, skipped = load_training_data(
                config, task, model, collectives, world_size, engine.device
            )
        run = cls(config, task, collectives, model, engine, data, report, threads)
        run.setup_seconds = seconds
        run.resume(reported_step, world_size, skipped)
        run.start_loss_columns()
        return run

    def resume(self, reported_step: int | None, world_size: int, skipped: int) -> None:
        """Load the agreed checkpoint, if any, and log where training (re)starts."""
        step = agreed_resume_step(self.task.run_dir, self.collectives, reported_step)
        if step is not None:
            path = load_training_state(self.engine, self.task.run_dir, step)
            self.start_step = step
            if self.log is not None:
                self.log.write(
                    "resume", step=step, path=str(path), setup_seconds=self.setup_seconds
                )
            return
        if self.log is not None:
            self.log.write(
                "start",
                step=0,
                task=self.task.kind,
                world_size=world_size,
                mentions=len(self.data.mentions),
                skipped_missing_gold=skipped,
                device=str(self.device),
                bf16=bool(self.engine.bfloat16_enabled()),
                setup_seconds=self.setup_seconds,
            )
        logger.info(
            "rank %d: %s training on %s (bf16 %s)",
            self.rank,
            self.task.kind,
            self.device,
            self.engine.bfloat16_enabled(),
        )

    def start_loss_columns(self) -> None:
        """When the retriever's sampler adds columns to the loss (its spec's ``loss_columns``,
        e.g. the momentum queue): start them from the (resumed) model, logging their memory."""
        spec = SAMPLER_SPECS[self.config.negatives.sampler]
        if self.task.kind != "retriever" or spec.loss_columns is None:
            return
        assert isinstance(self.model, BiEncoder)
        columns = spec.loss_columns(self.model, self.config.negatives, len(self.data.store))
        self.data.loss_columns = columns
        logger.info(
            "rank %d: %s adds loss columns: %.1f MiB",
            self.rank,
            spec.name,
            columns.memory_bytes / 2**20,
        )
        if self.log is not None:
            self.log.write("loss_columns", sampler=spec.name, bytes=columns.memory_bytes)

    def train(self) -> None:
        """:meth:`train_steps`, then the event log's TensorBoard file closed (rank 0)."""
        try:
            self.train_steps()
        finally:
            if self.log is not None:
                self.log.close()

    def train_steps(self) -> None:
        """Steps from the resume point to ``steps``: poll, micro-batches, log, checkpoint."""
        self.engine.train()
        loss = float("nan")
        if self.initial_negatives_since is not None and self.wait_for_initial_negatives():
            return
        for step in range(self.start_step, self.settings.steps):
            if self.poll_negatives(step):
                return
            threads = self.threads.for_step()
            started = time.perf_counter()
            mention_ids: list[str] = []
            losses = []
            for micro in range(self.settings.gradient_accumulation):
                batch = self.micro_batch(step * self.settings.gradient_accumulation + micro)
                mention_ids += batch.mention_ids
                batch = batch.to(self.device)
                losses.append(train_micro_batch(self.engine, batch, self.loss))
                if self.data.loss_columns is not None:
                    candidates = batch.candidates
                    self.data.loss_columns.observe(
                        batch.entity_ids, candidates["input_ids"], candidates["attention_mask"]
                    )
            if self.data.loss_columns is not None:
                self.data.loss_columns.after_step()
            loss = sum(losses) / len(losses)
            done = step + 1
            if self.diverged(done, loss):
                return
            seconds = time.perf_counter() - started
            self.log_step(done, loss, seconds, mention_ids, threads)
            if self.payoff is not None:
                self.payoff.observe(seconds)
            stale = self.negatives_went_stale(done, loss)
            if (stale or self.publishes_at(done)) and not self.publish(done, loss, stale):
                return
        if self.log is not None:
            self.log.write(
                "end",
                step=self.settings.steps,
                loss=loss,
                negatives_version=self.data.source.version,
            )

    def poll_negatives(self, step: int) -> bool:
        """Every ``negatives_check_every`` steps (and at the first), switch to the newest
        negatives version without waiting and read the refresh log; with ``refresh.mode: sync``
        wait at every ``sync_every`` steps for the negatives of that step's checkpoint. All
        collectives, so every rank switches and waits together. True when the refreshes failed
        too often and every rank stops here
        (:class:`hnce.pipeline.train.refresh_health.RefreshHealth`)."""
        sync = self.waits_for_refreshes and step > 0 and step % self.config.refresh.sync_every == 0
        if not sync and step % self.settings.negatives_check_every != 0 and step != self.start_step:
            return False
        self.switch_negatives(step)
        if sync:
            return self.wait_for_refresh(step)
        return self.health is not None and self.health.should_stop(step, self.log, self.device)

    def switch_negatives(self, step: int) -> None:
        """Switch to the newest published negatives version, logging a switch."""
        source = self.data.source
        if source.poll() and self.log is not None and source.current is not None:
            self.log.write(
                "negatives",
                step=step,
                version=source.version,
                checkpoint_step=source.current.checkpoint_step,
                lag=source.lag(step),
            )

    def wait_for_refresh(self, step: int) -> bool:
        """``refresh.mode: sync``: hold training at ``step`` until the negatives mined with the
        checkpoint of ``step`` are live (a ``refresh_wait`` event says how long it took); True
        when the refreshes failed too often meanwhile."""
        started = time.perf_counter()
        source = self.data.source
        while source.current is None or source.current.checkpoint_step < step:
            if self.health is not None and self.health.should_stop(step, self.log, self.device):
                return True
            time.sleep(self.config.refresh.poll_seconds)
            self.switch_negatives(step)
        if self.log is not None:
            self.log.write("refresh_wait", step=step, seconds=time.perf_counter() - started)
        return False

    def wait_for_initial_negatives(self) -> bool:
        """Hold the first step until negatives version 0, which the driver prepares while Ray
        Train starts the workers, is live (an ``initial_negatives_wait`` event says how long
        that took); True when the driver reports that it failed: every rank stands down without
        training, and the driver raises the error (:mod:`hnce.pipeline.train.version_zero`)."""
        assert self.initial_negatives_since is not None
        started = time.perf_counter()
        source = self.data.source
        self.switch_negatives(self.start_step)
        while source.current is None:
            failed = self.rank == 0 and (
                initial_negatives_error(self.task.run_dir, self.initial_negatives_since) is not None
            )
            if self.collectives.broadcast_int(int(failed)):
                return True
            time.sleep(self.config.refresh.poll_seconds)
            self.switch_negatives(self.start_step)
        if self.log is not None:
            self.log.write(
                "initial_negatives_wait",
                step=self.start_step,
                seconds=time.perf_counter() - started,
            )
        return False

    def micro_batch(self, micro_step: int) -> ContrastiveBatch:
        """This rank's mentions at ``micro_step`` with their negatives, seeded by the micro-step
        (dropout too) and with the sampler's options at its optimizer step
        (``negatives.schedule``), so a resumed run draws what an uninterrupted one would."""
        seed = micro_step_seed(self.config.run.seed, micro_step, self.rank)
        torch.manual_seed(seed)
        rows = self.data.order.batch(micro_step, self.rank)
        mentions = [self.data.mentions[i] for i in rows]
        data = self.data
        scores = data.scores.for_rows(rows) if data.scores is not None else None
        step = micro_step // self.settings.gradient_accumulation
        negatives = data.drawer.draw(
            mentions, data.source, torch.Generator().manual_seed(seed), scores, step
        )
        positives = [data.drawer.known_positives(m) for m in mentions]
        share = self.task.share(self.config)
        batch = assemble_batch(mentions, rows, data.tokens, negatives, data.store, positives, share)
        if data.loss_columns is not None:
            vectors, valid = data.loss_columns.columns(batch.entity_ids[batch.gold], positives)
            batch = dataclasses.replace(batch, queue_vectors=vectors, queue_valid=valid)
        return batch

    def publishes_at(self, step: int) -> bool:
        """A checkpoint every ``checkpoint_every`` steps, at the end and, with
        ``refresh.mode: sync``, at every step the next refresh waits for."""
        every = self.settings.checkpoint_every
        synced = self.waits_for_refreshes and step % self.config.refresh.sync_every == 0
        return step % every == 0 or step == self.settings.steps or synced

    def negatives_went_stale(self, step: int, loss: float) -> bool:
        """``refresh.trigger: stale``: record ``step``'s loss and, every ``negatives_check_every``
        steps, whether rank 0 finds the negatives stale (broadcast: every rank publishes the
        checkpoint that asks for their refresh together; a ``stale`` event says why)."""
        if self.staleness is None:
            return False
        self.staleness.observe(self.data.source.version, loss)
        if step % self.settings.negatives_check_every != 0:
            return False
        stale = bool(self.collectives.broadcast_int(int(self.staleness.stale())))
        if stale:
            self.staleness.mark_requested()
            if self.log is not None:
                self.log.write(
                    RunEvent.STALE,
                    step=step,
                    version=self.data.source.version,
                    loss_ratio=self.staleness.loss_ratio(),
                )
        return stale

    def log_step(
        self, done: int, loss: float, seconds: float, mention_ids: list[str], threads: int
    ) -> None:
        """A ``step`` event every ``log_every`` steps (rank 0), with the mentions it trained on
        and the torch threads it ran on."""
        if self.log is None:
            return
        if done % self.settings.log_every != 0 and done != self.settings.steps:
            return
        self.log.write(
            "step",
            step=done,
            loss=loss,
            lr=float(self.engine.get_lr()[0]),
            seconds=seconds,
            threads=threads,
            negatives_version=self.data.source.version,
            lag=self.data.source.lag(done - 1),
            mentions=mention_ids,
        )

    def diverged(self, step: int, loss: float) -> bool:
        """True on every rank when some rank's loss is not finite and ``training.on_nonfinite``
        stops (the cause is logged by rank 0; :mod:`hnce.pipeline.train.nonfinite`)."""
        ranks = nonfinite_ranks(self.collectives, math.isfinite(loss))
        if not ranks:
            return False
        stop = self.settings.on_nonfinite == "stop"
        cause = loss_cause(step, ranks, loss)
        if self.log is not None:
            self.log.write(
                RunEvent.NONFINITE_STOP if stop else RunEvent.NONFINITE_LOSS, step=step, cause=cause
            )
        logger.warning("rank %d: %s", self.rank, cause)
        return stop

    def asks_for_refresh(self, step: int, stale: bool) -> bool:
        """Whether the checkpoint of ``step`` asks the coordinator for a refresh: every one by
        default; with ``refresh.trigger: stale`` those of ``stale`` negatives; with
        ``refresh.mode: sync`` those training waits for (every ``sync_every`` steps), so that
        each refresh runs while the trainer waits (:mod:`hnce.pipeline.train.cores`)."""
        if self.staleness is not None:
            return stale
        if self.waits_for_refreshes:
            return step % self.config.refresh.sync_every == 0
        return True

    def refreshes_end(self, step: int) -> tuple[bool, float | None]:
        """Whether the checkpoint of ``step`` ends the run's asynchronous refreshes, rank 0's
        estimate (:mod:`hnce.pipeline.train.refresh_payoff`) broadcast, and when training is
        expected to end (seconds since the epoch; None when unknown): the coordinator abandons
        a refresh that would publish after it. The first checkpoint that ends them writes a
        ``refreshes_end`` event with the estimate."""
        if self.payoff is None:
            return False, None
        estimate = self.payoff.estimate(step)
        ends = bool(self.collectives.broadcast_int(int(estimate.ends)))
        if ends and not self.refreshes_ended and self.log is not None:
            self.log.write(
                RunEvent.REFRESHES_END,
                step=step,
                refresh_seconds=estimate.refresh_seconds,
                seconds_left=estimate.seconds_left,
            )
            logger.info(
                "no refresh from step %d on: the fastest took %s s, training has %s s left",
                step,
                "?" if estimate.refresh_seconds is None else f"{estimate.refresh_seconds:.0f}",
                "?" if estimate.seconds_left is None else f"{estimate.seconds_left:.0f}",
            )
        self.refreshes_ended |= ends
        if estimate.seconds_left is None:
            return ends, None
        return ends, time.time() + estimate.seconds_left

    def publish(self, step: int, loss: float, stale: bool = False) -> bool:
        """Checkpoint ``step-<step>/`` of this task's run, if every rank's weights are finite;
        False (on every rank, a stop logged) when they are not. Whether it asks for a refresh:
        :meth:`asks_for_refresh`, unless refreshes have ended (:meth:`refreshes_end`)."""
        ranks = nonfinite_ranks(self.collectives, weights_are_finite(self.model))
        if ranks:
            if self.log is not None:
                self.log.write(RunEvent.NONFINITE_STOP, step=step, cause=weights_cause(step, ranks))
            return False
        ends, ends_at = self.refreshes_end(step)
        state: dict[str, Any] = {
            "step": step,
            "task": self.task.kind,
            "seed": self.config.run.seed,
            "negatives_version": self.data.source.version,
            "loss": loss,
            REFRESH_REQUEST: not ends and self.asks_for_refresh(step, stale),
            REFRESHES_END: ends,
            TRAINING_ENDS_AT: ends_at,
        }
        publish_checkpoint(
            self.engine,
            self.model,
            self.task.run_dir,
            state,
            self.collectives,
            self.settings.keep_checkpoints,
            self.log,
        )
        self.report(step, loss, self.rank)
        return True


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: ``{"config": Config.to_dict(), "task": TrainingTask.to_dict(),
    "cores": the resolved training.cores, "initial_negatives_since": the driver's start when it
    prepares negatives version 0 beside the workers, else None}``."""
    config = config_from_dict(loop_config["config"])
    task = TrainingTask.from_dict(loop_config["task"])
    since = loop_config["initial_negatives_since"]
    WorkerRun.start(config, task, loop_config["cores"], since).train()
