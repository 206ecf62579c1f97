"""A run's locks, held across the cluster: every refresh of a run takes its ``refresh`` lock, every
launch of ``hnce train`` its ``training`` lock (docs/refresh.md, "The run lock").

The refresh coordinator inside ``hnce train`` and the stand-alone ``hnce refresh`` job take the
same ``refresh`` :class:`RunLock`, so two refreshes of one run never overlap (``IndexStore.begin``
removes unfinished builds of other checkpoints: only the holder may build). A second ``hnce
train`` of a run that is training (a double-submitted job, a retry while the first still runs)
is refused by the ``training`` lock before it starts anything; it would otherwise write the same
checkpoints and event log. Each lock has two layers, and a holder holds both:

- **the lock file** ``<run>/<kind>.lock``, through ``filelock``: a kernel ``flock``, released
  when the holder's process dies (``filelock`` falls back to its own marker file on a filesystem
  without ``flock``). It excludes contenders on one machine even when they run in separate Ray
  instances, and it is taken first, before Ray starts, so a refused command starts nothing;
- **a named Ray actor** ``<kind>-lock-<digest of the run directory>`` in the namespace ``hnce``:
  the cluster's control store (GCS) registers a name for one creator at a time, and the actor is
  owned by its creator (a driver, or the coordinator actor), so Ray removes it, and frees the
  name, when the holder dies. It excludes contenders on different nodes of one Ray cluster
  whatever the shared filesystem does with ``flock`` (NFS, EFS, FUSE mounts). The run directory
  must have the same path on every node (it does: the recipe names it once).

Who holds a lock is recorded in ``<run>/<kind>.lock.json`` (:class:`LockHolder`: role, pid,
host, since, and the checkpoint a refresh is encoding). A refused contender names the holder,
``hnce status`` shows it, and checkpoint retention spares the checkpoint a refresh is encoding
(:func:`encoding_checkpoint`).

Example::

    with RunLock(run_dir, "hnce refresh", connect=start_ray) as lock:   # RunLocked if held
        lock.encoding(step)
        run_refresh(plan, step)
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import ray
from filelock import FileLock, Timeout

from hnce.cluster.stores.files import atomic_write_json
from hnce.cluster.stores.lock_holder import (
    REFRESH,
    LockHolder,
    RunLocked,
    holder_file,
    lock_file,
    read_holder,
)

logger = logging.getLogger(__name__)

NAMESPACE = "hnce"
_HOLDER_QUERY_SECONDS = 10.0
_DEAD_OWNER_GRACE_SECONDS = 30.0
_DEAD_OWNER_POLL_SECONDS = 0.5


def cluster_lock_name(run_dir: Path, kind: str = REFRESH) -> str:
    """The Ray actor name that stands for ``run_dir``'s ``kind`` lock in the namespace ``hnce``."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:24]
    return f"{kind}-lock-{digest}"


@ray.remote(num_cpus=0, max_restarts=0)
class ClusterLockToken:
    """Exists while its owner holds the run's lock; its name is the lock (see module docs)."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self._holder = holder

    def holder(self) -> dict[str, Any]:
        return self._holder

    def update(self, holder: dict[str, Any]) -> None:
        self._holder = holder


class RunLock:
    """One of the run's locks (a context manager); raises :class:`RunLocked` naming the holder.

    Args:
        run_dir: the run directory.
        role: who takes it, shown to whoever is refused (``hnce refresh``, ``training
            coordinator``, ``hnce train``).
        connect: called once the lock file is held (e.g. starting or joining Ray), so a
            refused contender starts nothing.
        kind: ``refresh`` (every refresh of the run) or ``training`` (every launch of the
            trainer).

    The cluster layer is taken whenever this process is connected to Ray; every refresh is
    (its encoders are Ray actors). A process without Ray holds the lock file only.
    """

    def __init__(
        self,
        run_dir: Path,
        role: str,
        connect: Callable[[], None] | None = None,
        kind: str = REFRESH,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.kind = kind
        self.holder = LockHolder.this_process(role)
        self._connect = connect
        self._file = FileLock(self.run_dir / lock_file(kind), thread_local=False, blocking=False)
        self._token: Any = None
        self._recorded = False

    def __enter__(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._file.acquire()
        except Timeout:
            raise RunLocked(self.run_dir, read_holder(self.run_dir, self.kind), self.kind) from None
        try:
            if self._connect is not None:
                self._connect()
            if ray.is_initialized():
                self._token = self._take_cluster_lock()
            self._record()
        except BaseException:
            self._release()
            raise
        return self

    def encoding(self, step: int) -> None:
        """Record that the holder now encodes checkpoint ``step`` (retention spares it)."""
        self.holder = replace(self.holder, checkpoint=step)
        self._record()
        if self._token is not None:
            self._token.update.remote(asdict(self.holder))  # what a refused contender sees

    def __exit__(self, *_: object) -> None:
        self._release()

    def _take_cluster_lock(self) -> Any:
        """The named actor; while its name is held by a holder that provably died (its pid gone
        on this host: Ray frees the name moments after the owner's death), tried again for up to
        :data:`_DEAD_OWNER_GRACE_SECONDS`, so a run relaunched right after a kill is not refused."""
        name = cluster_lock_name(self.run_dir, self.kind)
        deadline = time.monotonic() + _DEAD_OWNER_GRACE_SECONDS
        while True:
            try:
                return ClusterLockToken.options(name=name, namespace=NAMESPACE).remote(
                    asdict(self.holder)
                )
            except ValueError:  # the name is taken: another process of the cluster holds it
                holder = _cluster_holder(name)
                if (holder is not None and not holder.is_stale()) or time.monotonic() > deadline:
                    raise RunLocked(self.run_dir, holder, self.kind) from None
                time.sleep(_DEAD_OWNER_POLL_SECONDS)

    def _record(self) -> None:
        atomic_write_json(self.run_dir / holder_file(self.kind), asdict(self.holder))
        self._recorded = True

    def _release(self) -> None:
        """Drop the record, then the cluster layer, then the file (the reverse of taking them).

        A contender refused by the cluster layer leaves the record alone: it is the holder's.
        """
        if self._recorded:
            (self.run_dir / holder_file(self.kind)).unlink(missing_ok=True)
            self._recorded = False
        if self._token is not None:
            ray.kill(self._token, no_restart=True)
            self._token = None
        if self._file.is_locked:
            self._file.release()


def _cluster_holder(name: str) -> LockHolder | None:
    """The holder recorded by the cluster's lock actor; None if it vanished meanwhile."""
    try:
        token = ray.get_actor(name, namespace=NAMESPACE)
        return LockHolder(**ray.get(token.holder.remote(), timeout=_HOLDER_QUERY_SECONDS))
    except (ValueError, ray.exceptions.RayError) as error:
        logger.info("the holder of %s could not be asked (%s)", name, error)
        return None
