"""Checkpoint retention: at most K checkpoints plus the one a refresh is encoding (no Ray)."""

from __future__ import annotations

from pathlib import Path

from store_helpers import write_checkpoint

from hnce.cluster.compute.lock import RunLock
from hnce.cluster.stores.checkpoints import (
    checkpoint_step,
    checkpoints_root,
    complete_checkpoints,
    prune_checkpoints,
)


def _on_disk(run_dir: Path) -> list[int]:
    return sorted(checkpoint_step(path) for path in checkpoints_root(run_dir).iterdir())


def test_a_lagging_refresh_pins_one_checkpoint_and_disk_stays_bounded(tmp_path: Path) -> None:
    keep = 3
    write_checkpoint(tmp_path, 1)
    with RunLock(tmp_path, "slow refresh") as lock:
        lock.encoding(1)
        for step in range(2, 41):  # training goes on while the refresh of step-1 lags behind
            write_checkpoint(tmp_path, step)
            prune_checkpoints(tmp_path, keep)
            assert len(_on_disk(tmp_path)) <= keep + 1
        assert _on_disk(tmp_path) == [1, 38, 39, 40]
    # Released: step-1 is no longer being encoded, and the next pruning takes it.
    assert prune_checkpoints(tmp_path, keep) == [1]
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [38, 39, 40]


def test_pruning_removes_unfinished_leftovers_but_not_the_one_being_written(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, step)
    write_checkpoint(tmp_path, 15, complete=False)  # a crash left it half-written
    write_checkpoint(tmp_path, 40, complete=False)  # being written now
    assert prune_checkpoints(tmp_path, keep=2) == [10, 15]
    assert _on_disk(tmp_path) == [20, 30, 40]
