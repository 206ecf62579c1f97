"""Disks that fill or fail during writes (docs/failures.md, "Disks that fill"): a write the machine
refuses while a store publishes is one ``OSError`` naming the file, nothing is half-published, the
live version stays live and verifying, and the same publication succeeds once the disk is freed.

The faults are real refusals of the OS where a write can be aimed at ``/dev/full`` (every
:class:`~hnce.cluster.stores.files.AtomicPath` write: the stores' files, manifests and
``CURRENT``), a file size limit for the Rust writer of safetensors, and a file that takes only so
many bytes (:class:`FillingFile`) for the logs written in place.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import resource
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fault_helpers
import numpy as np
import pytest
import torch
from store_helpers import mined_split, publish_index, write_checkpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from training_helpers import synthetic_config

from hnce.cluster.compute.refresh import job
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.stores import files
from hnce.cluster.stores.checkpoint_cache import read_cache_rows, write_cache_rows
from hnce.cluster.stores.checkpoints import (
    COMPLETE,
    DEEPSPEED_DIR,
    DEEPSPEED_TAG,
    STATE_FILE,
    checkpoint_dir,
    is_complete,
    newest_checkpoint,
    verify_checkpoint,
)
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import HeldoutRecall, append_heldout, read_log
from hnce.cluster.stores.run_events import LOG_FILE, read_events
from hnce.cluster.stores.shard_files import shard_file_names
from hnce.cluster.stores.tables import Entity, Mention
from hnce.cluster.stores.tables_read import verify_dataset
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.versioned_dir import CURRENT_FILE, MANIFEST_FILE
from hnce.events import RunEvent
from hnce.mining.negative_cache import CachedRows
from hnce.pipeline.cli.main import main
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.recipe_models import build_trainable
from hnce.pipeline.tensorboard import TENSORBOARD_DIR
from hnce.pipeline.train.checkpointing import WorkerCheckpoints
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import start_engine

DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs Linux's /dev/full")
#: the DeepSpeed state file a one-rank engine writes first
MODEL_STATES = "mp_rank_00_model_states.pt"
NO_SPACE = os.strerror(errno.ENOSPC)


@contextmanager
def disk_full_at(name: str) -> Iterator[list[Path]]:
    """The disk fills as a file named ``name`` is written atomically (every store write): its
    temporary file is a link to /dev/full, which refuses every write with ENOSPC. Yields the
    targets refused so far."""
    refused: list[Path] = []
    enter = AtomicPath.__enter__

    def entering(atomic: AtomicPath) -> Path:
        temporary = enter(atomic)
        if atomic.target.name == name:
            temporary.symlink_to(DEV_FULL)
            refused.append(atomic.target)
        return temporary

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AtomicPath, "__enter__", entering)
        yield refused


class FillingFile(io.FileIO):
    """A file on a disk with :attr:`room` bytes left: a write past it takes what fits, as
    ``write(2)`` does, and the next is refused with ENOSPC."""

    room = 1 << 30

    def write(self, data: Any) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, NO_SPACE)
        taken = super().write(bytes(data)[: self.room])
        self.room -= taken
        return taken


def leftovers(root: Path) -> list[Path]:
    """Temporary files of atomic writes under ``root`` (none may outlive a failed write)."""
    return [path for path in root.rglob("*") if path.name.startswith(".tmp-")]


def refused_as(raised: pytest.ExceptionInfo[OSError], code: int, path: Path) -> bool:
    return (raised.value.errno, raised.value.filename) == (code, str(path))


@needs_dev_full
@pytest.mark.parametrize("refused", [shard_file_names(1)[0], MANIFEST_FILE, CURRENT_FILE])
def test_an_index_version_on_a_full_disk_leaves_the_live_one_and_publishes_once_freed(
    tmp_path: Path, refused: str
) -> None:
    """A shard, the manifest or CURRENT refused: v1 stays live and searchable, v2 is not
    published (its staging is what a resumed build expects), and the build succeeds later. A
    refused CURRENT left v2 published but not live, so the next build numbered itself v3."""
    store = IndexStore(tmp_path / "index")
    vectors = np.random.default_rng(0).standard_normal((60, 16)).astype(np.float32)
    publish_index(store, 1, vectors)
    with disk_full_at(refused) as targets, pytest.raises(OSError) as raised:
        publish_index(store, 2, vectors)
    assert refused_as(raised, errno.ENOSPC, targets[0])
    assert (store.current_version(), store.versions(), store.unfinished_versions()) == (1, [1], [2])
    live = store.current()
    assert live is not None and live.checkpoint == 1
    found, _ = live.load().search(vectors[:5], 1)
    assert found[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert leftovers(tmp_path) == []
    publish_index(store, 2, vectors)
    assert (store.current_version(), store.unfinished_versions()) == (2, [])
    again = store.current()
    assert again is not None and again.checkpoint == 2
    assert again.load().search(vectors[:5], 1)[0][:, 0].tolist() == [0, 1, 2, 3, 4]


@needs_dev_full
@pytest.mark.parametrize("refused", ["train.parquet", MANIFEST_FILE, CURRENT_FILE])
def test_a_negatives_version_on_a_full_disk_leaves_the_live_one_and_publishes_once_freed(
    tmp_path: Path, refused: str
) -> None:
    store = NegativesStore(tmp_path / "negatives")
    store.publish(1, {"train": mined_split()}, 1, 3, 10)
    with disk_full_at(refused) as targets, pytest.raises(OSError) as raised:
        store.publish(2, {"train": mined_split()}, 2, 3, 10)
    assert refused_as(raised, errno.ENOSPC, targets[0])
    assert (store.current_version(), store.versions(), store.unfinished_versions()) == (1, [1], [2])
    live = store.latest()  # verified against its manifest, row by row
    assert live is not None and (live.version, live.checkpoint_step) == (1, 1)
    assert leftovers(tmp_path) == []
    store.publish(2, {"train": mined_split()}, 2, 3, 10)
    assert (store.current_version(), store.unfinished_versions()) == (2, [])
    live = store.latest()
    assert live is not None and (live.version, live.checkpoint_step) == (2, 2)


@needs_dev_full
def test_current_written_but_not_flushed_stays_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the directory's fsync after CURRENT's rename failed (EIO): CURRENT already names v2,
    so v2 stays where it is (moving it back would leave CURRENT naming no version)."""
    store = NegativesStore(tmp_path / "negatives")
    store.publish(1, {"train": mined_split()}, 1, 3, 10)
    flush = files.fsync_directory
    failing = [tmp_path / "negatives"]

    def fsync_directory(directory: Path) -> None:
        if failing and directory == failing[0] and (directory / CURRENT_FILE).read_text() == "v2\n":
            failing.clear()
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        flush(directory)

    monkeypatch.setattr(files, "fsync_directory", fsync_directory)
    with pytest.raises(OSError) as raised:
        store.publish(2, {"train": mined_split()}, 2, 3, 10)
    assert refused_as(raised, errno.EIO, tmp_path / "negatives" / CURRENT_FILE)
    live = store.latest()
    assert live is not None and live.version == 2 and store.unfinished_versions() == []


@contextmanager
def worker_checkpoints(
    run_dir: Path, dataset: Path, model_dir: Path
) -> Iterator[WorkerCheckpoints]:
    """A trainer worker's checkpoints of the synthetic recipe, in a one-process group."""
    config = synthetic_config(run_dir, dataset, model_dir)
    cpu = torch.device("cpu")
    with single_process_group():
        model = build_trainable(config, "retriever")
        engine = start_engine(model, config.training, cpu)
        log = EventLog(run_dir)
        yield WorkerCheckpoints(engine, model, run_dir, Collectives(cpu), 2, log, lambda *r: None)


def step_one_stays_newest(run_dir: Path) -> None:
    """Step 2 was refused: it is incomplete, step 1 is the newest and verifies, nothing is left."""
    assert not is_complete(checkpoint_dir(run_dir, 2))
    newest = newest_checkpoint(run_dir)
    assert newest is not None and newest[0] == 1
    verify_checkpoint(newest[1])
    assert leftovers(run_dir) == []


def publish_step_two_and_resume(checkpoints: WorkerCheckpoints, run_dir: Path) -> None:
    """With room again, step 2 publishes, verifies and is what a resume starts from."""
    assert checkpoints.publish({"step": 2, "loss": 0.4})
    verify_checkpoint(checkpoint_dir(run_dir, 2))
    assert checkpoints.resume(None, {}) == 2


def test_a_checkpoint_on_a_full_disk_leaves_the_one_before_newest_until_it_is_written(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    """DeepSpeed's state (``torch.save`` to a file name: a RuntimeError naming no file, the file
    cut short), the training state or the manifest refused: one OSError naming the file, step 2
    incomplete, step 1 still the newest and verifying; the same publication succeeds later."""
    if not DEV_FULL.exists():
        pytest.skip("needs Linux's /dev/full")
    run_dir = tmp_path / "run"
    with worker_checkpoints(run_dir, small_dataset, syllable_bert) as checkpoints:
        assert checkpoints.publish({"step": 1, "loss": 0.5})
        for refused in (MODEL_STATES, STATE_FILE, COMPLETE):
            with disk_full_at(refused) as targets, pytest.raises(OSError) as raised:
                checkpoints.publish({"step": 2, "loss": 0.4})
            assert refused_as(raised, errno.ENOSPC, targets[0]), refused
            assert targets[0].is_relative_to(checkpoint_dir(run_dir, 2))
            step_one_stays_newest(run_dir)
        publish_step_two_and_resume(checkpoints, run_dir)
    assert [event["step"] for event in read_events(run_dir, RunEvent.CHECKPOINT)] == [1, 2]


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Files larger than ``limit`` bytes are refused (EFBIG), as a quota on file sizes does."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the signal ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, handler)


def test_the_negative_cache_refused_in_a_checkpoint_names_its_file(tmp_path: Path) -> None:
    """safetensors (Rust) raised a bare error ending in '(os error 27)', and a traceback."""
    checkpoint = tmp_path / "step-3"
    (checkpoint / DEEPSPEED_DIR).mkdir(parents=True)
    kept = CachedRows(
        torch.arange(64), torch.ones(64, 1, 16), torch.full((64,), 2, dtype=torch.int64)
    )
    with file_size_limit(1024), pytest.raises(OSError) as raised:
        write_cache_rows(checkpoint, kept, 1)
    path = checkpoint / DEEPSPEED_DIR / "negative_cache.safetensors"
    assert refused_as(raised, errno.EFBIG, path)
    assert list((checkpoint / DEEPSPEED_DIR).iterdir()) == []
    write_cache_rows(checkpoint, kept, 1)
    back = read_cache_rows(checkpoint, (64, 1, 16), 3)
    assert back is not None and torch.equal(back.vectors, kept.vectors)


def test_an_index_copied_onto_a_full_disk_names_the_copy_not_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hnce export`` copies the index version with shutil, whose error on a full disk names
    the source first: the line named the run's own shard as the file that could not be
    written."""
    store = IndexStore(tmp_path / "index")
    version = publish_index(store, 1, np.eye(60, 16, dtype=np.float32))

    def copy_onto_a_full_disk(source: Path, target: Path) -> None:
        raise OSError(errno.ENOSPC, NO_SPACE, str(source), None, str(target))  # as shutil does

    monkeypatch.setattr(shutil, "copyfile", copy_onto_a_full_disk)
    with pytest.raises(OSError) as raised:
        version.copy_to(tmp_path / "out")
    assert refused_as(raised, errno.ENOSPC, tmp_path / "out" / shard_file_names(0)[0])


@pytest.mark.parametrize("log", ["event log", "refresh log"])
def test_a_log_append_on_a_full_disk_names_the_log_and_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str
) -> None:
    """The line that did not fit was left half-written (the next append cut it off), and the
    error named no file."""
    path = tmp_path / LOG_FILE if log == "event log" else tmp_path / "refresh_log.jsonl"
    opened: list[FillingFile] = []
    open_path = Path.open

    def opening(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self != path or "a" not in mode:
            return open_path(self, mode, *args, **kwargs)
        opened.append(FillingFile(self, mode.replace("b", "")))
        opened[-1].room = room
        return opened[-1]

    def append(number: int) -> None:
        if log == "event log":
            EventLog(tmp_path).write(RunEvent.STEP, step=number, loss=1.0 / number)
        else:
            recall = HeldoutRecall(number, 1, "test", 10, {"1": 0.5}, 1.0, float(number))
            append_heldout(tmp_path, recall)

    monkeypatch.setattr(Path, "open", opening)
    room = 1 << 30
    append(1)
    before = path.read_bytes()
    room = 10
    with pytest.raises(OSError) as raised:
        append(2)
    assert refused_as(raised, errno.ENOSPC, path)
    assert path.read_bytes() == before
    room = 1 << 30
    append(3)
    if log == "event log":
        steps = [event["step"] for event in read_events(tmp_path, RunEvent.STEP)]
    else:
        steps = [recall.step for recall in read_log(tmp_path).heldout]
    assert steps == [1, 3] and len(opened) == 3


def test_tensorboard_on_a_full_disk_warns_once_and_the_event_log_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TensorBoard's own writer failed in its background thread: a traceback on stderr, then
    the error again at the trainer's next event. Training goes on; the event file keeps whole
    records only."""
    log = EventLog(tmp_path, tensorboard=True)
    log.write(RunEvent.STEP, step=1, loss=1.0)
    scalars = log.scalars
    assert scalars is not None and scalars.file is not None
    scalars.file.close()
    scalars.file = FillingFile(scalars.path, "a")
    scalars.file.room = 10
    written = scalars.path.stat().st_size
    with caplog.at_level(logging.WARNING):
        for step in (2, 3, 4):
            log.write(RunEvent.STEP, step=step, loss=1.0 / step)
    log.close()
    warned = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARN]
    assert len(warned) == 1 and warned[0].startswith(f"{scalars.path}: {NO_SPACE}"), warned
    assert [event["step"] for event in read_events(tmp_path, RunEvent.STEP)] == [1, 2, 3, 4]
    assert scalars.path.stat().st_size == written
    accumulator = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train/loss")] == [1]


@needs_dev_full
def test_a_refresh_failing_on_a_full_disk_is_named_by_its_own_error_not_by_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The refresh log, on the same full disk, refused the failed refresh's record, and that
    second refusal was the line ``hnce refresh`` printed, naming the log."""
    plan = RefreshPlan(tmp_path / "run", tmp_path / "data")
    write_checkpoint(plan.run_dir, 5)
    (plan.run_dir / "refresh_log.jsonl").symlink_to(DEV_FULL)
    shard = plan.run_dir / "index" / ".building-v1" / shard_file_names(0)[0]

    def refused_refresh(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, NO_SPACE, str(shard))

    monkeypatch.setattr(job, "run_refresh", refused_refresh)
    with pytest.raises(OSError) as raised:
        job.refresh_once(plan, connect=lambda: None, report=lambda line: None)
    assert refused_as(raised, errno.ENOSPC, shard)
    unrecorded = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"the failed refresh is not in the refresh log: [Errno {errno.ENOSPC}]" in unrecorded[-1]


def _dataset(out: Path, entities: int, overwrite: bool = False) -> None:
    write_dataset(
        out,
        [Entity(i, f"e{i}", f"entity {i}", f"text {i}") for i in range(entities)],
        {"train": [Mention(f"m{i}", "", f"entity {i}", "", i) for i in range(entities)]},
        overwrite=overwrite,
    )


def test_a_dataset_replaced_on_a_failing_disk_is_the_old_one_until_the_new_one_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename that publishes the new dataset refused, after the old one was moved aside:
    ``--out`` was missing until someone put the old one back by hand."""
    out = tmp_path / "data"
    _dataset(out, 3)
    rename = os.rename

    def refusing_rename(source: Any, target: Any) -> None:
        if Path(source).name.startswith(files.STAGING_PREFIX):
            raise OSError(errno.ENOSPC, NO_SPACE, str(source), None, str(target))
        rename(source, target)

    with monkeypatch.context() as patch:
        patch.setattr(os, "rename", refusing_rename)
        with pytest.raises(OSError) as raised:
            _dataset(out, 5, overwrite=True)
    assert refused_as(raised, errno.ENOSPC, out)
    assert verify_dataset(out).payload["counts"]["entities"] == 3
    assert [path.name for path in tmp_path.iterdir()] == ["data"]
    _dataset(out, 5, overwrite=True)
    assert verify_dataset(out).payload["counts"]["entities"] == 5


def test_a_conversion_on_a_failing_disk_is_one_line_exit_74_and_retried_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """EIO (a failing disk) from the fsync of the dataset's manifest: a traceback (exit 1)."""
    out = tmp_path / "synthetic"
    convert = ["data", "synthetic", "--worlds", "1", "--entities-per-world", "4"]
    assert main([*convert, "--out", str(out)]) == 0
    old = verify_dataset(out).payload["dataset_id"]
    capsys.readouterr()
    flush = files.fsync_file

    def failing_fsync(path: Path) -> None:
        if path.name.endswith(f"-{MANIFEST_FILE}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        flush(path)

    with monkeypatch.context() as patch:
        patch.setattr(files, "fsync_file", failing_fsync)
        assert main([*convert, "--seed", "1", "--out", str(out), "--overwrite"]) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"hnce data: {tmp_path}/"), error
    assert error[0].endswith(f"/{MANIFEST_FILE}: {os.strerror(errno.EIO)}"), error
    assert verify_dataset(out).payload["dataset_id"] == old
    assert [path.name for path in tmp_path.iterdir()] == ["synthetic"]
    assert main([*convert, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert verify_dataset(out).payload["dataset_id"] != old


@contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """``fault_helpers.small_disk``: a tmpfs of ``size`` at ``where``; skips where mounting is
    not allowed."""
    try:
        with fault_helpers.small_disk(where, size) as disk:
            yield disk
    except fault_helpers.MountRefused as refused:
        pytest.skip(str(refused))


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


@pytest.mark.slow
@pytest.mark.parametrize(
    ("room", "refused"),
    [(0.1, f"{DEEPSPEED_DIR}/{DEEPSPEED_TAG}/{MODEL_STATES}"), (0.5, "export")],
    ids=["in-the-deepspeed-state", "in-the-export"],
)
def test_a_checkpoint_filling_a_real_disk_is_refused_whole_and_written_once_freed(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, room: float, refused: str
) -> None:
    """A real file system (a 64 MiB tmpfs) with ``room`` for a part of a checkpoint: whichever
    writer runs into the full disk (torch's under DeepSpeed, or transformers' and safetensors'
    in the export), the error names a file of the checkpoint being written (the export: its
    directory) and step 1 stays the newest. torch's zip writer, closed under the full disk,
    raised a RuntimeError ("unexpected pos") in place of the OSError."""
    with small_disk(tmp_path / "disk", "64m") as disk:
        run_dir = disk / "run"
        with worker_checkpoints(run_dir, small_dataset, syllable_bert) as checkpoints:
            free = _free_bytes(disk)
            assert checkpoints.publish({"step": 1, "loss": 0.5})
            size = free - _free_bytes(disk)
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (_free_bytes(disk) - int(size * room)))
            with pytest.raises(OSError) as raised:
                checkpoints.publish({"step": 2, "loss": 0.4})
            assert refused_as(raised, errno.ENOSPC, checkpoint_dir(run_dir, 2) / refused)
            step_one_stays_newest(run_dir)
            filler.unlink()
            publish_step_two_and_resume(checkpoints, run_dir)
