"""The trainer's side of refresh failures without Ray: the workers' health check, the driver's
stop, and the progress line (fast; the end-to-end run is in test_pipeline_operations.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from cluster.refresh_job import RefreshesFailing
from cluster.refresh_log import RefreshRecord, append_record
from pipeline.train.events import EventLog, read_events
from pipeline.train.progress import follow_progress
from pipeline.train.refresh_health import (
    FAILED_EVENT,
    STOP_EVENT,
    RefreshHealth,
    raise_if_stopped,
)

CPU = torch.device("cpu")


def _failure(checkpoint: int, in_a_row: int, finished: float) -> RefreshRecord:
    return RefreshRecord(
        "failed",
        "training coordinator",
        finished - 2.0,
        2.0,
        checkpoint,
        consecutive_failures=in_a_row,
        message=f"OSError: disk full at step-{checkpoint}",
    )


def test_failures_are_logged_at_once_and_the_limit_stops_training(tmp_path: Path) -> None:
    started = time.time()
    append_record(tmp_path, _failure(4, 5, started - 60))  # an earlier run's: ignored
    health = RefreshHealth(tmp_path, max_consecutive_failures=3, rank=0)
    log = EventLog(tmp_path)
    assert not health.should_stop(10, log, CPU)
    append_record(tmp_path, _failure(12, 1, time.time()))
    append_record(tmp_path, _failure(16, 2, time.time()))
    assert not health.should_stop(17, log, CPU)
    assert [(e["step"], e["checkpoint"], e["consecutive"]) for e in read_events(tmp_path)] == [
        (17, 12, 1),
        (17, 16, 2),
    ]
    append_record(tmp_path, _failure(20, 3, time.time()))
    assert health.should_stop(21, log, CPU)
    stop = read_events(tmp_path, STOP_EVENT)
    assert len(stop) == 1 and stop[0]["step"] == 21
    assert len(read_events(tmp_path, FAILED_EVENT)) == 3
    with pytest.raises(RefreshesFailing, match=r"step 21: 3 refreshes .* of step-20: OSError"):
        raise_if_stopped(tmp_path, since=started)
    raise_if_stopped(tmp_path, since=time.time() + 1)  # a later driver: not its stop


def test_a_failed_refresh_shows_on_the_progress_line_when_it_is_recorded(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    done = threading.Event()
    follower = threading.Thread(target=follow_progress, args=(tmp_path, 10, done))
    follower.start()
    try:
        EventLog(tmp_path).write("step", step=3, loss=1.5, negatives_version=-1)
        time.sleep(0.2)
        append_record(tmp_path, _failure(4, 1, time.time()))
        deadline = time.monotonic() + 10
        seen = ""
        while "refresh=failed x1" not in seen and time.monotonic() < deadline:
            time.sleep(0.2)
            seen += capfd.readouterr().err
    finally:
        done.set()
        follower.join()
    assert "refresh of step-4 failed (1 in a row): OSError: disk full at step-4" in seen
    assert "refresh=failed x1" in seen
