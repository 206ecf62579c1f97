"""``training.cores``: the trainer runs on every core of its node while no refresh of its run is
working, on ``cpus_per_worker`` threads while one is (the run lock's holder record says which),
and always on ``cpus_per_worker`` with ``reserved``."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from training_helpers import synthetic_config

from hnce.cluster.stores.files import atomic_write_json
from hnce.cluster.stores.lock_holder import REFRESH, LockHolder, holder_file
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.train import worker
from hnce.pipeline.train.cores import TrainerThreads, resolve_cores, threads_lent_to_refresh
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun


@pytest.fixture(autouse=True)
def keep_torch_threads() -> None:
    """The tests set this process's torch threads; put them back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def hold_lock(run_dir: Path, checkpoint: int | None, pid: int | None = None) -> None:
    """Record a refresh of ``run_dir`` as the run lock's holder does (this process, alive)."""
    holder = replace(LockHolder.this_process("training coordinator"), checkpoint=checkpoint)
    if pid is not None:
        holder = replace(holder, pid=pid)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / holder_file(REFRESH), asdict(holder))


@pytest.mark.parametrize(
    ("requested", "nodes", "use_gpu", "expected"),
    [
        ("auto", 1, False, "handover"),
        ("auto", 1, True, "reserved"),
        ("auto", 3, False, "reserved"),
        ("reserved", 1, False, "reserved"),
        ("handover", 3, False, "handover"),
    ],
)
def test_auto_hands_cores_over_only_on_one_cpu_node(
    requested: str, nodes: int, use_gpu: bool, expected: str
) -> None:
    mode, why = resolve_cores(requested, nodes, use_gpu)
    assert mode == expected
    assert why.startswith("auto:") == (requested == "auto")


def test_a_waiting_trainer_lends_its_threads_only_when_it_hands_cores_over() -> None:
    assert threads_lent_to_refresh("handover", True, 2, 1.0) == 2
    assert threads_lent_to_refresh("handover", False, 2, 1.0) == 0  # async: it never waits
    assert threads_lent_to_refresh("reserved", True, 2, 1.0) == 0


def test_a_worker_gets_its_share_of_the_node_and_never_less_than_reserved() -> None:
    assert TrainerThreads.for_worker(Path("r"), "handover", 1.0, 8, 2).idle == 4
    assert TrainerThreads.for_worker(Path("r"), "handover", 3.0, 4, 2).idle == 3
    reserved = TrainerThreads.for_worker(Path("r"), "reserved", 1.0, 8, 1)
    assert (reserved.reserved, reserved.idle) == (1, 1)


def test_a_sync_trainer_never_gives_its_cores_back(tmp_path: Path) -> None:
    """Its refreshes run only while it waits: it keeps every core, whatever the lock says."""
    run_dir = tmp_path / "run"
    threads = TrainerThreads.for_worker(run_dir, "handover", 1.0, 2, 1, waits_for_refreshes=True)
    hold_lock(run_dir, checkpoint=10)
    assert threads.for_step() == 2


def test_threads_follow_the_refresh_lock(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    threads = TrainerThreads(run_dir, reserved=1, idle=2)
    assert threads.for_step() == 2 and torch.get_num_threads() == 2
    hold_lock(run_dir, checkpoint=None)  # the lock taken, no checkpoint chosen yet
    assert threads.for_step() == 2
    hold_lock(run_dir, checkpoint=10)
    assert threads.for_step() == 1 and torch.get_num_threads() == 1
    (run_dir / holder_file(REFRESH)).unlink()
    assert threads.for_step() == 2 and torch.get_num_threads() == 2


def test_a_dead_refresh_does_not_keep_the_cores(tmp_path: Path) -> None:
    """A killed refresh leaves its record behind; its pid is gone, so the cores come back."""
    run_dir = tmp_path / "run"
    hold_lock(run_dir, checkpoint=10, pid=2**22 + 12345)
    assert TrainerThreads(run_dir, reserved=1, idle=2).for_step() == 2


def test_reserved_threads_never_change(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    threads = TrainerThreads.for_worker(run_dir, "reserved", 1.0, 2, 1)
    assert threads.for_step() == 1
    hold_lock(run_dir, checkpoint=10)
    assert threads.for_step() == 1 and torch.get_num_threads() == 1


def test_an_unknown_mode_is_a_config_error(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("training:\n  cores: all\n")
    with pytest.raises(ConfigError, match=r"training\.cores"):
        load_config(recipe)


@pytest.mark.slow
def test_training_steps_give_the_cores_back_while_a_refresh_works(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker run with ``handover`` on a 2-core node: steps 1-2 on both cores; the
    checkpoint of step 2 is being refreshed (its holder record appears), so steps 3-4 run on
    ``cpus_per_worker``; each step event says how many threads it ran on."""
    monkeypatch.setattr(worker, "node_cores", lambda: 2)
    config = synthetic_config(
        tmp_path / "run",
        small_dataset,
        syllable_bert,
        "training.cpus_per_worker=1",
        "training.batch_size=4",
        "training.steps=4",
        "training.log_every=1",
        "training.checkpoint_every=2",
    )

    def refresh_starts(step: int, loss: float, rank: int) -> None:
        if step == 2:
            hold_lock(config.run_dir, checkpoint=step)

    with single_process_group():
        task = TrainingTask.retriever(config)
        run = WorkerRun.build(
            config, task, torch.device("cpu"), 1, refresh_starts, None, "handover"
        )
        run.train()
    steps = read_events(config.run_dir, RunEvent.STEP)
    assert [(e["step"], e["threads"]) for e in steps] == [(1, 2), (2, 2), (3, 1), (4, 1)]
