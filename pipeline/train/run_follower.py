"""The driver's progress line for a training run, fed by the run's event and refresh logs.

The Ray Train workers run in other processes (other machines on a cluster), so the driver follows
``<run>/train_log.jsonl`` (``hnce.pipeline.event_log``) instead of holding the training loop, and
``<run>/refresh_log.jsonl`` (``hnce.cluster.stores.refresh_log``) for the refreshes: a failed refresh and
each held-out recall (``refresh.heldout_recall``) are printed above the bar the moment they are
recorded, and the bar shows the last refresh's outcome.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from hnce.cluster.stores.refresh_log import RefreshRecord, read_log
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.progress import progress_bar

logger = logging.getLogger(__name__)


def follow_run(run_dir: Path, steps: int, done: threading.Event) -> None:
    """A progress bar fed by the run's logs (the workers run in other processes)."""
    since, offset = time.time(), 0
    refresh = "none yet"
    with progress_bar(total=steps, desc="training", unit="step") as bar:
        while not done.is_set():
            log = read_log(run_dir, offset)
            offset = log.offset
            for heldout in log.heldout:
                if heldout.time >= since:
                    _report(heldout.line(), bar, logging.INFO)
            for record in log.records:
                if record.finished >= since:
                    refresh = _refresh_news(record, bar)
            events = read_events(run_dir, RunEvent.STEP)
            if events:
                last = events[-1]
                loss = "nan" if last["loss"] is None else f"{last['loss']:.3f}"
                bar.set_postfix(  # a dict: ``refresh`` is also a keyword of set_postfix
                    {
                        "loss": loss,
                        "negatives": _negatives_shown(last["negatives_version"]),
                        "refresh": refresh,
                    },
                    refresh=False,  # shown at the bar's own pace (a log line every 30 s)
                )
                bar.update(min(int(last["step"]), steps) - bar.n)
            done.wait(1.0)
        if read_events(run_dir, RunEvent.END):
            bar.n = steps
            bar.refresh()


def _refresh_news(record: RefreshRecord, bar: tqdm) -> str:
    """The bar's refresh field for ``record``; a failure is also reported at once
    (:func:`_report`, as a warning)."""
    if record.outcome == "failed":
        message = (
            f"refresh of step-{record.checkpoint} failed ({record.consecutive_failures} in a "
            f"row): {record.message}"
        )
        _report(message, bar, logging.WARNING)
        return f"failed x{record.consecutive_failures}"
    if record.outcome == "published":
        return f"v{record.index_version} from step-{record.checkpoint}"
    return record.outcome


def _report(message: str, bar: tqdm, level: int) -> None:
    """Print ``message`` above a bar on a terminal, else log it at ``level`` (a job's log,
    ``--no-progress``)."""
    if bar.disable or not sys.stderr.isatty():
        logger.log(level, "%s", message)
    else:
        bar.write(message, file=sys.stderr)  # where the bar is


def _negatives_shown(version: int) -> str:
    """The negatives version a step trained on as the bar shows it: ``v<N>``, or ``none`` before
    any (-1: random negatives, or the negative cache alone)."""
    return f"v{version}" if version >= 0 else "none"
