"""Scheduled refresh jobs: `hnce refresh` once (cron, `ray job submit`) or `--every 6h` (DESIGN.md §5).

A job takes an exclusive `fcntl` lock on `<run>/refresh.lock` before touching the stores, so two
refreshes of one run never overlap: the second exits at once with `EXIT_LOCKED` and a message
naming the holder. The lock is released by the kernel if the holder dies, so a crash never leaves
a stale lock behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cluster.refresh import NoCheckpointError, RefreshPlan, RefreshSummary, run_refresh

logger = logging.getLogger(__name__)

LOCK_FILE = "refresh.lock"
EXIT_OK = 0
EXIT_NO_CHECKPOINT = 3
EXIT_LOCKED = 75  # EX_TEMPFAIL: another refresh holds the lock; try again later

_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class RefreshLocked(RuntimeError):
    """Another refresh of the same run holds the lock."""


def parse_interval(text: str) -> float:
    """Seconds in an interval like `6h`, `30m`, `90s`, `1d` or `45` (seconds)."""
    match = _INTERVAL.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"bad interval {text!r}: expected a positive number with s, m, h or d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class RefreshLock:
    """Exclusive, non-blocking `fcntl.flock` on `<run>/refresh.lock` (a context manager)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._descriptor: int | None = None

    def __enter__(self) -> RefreshLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 256, 0).decode("utf-8", "replace").strip()
            os.close(descriptor)
            raise RefreshLocked(
                f"another refresh of {self.path.parent} is running ({holder or 'holder unknown'}); "
                f"lock {self.path}"
            ) from None
        os.ftruncate(descriptor, 0)
        holder = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%F %T')}"
        os.pwrite(descriptor, holder.encode(), 0)
        self._descriptor = descriptor
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._descriptor is not None:
            os.ftruncate(self._descriptor, 0)
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None


def refresh_once(
    plan: RefreshPlan,
    step: int | None = None,
    report: Callable[[str], None] = print,
    connect: Callable[[], None] | None = None,
) -> int:
    """One locked refresh; returns an exit code and reports one summary or error line.

    `connect` (e.g. starting or joining Ray) runs once the lock is held, so a refresh that finds
    the lock taken exits without starting anything. Other errors propagate.
    """
    try:
        with RefreshLock(plan.run_dir):
            if connect is not None:
                connect()
            summary: RefreshSummary = run_refresh(plan, step)
    except RefreshLocked as error:
        report(f"hnce refresh: {error}")
        return EXIT_LOCKED
    except NoCheckpointError as error:
        report(f"hnce refresh: {error}")
        return EXIT_NO_CHECKPOINT
    report(summary.line())
    return EXIT_OK


def refresh_every(
    plan: RefreshPlan,
    interval_seconds: float,
    max_runs: int | None = None,
    report: Callable[[str], None] = print,
    connect: Callable[[], None] | None = None,
) -> int:
    """Refresh every `interval_seconds` (measured start to start) until interrupted.

    A run that finds the lock held or no checkpoint is reported and the schedule goes on; a
    failing refresh raises and ends the job (so the scheduler sees it).
    """
    runs = 0
    while max_runs is None or runs < max_runs:
        started = time.monotonic()
        code = refresh_once(plan, report=report, connect=connect)
        runs += 1
        logger.info("scheduled refresh %d finished with exit code %d", runs, code)
        if max_runs is not None and runs >= max_runs:
            break
        time.sleep(max(0.0, interval_seconds - (time.monotonic() - started)))
    return EXIT_OK
