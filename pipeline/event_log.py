"""The run's event log ``<run>/train_log.jsonl``: one JSON object per line.

Every line is one event, its kind in ``event`` a member of :class:`hnce.events.RunEvent`
(``launch``, ``start``, ``step``, ``checkpoint``, ``end`` and the rest), whose comments give
each kind's fields (who writes and reads it: ``tests/event_uses.py``); :meth:`EventLog.write` and
``read_events`` take the member, never its string. Each line also carries ``time``.
Tests, benchmarks, the refresh and ``hnce status`` read it back with
:func:`hnce.cluster.stores.run_events.read_events`; rank 0's log also
follows it into TensorBoard scalars (:mod:`hnce.pipeline.tensorboard`). It is appended and read
through :mod:`hnce.cluster.stores.jsonl`: a line torn by a crash is repaired by the next write
and never read, a corrupt line is reported and skipped, a non-finite number is written as null.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hnce.cluster.stores.jsonl import append_jsonl
from hnce.cluster.stores.run_events import LOG_FILE
from hnce.events import RunEvent
from hnce.pipeline.tensorboard import TENSORBOARD_DIR, TensorBoardScalars


class EventLog:
    """Append-only JSON-lines log, flushed after every event (readable while a run goes on);
    with ``tensorboard``, its scalars also go to ``<run>/tensorboard/`` as they are written."""

    def __init__(self, run_dir: Path, tensorboard: bool = False) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.scalars = (
            TensorBoardScalars(self.path, Path(run_dir) / TENSORBOARD_DIR) if tensorboard else None
        )

    def write(self, event: RunEvent, **fields: Any) -> None:
        append_jsonl(self.path, {"event": event, "time": time.time(), **fields})
        if self.scalars is not None:
            self.scalars.follow()

    def close(self) -> None:
        """Close the TensorBoard event file, if any (the log itself holds nothing open)."""
        if self.scalars is not None:
            self.scalars.close()
