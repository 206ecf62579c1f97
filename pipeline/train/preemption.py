"""A training launch stopped by SIGTERM: a spot instance's notice, ``ray job stop``, Kubernetes
deleting the pod (docs/failures.md, "Preemption").

SIGKILL follows SIGTERM after a grace period (:data:`NOTICE_SECONDS` on most clouds and under
Kubernetes by default). Within it, ``hnce train`` stops the way a finished run does:

- the driver (:class:`SigtermStop`, in its main thread while the workers train) writes
  ``<run>/stop-request.json`` (:data:`STOP_FILE`) the moment SIGTERM arrives, and asks the
  refresh coordinator to abandon its refresh at once (resumable: its finished shards stay
  recorded), so none starts meanwhile;
- the workers look at every step boundary (:class:`StopAgreement`): rank 0 whether the request
  is there, broadcast to every rank as the refresh health stop is
  (:mod:`hnce.cluster.compute.refresh.health`), so every rank leaves the loop at the same step.
  They publish the checkpoint of that step through the normal path (unless it is published
  already), and return normally: Ray Train's ``fit`` returns and restarts nothing;
- the driver waits for the refresh to stop, releases the run's locks and raises
  :class:`~hnce.errors.Terminated` naming the checkpoint the same command resumes from (exit 143).

Each wait is bounded, counted from SIGTERM, so that the whole stop fits in the notice. The
workers must have stopped :data:`WORKERS_STOP_SECONDS` after it; workers that have not (still
starting, or a step and checkpoint slower than that) end with the driver's Ray job, and the run
resumes from its newest complete checkpoint, as after SIGKILL. The refresh must have stopped
:data:`REFRESH_STOP_SECONDS` after it (one starting its encoder actors stops once they have
started); then its coordinator is killed, which publishes nothing half-written either.

A request left by a launch killed before its workers read it is removed by the next launch
before its workers start (it holds the run's training lock).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.files import atomic_write_json
from hnce.errors import Terminated

if TYPE_CHECKING:
    from hnce.pipeline.train.distributed import Collectives

logger = logging.getLogger(__name__)

#: the driver's request to the workers, in the run directory
STOP_FILE = "stop-request.json"
#: SIGTERM to SIGKILL on a spot or preemptible instance (GCP: 30 s; AWS warns 2 min ahead) and
#: under Kubernetes (``terminationGracePeriodSeconds``' default)
NOTICE_SECONDS = 30.0
#: when, after SIGTERM, the workers must have stopped (their last step and checkpoint)
WORKERS_STOP_SECONDS = 15.0
#: when, after SIGTERM, the coordinator's refresh must have stopped (encoding: within a batch);
#: the rest of the notice serves the coordinator's release, the locks and the local Ray
#: instance's shutdown (about 4 s on two cores)
REFRESH_STOP_SECONDS = 22.0


class SigtermStop:
    """The driver's side (module docs), a context manager around the workers' training: from
    ``__enter__`` to ``__exit__`` SIGTERM (heard in the main thread only; elsewhere this does
    nothing) writes the stop request instead of ending the command. ``abandon_refresh`` asks
    the coordinator to abandon its refresh without waiting (:meth:`poll` calls it once)."""

    def __init__(self, run_dir: Path, abandon_refresh: Callable[[], object] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / STOP_FILE
        self.abandon_refresh = abandon_refresh
        self.asked_at: float | None = None
        self._previous: Any = None

    def __enter__(self) -> SigtermStop:
        self.path.unlink(missing_ok=True)  # left by a launch killed before its workers read it
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *_: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        self.path.unlink(missing_ok=True)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.asked_at is not None:
            return
        self.asked_at = time.monotonic()
        atomic_write_json(self.path, {"signal": "SIGTERM", "pid": os.getpid(), "at": time.time()})
        logger.warning(
            "SIGTERM: the workers stop at their next step with a checkpoint of it (waiting up to "
            "%.0f s); a refresh in progress is abandoned (resumable)",
            WORKERS_STOP_SECONDS,
        )

    @property
    def asked(self) -> bool:
        """Whether SIGTERM came (the workers were asked to stop)."""
        return self.asked_at is not None

    def poll(self) -> None:
        """While the workers train (the main thread, between waits on them): once asked to
        stop, the refresh abandoned (once); :class:`~hnce.errors.Terminated` once the workers
        have not stopped within :data:`WORKERS_STOP_SECONDS`: they are left to end with this
        process's Ray job."""
        if self.asked_at is None:
            return
        if self.abandon_refresh is not None:
            self.abandon_refresh()
            self.abandon_refresh = None
        if time.monotonic() - self.asked_at < WORKERS_STOP_SECONDS:
            return
        newest = newest_checkpoint(self.run_dir)
        now = f"step-{newest[0]}" if newest is not None else "none"
        raise Terminated(
            f"stopped on SIGTERM; the workers had not stopped {WORKERS_STOP_SECONDS:.0f} s later "
            f"and end with this command; the same command resumes {self.run_dir} from its newest "
            f"complete checkpoint (now: {now})"
        )

    def refresh_bounds(self) -> dict[str, float]:
        """``stop_refresh``'s waits: once asked to stop, none before abandoning the refresh,
        and until :data:`REFRESH_STOP_SECONDS` after SIGTERM for it to stop (a second at least);
        its defaults otherwise."""
        if self.asked_at is None:
            return {}
        left = self.asked_at + REFRESH_STOP_SECONDS - time.monotonic()
        return {"grace_seconds": 0.0, "boundary_seconds": max(left, 1.0)}

    def raise_if_stopped(self, steps: int) -> None:
        """:class:`~hnce.errors.Terminated` when SIGTERM stopped the workers before the run's
        last step (``steps``), naming the checkpoint they stopped at."""
        newest = newest_checkpoint(self.run_dir)
        if self.asked_at is None or (newest is not None and newest[0] >= steps):
            return
        step = 0 if newest is None else newest[0]
        start = "the start" if newest is None else f"step-{step}"
        raise Terminated(
            f"stopped on SIGTERM at step {step}; the same command resumes {self.run_dir} from "
            f"{start}"
        )


class StopAgreement:
    """The workers' side (module docs): whether the driver asked them to stop, on every rank
    (a collective: every rank asks at the same step boundary)."""

    def __init__(self, run_dir: Path, collectives: Collectives) -> None:
        self.path = Path(run_dir) / STOP_FILE
        self.collectives = collectives

    def agreed(self) -> bool:
        asked = self.collectives.rank == 0 and self.path.exists()
        return bool(self.collectives.broadcast_int(int(asked)))
