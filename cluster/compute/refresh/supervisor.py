"""The training run's side of the asynchronous refresh: start the coordinator, stop it at the end.

``hnce.pipeline.train.trainer.run_training`` starts one
:class:`~hnce.cluster.compute.refresh.coordinator.RefreshCoordinator` per run beside the Ray
Train workers and stops it when training ends (docs/refresh.md). Every wait on the coordinator
has a timeout, and a normal end prints no Ray task failure: the loop is asked to stop, its task
is awaited and read, and only the idle actor is then released. ``hnce refresh`` beside a
training launch shares its GPUs as that launch chose (:func:`beside_training`). This module
imports neither DeepSpeed nor Ray Train, so ``hnce refresh`` stays light.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import Any

import ray

from hnce.cluster.compute.gpu_sharing import gpu_plan
from hnce.cluster.compute.refresh.coordinator import RefreshCoordinator
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.session import WORKER_ENV
from hnce.cluster.stores.lock_holder import TRAINING, read_holder
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

CALL_SECONDS = 60.0  # a control call (stop, abandon, status) is served by an idle thread at once


def beside_training(plan: RefreshPlan, use_gpu: bool, num_workers: int) -> RefreshPlan:
    """``plan`` for ``hnce refresh``: while a launch of ``hnce train`` holds the run's training
    lock on GPUs (``use_gpu``, its ``num_workers``), the job's encoder actors take the share of a
    GPU that launch chose for its own (:func:`~hnce.cluster.compute.gpu_sharing.gpu_plan` of the
    mode its ``launch`` event records) and count the GPUs its workers hold as taken; an encoder
    asking for a whole GPU could otherwise never be placed beside a trainer on one GPU. Without a
    training launch, or on CPUs, the refresh has the cluster to itself."""
    if not use_gpu or read_holder(plan.run_dir, TRAINING) is None:
        return plan
    launches = read_events(plan.run_dir, RunEvent.LAUNCH)
    mode = "shared" if launches and launches[-1].get("gpus") == "shared" else "dedicated"
    gpus = gpu_plan(mode, num_workers, "a launch is training this run")
    logger.info("refresh GPUs beside training: %s (%s)", gpus.mode, gpus.why)
    return replace(plan, encoder_gpus=gpus.encoder_gpus, trainer_gpus=gpus.trainer_gpus)


def start_refresh(plan: RefreshPlan) -> tuple[Any, Any]:
    """Start the coordinator actor and its watch loop; returns (actor, watch reference).

    The actor takes no CPU slot itself (its encoders take theirs); FAISS in it is held to one
    thread so mining does not steal the trainer's cores.
    """
    coordinator = RefreshCoordinator.options(
        max_concurrency=4,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", **WORKER_ENV}},
    ).remote(plan)
    return coordinator, coordinator.watch.remote()


def stop_refresh(
    coordinator: Any, watch: Any, grace_seconds: float = 2.0, boundary_seconds: float = 120.0
) -> dict[str, Any]:
    """Stop the watch loop and release the coordinator; returns its last status.

    A refresh still running after ``grace_seconds`` is abandoned: while it encodes, within a
    batch (its finished shards stay recorded, so a later ``hnce refresh`` resumes it); while it
    mines, when the mining ends. One that has not stopped within ``boundary_seconds`` (mining
    on a slow or loaded machine) is killed, which leaves nothing half-published either, but Ray
    then reports the killed task.
    """
    ray.get(coordinator.stop.remote(), timeout=CALL_SECONDS)
    ready, _ = ray.wait([watch], timeout=grace_seconds)
    if not ready:
        logger.info("a refresh is still running; abandoning it (resumable)")
        ray.get(coordinator.abandon.remote(), timeout=CALL_SECONDS)
        ready, _ = ray.wait([watch], timeout=boundary_seconds)
    status: dict[str, Any] = ray.get(coordinator.status.remote(), timeout=CALL_SECONDS)
    if ready:
        ray.get(watch, timeout=CALL_SECONDS)
        ray.kill(coordinator)  # idle: it ends without a task to fail
        return status
    logger.warning("the refresh did not stop in time; killing the coordinator (resumable)")
    ray.kill(coordinator)
    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(watch, timeout=CALL_SECONDS)  # read, so Ray does not report it again at exit
    return status
