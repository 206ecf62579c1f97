"""The run lock, the refresh job's exit codes, its fixed cadence and SIGTERM (no Ray here: the
lock file is the layer a process without Ray holds, and nothing below starts an encoder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from store_helpers import mined_split, publish_index, write_checkpoint

from hnce.cluster.compute.lock import RunLock
from hnce.cluster.compute.refresh.health import RefreshesFailing
from hnce.cluster.compute.refresh.job import (
    EXIT_NO_CHECKPOINT,
    EXIT_OK,
    JOB_ROLE,
    StopRequest,
    parse_interval,
    refresh_every,
    refresh_once,
)
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.stores.lock_holder import (
    EXIT_LOCKED,
    REFRESH,
    RunLocked,
    holder_file,
    read_holder,
)
from hnce.cluster.stores.refresh_log import LOG_FILE, RefreshRecord, append_record, read_log
from hnce.cluster.stores.tables import Entity, Mention
from hnce.cluster.stores.tables_write import write_dataset
from hnce.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def test_intervals_parse_with_an_optional_unit_and_bad_ones_are_refused() -> None:
    assert parse_interval("6h") == 21600
    assert parse_interval("30m") == 1800
    assert parse_interval("45") == 45
    assert parse_interval("1d") == 86400
    for bad in ("", "-1h", "6 hours", "0s"):
        with pytest.raises(InputError, match="bad interval"):
            parse_interval(bad)


def test_second_lock_on_one_run_fails_and_names_the_holder(tmp_path: Path) -> None:
    with RunLock(tmp_path, "first holder") as lock:
        lock.encoding(40)
        with pytest.raises(RunLocked, match=rf"first holder \(pid {os.getpid()} .*step-40"):
            RunLock(tmp_path, "second").__enter__()
        assert read_holder(tmp_path).checkpoint == 40
    assert read_holder(tmp_path) is None and not (tmp_path / holder_file(REFRESH)).exists()
    with RunLock(tmp_path, "again"):  # released: taken again
        assert read_holder(tmp_path).role == "again"


def test_lock_of_a_killed_holder_is_free_and_its_record_ignored(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from hnce.cluster.compute.lock import RunLock\n"
            "with RunLock(sys.argv[1], 'doomed'):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"doomed \\(pid {holder.pid}"):
            RunLock(tmp_path, "waiting").__enter__()
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / holder_file(REFRESH)).exists()  # a SIGKILL leaves the record behind ...
    assert read_holder(tmp_path) is None  # ... but its holder is provably gone
    with RunLock(tmp_path, "next"):  # and the kernel released the lock file
        pass


def test_refresh_log_reads_whole_lines_and_names_a_bad_one_without_failing(tmp_path: Path) -> None:
    append_record(tmp_path, RefreshRecord("published", JOB_ROLE, 1.0, 2.0, 5, 1, 1))
    with (tmp_path / LOG_FILE).open("a") as handle:
        handle.write('{"event": "refresh", "outcome": "fail')  # still being written
    log = read_log(tmp_path)
    records, offset = log.records, log.offset
    assert [(r.outcome, r.checkpoint, r.finished) for r in records] == [("published", 5, 3.0)]
    again = read_log(tmp_path, offset)
    assert (again.records, again.offset) == ([], offset)
    with (tmp_path / LOG_FILE).open("a") as handle:
        handle.write('ed"\n')  # finished, but not a record
    problems: list[str] = []
    assert read_log(tmp_path, offset, problems).records == []  # named and skipped, never fatal
    assert len(problems) == 1 and f"{LOG_FILE}:2: not a JSON record" in problems[0]
    append_record(tmp_path, RefreshRecord("failed", JOB_ROLE, 4.0, 1.0, 6))
    assert [r.outcome for r in read_log(tmp_path, offset).records] == ["failed"]


def _publish_versions(plan: RefreshPlan, checkpoint: int) -> None:
    """Live index and negatives versions (real, tiny) that come from ``checkpoint``."""
    vectors = np.random.default_rng(0).standard_normal((10, 16)).astype(np.float32)
    publish_index(plan.index_store, checkpoint, vectors, shards=1)
    plan.negatives_store.publish(1, {"train": mined_split()}, checkpoint, 3, 10)


def _no_ray() -> None:
    raise AssertionError("connected to Ray for a refresh that had nothing to do")


def test_refresh_once_exit_codes_and_json_lines(tmp_path: Path) -> None:
    plan = RefreshPlan(tmp_path / "run", tmp_path / "data")
    lines: list[str] = []
    assert refresh_once(plan, connect=_no_ray, report=lines.append) == EXIT_NO_CHECKPOINT
    assert json.loads(lines[-1])["outcome"] == "no-checkpoint"
    write_checkpoint(plan.run_dir, 5)
    with RunLock(plan.run_dir, "a test"):
        assert refresh_once(plan, connect=_no_ray, report=lines.append) == EXIT_LOCKED
    locked = json.loads(lines[-1])
    assert locked["outcome"] == "locked" and f"a test (pid {os.getpid()}" in locked["message"]
    _publish_versions(plan, 5)
    # Already indexed: exit 0 without taking the lock, starting Ray or an encoder pool.
    assert refresh_once(plan, connect=_no_ray, report=lines.append) == EXIT_OK
    up_to_date = json.loads(lines[-1])
    assert (up_to_date["outcome"], up_to_date["checkpoint"]) == ("up-to-date", 5)
    write_checkpoint(plan.run_dir, 6)  # a newer checkpoint is pending again
    with RunLock(plan.run_dir, "a test"):
        assert refresh_once(plan, connect=_no_ray, report=lines.append) == EXIT_LOCKED
    # A step that is not a complete checkpoint: said before Ray or the lock is touched.
    assert refresh_once(plan, 999, connect=_no_ray, report=lines.append) == EXIT_NO_CHECKPOINT
    missing = json.loads(lines[-1])
    assert missing["outcome"] == "no-checkpoint"
    assert "no complete checkpoint step-999 (complete: step-5, step-6)" in missing["message"]


class FakeClock:
    """Time that passes only when the scheduler sleeps or a fake refresh runs."""

    def __init__(self, runs_before_stop: int) -> None:
        self.now = 1_000_000.0
        self.runs_before_stop = runs_before_stop
        self.starts: list[float] = []

    def sleep(self, seconds: float) -> bool:
        assert seconds >= 0
        self.now += seconds
        return len(self.starts) >= self.runs_before_stop


def test_every_keeps_a_fixed_cadence_and_skips_missed_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(runs_before_stop=5)
    durations = iter([3.0, 25.0, 4.0, 9.5, 1.0])

    def fake_attempt(plan, role, step, connect, stopping, failures) -> RefreshRecord:
        clock.starts.append(clock.now)
        started = clock.now
        clock.now += next(durations)
        return RefreshRecord("published", role, started, clock.now - started)

    monkeypatch.setattr("hnce.cluster.compute.refresh.job.attempt_refresh", fake_attempt)
    lines: list[str] = []
    code = refresh_every(
        RefreshPlan(tmp_path, tmp_path),
        10.0,
        report=lines.append,
        clock=lambda: clock.now,
        sleep=clock.sleep,
    )
    assert code == EXIT_OK
    first = 1_000_000.0
    # Slot k starts at first + 10k; the 25 s run overran slots 2 and 3, which are skipped.
    assert [start - first for start in clock.starts] == [0.0, 10.0, 40.0, 50.0, 60.0]
    records = [json.loads(line) for line in lines]
    assert [r["missed_slots"] for r in records[:-1]] == [0, 0, 2, 0, 0]
    assert [r["scheduled"] - first for r in records[:-1]] == [0.0, 10.0, 40.0, 50.0, 60.0]
    assert records[-1]["outcome"] == "stopped"


def test_every_stops_after_three_failures_in_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(runs_before_stop=100)

    def failing(plan, role, step, connect, stopping, failures) -> RefreshRecord:
        clock.starts.append(clock.now)
        return RefreshRecord(
            "failed", role, clock.now, 1.0, 7, consecutive_failures=failures + 1, message="boom"
        )

    monkeypatch.setattr("hnce.cluster.compute.refresh.job.attempt_refresh", failing)
    plan = RefreshPlan(tmp_path, tmp_path)  # MAX_FAILURES_IN_A_ROW: 3
    with pytest.raises(RefreshesFailing, match=r"3 refreshes in a row failed.*step-7: boom"):
        refresh_every(
            plan, 60.0, report=lambda line: None, clock=lambda: clock.now, sleep=clock.sleep
        )
    assert len(clock.starts) == 3


@pytest.mark.timeout(60)  # a SIGTERM that is not heard would wait out the hour
def test_sigterm_between_refreshes_stops_the_schedule_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[float] = []

    def fake_attempt(plan, role, step, connect, stopping, failures) -> RefreshRecord:
        runs.append(time.time())
        return RefreshRecord("up-to-date", role, time.time())

    monkeypatch.setattr("hnce.cluster.compute.refresh.job.attempt_refresh", fake_attempt)
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    stop.install()
    try:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        lines: list[str] = []
        started = time.monotonic()
        code = refresh_every(
            RefreshPlan(tmp_path, tmp_path), 3600.0, stop=stop.event, report=lines.append
        )
        timer.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == EXIT_OK and len(runs) == 1
    assert time.monotonic() - started < 1800  # woke from the hour-long wait, however loaded
    assert [json.loads(line)["outcome"] for line in lines] == ["up-to-date", "stopped"]


@pytest.mark.slow  # the CLI imports torch, transformers and Ray (~8 s)
def test_cli_every_exits_zero_on_sigterm_between_refreshes(tmp_path: Path) -> None:
    run_dir, data = tmp_path / "run", tmp_path / "data"
    write_dataset(data, [Entity(0, "k0", "t", "text")], {"train": [Mention("m", "", "t", "", 0)]})
    write_checkpoint(run_dir, 5)
    _publish_versions(RefreshPlan(run_dir, data), 5)
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hnce.pipeline.cli.main",
            "refresh",
            "--every",
            "1h",
            "--set",
            f"run.dir={run_dir}",
            "--set",
            f"data.root={data}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(job.stdout.readline())
        assert first["outcome"] == "up-to-date" and first["role"] == JOB_ROLE
        job.send_signal(signal.SIGTERM)
        rest, errors = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == EXIT_OK, errors
    assert json.loads(rest.splitlines()[-1])["outcome"] == "stopped"
    assert "Traceback" not in errors
