"""The driver of a training run: Ray Train's ``TorchTrainer`` plus the refresh coordinator.

The coordinator actor (cluster/refresh.py) runs alongside on its own CPU (its encoder actors
request their own CPUs or GPUs, and ``hnce_encoder`` on a launched cluster), watching
``<run>/checkpoints`` and publishing index and negatives versions; the trainer workers (one
``hnce_trainer`` slot each on a launched cluster) never wait for it (DESIGN.md §5). A worker
failure restarts the worker group up to ``training.max_failures`` times; the new group resumes
from the newest complete checkpoint (``FailureConfig`` + the checkpoint pointer each publish
reports to Ray Train).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from cluster.checkpoints import newest_checkpoint
from cluster.resources import TRAINER_RESOURCE, custom_resource_request
from cluster.session import init_ray
from pipeline.config import Config, dump_config
from pipeline.preflight import check_training_inputs
from pipeline.train.events import read_events
from pipeline.train.progress import follow_progress
from pipeline.train.refresh_health import raise_if_stopped
from pipeline.train.refresh_supervisor import refresh_plan, start_refresh, stop_refresh
from pipeline.train.worker import train_loop_per_worker


@dataclass
class TrainingSummary:
    """What a run did, read back from its event log."""

    run_dir: Path
    steps: int
    final_loss: float
    seconds: float
    checkpoints: list[int] = field(default_factory=list)
    negatives_switches: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    refreshes: int = 0
    refresh_error: str | None = None

    def line(self) -> str:
        lags = [s["lag"] for s in self.negatives_switches]
        switches = (
            f"{len(self.negatives_switches)} negatives switches (lag {min(lags)}-{max(lags)} steps)"
            if lags
            else "random negatives only"
        )
        resumed = f", resumed from step {self.resumed_from}" if self.resumed_from else ""
        return (
            f"trained {self.steps} steps in {self.seconds:.0f}s, final loss {self.final_loss:.4f}, "
            f"{len(self.checkpoints)} checkpoints, {self.refreshes} refreshes, "
            f"{switches}{resumed}"
        )


def _with_run_dir(config: Config, run_dir: Path) -> dict[str, Any]:
    """The config as the workers get it, with the run directory made absolute."""
    tree = config.to_dict()
    tree["run"]["dir"] = str(run_dir)
    tree["data"]["root"] = str(Path(config.data.root).resolve())
    return tree


def run_training(config: Config, progress: bool = True) -> TrainingSummary:
    """Train ``config`` to ``training.steps`` (resuming from a checkpoint in ``run.dir``)."""
    training = config.training
    check_training_inputs(config)
    run_dir = config.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    with_refresh = config.refresh.enabled and config.negatives.source == "index"
    cpus_needed = training.num_workers * training.cpus_per_worker + (
        config.refresh.num_encoders * config.refresh.encoder_cpus if with_refresh else 0
    )
    init_ray(config.cluster, cpus_needed)

    resources = custom_resource_request(TRAINER_RESOURCE, ray.cluster_resources())
    scaling = ScalingConfig(
        num_workers=training.num_workers,
        use_gpu=config.cluster.use_gpu,
        resources_per_worker={"CPU": training.cpus_per_worker, **resources},
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": _with_run_dir(config, run_dir)},
        scaling_config=scaling,
        torch_config=TorchConfig(backend="nccl" if config.cluster.use_gpu else "gloo"),
        run_config=RunConfig(
            name=f"hnce-{run_dir.name}",
            storage_path=str(run_dir / "ray"),
            failure_config=FailureConfig(max_failures=training.max_failures),
        ),
    )
    coordinator = watch = None
    if with_refresh:
        coordinator, watch = start_refresh(refresh_plan(config))
    done = threading.Event()
    follower = threading.Thread(
        target=follow_progress, args=(run_dir, training.steps, done), daemon=True
    )
    started, since = time.perf_counter(), time.time()
    if progress:
        follower.start()
    try:
        trainer.fit()
    finally:
        done.set()
        if progress:
            follower.join()
        status: dict[str, Any] = {}
        if coordinator is not None:
            status = stop_refresh(coordinator, watch)
    raise_if_stopped(run_dir, since)
    seconds = time.perf_counter() - started
    summary = summarise_run(run_dir, seconds)
    summary.refreshes = int(status.get("refreshes", 0))
    summary.refresh_error = status.get("error")
    return summary


def summarise_run(run_dir: Path, seconds: float) -> TrainingSummary:
    """Read a run's event log into a :class:`TrainingSummary`."""
    end = read_events(run_dir, "end")
    newest = newest_checkpoint(run_dir)
    return TrainingSummary(
        run_dir=run_dir,
        steps=int(end[-1]["step"]) if end else (newest[0] if newest else 0),
        final_loss=float(end[-1]["loss"]) if end else float("nan"),
        seconds=seconds,
        checkpoints=[int(e["step"]) for e in read_events(run_dir, "checkpoint")],
        negatives_switches=read_events(run_dir, "negatives"),
        resumed_from=[int(e["step"]) for e in read_events(run_dir, "resume")],
    )
