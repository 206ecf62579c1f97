"""Who holds a run's refresh lock, as recorded on disk (the lock itself is
:class:`hnce.cluster.compute.lock.RunLock`; docs/refresh.md, "The run lock").

The holder of ``<run>/refresh.lock`` records itself in ``<run>/refresh.lock.json``: role, pid,
host, since, and the checkpoint it is encoding. Readers need no Ray: ``hnce status`` shows the
holder, and checkpoint retention spares the checkpoint it is encoding (:func:`encoding_checkpoint`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from hnce.encoders.errors import InputError

LOCK_FILE = "refresh.lock"
HOLDER_FILE = "refresh.lock.json"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run's lock, and what it is doing."""

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


def read_holder(run_dir: Path) -> LockHolder | None:
    """The recorded holder of ``run_dir``'s lock; None when free or when the holder provably
    died without releasing it (a killed process leaves its record behind)."""
    path = Path(run_dir) / HOLDER_FILE
    try:
        holder = LockHolder(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as error:
        raise InputError(
            f"{path}: not a lock holder record ({error}); it is written atomically by the "
            f"holder, so it was changed by hand: remove it if no refresh of this run is running"
        ) from None
    return None if holder.is_stale() else holder


def encoding_checkpoint(run_dir: Path) -> int | None:
    """The checkpoint step a refresh holding ``run_dir``'s lock is encoding, if any."""
    holder = read_holder(run_dir)
    return None if holder is None else holder.checkpoint
