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
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from hnce.cluster.stores.jsonl import append_jsonl, read_jsonl

logger = logging.getLogger(__name__)

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
    """Append ``record`` to the run's refresh log (call only while holding the run's lock);
    a line torn by a writer that died is repaired first (:mod:`hnce.cluster.stores.jsonl`)."""
    append_jsonl(Path(run_dir) / LOG_FILE, {"event": "refresh", **record.to_json()}, durable=True)


def read_records(
    run_dir: Path, offset: int = 0, problems: list[str] | None = None
) -> tuple[list[RefreshRecord], int]:
    """Records appended since byte ``offset``, and the offset to read on from.

    A line still being written (no newline yet) is left for the next read; a line that is not
    a refresh record is named (``file:line``) in ``problems`` (else logged) and skipped.
    """
    path = Path(run_dir) / LOG_FILE
    found = read_jsonl(path, offset)
    bad = list(found.problems)
    records = []
    for fields in found.records:
        try:
            fields = {key: value for key, value in fields.items() if key != "event"}
            records.append(RefreshRecord(**fields))
        except TypeError as error:
            bad.append(f"{path}: not a refresh record ({error})")
    if problems is not None:
        problems.extend(bad)
    for problem in bad if problems is None else ():
        logger.warning("%s (skipped)", problem)
    return records, found.offset
