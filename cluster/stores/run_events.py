"""Reading the run's event log ``<run>/train_log.jsonl``: one JSON object per line.

The trainer writes it (:class:`hnce.pipeline.event_log.EventLog`, which also follows it into
TensorBoard); everything that reads it back (``hnce status``, the refresh, tests, benchmarks)
reads it here, below every layer that needs it. Each line is one event, its kind in ``event`` a
member of :class:`hnce.events.RunEvent`, with its ``time``; a line torn by a crash is never read,
a corrupt line is reported and skipped (:mod:`hnce.cluster.stores.jsonl`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hnce.cluster.stores.jsonl import read_jsonl
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"


def read_events(run_dir: Path, event: RunEvent | None = None) -> list[dict[str, Any]]:
    """All events of a run (optionally of one kind), in order."""
    found = read_jsonl(Path(run_dir) / LOG_FILE)
    for problem in found.problems:
        logger.warning("%s (skipped)", problem)
    return [r for r in found.records if event is None or r.get("event") == event]
