"""Peak resident memory, one way: each process's own high-water mark, over a process tree.

The kernel keeps, per process, the largest resident set it has reached (``VmHWM`` in
``/proc/<pid>/status``; ``ru_maxrss`` once it has exited), so a peak is exact however briefly it
lasted. :class:`PeakMemory` walks this process and its descendants every ``interval`` seconds
(the benchmark's own tree: other runs on a shared machine are not counted; a locally started
Ray instance, GCS, raylet and workers, descends from the driver that started it) and keeps the
largest high-water mark of any process of each role, the largest of each process, and the
largest total of all processes' resident sets at one instant. Roles come from the process title
Ray gives its workers (``ray::EntityEncoderActor.encode_shard``, ``ray::RayTrainWorker``...);
every other process of the tree is a ``driver``. A process that lives less than ``interval`` may
be missed; :func:`benchmarks.harness.commands.run_command` adds the exact figure of its child
from ``wait4``. For a peak inside this process, :func:`reset_own_peak` then
:func:`own_peak_bytes`.

Resident memory counts memory-mapped file pages a process has touched (token store rows, mmap'd
FAISS shards), so it over-states what a process could not give back; it is what the operating
system charges and what an out-of-memory killer reads.

Example::

    with PeakMemory() as memory:
        subprocess.run(["hnce", "train", ...], check=True)
    print(memory.as_gib())    # {"driver": 0.61, "trainer worker": 1.2, ..., "all processes": 4.1}
"""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass, field
from pathlib import Path

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


def _status_kib(pid: int | str, field_name: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status``, or None where there is none (not Linux, gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def peak_bytes(process: psutil.Process) -> int:
    """The largest resident set ``process`` has reached (its current one where the kernel keeps
    no high-water mark)."""
    kib = _status_kib(process.pid, "VmHWM")
    return kib * 1024 if kib is not None else process.memory_info().rss


def own_rss_bytes() -> int:
    """This process's resident set now."""
    return psutil.Process(os.getpid()).memory_info().rss


def own_peak_bytes() -> int:
    """The largest resident set of this process since it started or since :func:`reset_own_peak`."""
    kib = _status_kib("self", "VmHWM")
    if kib is not None:
        return kib * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_own_peak() -> bool:
    """Reset this process's high-water mark to its resident set now (Linux ``clear_refs``);
    False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


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
    """Samples the run's processes every ``interval`` seconds until stopped (context manager):
    ``peak_by_role`` and ``peak_by_pid`` (bytes), ``peak_total`` (bytes at one instant), and
    ``private_by_role``: the largest anonymous resident memory sampled (``RssAnon``), the part
    of a peak that is the process's own. The rest of a resident set is files it maps, such as
    the index files FAISS maps: page cache, shared with other readers and evicted under
    pressure, which the kernel's high-water mark counts as soon as a search touches it."""

    interval: float = 0.5
    peak_by_role: dict[str, int] = field(default_factory=dict)
    peak_by_pid: dict[int, int] = field(default_factory=dict)
    private_by_role: dict[str, int] = field(default_factory=dict)
    peak_total: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        """One sample of every process of this process's tree."""
        me = psutil.Process(os.getpid())
        processes = [me, *me.children(recursive=True)]
        drivers = {process.pid for process in processes}
        total = 0
        for process in processes:
            role = role_of(process, drivers)
            if role is None:
                continue
            try:
                rss, peak = process.memory_info().rss, peak_bytes(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            anonymous = _status_kib(process.pid, "RssAnon")
            private = rss if anonymous is None else anonymous * 1024
            self.private_by_role[role] = max(self.private_by_role.get(role, 0), private)
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0), peak)
            self.peak_by_pid[process.pid] = max(self.peak_by_pid.get(process.pid, 0), peak)
        self.peak_total = max(self.peak_total, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        reset_own_peak()  # this process's figure is the stage's, not its whole life's
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def as_gib(self) -> dict[str, float]:
        """Peak GiB per role, plus ``all processes`` (the largest instantaneous total)."""
        peaks = {role: value / GIB for role, value in sorted(self.peak_by_role.items())}
        peaks["all processes"] = self.peak_total / GIB
        return peaks

    def private_as_gib(self) -> dict[str, float]:
        """The largest anonymous resident memory sampled per role, GiB."""
        return {role: value / GIB for role, value in sorted(self.private_by_role.items())}
