"""Watching a run: rank 0's event log also writes TensorBoard scalars (loss, learning rate,
negatives lag, refresh duration, held-out recall) equal to the events it records, a real training
step included, and a held-out recall recorded after training ended reaches them once; ``hnce status --plot`` draws the curves from a run's logs into a PNG, and says
clearly when the run has logged no step; ``hnce status`` says which checkpoints are refreshed and
the trainer's last staleness request, and that an ended run's last checkpoint waits for no
refresh."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from store_helpers import publish_index, write_checkpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from training_helpers import synthetic_config

from hnce.cluster.compute.refresh.health import RefreshHealth, log_missed_heldout
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.index_store import INDEX_DIR, IndexStore
from hnce.cluster.stores.refresh_log import (
    HeldoutRecall,
    RefreshRecord,
    append_heldout,
    append_record,
)
from hnce.cluster.stores.run_events import read_events
from hnce.errors import InputError
from hnce.events import RunEvent
from hnce.pipeline.cli.main import main
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.status import plot_training, run_status, training_panels
from hnce.pipeline.tensorboard import TENSORBOARD_DIR
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """(step, wall time, value) of every scalar under ``<run>/tensorboard/``, by tag."""
    accumulator = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    accumulator.Reload()
    return {
        tag: [(s.step, s.wall_time, s.value) for s in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def expected(events: list[dict], field: str) -> list[tuple[int, float, float]]:
    return [(e["step"], e["time"], e[field]) for e in events if e.get(field) is not None]


def assert_scalars(found: list[tuple[int, float, float]], events: list[tuple]) -> None:
    assert [step for step, _, _ in found] == [step for step, _, _ in events]
    for (_, wall, value), (_, when, number) in zip(found, events, strict=True):
        assert wall == pytest.approx(when, abs=1e-3)
        assert value == pytest.approx(number, rel=1e-6)  # TensorBoard keeps float32


def test_the_event_log_writes_tensorboard_scalars_equal_to_its_events(tmp_path: Path) -> None:
    log = EventLog(tmp_path, tensorboard=True)
    health = RefreshHealth(tmp_path, Collectives(torch.device("cpu")))
    for step, loss, lag in ((1, 2.5, None), (2, float("nan"), 1), (3, 1.75, 2)):
        log.write(RunEvent.STEP, step=step, loss=loss, lr=1e-3 * step, seconds=0.5, lag=lag)
    now = time.time()
    append_heldout(tmp_path, HeldoutRecall(2, 1, "test", 40, {"1": 0.25, "64": 0.75}, 3.0, now))
    append_record(tmp_path, RefreshRecord("published", "training coordinator", now, 12.5, 2, 1, 1))
    assert not health.should_stop(4, log)
    EventLog(tmp_path).write(RunEvent.REFRESH_WAIT, step=4, seconds=0.25)  # another writer's event
    log.write(RunEvent.STEP, step=4, loss=1.5, lr=4e-3, seconds=0.5, lag=2)
    log.close()

    found = tensorboard_scalars(tmp_path)
    steps = read_events(tmp_path, RunEvent.STEP)
    assert_scalars(found["train/loss"], expected(steps, "loss"))  # the NaN (null) left out
    assert_scalars(found["train/learning_rate"], expected(steps, "lr"))
    assert_scalars(found["negatives/lag_steps"], expected(steps, "lag"))
    assert_scalars(
        found["refresh/seconds"], expected(read_events(tmp_path, RunEvent.REFRESH), "seconds")
    )
    assert found["refresh/seconds"][0][0::2] == (4, 12.5)  # at the step the trainer saw it
    assert_scalars(
        found["refresh/wait_seconds"],
        expected(read_events(tmp_path, RunEvent.REFRESH_WAIT), "seconds"),
    )
    assert [(s, v) for s, _, v in found["heldout/recall@64"]] == [(2, 0.75)]
    assert [(s, v) for s, _, v in found["heldout/recall@1"]] == [(2, 0.25)]


def test_a_heldout_recall_recorded_after_training_ended_reaches_tensorboard_once(
    tmp_path: Path,
) -> None:
    """The last refresh finished after rank 0 last read the refresh log: its recall was in the
    refresh log and ``hnce status`` only. The driver's copy once the coordinator has
    stopped writes it, at its checkpoint's step and scoring time, and a second copy writes
    nothing."""
    log = EventLog(tmp_path, tensorboard=True)
    health = RefreshHealth(tmp_path, Collectives(torch.device("cpu")))
    now = time.time()
    append_heldout(tmp_path, HeldoutRecall(2, 1, "test", 40, {"1": 0.25}, 3.0, now))
    assert not health.should_stop(3, log)  # the trainer copies this one
    log.write(RunEvent.END, step=4, loss=1.0)
    log.close()
    late = HeldoutRecall(4, 2, "test", 40, {"1": 0.5}, 3.0, now + 1)
    append_heldout(tmp_path, late)  # training ended first

    def open_log() -> EventLog:
        return EventLog(tmp_path, tensorboard=True)

    assert log_missed_heldout(tmp_path, open_log) == 1
    assert log_missed_heldout(tmp_path, open_log) == 0
    found = tensorboard_scalars(tmp_path)["heldout/recall@1"]
    assert [(step, value) for step, _, value in found] == [(2, 0.25), (4, 0.5)]
    assert found[1][1] == pytest.approx(late.time, abs=1e-3)
    events = read_events(tmp_path, RunEvent.HELDOUT_RECALL)
    assert [(e["step"], e["index_version"]) for e in events] == [(2, 1), (4, 2)]


@pytest.mark.slow
def test_a_training_worker_writes_tensorboard_scalars_of_its_steps(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    config = synthetic_config(
        tmp_path / "run",
        small_dataset,
        syllable_bert,
        "training.batch_size=4",
        "training.steps=3",
        "training.checkpoint_every=100",
    )
    with single_process_group():
        task = TrainingTask.retriever(config)
        WorkerRun.build(config, task, torch.device("cpu"), 1, lambda *_: None).train()
    steps = read_events(config.run_dir, RunEvent.STEP)
    assert [e["step"] for e in steps] == [1, 2, 3]
    found = tensorboard_scalars(config.run_dir)
    assert_scalars(found["train/loss"], expected(steps, "loss"))
    assert_scalars(found["train/learning_rate"], expected(steps, "lr"))
    assert_scalars(found["train/step_seconds"], expected(steps, "seconds"))


def write_events(run_dir: Path, steps: int) -> None:
    """A run's logs by hand: ``steps`` step events (lag from step 3), and two held-out recalls."""
    log = EventLog(run_dir)
    log.write(RunEvent.START, step=0)
    for step in range(1, steps + 1):
        log.write(
            RunEvent.STEP, step=step, loss=3.0 / step, lr=1e-3, lag=step - 3 if step > 2 else None
        )
    now = time.time()
    append_heldout(run_dir, HeldoutRecall(4, 1, "test", 10, {"1": 0.2, "64": 0.7}, 1.0, now))
    append_heldout(run_dir, HeldoutRecall(8, 2, "test", 10, {"1": 0.4, "64": 0.9}, 1.0, now + 1))


def test_plot_draws_loss_lag_and_heldout_recall_into_a_png(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    write_events(run_dir, 8)
    panels = dict(training_panels(run_dir))
    assert panels["loss"][0].steps == list(range(1, 9))
    assert panels["negatives lag (steps)"][0].steps == list(range(3, 9))
    assert [(s.label, s.steps, s.values) for s in panels["held-out recall"]] == [
        ("R@1", [4, 8], [0.2, 0.4]),
        ("R@64", [4, 8], [0.7, 0.9]),
    ]
    out = tmp_path / "plots" / "run.png"
    assert main(["status", str(run_dir), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 1000
    assert [p.name for p in out.parent.iterdir()] == ["run.png"]  # no temporary left


def test_plot_of_a_run_without_steps_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    with pytest.raises(InputError, match=r"train_log.jsonl: no step logged yet; nothing to plot"):
        plot_training(run_dir, tmp_path / "none.png")
    assert main(["status", str(run_dir), "--plot", str(tmp_path / "none.png")]) == 2
    assert "nothing to plot" in capsys.readouterr().err
    assert not (tmp_path / "none.png").exists()


@pytest.mark.parametrize("trigger", ["stale", "checkpoints"])
def test_status_reports_the_trigger_and_the_last_staleness_request(
    trigger: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trigger's own line of its ``refresh_decision`` events (its spec's ``summary``)."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text(f"refresh:\n  trigger: {trigger}\n")
    log = EventLog(tmp_path)
    log.write(RunEvent.START, step=0)
    if trigger == "stale":
        assert "stale: no refresh asked for yet" in run_status(tmp_path).render()
    for step, version, ratio in ((40, 0, 0.71), (90, 1, 0.6842)):
        log.write(
            RunEvent.REFRESH_DECISION,
            trigger="stale",
            step=step,
            version=version,
            loss_ratio=ratio,
        )
    log.close()
    status = run_status(tmp_path)
    expected = (
        "stale: 2 refresh(es) asked for; the last at step 90 on negatives version 1, "
        "loss ratio 0.684"
        if trigger == "stale"
        else "checkpoints (every checkpoint is refreshed)"
    )
    assert status.refresh_trigger is not None
    assert status.refresh_trigger["summary"] == expected
    assert main(["status", str(tmp_path)]) == 0
    assert f"trigger       {expected}" in capsys.readouterr().out


def test_status_reports_the_refresh_policys_last_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``refresh.trigger: payoff``: how many checkpoints asked, and the last decision."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("refresh:\n  trigger: payoff\n")
    log = EventLog(tmp_path)
    log.write(RunEvent.START, step=0)
    assert "payoff: no checkpoint decided yet" in run_status(tmp_path).render()
    log.write(RunEvent.REFRESH_DECISION, step=30, refresh=True, reason="pays", mean_age=26.5)
    log.write(RunEvent.REFRESH_DECISION, step=45, refresh=False, reason="pending", mean_age=41.0)
    log.close()
    assert main(["status", str(tmp_path)]) == 0
    expected = (
        "payoff: 1 refresh(es) asked for; at step 45: no refresh (pending), hard negatives "
        "41.0 steps old on average"
    )
    assert f"trigger       {expected}" in capsys.readouterr().out


def test_a_plot_onto_a_directory_is_one_line_and_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every atomic write refuses a directory at its target before writing beside it (was an
    IsADirectoryError with a temporary PNG left in the parent); a commit that fails later (a
    directory made at the target while the file was written) removes its temporary file."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    write_events(run_dir, 8)
    taken = tmp_path / "plots" / "run.png"
    taken.mkdir(parents=True)
    assert main(["status", str(run_dir), "--plot", str(taken)]) == 2
    error = capsys.readouterr().err
    assert f"{taken}: is a directory; name a file to write" in error and "Traceback" not in error
    assert [p.name for p in taken.parent.iterdir()] == ["run.png"] and taken.is_dir()
    target = tmp_path / "late.txt"
    atomic = AtomicPath(target)
    atomic.temporary.write_text("written")
    target.mkdir()  # the target became a directory meanwhile
    with pytest.raises(IsADirectoryError):
        atomic.commit()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_plot_onto_a_full_disk_is_one_line_naming_it_and_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's write and fsync errors name no file (only open's do): the line was ``hnce
    status: No space left on device``. Every atomic write names its target."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    write_events(run_dir, 8)
    enter = AtomicPath.__enter__

    def on_a_full_disk(atomic: AtomicPath) -> Path:
        temporary = enter(atomic)
        temporary.symlink_to("/dev/full")  # the OS refuses every write into it (ENOSPC)
        return temporary

    monkeypatch.setattr(AtomicPath, "__enter__", on_a_full_disk)
    out = tmp_path / "plots" / "run.png"
    assert main(["status", str(run_dir), "--plot", str(out)]) == 74
    error = capsys.readouterr().err
    assert f"hnce status: {out}: No space left on device\n" in error and "Traceback" not in error
    assert list(out.parent.iterdir()) == []
    late = AtomicPath(tmp_path / "late.txt")
    late.temporary.symlink_to("/dev/full")  # which refuses an fsync too (EINVAL)
    with pytest.raises(OSError, match="Invalid argument") as refused:
        late.commit()
    assert refused.value.filename == str(late.target)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_status_of_an_ended_run_says_its_last_checkpoint_is_not_refreshed_by_design(
    tmp_path: Path,
) -> None:
    """The trainer's last checkpoint asks for no refresh (``refreshes_end``): nothing trains on
    what it would mine. ``hnce status`` said it had waited so many minutes for its refresh; it
    says the run ended and reports no wait. A checkpoint that asks still waits."""
    write_checkpoint(tmp_path, 20, refresh=True)
    vectors = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    publish_index(IndexStore(tmp_path / INDEX_DIR), 20, vectors)
    write_checkpoint(tmp_path, 30, refresh=False, ends_refreshes=True)
    log = EventLog(tmp_path)
    log.write(RunEvent.START, step=0)
    log.write(RunEvent.STEP, step=30, loss=1.0)
    running = run_status(tmp_path)
    assert (running.lag_steps, running.lag_minutes) == (10, None)
    assert "the newest checkpoint step-30 asks for no refresh" in running.render()
    log.write(RunEvent.END, step=30, loss=1.0)

    status = run_status(tmp_path)
    assert status.training["state"] == "ended"
    assert status.newest_checkpoint["asks_for_refresh"] is False
    assert (status.lag_steps, status.lag_minutes) == (10, None)
    lag = status.render().splitlines()[5]
    assert lag.startswith("lag           10 steps; the run ended at step 30 (its end event)")
    assert "last checkpoint step-30 is not refreshed by design" in lag and "waited" not in lag

    write_checkpoint(tmp_path, 40, refresh=True)  # a longer run's checkpoint, asking
    status = run_status(tmp_path)
    assert status.lag_steps == 20 and status.lag_minutes is not None
    assert "the newest checkpoint has waited" in status.render()
