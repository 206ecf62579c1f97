"""The refresh coordinator: a Ray actor that refreshes a run as its checkpoints appear (DESIGN.md §5).

The trainer starts one per run (``pipeline.train.trainer``); it watches ``<run>/checkpoints`` and
runs :func:`cluster.refresh.run_refresh` for the newest complete checkpoint whenever the live
index or negatives version is older, skipping stale ones. Its encoder actors take their own CPUs
or GPUs; the coordinator itself takes no CPU slot.

Example (inside a Ray job)::

    coordinator = RefreshCoordinator.remote(RefreshPlan(run_dir, data_dir, refresh, index))
    watch = coordinator.watch.remote()            # runs until coordinator.stop.remote()
"""

from __future__ import annotations

import logging
import threading

import ray

from cluster.checkpoints import complete_checkpoints
from cluster.refresh import RefreshPlan, RefreshSummary, run_refresh

logger = logging.getLogger(__name__)


@ray.remote(max_restarts=3, max_task_retries=3, num_cpus=0, max_concurrency=4)
class RefreshCoordinator:
    """Ray actor that refreshes whenever a newer complete checkpoint appears.

    Restarted by Ray if it dies; a restarted refresh resumes from the recorded shards. Runs its
    loop in a thread so `stop`, `status` and `refresh` calls are served meanwhile.
    """

    def __init__(self, plan: RefreshPlan) -> None:
        self.plan = plan
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.summaries: list[RefreshSummary] = []
        self.last_error: str | None = None

    def refresh(self, step: int | None = None) -> RefreshSummary:
        """One refresh now (newest checkpoint unless `step` is given)."""
        with self._lock:
            summary = run_refresh(self.plan, step)
            self.summaries.append(summary)
            return summary

    def watch(self) -> int:
        """Refresh each time a newer checkpoint is complete, until `stop`; returns refreshes done."""
        done = 0
        while not self._stop.is_set():
            checkpoints = complete_checkpoints(self.plan.run_dir)
            current = self.plan.index_store.current_version()
            newest = checkpoints[-1][0] if checkpoints else None
            published = (
                self.plan.index_store.read_manifest(current)["checkpoint"]
                if current is not None
                else None
            )
            negatives = self.plan.negatives_store.current_version()
            if newest is not None and (newest != published or negatives != current):
                try:
                    self.refresh(newest)
                    done += 1
                except Exception as error:  # reported through status(); the loop keeps watching
                    logger.exception("refresh of step-%s failed", newest)
                    self.last_error = f"step-{newest}: {error!r}"
            self._stop.wait(self.plan.refresh.poll_seconds)
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
