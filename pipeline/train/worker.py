"""What each Ray Train worker runs: the one contrastive training loop, for either task.

:class:`WorkerRun` holds the loop and wires its parts, each a module of its own:

- the negatives (:mod:`hnce.pipeline.train.negatives`): B training mentions per micro-batch in
  the run's data order, K negatives per mention from the task's drawer, assembled from the token
  stores (:class:`~hnce.pipeline.train.negatives.TrainingData`);
- the step (:mod:`hnce.pipeline.train.step`): ``gradient_accumulation`` micro-batches per
  optimizer step on the DeepSpeed engine, hard-negative NCE (eq. 5/11) by default; a loss that
  is not finite stops every rank (:mod:`hnce.pipeline.train.nonfinite`);
- the checkpoints (:class:`~hnce.pipeline.train.checkpointing.WorkerCheckpoints`): every R steps
  one is published; a restarted worker group resumes from the newest complete one (verified,
  loaded weights-only);
- the refresh hand-over (:class:`~hnce.cluster.compute.refresh.handover.RefreshHandover`): every
  C steps the newest negatives version is picked up without waiting, and each checkpoint says
  whether it asks for a refresh;
- the stop on SIGTERM (:class:`~hnce.pipeline.train.preemption.StopAgreement`): at every step
  boundary the ranks agree whether the driver asked them to stop; they then publish the
  checkpoint of that step and return.

A resumed run replays exactly what an uninterrupted run would have done: every random draw
(negatives, dropout) is a function of (seed, micro-step, rank).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

import deepspeed
import ray.train
import torch

from hnce.cluster.compute.encoder_actor import node_cores
from hnce.cluster.compute.index_build import timed
from hnce.cluster.compute.refresh.handover import Cadence, RefreshHandover
from hnce.cluster.stores.checkpoints import checkpoint_dir
from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.reranker import JointReranker
from hnce.events import RunEvent
from hnce.mining.losses import build_loss, loss_options
from hnce.pipeline.config import Config, CoresMode, config_from_dict
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.recipe_models import build_trainable
from hnce.pipeline.train.batch import ContrastiveBatch
from hnce.pipeline.train.checkpointing import (
    CheckpointReport,
    WorkerCheckpoints,
    report_checkpoint,
    reported_checkpoint_step,
)
from hnce.pipeline.train.cores import TrainerThreads
from hnce.pipeline.train.distributed import Collectives, worker_device
from hnce.pipeline.train.negatives import TrainingData, load_training_data
from hnce.pipeline.train.nonfinite import loss_stops
from hnce.pipeline.train.preemption import StopAgreement
from hnce.pipeline.train.step import (
    flush_subnormal_floats,
    skip_shared_memory_op,
    start_engine,
    train_step,
)
from hnce.pipeline.train.task import TrainingTask

logger = logging.getLogger(__name__)


class WorkerRun:
    """One worker's training run of one task: set up by :meth:`start` (inside Ray Train) or
    :meth:`build` (any initialised process group), run by :meth:`train` (module docs: ``data``,
    ``engine``, ``checkpoints`` and ``refresh`` are its parts)."""

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
        initial_negatives_since: float | None = None,
    ) -> None:
        self.config = config
        self.task = task
        self.settings = task.settings(config)
        self.collectives = collectives
        self.model = model
        self.engine = engine
        self.data = data
        self.threads = threads
        self.device = engine.device
        cosine = bool(getattr(model, "normalize", False))
        self.loss = build_loss(
            config.loss.name,
            config.negatives.positive_aware,
            **loss_options(config.loss.name, config.loss.temperature, cosine),
        )
        self.log = EventLog(task.run_dir, tensorboard=True) if collectives.rank == 0 else None
        keep = self.settings.keep_checkpoints
        self.checkpoints = WorkerCheckpoints(
            engine,
            model,
            task.run_dir,
            collectives,
            keep,
            self.log,
            report,
            self.settings.keep_deepspeed_state,
        )
        cadence = Cadence(
            self.settings.steps,
            self.settings.negatives_check_every,
            self.settings.checkpoint_every,
        )
        self.stop_request = StopAgreement(task.run_dir, collectives)
        self.refresh = RefreshHandover(
            config.refresh if task.refreshes(config) else None,
            cadence,
            task.run_dir,
            collectives,
            self.log,
            data,
            initial_negatives_since,
            slowdown_prior=threads.idle / threads.reserved,
            stop_asked=self.stop_request.agreed,
        )
        self.logged_negatives = data.freshness.window()
        self.start_step = 0
        self.published_step = 0  # the newest checkpoint's step, once resumed
        self.setup_seconds: dict[str, float] = {}

    @classmethod
    def start(
        cls,
        config: Config,
        task: TrainingTask,
        cores: CoresMode,
        initial_negatives_since: float | None = None,
    ) -> WorkerRun:
        """Inside a Ray Train worker: its device, world size and reported checkpoint;
        ``initial_negatives_since``: the start of the driver that prepares the initial negatives
        beside the workers' start-up (:meth:`RefreshHandover.wait_for_initial_negatives`), None when
        it is ready."""
        device = worker_device(config.cluster.use_gpu)
        world_size = ray.train.get_context().get_world_size()
        reported = reported_checkpoint_step()
        since = initial_negatives_since
        return cls.build(
            config, task, device, world_size, report_checkpoint, reported, cores, since
        )

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
        initial_negatives_since: float | None = None,
    ) -> WorkerRun:
        """Model and engine on ``device``, resume point and data, in the initialised process
        group; ``report`` hears of every published checkpoint (step, loss, rank); ``cores``:
        the run's resolved ``training.cores`` (:mod:`hnce.pipeline.train.cores`);
        ``initial_negatives_since``: as :meth:`start` takes it."""
        settings = task.settings(config)
        waits = task.waits_for_refreshes(config)
        threads = TrainerThreads.for_worker(
            task.run_dir, cores, settings.cpus_per_worker, node_cores(), settings.num_workers, waits
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
        cached = task.caches_negatives(config)
        with timed(seconds, "engine"):
            engine = start_engine(model, settings, device, gather, keep_candidates=cached)
        with timed(seconds, "data"):
            data, skipped = load_training_data(
                config, task, model, collectives, world_size, engine.device
            )
            data.start_cache(config, task, model, engine.module, collectives, engine.device)
        since = initial_negatives_since
        run = cls(config, task, collectives, model, engine, data, report, threads, since)
        run.setup_seconds = seconds
        run.resume(reported_step, world_size, skipped)
        data.start_loss_columns(config, task, model, run.log)
        return run

    def resume(self, reported_step: int | None, world_size: int, skipped: int) -> None:
        """Load the agreed checkpoint, if any, and log where training (re)starts."""
        step = self.checkpoints.resume(reported_step, self.setup_seconds)
        if step is not None:
            self.start_step = self.published_step = step
            if self.data.cache is not None:
                self.data.cache.restore(checkpoint_dir(self.task.run_dir, step), step, self.log)
            return
        bf16 = self.engine.bfloat16_enabled()
        if self.log is not None:
            self.log.write(
                RunEvent.START,
                step=0,
                task=self.task.kind,
                world_size=world_size,
                mentions=len(self.data.mentions),
                skipped_missing_gold=skipped,
                device=str(self.device),
                bf16=bool(bf16),
                setup_seconds=self.setup_seconds,
            )
        rank, kind = self.collectives.rank, self.task.kind
        logger.info("rank %d: %s training on %s (bf16 %s)", rank, kind, self.device, bf16)

    def micro_batch(self, micro_step: int) -> ContrastiveBatch:
        """The micro-batch of ``micro_step`` (:meth:`TrainingData.micro_batch`), as the loop
        draws it; the benchmarks time the product's step on it."""
        return self.data.micro_batch(micro_step)

    def train(self) -> None:
        """:meth:`train_steps`, then the event log's TensorBoard file closed (rank 0)."""
        try:
            self.train_steps()
        finally:
            if self.log is not None:
                self.log.close()

    def train_steps(self) -> None:
        """Steps from the resume point to ``steps``: stop request, poll, micro-batches, log,
        checkpoint."""
        self.engine.train()
        loss = float("nan")
        if self.refresh.wait_for_initial_negatives(self.start_step):
            return
        for step in range(self.start_step, self.settings.steps):
            if self.stop_request.agreed():
                self.stop_at(step, loss)
                return
            if self.refresh.poll(step, first=step == self.start_step):
                return
            threads = self.threads.for_step()
            started = time.perf_counter()
            batches = self.data.micro_batches(step, self.device)
            loss, mention_ids = train_step(self.engine, batches, self.loss)
            done = step + 1
            if loss_stops(self.collectives, done, loss, self.settings.on_nonfinite, self.log):
                return
            seconds = time.perf_counter() - started
            self.log_step(done, loss, seconds, mention_ids, threads)
            asked = self.refresh.after_step(done, loss, seconds)
            if (asked or self.refresh.publishes_at(done)) and not self.publish(done, loss, asked):
                return
        if self.log is not None:
            version = self.data.source.version
            self.log.write(
                RunEvent.END, step=self.settings.steps, loss=loss, negatives_version=version
            )

    def log_step(
        self, done: int, loss: float, seconds: float, mention_ids: list[str], threads: int
    ) -> None:
        """A ``step`` event every ``log_every`` steps (rank 0), with the mentions it trained on
        and the torch threads it ran on."""
        if self.log is None:
            return
        if done % self.settings.log_every != 0 and done != self.settings.steps:
            return
        drawn = self.logged_negatives.take()
        self.log.write(
            RunEvent.STEP,
            step=done,
            loss=loss,
            lr=float(self.engine.get_lr()[0]),
            seconds=seconds,
            threads=threads,
            negatives_version=self.data.source.version,
            lag=self.data.source.lag(done - 1),
            hard_negatives=drawn.hard,
            fresh_hard_negatives=drawn.fresh,
            fresh_share=drawn.fresh_share,
            hard_negative_age=drawn.mean_age,
            mentions=mention_ids,
        )

    def stop_at(self, step: int, loss: float) -> None:
        """Stop before ``step``, as the driver asked (SIGTERM), with a checkpoint of the steps
        trained (``loss``: the last one's) unless it is published already."""
        if step != self.published_step and not self.publish(step, loss, stopping=True):
            return  # some rank's weights are not finite: that stop is logged
        if self.log is not None:
            logger.info("stopped at step %d, as the driver asked (SIGTERM)", step)

    def publish(self, step: int, loss: float, asked: bool = False, stopping: bool = False) -> bool:
        """Checkpoint ``step-<step>/`` of this task's run with what it asks of the refresh
        coordinator (nothing when ``stopping``: the run stops on SIGTERM); False (on every rank,
        a stop logged) when some rank's weights are not finite (:meth:`WorkerCheckpoints.publish`)."""
        state: dict[str, Any] = {
            "step": step,
            "task": self.task.kind,
            "seed": self.config.run.seed,
            "negatives_version": self.data.source.version,
            "loss": loss,
        }
        request = (
            self.refresh.stopping_request
            if stopping
            else functools.partial(self.refresh.checkpoint_request, step, asked)
        )
        cache = self.data.cache
        published = self.checkpoints.publish(state, request, None if cache is None else cache.save)
        if published:
            self.published_step = step
        return published


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: ``{"config": Config.to_dict(), "task": TrainingTask.to_dict(),
    "cores": the resolved training.cores, "initial_negatives_since": the driver's start when it
    prepares the initial negatives beside the workers, else None}``."""
    config = config_from_dict(loop_config["config"])
    task = TrainingTask.from_dict(loop_config["task"])
    since = loop_config["initial_negatives_since"]
    WorkerRun.start(config, task, loop_config["cores"], since).train()
