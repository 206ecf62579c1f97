"""The driver's progress line for a training run, fed by the run's event and refresh logs.

The Ray Train workers run in other processes (other machines on a cluster), so the driver follows
``<run>/train_log.jsonl`` (``hnce.pipeline.train.events``) instead of holding the training loop, and
``<run>/refresh_log.jsonl`` (``hnce.cluster.stores.refresh_log``) for the refreshes: a failed refresh is
printed above the bar the moment it is recorded, and the bar shows the last refresh's outcome.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from hnce.cluster.stores.refresh_log import RefreshRecord, read_records
from hnce.encoders.progress import progress_bar
from hnce.pipeline.train.events import read_events

logger = logging.getLogger(__name__)


def follow_progress(run_dir: Path, steps: int, done: threading.Event) -> None:
    """A progress bar fed by the run's logs (the workers run in other processes)."""
    since, offset = time.time(), 0
    refresh = "none yet"
    with progress_bar(total=steps, desc="training", unit="step") as bar:
        while not done.is_set():
            records, offset = read_records(run_dir, offset)
            for record in records:
                if record.finished >= since:
                    refresh = _refresh_news(record, bar)
            events = read_events(run_dir, "step")
            if events:
                last = events[-1]
                loss = "nan" if last["loss"] is None else f"{last['loss']:.3f}"
                bar.set_postfix(  # a dict: ``refresh`` is also a keyword of set_postfix
                    {
                        "loss": loss,
                        "negatives": f"v{last['negatives_version']}",
                        "refresh": refresh,
                    },
                    refresh=False,  # shown at the bar's own pace (a log line every 30 s)
                )
                bar.update(min(int(last["step"]), steps) - bar.n)
            done.wait(1.0)
        if read_events(run_dir, "end"):
            bar.n = steps
            bar.refresh()


def _refresh_news(record: RefreshRecord, bar: tqdm) -> str:
    """The bar's refresh field for ``record``; a failure is also reported at once: printed above
    a bar on a terminal, else logged as a warning (a job's log, ``--no-progress``)."""
    if record.outcome == "failed":
        message = (
            f"refresh of step-{record.checkpoint} failed ({record.consecutive_failures} in a "
            f"row): {record.message}"
        )
        if bar.disable or not sys.stderr.isatty():
            logger.warning("%s", message)
        else:
            bar.write(message, file=sys.stderr)  # where the bar is
        return f"failed x{record.consecutive_failures}"
    if record.outcome == "published":
        return f"v{record.index_version} from step-{record.checkpoint}"
    return record.outcome
