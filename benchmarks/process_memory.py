"""Peak resident memory of every process a benchmark stage runs, grouped by role.

A stage of hnce runs in several processes: the driver (``hnce ...`` and its children), Ray
Train's trainer workers, the refresh coordinator, encoder actors and shard holders, and Ray's own
system processes (GCS, raylet, dashboard). :class:`PeakMemory` samples them (the benchmark's
own process tree only: other runs on a shared machine are not counted) with psutil in a
background thread and keeps, per role, the largest resident set any one process of that role
reached and the largest total of all processes at one instant. Roles come from the process
title Ray gives its workers (``ray::EntityEncoderActor.encode_shard``, ``ray::RayTrainWorker``...).

Resident memory counts memory-mapped file pages a process has touched (token store rows, mmap'd
FAISS shards), so it over-states what a process could not give back; it is what the operating
system charges and what an out-of-memory killer reads.

Example::

    with PeakMemory() as memory:
        subprocess.run(["hnce", "train", ...], check=True)
    print(memory.table())
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

import psutil

GIB = 1 << 30

# (substring of the process title or command line, role); the first match wins.
ROLES: tuple[tuple[str, str], ...] = (
    ("RayTrainWorker", "trainer worker"),
    ("TrainController", "trainer worker"),
    ("RefreshCoordinator", "coordinator"),
    ("EntityEncoderActor", "encoder actor"),
    ("ShardHolder", "shard holder"),
    ("raylet", "ray system"),
    ("gcs_server", "ray system"),
    ("dashboard", "ray system"),
    ("log_monitor", "ray system"),
    ("monitor.py", "ray system"),
    ("runtime_env", "ray system"),
    ("ray::IDLE", "ray idle worker"),
    ("default_worker.py", "ray idle worker"),
    ("ray::", "other ray task"),
)


def role_of(process: psutil.Process, driver_pids: set[int]) -> str | None:
    """The role of ``process``, or None when it is not part of the run. Ray's processes are
    recognised by title first: a locally started Ray instance is the driver's child."""
    try:
        title = " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for marker, role in ROLES:
        if marker in title:
            return role
    return "driver" if process.pid in driver_pids else None


@dataclass
class PeakMemory:
    """Samples the run's processes every ``interval`` seconds until stopped (context manager)."""

    interval: float = 0.5
    peak_by_role: dict[str, int] = field(default_factory=dict)
    peak_total: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run_processes(self) -> list[psutil.Process]:
        """This process and its descendants: a locally started Ray instance (GCS, raylet and
        its workers) descends from the driver that started it, and the machine's other runs,
        which may be Ray runs too, do not."""
        me = psutil.Process(os.getpid())
        return [me, *me.children(recursive=True)]

    def sample(self) -> None:
        """One sample of every process of the run."""
        processes = self._run_processes()
        drivers = {process.pid for process in processes}
        total = 0
        for process in processes:
            role = role_of(process, drivers)
            if role is None:
                continue
            try:
                rss = process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0), rss)
        self.peak_total = max(self.peak_total, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def as_gib(self) -> dict[str, float]:
        """Peak GiB per role, plus ``all processes`` (the largest instantaneous total)."""
        peaks = {role: value / GIB for role, value in sorted(self.peak_by_role.items())}
        peaks["all processes"] = self.peak_total / GIB
        return peaks


def merge_peaks(peaks: Iterable[dict[str, float]]) -> dict[str, float]:
    """The maximum per role over several stages."""
    merged: dict[str, float] = {}
    for stage in peaks:
        for role, value in stage.items():
            merged[role] = max(merged.get(role, 0.0), value)
    return merged
