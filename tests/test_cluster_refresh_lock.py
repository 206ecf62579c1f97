"""The run lock across the CLI refresh and a training run's coordinator, the coordinator's loop,
abandoning and resuming, and a checkpoint deleted under a refresh (local Ray, tiny BERT; slow).

Contention is made certain, not left to timing: once one side holds the lock (its record names
it), its process is frozen with SIGSTOP and the record read again, so the other side provably
starts while the lock is held; then it is resumed with SIGCONT.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import ray
from store_helpers import random_word_dataset, write_checkpoint
from training_helpers import write_letter_export

from hnce.cluster.compute.refresh.coordinator import COORDINATOR_ROLE
from hnce.cluster.compute.refresh.engine import run_refresh
from hnce.cluster.compute.refresh.job import (
    EXIT_ABANDONED,
    EXIT_OK,
    JOB_ROLE,
    StopRequest,
    attempt_refresh,
    refresh_every,
    refresh_once,
)
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.settings import RefreshSettings
from hnce.cluster.compute.refresh.supervisor import start_refresh, stop_refresh
from hnce.cluster.stores.checkpoints import checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import PROGRESS_FILE, IndexStore
from hnce.cluster.stores.lock_holder import (
    EXIT_LOCKED,
    REFRESH,
    LockHolder,
    holder_file,
    read_holder,
)
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import RefreshRecord, append_record, read_log
from hnce.cluster.stores.versioned_dir import building_dir_name

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lock")
    return {
        "data": random_word_dataset(root / "data"),
        "dual": write_letter_export(root / "dual", "dual"),
    }


@pytest.fixture(scope="module")
def clean_checksums(
    assets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, ray_session: str
) -> list[str]:
    """Shard checksums of an undisturbed refresh of the same checkpoint."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    write_checkpoint(run_dir, 1, assets["dual"])
    run_refresh(_plan(run_dir, assets["data"]))
    return IndexStore(run_dir / "index").current().shard_checksums


def _plan(run_dir: Path, data: Path, **overrides: object) -> RefreshPlan:
    settings = {
        "shard_size": 8,
        "encoder_batch_size": 4,
        "top_n": 10,
        "num_encoders": 1,
    }
    settings.update(overrides)
    return RefreshPlan(run_dir, data, RefreshSettings(**settings), IndexSpec(faiss_device="cpu"))


def _wait_for(condition: Callable[[], bool], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def frozen_holder(run_dir: Path, role: str) -> Iterator[LockHolder]:
    """Wait until ``role`` holds the run's lock and encodes a checkpoint, freeze its process while
    it still does, and yield the holder; the process is resumed on exit."""

    def same(a: LockHolder | None, b: LockHolder) -> bool:
        return a is not None and (a.pid, a.since) == (b.pid, b.since)

    deadline = time.monotonic() + 120
    while True:
        holder = read_holder(run_dir)
        if holder is not None and holder.role == role and holder.checkpoint is not None:
            os.kill(holder.pid, signal.SIGSTOP)
            if same(read_holder(run_dir), holder):  # the record goes before the lock does
                break
            os.kill(holder.pid, signal.SIGCONT)  # released meanwhile: wait for the next hold
        assert time.monotonic() < deadline, f"{role} never held the lock"
        time.sleep(0.02)
    try:
        yield holder
    finally:
        os.kill(holder.pid, signal.SIGCONT)


class PublishedReader(threading.Thread):
    """Opens the live index and negatives versions in a loop, as the trainer and a server would:
    every open must verify, and the negatives must come from a published index version."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.done = threading.Event()
        self.reads = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            self.read_until_done()
        except BaseException as error:  # kept for the assertion in the test
            self.errors.append(error)

    def read_until_done(self) -> None:
        index_store = IndexStore(self.run_dir / "index")
        negatives_store = NegativesStore(self.run_dir / "negatives")
        while not self.done.is_set():
            try:
                index = index_store.current()
                negatives = negatives_store.latest()
                if negatives is not None:
                    manifest = index_store.read_manifest(negatives.version)
                    assert manifest["checkpoint"] == negatives.checkpoint_step
                self.reads += index is not None
            except BaseException as error:  # kept for the assertion in the test
                self.errors.append(error)
            self.done.wait(0.02)


def _cli_refresh(run_dir: Path, data: Path, address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hnce.pipeline.cli.main",
        "refresh",
        *("--set", f"run.dir={run_dir}", "--set", f"data.root={data}"),
        *("--set", f"cluster.address={address}", "--set", "index.faiss_device=cpu"),
        *("--set", "refresh.shard_size=8", "--set", "refresh.encoder_batch_size=4"),
        *("--set", "refresh.top_n=10", "--set", "refresh.num_encoders=1"),
    ]


def test_cli_refresh_and_training_coordinator_never_overlap_and_the_coordinator_follows_on(
    ray_session: str, assets: dict[str, Path], tmp_path: Path
) -> None:
    """``hnce refresh`` holds the lock while the coordinator starts: the coordinator waits for
    it. The coordinator holds it (refreshing checkpoint 2) while a job starts: the job is
    refused, naming the holder. The coordinator then follows the next checkpoint on its own;
    every refresh is logged with its checkpoint and index version, one at a time, and readers
    only ever see published versions."""
    run_dir, data = tmp_path / "run", assets["data"]
    write_checkpoint(run_dir, 1, assets["dual"])
    reader = PublishedReader(run_dir)
    reader.start()
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    command = _cli_refresh(run_dir, data, ray_session)
    cli = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, text=True)
    # 1. The CLI holds the lock while the training run's coordinator starts: it must wait.
    with frozen_holder(run_dir, JOB_ROLE) as holder:
        assert holder.pid == cli.pid
        coordinator, watch = start_refresh(_plan(run_dir, data))
        _wait_for(lambda: f"pid {cli.pid}" in (_status(coordinator)["locked_by"] or ""))
    output, _ = cli.communicate(timeout=240)
    assert cli.returncode == EXIT_OK
    assert json.loads(output.splitlines()[-1])["outcome"] == "published"
    # 2. The coordinator holds the lock (refreshing a new checkpoint) while a job starts: the
    # job `hnce refresh` runs (refresh_once, here in this process) is refused.
    write_checkpoint(run_dir, 2, assets["dual"])
    lines: list[str] = []
    with frozen_holder(run_dir, COORDINATOR_ROLE) as holder:
        refused = refresh_once(_plan(run_dir, data), report=lines.append)
    assert refused == EXIT_LOCKED
    message = json.loads(lines[-1])["message"]
    assert f"{COORDINATOR_ROLE} (pid {holder.pid}" in message and "step-2" in message
    negatives = NegativesStore(run_dir / "negatives")
    _wait_for(lambda: negatives.current_version() == 2)
    # 3. The coordinator follows the next checkpoint.
    write_checkpoint(run_dir, 3, assets["dual"])
    _wait_for(lambda: negatives.current_version() == 3)
    status = stop_refresh(coordinator, watch)
    reader.done.set()
    reader.join()

    assert status["refreshes"] == 2 and status["error"] is None
    ran = [record for record in read_log(run_dir).records if record.outcome == "published"]
    assert [(r.role, r.checkpoint, r.index_version) for r in ran] == [
        (JOB_ROLE, 1, 1),
        (COORDINATOR_ROLE, 2, 2),
        (COORDINATOR_ROLE, 3, 3),
    ]
    for earlier, later in itertools.pairwise(ran):
        assert later.started >= earlier.finished  # one refresh at a time
    assert negatives.latest().checkpoint_step == 3
    assert reader.errors == [] and reader.reads > 0
    assert read_holder(run_dir) is None


def _status(coordinator: object) -> dict:
    return ray.get(coordinator.status.remote(), timeout=60)


def test_abandoned_refresh_publishes_nothing_and_the_next_resumes_it(
    ray_session: str, assets: dict[str, Path], tmp_path: Path, clean_checksums: list[str]
) -> None:
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, assets["dual"])
    plan = _plan(run_dir, assets["data"])
    abandoned = attempt_refresh(plan, JOB_ROLE, stopping=lambda: bool(_recorded_shards(run_dir)))
    assert abandoned.outcome == "abandoned" and "stopped while waiting" in abandoned.message
    assert IndexStore(run_dir / "index").current_version() is None
    assert NegativesStore(run_dir / "negatives").current_version() is None
    finished = len(_recorded_shards(run_dir))
    assert finished >= 1
    resumed = attempt_refresh(plan, JOB_ROLE)
    assert resumed.outcome == "published" and f"{finished} resumed" in resumed.message
    assert IndexStore(run_dir / "index").current().shard_checksums == clean_checksums


def _recorded_shards(run_dir: Path) -> dict[str, object]:
    """The shards recorded as finished in the run's unpublished index build (none: {})."""
    progress = run_dir / "index" / building_dir_name(1) / PROGRESS_FILE
    return json.loads(progress.read_text())["shards"] if progress.is_file() else {}


@pytest.mark.timeout(120)  # a SIGTERM that is not heard would wait out the hour
def test_sigterm_abandons_a_scheduled_refresh_resumably_and_frees_the_lock(
    ray_session: str, assets: dict[str, Path], tmp_path: Path
) -> None:
    """A spot notice (SIGTERM, SIGKILL due 30 s later) to a scheduled refresh, run as ``hnce
    refresh --every`` runs it (its SIGTERM handler, here in this process), while it encodes: the
    first shard recorded, hundreds to go. It ends inside the notice with ``hnce refresh``'s exit
    143 and an ``abandoned`` line; nothing is published, the finished shards stay recorded for
    the next refresh, and the lock is released (its record gone, not merely stale)."""
    data = random_word_dataset(tmp_path / "data", num_entities=2000)
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, assets["dual"])
    signalled: list[float] = []

    def notice() -> None:  # once a shard is recorded, or after a minute whatever happened
        deadline = time.monotonic() + 60
        while not _recorded_shards(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    stop.install()
    lines: list[str] = []
    try:
        threading.Thread(target=notice, daemon=True).start()
        code = refresh_every(_plan(run_dir, data), 3600.0, stop=stop.event, report=lines.append)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - signalled[0] < 30
    assert code == EXIT_ABANDONED, lines
    record = json.loads(lines[-1])
    assert record["outcome"] == "abandoned" and "next refresh resumes" in record["message"]
    assert IndexStore(run_dir / "index").current_version() is None
    assert NegativesStore(run_dir / "negatives").current_version() is None
    assert _recorded_shards(run_dir)
    assert not (run_dir / holder_file(REFRESH)).exists()


def test_an_abandoned_refresh_stops_inside_the_shard_it_is_encoding(
    ray_session: str, assets: dict[str, Path], tmp_path: Path
) -> None:
    """Abandoning cancels the running shard task, which stops before its next batch instead of
    finishing the shard: one shard of 3,000 entities encoded one at a time (many seconds),
    abandoned 1.5 s in, leaves no shard file and nothing recorded."""
    data = random_word_dataset(tmp_path / "data", num_entities=3000)
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, assets["dual"])
    asked: list[float] = []

    def stopping() -> bool:  # first asked once the shard task is submitted
        asked.append(time.monotonic())
        return asked[-1] - asked[0] > 1.5

    plan = _plan(run_dir, data, shard_size=10_000, encoder_batch_size=1)
    abandoned = attempt_refresh(plan, JOB_ROLE, stopping=stopping)
    assert abandoned.outcome == "abandoned", abandoned.message
    building = run_dir / "index" / building_dir_name(1)
    assert not list(building.glob("shard-*")) and _recorded_shards(run_dir) == {}


def test_a_coordinator_refresh_that_would_publish_after_training_ends_is_abandoned(
    ray_session: str, assets: dict[str, Path], tmp_path: Path
) -> None:
    """The training coordinator's refresh of step 1 starts (the trainer expects to end in an
    hour; the run's fastest refresh took 100 s); once its first shard is recorded the trainer
    publishes step 2, which expects the end in 10 s: the refresh stops there, publishes nothing,
    and says why; the coordinator then starts none (no-checkpoint). `hnce refresh` of the same
    run is not concerned."""
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, assets["dual"], ends_at=time.time() + 3600.0)
    append_record(run_dir, RefreshRecord("published", COORDINATOR_ROLE, 0.0, seconds=100.0))
    plan = _plan(run_dir, assets["data"])

    def stopping() -> bool:  # the trainer's next checkpoint, once a shard is done
        if _recorded_shards(run_dir) and newest_checkpoint(run_dir)[0] == 1:
            write_checkpoint(run_dir, 2, assets["dual"], ends_at=time.time() + 10.0)
        return False

    record = attempt_refresh(plan, COORDINATOR_ROLE, stopping=stopping, requests_only=True)
    assert (record.outcome, record.checkpoint) == ("abandoned", 1), record.message
    assert "would publish after training ends" in record.message
    assert "expects at" in record.message and "step-2" in record.message
    assert IndexStore(run_dir / "index").current_version() is None
    assert NegativesStore(run_dir / "negatives").current_version() is None
    again = attempt_refresh(plan, COORDINATOR_ROLE, requests_only=True)
    assert again.outcome == "no-checkpoint" and "no refresh any more" in again.message
    assert attempt_refresh(plan, JOB_ROLE).outcome == "published"


def test_checkpoint_deleted_under_a_refresh_finishes_from_what_it_loaded(
    ray_session: str, assets: dict[str, Path], tmp_path: Path, clean_checksums: list[str]
) -> None:
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, assets["dual"])

    def delete_the_checkpoint(encoded: object, pool: object) -> None:
        shutil.rmtree(checkpoint_dir(run_dir, 1), ignore_errors=True)

    summary = run_refresh(_plan(run_dir, assets["data"]), 1, on_shard=delete_the_checkpoint)
    assert not checkpoint_dir(run_dir, 1).exists()
    assert (summary.checkpoint, summary.index_version) == (1, 1)
    assert IndexStore(run_dir / "index").current().shard_checksums == clean_checksums
    assert NegativesStore(run_dir / "negatives").latest().checkpoint_step == 1
