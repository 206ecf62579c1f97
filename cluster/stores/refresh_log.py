"""What each refresh did: :class:`RefreshRecord`, one JSON line, and the run's refresh log.

Every refresh attempt ends in one record: ``hnce refresh`` prints it as one JSON line on stdout
(for cron mail, ``ray job logs`` and log shippers), and a refresh that held the run's lock also
appends it to ``<run>/refresh_log.jsonl``, written only under the lock, so lines never
interleave even on a network filesystem. The trainer (``hnce.cluster.compute.refresh.health``), the
driver's progress line and ``hnce status`` follow that log.

Outcomes: ``published`` (a new index and negatives version), ``up-to-date`` (the live versions
already come from the checkpoint), ``failed``, ``abandoned`` (stopped within a batch of
encoding, or before mining; finished shards are recorded and the next refresh resumes them), ``locked`` (another refresh
holds the lock), ``no-checkpoint``, and ``stopped`` (a scheduled job ended by SIGTERM between
refreshes). The last three never ran and are not in the run's log.

The log also holds one :class:`HeldoutRecall` line (``"event": "heldout_recall"``) per refresh
that scored the eval split against its new index version (``refresh.heldout_recall``), appended
just before that refresh's record; :func:`read_log` reads both kinds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from hnce.cluster.stores.jsonl import append_jsonl, read_jsonl
from hnce.documents import schema_problems
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

LOG_FILE = "refresh_log.jsonl"

Outcome = Literal[
    "published", "up-to-date", "failed", "abandoned", "locked", "no-checkpoint", "stopped"
]
#: what a log line must be to be read as a record (pydantic, strict: no key the record lacks, no
#: coercion, finite numbers, no negative durations or counts), so a hand-edited or corrupt line is
#: named, not crashed on later nor taken as what a refresh cost
_LINE_SCHEMA = ConfigDict(
    strict=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True
)
Seconds = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


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
        start_seconds: of ``seconds``, starting its encoder pool (0 for a pool kept from the
            refresh before, which only reloads the model).
    """

    __pydantic_config__ = _LINE_SCHEMA

    outcome: Outcome
    role: str
    started: float
    seconds: Seconds = 0.0
    checkpoint: Count | None = None
    index_version: Count | None = None
    negatives_version: Count | None = None
    consecutive_failures: Count = 0
    message: str = ""
    scheduled: float | None = None
    missed_slots: Count = 0
    start_seconds: Seconds = 0.0
    error: BaseException | None = field(default=None, repr=False, compare=False)

    @model_validator(mode="after")
    def _starting_within(self) -> RefreshRecord:
        """A line read back: starting the pool is part of the refresh's seconds."""
        if self.start_seconds > self.seconds:
            raise ValueError(
                f"start_seconds {self.start_seconds} exceed the refresh's seconds {self.seconds}"
            )
        return self

    @property
    def finished(self) -> float:
        return self.started + self.seconds

    def to_json(self) -> dict[str, object]:
        record = asdict(self)
        del record["error"]
        return record

    def json_line(self) -> str:
        return json.dumps({"event": RunEvent.REFRESH, **self.to_json()}, sort_keys=False)


def append_record(run_dir: Path, record: RefreshRecord) -> None:
    """Append ``record`` to the run's refresh log (call only while holding the run's lock);
    a line torn by a writer that died is repaired first (:mod:`hnce.cluster.stores.jsonl`)."""
    append_jsonl(
        Path(run_dir) / LOG_FILE, {"event": RunEvent.REFRESH, **record.to_json()}, durable=True
    )


@dataclass
class HeldoutRecall:
    """Recall@k of the eval split's mentions against the index version a refresh just built.

    Attributes:
        step: the checkpoint the version was built from.
        index_version: the version searched.
        split: the mention split scored (``data.eval_split``).
        mentions: how many of its mentions (``data.max_eval_mentions`` caps them).
        recall: micro recall@k by k (as text: JSON keys), e.g. ``{"1": 0.45, "64": 0.97}``.
        seconds: the scoring's time (mentions read, encoded, searched; recall computed).
        time: when it was scored (seconds since the epoch).
    """

    __pydantic_config__ = _LINE_SCHEMA

    step: Count
    index_version: Count
    split: str
    mentions: Count
    recall: dict[str, Annotated[float, Field(ge=0, le=1)]]
    seconds: Seconds
    time: float

    def line(self) -> str:
        """``refresh v3 (step 20): held-out R@1 0.450 R@64 0.970 (test, 300 mentions, 1.2 s)``."""
        figures = " ".join(f"R@{k} {value:.3f}" for k, value in self.recall.items())
        return (
            f"refresh v{self.index_version} (step {self.step}): held-out {figures} "
            f"({self.split}, {self.mentions} mentions, {self.seconds:.1f} s)"
        )


def append_heldout(run_dir: Path, heldout: HeldoutRecall) -> None:
    """Append ``heldout`` to the run's refresh log (only while holding the run's lock)."""
    append_jsonl(
        Path(run_dir) / LOG_FILE,
        {"event": RunEvent.HELDOUT_RECALL, **asdict(heldout)},
        durable=True,
    )


@dataclass
class RefreshLog:
    """What :func:`read_log` found from an offset on: the records, the held-out recalls, and
    the byte offset to read on from."""

    records: list[RefreshRecord] = field(default_factory=list)
    heldout: list[HeldoutRecall] = field(default_factory=list)
    offset: int = 0


def fastest_refresh_seconds(records: Iterable[RefreshRecord]) -> float | None:
    """The fewest seconds a published refresh of ``records`` took, less starting its encoder pool
    (a run's first refresh starts the pool its later ones keep): what the next refresh of the
    run costs. None before one has published."""
    durations = [r.seconds - r.start_seconds for r in records if r.outcome == "published"]
    return min(durations) if durations else None


_RECORD = TypeAdapter(RefreshRecord)
_HELDOUT = TypeAdapter(HeldoutRecall)


def read_log(run_dir: Path, offset: int = 0, problems: list[str] | None = None) -> RefreshLog:
    """Records and held-out recalls appended since byte ``offset``.

    A line still being written (no newline yet) is left for the next read; a line that is
    neither kind (checked against its schema: keys, types, finite numbers) is named
    (``file:line``) in ``problems`` (else logged) and skipped. A line without an ``event`` is
    read as a record.
    """
    path = Path(run_dir) / LOG_FILE
    found = read_jsonl(path, offset)
    bad = list(found.problems)
    log = RefreshLog(offset=found.offset)
    for number, fields in zip(found.record_lines, found.records, strict=True):
        event = fields.pop("event", RunEvent.REFRESH)
        heldout = event == RunEvent.HELDOUT_RECALL
        try:
            read = (_HELDOUT if heldout else _RECORD).validate_json(json.dumps(fields))
        except ValidationError as error:
            bad.append(f"{path}:{number}: not a {event} record ({schema_problems(error)})")
            continue
        (log.heldout if heldout else log.records).append(read)
    if problems is not None:
        problems.extend(bad)
    for problem in bad if problems is None else ():
        logger.warning("%s (skipped)", problem)
    return log
