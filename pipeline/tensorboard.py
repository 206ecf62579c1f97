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

Example::

    scalars = TensorBoardScalars(run_dir / "train_log.jsonl", run_dir / TENSORBOARD_DIR)
    scalars.follow()   # every event appended since the last call
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.cluster.stores.jsonl import read_jsonl
from hnce.events import RunEvent

TENSORBOARD_DIR = "tensorboard"

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
    """A ``SummaryWriter`` in ``directory`` fed by the event log ``log_path``, from its end."""

    def __init__(self, log_path: Path, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported by the trainer only

        self.log_path = Path(log_path)
        self.writer = SummaryWriter(log_dir=str(directory))
        end = read_jsonl(self.log_path)  # earlier events: an earlier writer's
        self.offset, self.line = end.offset, end.line

    def follow(self) -> None:
        """Write the scalars of every event appended to the log since the last call (only the
        appended bytes are read)."""
        found = read_jsonl(self.log_path, self.offset, self.line)
        self.offset, self.line = found.offset, found.line
        for event in found.records:
            for tag, value in scalars_of(event).items():
                self.writer.add_scalar(tag, value, int(event["step"]), walltime=event["time"])
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
