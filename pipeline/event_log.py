"""The run's event log ``<run>/train_log.jsonl``: one JSON object per line.

Events: ``launch`` (the driver, as it hands over to Ray Train: the seconds it spent starting Ray
and the refresh coordinator), ``initial_negatives`` (the driver, when negatives version 0, which
it prepares while Ray Train starts the workers, is ready or has failed: its seconds, and the error),
``start`` and ``resume`` (rank 0 after its set-up, with the seconds each worker set-up stage took:
process group, model, engine, data), ``initial_negatives_wait`` (rank 0, how long its first step
waited for version 0), ``step`` (loss, learning rate, negatives version and lag), ``negatives``
(switch to a newer version, with its lag in steps), ``checkpoint`` (published),
``refresh_failed`` and ``refresh_stop`` (``hnce.pipeline.train.refresh_health``), ``refresh`` (a
published refresh that rank 0 read in the refresh log, with its duration), ``end``.
Tests, benchmarks and ``hnce status`` read it back with :func:`read_events`; rank 0's log also
follows it into TensorBoard scalars (:mod:`hnce.pipeline.tensorboard`). It is appended and read
through :mod:`hnce.cluster.stores.jsonl`: a line torn by a crash is repaired by the next write
and never read, a corrupt line is reported and skipped, a non-finite number is written as null.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hnce.cluster.stores.jsonl import append_jsonl, read_jsonl
from hnce.pipeline.tensorboard import TENSORBOARD_DIR, TensorBoardScalars

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"


class EventLog:
    """Append-only JSON-lines log, flushed after every event (readable while a run goes on);
    with ``tensorboard``, its scalars also go to ``<run>/tensorboard/`` as they are written."""

    def __init__(self, run_dir: Path, tensorboard: bool = False) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.scalars = (
            TensorBoardScalars(self.path, Path(run_dir) / TENSORBOARD_DIR) if tensorboard else None
        )

    def write(self, event: str, **fields: Any) -> None:
        append_jsonl(self.path, {"event": event, "time": time.time(), **fields})
        if self.scalars is not None:
            self.scalars.follow()

    def close(self) -> None:
        """Close the TensorBoard event file, if any (the log itself holds nothing open)."""
        if self.scalars is not None:
            self.scalars.close()


def read_events(run_dir: Path, event: str | None = None) -> list[dict[str, Any]]:
    """All events of a run (optionally of one kind), in order."""
    found = read_jsonl(Path(run_dir) / LOG_FILE)
    for problem in found.problems:
        logger.warning("%s (skipped)", problem)
    return [r for r in found.records if event is None or r.get("event") == event]
