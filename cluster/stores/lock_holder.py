"""Who holds a run's locks, as recorded on disk (the locks themselves are
:class:`hnce.cluster.compute.lock.RunLock`; docs/refresh.md, "The run lock").

A run has two locks, one per activity that must never run twice at once: ``refresh`` (every
refresh of the run: the coordinator inside ``hnce train`` and ``hnce refresh``) and ``training``
(a launch of ``hnce train``, so two launches never write one run's checkpoints and event log).
The holder of ``<run>/<kind>.lock`` records itself in ``<run>/<kind>.lock.json``: role, pid,
host, since, and for a refresh the checkpoint it is encoding. Readers need no Ray: ``hnce
status`` shows both holders, and checkpoint retention spares the checkpoint a refresh is encoding
(:func:`encoding_checkpoint`).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pydantic import TypeAdapter

from hnce.documents import document_record, read_document
from hnce.errors import InputError

#: the lock every refresh of a run takes, and the one every launch of ``hnce train`` takes
REFRESH, TRAINING = "refresh", "training"
#: what each lock guards, as a refused contender is told ("another <activity> of <run> is running")
ACTIVITY = {REFRESH: "refresh", TRAINING: "training launch"}


#: the exit status of a command refused by a lock (sysexits' EX_TEMPFAIL: try again later)
EXIT_LOCKED = 75


class RunLocked(RuntimeError):
    """Another refresh (or training launch) of the same run holds the lock."""

    def __init__(self, run_dir: Path, holder: LockHolder | None, kind: str = REFRESH) -> None:
        self.holder = holder
        named = holder.describe() if holder is not None else "holder unknown"
        super().__init__(
            f"another {ACTIVITY[kind]} of {run_dir} is running: {named}; "
            f"lock {Path(run_dir) / lock_file(kind)}"
        )


def lock_file(kind: str) -> str:
    """The file name of the ``kind`` lock (``refresh.lock``), in the run directory."""
    return f"{kind}.lock"


def holder_file(kind: str) -> str:
    """The file name of the ``kind`` lock's holder record (``refresh.lock.json``)."""
    return f"{lock_file(kind)}.json"


@document_record
class LockHolder:
    """Who holds a run's lock, and what it is doing (the schema of its record: a record edited
    by hand is named, never crashed on where a value is used)."""

    role: str
    pid: int
    host: str
    since: float
    checkpoint: int | None = None

    @classmethod
    def this_process(cls, role: str) -> LockHolder:
        return cls(role=role, pid=os.getpid(), host=socket.gethostname(), since=time.time())

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        doing = f", encoding step-{self.checkpoint}" if self.checkpoint is not None else ""
        return f"{self.role} (pid {self.pid} on {self.host} since {since}{doing})"

    def is_stale(self) -> bool:
        """True when the holder provably died: it ran on this host and its pid is gone."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


_HOLDER = TypeAdapter(LockHolder)


def read_holder(run_dir: Path, kind: str = REFRESH) -> LockHolder | None:
    """The recorded holder of ``run_dir``'s ``kind`` lock; None when free or when the holder
    provably died without releasing it (a killed process leaves its record behind)."""
    path = Path(run_dir) / holder_file(kind)
    try:
        holder = read_document(path, _HOLDER, "lock holder record")
    except FileNotFoundError:
        return None
    except InputError as error:
        raise InputError(
            f"{error}; it is written atomically by the holder, so it was changed by hand: "
            f"remove it if no {ACTIVITY[kind]} of this run is running"
        ) from None
    return None if holder.is_stale() else holder


def encoding_checkpoint(run_dir: Path) -> int | None:
    """The checkpoint step a refresh holding ``run_dir``'s lock is encoding, if any."""
    holder = read_holder(run_dir)
    return None if holder is None else holder.checkpoint
