"""The trainer's side of refresh failures: the workers' health check, the driver's stop and the
progress line without Ray (fast), and a training run whose every refresh fails (local Ray, tiny
BERT; slow)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import write_letter_bert
from training_helpers import CONFIGS, REFRESHED

from hnce import progress
from hnce.cluster.compute.refresh.health import RefreshesFailing, RefreshHealth, raise_if_stopped
from hnce.cluster.stores.refresh_log import RefreshRecord, append_record, read_log
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import mention_split_path
from hnce.events import RunEvent
from hnce.pipeline.config import load_config
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.run_follower import follow_run
from hnce.pipeline.train.trainer import run_training

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
    health = RefreshHealth(tmp_path, Collectives(CPU))
    log = EventLog(tmp_path)
    assert not health.should_stop(10, log)
    append_record(tmp_path, _failure(12, 1, time.time()))
    append_record(tmp_path, _failure(16, 2, time.time()))
    assert not health.should_stop(17, log)
    assert [(e["step"], e["checkpoint"], e["consecutive"]) for e in read_events(tmp_path)] == [
        (17, 12, 1),
        (17, 16, 2),
    ]
    append_record(tmp_path, _failure(20, 3, time.time()))
    assert health.should_stop(21, log)
    stop = read_events(tmp_path, RunEvent.REFRESH_STOP)
    assert len(stop) == 1 and stop[0]["step"] == 21
    assert len(read_events(tmp_path, RunEvent.REFRESH_FAILED)) == 3
    with pytest.raises(RefreshesFailing, match=r"step 21: 3 refreshes .* of step-20: OSError"):
        raise_if_stopped(tmp_path, since=started)
    raise_if_stopped(tmp_path, since=time.time() + 1)  # a later driver: not its stop


def test_a_failed_refresh_is_reported_when_it_is_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal (a job's log): the failure is a warning at once, and the progress line
    written when training ends carries it."""
    monkeypatch.setattr(progress, "_shown", True)
    done = threading.Event()
    follower = threading.Thread(target=follow_run, args=(tmp_path, 10, done))
    with caplog.at_level(logging.INFO):
        follower.start()
        try:
            EventLog(tmp_path).write(RunEvent.STEP, step=3, loss=1.5, negatives_version=-1)
            time.sleep(0.2)
            append_record(tmp_path, _failure(4, 1, time.time()))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not _warnings(caplog):
                time.sleep(0.2)
        finally:
            done.set()
            follower.join()
    assert _warnings(caplog) == [
        "refresh of step-4 failed (1 in a row): OSError: disk full at step-4"
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "hnce.progress"]
    assert "refresh=failed x1" in lines[-1]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_stops_with_the_cause_when_every_refresh_fails(
    tmp_path: Path, ray_session: str
) -> None:
    """Every refresh fails reading a corrupted split (before it encodes the catalogue): training
    stops after three (MAX_FAILURES_IN_A_ROW), not at the end."""
    data = tmp_path / "data"
    generate_synthetic_dataset(data, num_worlds=2, entities_per_world=30, mentions_per_entity=2)
    # The test split's bytes replaced by junk of the same size: the dataset's cheap checks
    # (preflight) pass, and every refresh fails opening it, before it encodes.
    broken = mention_split_path(data, "test")
    broken.write_bytes(b"x" * broken.stat().st_size)
    steps = 1000
    config = load_config(
        CONFIGS / "synthetic-test.yaml",
        [
            f"run.dir={tmp_path / 'run'}",
            f"data.root={data}",
            f"model.path={write_letter_bert(tmp_path / 'model')}",
            *REFRESHED,
            "training.batch_size=8",
            "refresh.shard_size=8",
            "index.faiss_device=cpu",
            f"training.steps={steps}",
            "training.checkpoint_every=4",
            "training.negatives_check_every=1",
            "refresh.splits=[train, test]",
        ],
    )
    with pytest.raises(RefreshesFailing) as raised:
        run_training(config)
    run_dir = config.run_dir
    stop = read_events(run_dir, RunEvent.REFRESH_STOP)
    assert len(stop) == 1 and stop[0]["step"] < steps
    assert re.search(
        rf"training stopped at step {stop[0]['step']}: 3 refreshes in a row failed.*the last, "
        rf"of step-\d+: DatasetError: {broken}: not a readable Parquet file",
        str(raised.value),
    ), raised.value
    failed = read_events(run_dir, RunEvent.REFRESH_FAILED)
    assert [event["consecutive"] for event in failed][:3] == [1, 2, 3]  # logged as they happened
    assert failed[0]["step"] <= stop[0]["step"] and str(broken) in failed[0]["error"]
    assert not read_events(
        run_dir, RunEvent.END
    )  # the stop is final: no restart trained to the end
    assert max(event["step"] for event in read_events(run_dir, RunEvent.STEP)) <= stop[0]["step"]
    outcomes = [record.outcome for record in read_log(run_dir).records]
    assert outcomes.count("failed") >= 3 and set(outcomes) <= {"failed", "abandoned"}
    assert "abandoned" not in outcomes[:-1]  # only a refresh still running at the stop
