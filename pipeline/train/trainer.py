"""The one training driver: Ray Train's ``TorchTrainer`` (DeepSpeed in every worker), plus the
refresh coordinator when the task trains the retriever on an index.

:func:`run_task` trains a :class:`~hnce.pipeline.train.task.TrainingTask`: ``hnce train`` the
retriever (:func:`run_training`), ``hnce rerank`` the joint reranker. The coordinator actor
(:mod:`hnce.cluster.compute.refresh.coordinator`) runs alongside on its own CPU (its encoder actors request their own CPUs
or GPUs, and ``hnce_encoder`` on a launched cluster), watching ``<run>/checkpoints`` and
publishing index and negatives versions; the trainer workers (one ``hnce_trainer`` slot each on
a launched cluster) never wait for it (docs/refresh.md). A worker failure restarts the worker group
up to ``training.max_failures`` times; the new group resumes from the newest complete checkpoint
(``FailureConfig`` + the checkpoint pointer each publish reports to Ray Train). That pointer
serves one launch: a new launch resumes from hnce's own newest complete checkpoint and starts
Ray Train's state afresh (:func:`discard_earlier_launch_state`).

SIGTERM (a spot instance's notice) stops a launch cleanly within the notice
(:mod:`~hnce.pipeline.train.preemption`): every worker stops at the same step boundary with a
checkpoint of it, the coordinator's refresh is abandoned (resumable), the locks are released, and
:class:`~hnce.errors.Terminated` names the checkpoint the same command resumes from.

Once the workers and the coordinator have stopped, the held-out recalls the refresh log holds and
the event log lacks (a refresh that finished after rank 0 last looked) are copied into the event
log and TensorBoard (:func:`~hnce.cluster.compute.refresh.health.log_missed_heldout`).

The initial negatives (``negatives.initial`` lexical or model) are prepared in a driver thread
while Ray Train starts the workers, which hold their first step until they are published
(:class:`~hnce.cluster.compute.refresh.initial.InitialNegativesBeside`); a trainer that fails
first abandons them before its error is raised.

A launch holds the run's ``training`` lock (:class:`~hnce.cluster.compute.lock.RunLock`) from
before Ray starts until it returns: a second launch on the same run directory (a job submitted
twice, a retry while the first still runs, on this machine or another node of the cluster) is
refused, naming the first, before it writes or starts anything.

The driver can run many trainings in one process: Ray is started once (``init_ray`` is a no-op
when it is up) and nothing of a run stays behind in the driver but its run directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from hnce.cluster.compute.encoder_actor import node_cores
from hnce.cluster.compute.gpu_sharing import GpuPlan, resolve_gpu_sharing
from hnce.cluster.compute.index_build import timed
from hnce.cluster.compute.lock import RunLock
from hnce.cluster.compute.refresh.health import log_missed_heldout, raise_if_stopped
from hnce.cluster.compute.refresh.initial import (
    InitialNegativesBeside,
    InitialRequest,
    TrainerBeside,
)
from hnce.cluster.compute.refresh.supervisor import start_refresh, stop_refresh
from hnce.cluster.compute.resources import (
    ENCODER_RESOURCE,
    TRAINER_RESOURCE,
    custom_resource_request,
)
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.lock_holder import TRAINING
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import Config, CoresMode, dump_config
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.preflight import check_training_inputs
from hnce.pipeline.recipe_models import untrained_export
from hnce.pipeline.run import RUN_RECIPE, refresh_plan
from hnce.pipeline.train.cores import describe_cores, resolve_cores, threads_lent_to_refresh
from hnce.pipeline.train.nonfinite import raise_if_diverged
from hnce.pipeline.train.preemption import SigtermStop
from hnce.pipeline.train.run_follower import follow_run
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import train_loop_per_worker

logger = logging.getLogger(__name__)


@dataclass
class TrainingSummary:
    """What a run did, read back from its event log."""

    run_dir: Path
    steps: int
    final_loss: float
    seconds: float
    task: str = "retriever"
    mentions: int = 0
    skipped_missing_gold: int = 0
    checkpoints: list[int] = field(default_factory=list)
    negatives_switches: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    refreshes: int = 0
    refresh_error: str | None = None
    refreshes_over: str | None = None  # why the coordinator started no more (it logged the figures)
    hard_negatives: int = 0  # drawn over the run (its step events' counts)

    def note_refreshes(self, status: dict[str, Any]) -> None:
        """Take the refresh coordinator's last ``status`` (empty without a coordinator)."""
        self.refreshes = int(status.get("refreshes", 0))
        self.refresh_error = status.get("error")
        self.refreshes_over = status.get("refreshes_over")

    def line(self) -> str:
        lags = [s["lag"] for s in self.negatives_switches]
        switches = (
            f"{len(self.negatives_switches)} negatives switches (lag {min(lags)}-{max(lags)} steps)"
            if lags
            else f"{self.hard_negatives:,} hard negatives from the negative cache"
            if self.hard_negatives
            else "random negatives only"
        )
        if self.task == "reranker":
            switches = "the retriever's fixed candidates"
        resumed = f", resumed from step {self.resumed_from}" if self.resumed_from else ""
        over = (
            " (then none: any other would have published after the last step)"
            if self.refreshes_over
            else ""
        )
        return (
            f"trained {self.steps} steps in {self.seconds:.0f}s, final loss {self.final_loss:.4f}, "
            f"{len(self.checkpoints)} checkpoints, {self.refreshes} refreshes{over}, "
            f"{switches}{resumed}"
        )


def _worker_config(
    config: Config, task: TrainingTask, cores: CoresMode, initial_negatives_since: float | None
) -> dict[str, Any]:
    """What every worker gets: the config (paths made absolute), the task, the resolved
    ``training.cores`` and, when the driver prepares the initial negatives beside the workers'
    start-up, the driver's start (the workers wait for it from then)."""
    tree = config.to_dict()
    tree["run"]["dir"] = str(config.run_dir.resolve())
    tree["data"]["root"] = str(Path(config.data.root).resolve())
    return {
        "config": tree,
        "task": task.to_dict(),
        "cores": cores,
        "initial_negatives_since": initial_negatives_since,
    }


def run_training(config: Config) -> TrainingSummary:
    """``hnce train``: train the retriever to ``training.steps`` (resuming from a checkpoint in
    ``run.dir``), on the initial negatives ``negatives.initial`` says and the refresh when the
    recipe asks for it."""
    check_training_inputs(config)
    return run_task(config, TrainingTask.retriever(config))


#: Ray Train's controller polls its workers this often (Ray's default is 2 s): a run's start and
#: end each waited up to one interval for the next poll. Ray Train hands the driver's value to the
#: controller; a value the user exported wins.
CONTROLLER_POLL = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


def _trainer(
    config: Config,
    task: TrainingTask,
    cores: CoresMode,
    gpus: GpuPlan,
    initial_negatives_since: float | None,
) -> TorchTrainer:
    """Ray Train's trainer for ``task``: one worker per ``num_workers``, each with its CPUs, its
    share of a GPU when ``cluster.use_gpu`` (``gpus``; NCCL, gloo without), and the
    ``hnce_trainer`` resource; Ray Train's state of an earlier launch is discarded first."""
    settings = task.settings(config)
    os.environ.setdefault(*CONTROLLER_POLL)
    name = f"hnce-{task.kind}-{task.run_dir.name}"
    storage = task.run_dir / "ray"
    discard_earlier_launch_state(storage / name)
    resources = custom_resource_request(TRAINER_RESOURCE, ray.cluster_resources())
    if config.cluster.use_gpu:
        resources["GPU"] = gpus.worker_gpus
    scaling = ScalingConfig(
        num_workers=settings.num_workers,
        use_gpu=config.cluster.use_gpu,
        resources_per_worker={"CPU": settings.cpus_per_worker, **resources},
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=_worker_config(config, task, cores, initial_negatives_since),
        scaling_config=scaling,
        torch_config=TorchConfig(backend="nccl" if config.cluster.use_gpu else "gloo"),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=settings.max_failures),
        ),
    )


def discard_earlier_launch_state(experiment_dir: Path) -> None:
    """Remove what an earlier launch left of Ray Train's own run state in ``experiment_dir``
    (its checkpoint manager's snapshot and the checkpoint pointers reported to it).

    That state serves one launch: a worker group Ray Train restarts resumes from the pointer it
    holds in memory. A new launch resumes from the newest complete checkpoint on disk
    (:func:`~hnce.pipeline.train.checkpointing.agreed_resume_step`), which is never older than the
    last pointer reported. Ray Train writes its snapshot in place, so a launch killed mid-write
    leaves it truncated, and Ray Train then refuses to start (``CheckpointManagerInitializationError``);
    starting from none makes a killed launch always resumable."""
    if experiment_dir.exists():
        logger.info("Ray Train's state of an earlier launch is discarded: %s", experiment_dir)
        shutil.rmtree(experiment_dir)


def initial_request(config: Config, source: str) -> InitialRequest:
    """The initial negatives of ``source`` (``negatives.initial`` as the task resolves it) for
    this recipe: its train split and, exported when asked, its starting
    model (:func:`~hnce.pipeline.recipe_models.untrained_export`)."""
    return InitialRequest(
        source,
        config.data.train_split,
        starting_model=lambda: untrained_export(config),
    )


def run_task(config: Config, task: TrainingTask) -> TrainingSummary:
    """Train ``task`` to its ``steps`` through Ray Train (resuming from the newest checkpoint in
    its run directory); returns what the run did, read back from its event log. Raises
    :class:`~hnce.cluster.stores.lock_holder.RunLocked` when another launch is training the run."""
    settings = task.settings(config)
    cpus_needed = settings.num_workers * settings.cpus_per_worker + (
        config.refresh.num_encoders * config.refresh.encoder_cpus
        if task.encoders_beside(config)
        else 0
    )
    seconds: dict[str, float] = {}
    since = time.time()

    def start_ray() -> None:
        with timed(seconds, "ray"):
            init_ray(config.cluster, cpus_needed)

    with RunLock(task.run_dir, f"hnce train ({task.kind})", start_ray, kind=TRAINING):
        return _launch(config, task, seconds, since)


def _launch(
    config: Config, task: TrainingTask, seconds: dict[str, float], since: float
) -> TrainingSummary:
    """:func:`run_task` once Ray is up and the run's training lock held (``seconds``: the
    driver's stages so far; ``since``: the launch's start)."""
    settings = task.settings(config)
    dump_config(config, task.run_dir / RUN_RECIPE)
    with_refresh = task.refreshes(config)
    initial = task.initial_negatives(config)
    nodes = sum(1 for node in ray.nodes() if node["Alive"])
    cores, why = resolve_cores(settings.cores, nodes, config.cluster.use_gpu)
    workers, cpus = settings.num_workers, settings.cpus_per_worker
    here = node_cores() if nodes == 1 and config.cluster.address == "local" else None
    logger.info("training: %s", describe_cores(cores, why, workers, cpus, here))
    resources = ray.cluster_resources()
    gpus = resolve_gpu_sharing(
        config.cluster.gpu_sharing,
        config.cluster.use_gpu,
        resources.get("GPU", 0.0),
        settings.num_workers,
        encoders_beside=task.encoders_beside(config),
        encoder_slots=bool(custom_resource_request(ENCODER_RESOURCE, resources)),
    )
    if config.cluster.use_gpu:
        logger.info("training GPUs: %s (%s)", gpus.mode, gpus.why)
    initial_beside = None
    if initial != "random" and refresh_plan(config).negatives_store.current_version() is None:
        lent = threads_lent_to_refresh(cores, True, workers, cpus)
        trainer_beside = TrainerBeside(
            cpus=workers * cpus,
            lent_threads=lent,
            gpus=gpus.trainer_gpus,
            encoder_gpus=gpus.encoder_gpus,
        )
        logger.info("the initial negatives (%s) are prepared while the workers start", initial)
        request = initial_request(config, initial)
        log = EventLog(task.run_dir)
        initial_beside = InitialNegativesBeside(
            refresh_plan(config), request, trainer_beside, log
        ).start()
    trainer = _trainer(config, task, cores, gpus, since if initial_beside is not None else None)
    coordinator = watch = None
    if with_refresh:
        lent = threads_lent_to_refresh(
            cores, task.waits_for_refreshes(config), settings.num_workers, settings.cpus_per_worker
        )
        if lent:
            logger.info("the waiting trainer lends each refresh %d torch thread(s)", lent)
        plan = replace(
            refresh_plan(config),
            lent_threads=lent,
            encoder_gpus=gpus.encoder_gpus,
            trainer_gpus=gpus.trainer_gpus,
        )
        with timed(seconds, "refresh coordinator"):
            coordinator, watch = start_refresh(plan)
    EventLog(task.run_dir).write(
        RunEvent.LAUNCH,
        seconds=seconds,
        cores=cores,
        cores_reason=why,
        gpus=gpus.mode,
        gpus_reason=gpus.why,
    )
    done = threading.Event()
    follower = threading.Thread(
        target=follow_run, args=(task.run_dir, settings.steps, done), daemon=True
    )
    started = time.perf_counter()
    follower.start()
    abandon = None if coordinator is None else coordinator.abandon.remote
    with SigtermStop(task.run_dir, abandon) as sigterm:
        try:
            fit_interruptibly(trainer, task.run_dir, sigterm)
        except BaseException:
            if initial_beside is not None:
                initial_beside.abandon()
            raise
        finally:
            done.set()
            follower.join()
            status: dict[str, Any] = {}
            if coordinator is not None:
                status = stop_refresh(coordinator, watch, **sigterm.refresh_bounds())
    # a refresh that outlived the workers recorded its recall
    log_missed_heldout(task.run_dir, lambda: EventLog(task.run_dir, tensorboard=True))
    if initial_beside is not None and sigterm.asked:
        initial_beside.abandon()  # the workers stopped before they needed them
    elif initial_beside is not None:
        initial_beside.raise_if_failed()
    raise_if_stopped(task.run_dir, since)
    raise_if_diverged(task.run_dir, since)
    sigterm.raise_if_stopped(settings.steps)
    summary = summarise_run(task.run_dir, time.perf_counter() - started)
    summary.note_refreshes(status)
    return summary


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT during training; the message says where the run resumes."""


def fit_interruptibly(
    trainer: TorchTrainer, run_dir: Path, sigterm: SigtermStop | None = None
) -> None:
    """``trainer.fit()`` in a thread, so that SIGINT and SIGTERM reach this process's main
    thread (Ray Train would take SIGINT in the main thread, abort its controller and leave the
    process to exit 1 with no word). On SIGINT: :class:`TrainingInterrupted`, naming the
    checkpoint the same command resumes from; the workers stop with this process, whose Ray job
    owns them. SIGTERM (``sigterm``) asks the workers to stop and the refresh to be abandoned;
    once the workers have not stopped within its bound, :class:`~hnce.errors.Terminated`
    likewise."""
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # handed to the main thread below
            failure.append(error)

    fitting = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    fitting.start()
    try:
        while fitting.is_alive():
            fitting.join(0.1)  # a stop on SIGTERM reaches the refresh within 0.1 s
            if sigterm is not None:
                sigterm.poll()
    except KeyboardInterrupt:
        newest = newest_checkpoint(run_dir)
        resumes = f"step-{newest[0]}" if newest is not None else "the start"
        raise TrainingInterrupted(
            f"interrupted; the same command resumes {run_dir} from {resumes}"
        ) from None
    if failure:
        raise failure[0]


def summarise_run(run_dir: Path, seconds: float) -> TrainingSummary:
    """Read a run's event log into a :class:`TrainingSummary`."""
    end = read_events(run_dir, RunEvent.END)
    start = read_events(run_dir, RunEvent.START)
    newest = newest_checkpoint(run_dir)
    return TrainingSummary(
        run_dir=run_dir,
        task=str(start[0].get("task", "retriever")) if start else "retriever",
        mentions=int(start[0]["mentions"]) if start else 0,
        skipped_missing_gold=int(start[0].get("skipped_missing_gold", 0)) if start else 0,
        steps=int(end[-1]["step"]) if end else (newest[0] if newest else 0),
        final_loss=float("nan") if not end or end[-1]["loss"] is None else float(end[-1]["loss"]),
        seconds=seconds,
        checkpoints=[int(e["step"]) for e in read_events(run_dir, RunEvent.CHECKPOINT)],
        negatives_switches=read_events(run_dir, RunEvent.NEGATIVES),
        resumed_from=[int(e["step"]) for e in read_events(run_dir, RunEvent.RESUME)],
        hard_negatives=sum(
            int(e.get("hard_negatives") or 0) for e in read_events(run_dir, RunEvent.STEP)
        ),
    )
