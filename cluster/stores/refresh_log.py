"""What each refresh did: :class:`RefreshRecord`, one JSON line, and the run's refresh log.

Every refresh attempt ends in one record: ``hnce refresh`` prints it as one JSON line on stdout
(for cron mail, ``ray job logs`` and log shippers), and a refresh that held the run's lock also
appends it to ``<run>/refresh_log.jsonl``, written only under the lock, so lines never
interleave even on a network filesystem. The trainer (``hnce.pipeline.train.refresh_health``), the
driver's progress line and ``hnce status`` follow that log.

Outcomes: ``published`` (a new index and negatives version), ``up-to-date`` (the live versions
already come from the checkpoint), ``failed``, ``abandoned`` (stopped at a shard boundary;
finished shards are recorded and the next refresh resumes them), ``locked`` (another refresh
holds the lock), ``no-checkpoint``, and ``stopped`` (a scheduled job ended by SIGTERM between
refreshes). The last three never ran and are not in the run's log.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

LOG_FILE = "refresh_log.jsonl"

Outcome = Literal[
    "published", "up-to-date", "failed", "abandoned", "locked", "no-checkpoint", "stopped"
]


@dataclass
class RefreshRecord:
    """One refresh attempt.

    Attributes:
        outcome: see the module docs.
        role: who ran it (``hnce refresh``, ``training coordinator``).
        started: wall-clock start (seconds since the epoch).
        seconds: how long it took.
        checkpoint: the checkpoint step refreshed (None when none was chosen).
        index_version, negatives_version: what a published refresh made live.
        consecutive_failures: failures in a row of this refresher, this one included.
        message: the refresh's summary line, or the error that ended it.
        scheduled: the slot of a scheduled (``--every``) run; missed_slots: slots skipped
            before it because the previous refresh overran them.
    """

    outcome: Outcome
    role: str
    started: float
    seconds: float = 0.0
    checkpoint: int | None = None
    index_version: int | None = None
    negatives_version: int | None = None
    consecutive_failures: int = 0
    message: str = ""
    scheduled: float | None = None
    missed_slots: int = 0
    error: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def finished(self) -> float:
        return self.started + self.seconds

    def to_json(self) -> dict[str, object]:
        record = asdict(self)
        del record["error"]
        return record

    def json_line(self) -> str:
        return json.dumps({"event": "refresh", **self.to_json()}, sort_keys=False)


def append_record(run_dir: Path, record: RefreshRecord) -> None:
    """Append ``record`` to the run's refresh log (call only while holding the run's lock)."""
    path = Path(run_dir) / LOG_FILE
    with path.open("a", encoding="utf-8") as handle:
        handle.write(record.json_line() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(run_dir: Path, offset: int = 0) -> tuple[list[RefreshRecord], int]:
    """Records appended since byte ``offset``, and the offset to read on from.

    A line still being written (no newline yet) is left for the next read.
    """
    path = Path(run_dir) / LOG_FILE
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    records = []
    for number, line in enumerate(complete.decode("utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
            del fields["event"]
            records.append(RefreshRecord(**fields))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            lineno = path.read_bytes()[:offset].count(b"\n") + number + 1
            raise ValueError(f"{path}:{lineno}: not a refresh record ({error})") from None
    return records, offset + len(complete)
