"""TensorBoard scalars of a training run, derived from its event log: ``<run>/tensorboard/``.

The event log (``<run>/train_log.jsonl``, :mod:`hnce.pipeline.event_log`) stays the one place
where a run's metrics are emitted; rank 0's log follows its own file and writes the fields of
:data:`SCALARS` as TensorBoard scalars at the event's step and wall-clock time, flushed at once so
``tensorboard --logdir <run>/tensorboard`` shows a run while it trains. Following the file rather
than the calls also picks up events another process appended (read at rank 0's next event). The
driver writes the same way once its workers have stopped: the held-out recalls rank 0 missed
(``hnce.cluster.compute.refresh.health.log_missed_heldout``), in an event file of their own. A
resumed run starts a new event file that goes on from the end of the log: steps repeated after
a crash appear twice, as in the log. Fields that are missing, null (a non-finite loss) or not
numbers are left out.

The event file is written in the calling thread, in TensorBoard's record format (its
``RecordWriter`` and protocol buffers). TensorBoard's own ``SummaryWriter`` writes from a
background thread, so a full disk was a traceback from that thread and an error at some later
call. Here a write the machine refuses (a full disk, a quota, a failing disk) is cut off, so the
file ends with whole records, and said once, as a warning naming the file: the scalars stop and
training goes on, since the event log holds every figure (docs/failures.md, "Disks that fill").

Example::

    scalars = TensorBoardScalars(run_dir / "train_log.jsonl", run_dir / TENSORBOARD_DIR)
    scalars.follow()   # every event appended since the last call
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.cluster.stores.jsonl import read_jsonl
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
#: numbers the event files one process opens, as TensorBoard's own writer does
_FILE_NUMBERS = itertools.count()

#: (event, field) -> TensorBoard tag
SCALARS: dict[tuple[RunEvent, str], str] = {
    (RunEvent.STEP, "loss"): "train/loss",
    (RunEvent.STEP, "lr"): "train/learning_rate",
    (RunEvent.STEP, "seconds"): "train/step_seconds",
    (RunEvent.STEP, "lag"): "negatives/lag_steps",
    (RunEvent.STEP, "negatives_version"): "negatives/version",
    (RunEvent.STEP, "fresh_share"): "negatives/fresh_hard_share",
    (RunEvent.STEP, "hard_negative_age"): "negatives/hard_negative_age_steps",
    (RunEvent.REFRESH, "seconds"): "refresh/seconds",
    (RunEvent.REFRESH_WAIT, "seconds"): "refresh/wait_seconds",
    (RunEvent.HELDOUT_RECALL, "recall"): "heldout/recall@",  # {k: recall@k}: one tag per k
    # each refresh trigger's decision fields, as its spec declares them
    **{
        (RunEvent.REFRESH_DECISION, field): tag
        for spec in TRIGGER_SPECS.values()
        for field, tag in spec.scalars.items()
    },
}


def scalars_of(event: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars (tag -> value) one event of the log gives."""
    found = {}
    for (name, field), tag in SCALARS.items():
        if event.get("event") != name:
            continue
        value = event.get(field)
        values = (
            {f"{tag}{k}": v for k, v in value.items()} if isinstance(value, dict) else {tag: value}
        )
        found.update({key: float(v) for key, v in values.items() if _finite_number(v)})
    return found


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoardScalars:
    """An event file in ``directory`` fed by the event log ``log_path``, from its end; a write
    the machine refuses ends the scalars with one warning (module docstring)."""

    def __init__(self, log_path: Path, directory: Path) -> None:
        self.log_path = Path(log_path)
        end = read_jsonl(self.log_path)  # earlier events: an earlier writer's
        self.offset, self.line = end.offset, end.line
        self.path = Path(directory) / _event_file_name()
        self.file: io.FileIO | None = None
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.file = io.FileIO(self.path, "ab")
        except OSError as error:
            self._stop(error)
        self._write([_file_version_event()])

    def follow(self) -> None:
        """Write the scalars of every event appended to the log since the last call (only the
        appended bytes are read)."""
        found = read_jsonl(self.log_path, self.offset, self.line)
        self.offset, self.line = found.offset, found.line
        self._write(
            _scalar_event(tag, value, int(event["step"]), event["time"])
            for event in found.records
            for tag, value in scalars_of(event).items()
        )

    def close(self) -> None:
        """Close the event file (every record is written when :meth:`follow` returns)."""
        if self.file is not None:
            self.file.close()
            self.file = None

    def _write(self, events: Iterable[Any]) -> None:
        """Append ``events`` as TensorBoard records, whole or (the machine refusing) not at all."""
        if self.file is None:
            return
        from tensorboard.summary.writer.record_writer import RecordWriter

        framed = io.BytesIO()
        records = RecordWriter(framed)
        for event in events:
            records.write(event.SerializeToString())
        data = memoryview(framed.getvalue())
        end = self.file.seek(0, os.SEEK_END)
        try:
            while data:  # unbuffered: a write may take part of the data
                data = data[self.file.write(data) :]
        except OSError as error:
            with contextlib.suppress(OSError):  # else TensorBoard stops reading at the torn record
                self.file.truncate(end)
            self._stop(error)

    def _stop(self, error: OSError) -> None:
        logger.warning(
            "%s: %s; TensorBoard scalars stop here and training goes on (%s keeps every figure)",
            self.path,
            error.strerror or error,
            self.log_path,
        )
        self.close()


def _event_file_name() -> str:
    """``events.out.tfevents.<seconds>.<host>.<pid>.<n>``: TensorBoard's own naming, so its
    readers find the files and order them by when they were opened."""
    host, pid = socket.gethostname(), os.getpid()
    return f"events.out.tfevents.{int(time.time()):010d}.{host}.{pid}.{next(_FILE_NUMBERS)}"


def _file_version_event() -> Any:
    """The first record of every event file: the format it is written in."""
    from tensorboard.compat.proto.event_pb2 import Event

    return Event(wall_time=time.time(), file_version="brain.Event:2")


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> Any:
    """One scalar at ``step`` and ``wall_time``, as ``SummaryWriter.add_scalar`` records it."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    return Event(wall_time=wall_time, step=step, summary=summary)
