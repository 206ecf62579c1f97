"""The training run's side of the asynchronous refresh: start the coordinator, stop it at the end.

``pipeline.train.trainer.run_training`` starts one :class:`cluster.coordinator.RefreshCoordinator`
per run beside the Ray Train workers and stops it when training ends (DESIGN.md §5).
"""

from __future__ import annotations

from typing import Any

import ray

from cluster.coordinator import RefreshCoordinator
from cluster.refresh import RefreshPlan
from cluster.session import WORKER_ENV


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


def stop_refresh(coordinator: Any, watch: Any, grace_seconds: float = 5.0) -> dict[str, Any]:
    """Stop the watch loop; a refresh still encoding after ``grace_seconds`` is abandoned (its
    finished shards stay recorded, so a later ``hnce refresh`` resumes it). Returns its status."""
    ray.get(coordinator.stop.remote())
    status = ray.get(coordinator.status.remote())
    ray.wait([watch], timeout=grace_seconds)
    ray.kill(coordinator)
    return status
