"""The run's event log ``<run>/train_log.jsonl``: one JSON object per line.

Events: ``start``, ``resume`` (from a checkpoint step), ``step`` (loss, learning rate,
negatives version and lag), ``negatives`` (switch to a newer version, with its lag in steps),
``checkpoint`` (published), ``refresh_failed`` and ``refresh_stop`` (``hnce.pipeline.train.refresh_health``),
``end``. Tests and benchmarks read it back with :func:`read_events`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

LOG_FILE = "train_log.jsonl"


class EventLog:
    """Append-only JSON-lines log, flushed after every event (readable while a run goes on)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": time.time(), **fields}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def read_events(run_dir: Path, event: str | None = None) -> list[dict[str, Any]]:
    """All events of a run (optionally of one kind), in order."""
    path = Path(run_dir) / LOG_FILE
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if event is None or r["event"] == event]
