"""Checkpoint retention: at most K checkpoints plus the one a refresh is encoding, and the
DeepSpeed state of the newest only when the recipe says so, dropped so that a crash never leaves a
checkpoint that fails to verify (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import DEEPSPEED_STATE_FILE, PLACEHOLDER_WEIGHTS, write_checkpoint

from hnce.cluster.compute.lock import RunLock
from hnce.cluster.stores import checkpoints
from hnce.cluster.stores.checkpoints import (
    COMPLETE,
    DEEPSPEED_DIR,
    EXPORT_DIR,
    CheckpointIntegrityError,
    checkpoint_step,
    checkpoints_root,
    complete_checkpoints,
    prune_checkpoints,
    resumable,
    slim_checkpoints,
    verify_checkpoint,
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


def test_slimming_keeps_the_newest_deepspeed_state_and_every_export(tmp_path: Path) -> None:
    """``training.keep_deepspeed_state: newest``: the older checkpoints keep their export and
    still verify, their manifest re-signed to list the state as dropped; the newest and the one
    a refresh is encoding keep their state; a second slimming has nothing to do."""
    for step in (10, 20, 30, 40):
        write_checkpoint(tmp_path, step, deepspeed_state=True)
    with RunLock(tmp_path, "refresh") as lock:
        lock.encoding(20)
        assert slim_checkpoints(tmp_path) == [10, 30]
    assert slim_checkpoints(tmp_path) == [20]
    assert slim_checkpoints(tmp_path) == []
    for step, directory in complete_checkpoints(tmp_path):
        manifest = verify_checkpoint(directory)
        newest = step == 40
        assert (directory / DEEPSPEED_DIR).is_dir() == newest == resumable(directory)
        assert (directory / EXPORT_DIR / "weights.bin").read_bytes() == PLACEHOLDER_WEIGHTS
        state = f"{DEEPSPEED_DIR}/{DEEPSPEED_STATE_FILE}"
        assert (state in manifest.files) == newest and (state in manifest.dropped) != newest


def test_a_slimming_cut_short_leaves_a_checkpoint_that_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before the manifest is re-signed, the checkpoint is as it was written; killed
    after, before the state is deleted, the files left are those the manifest lists as dropped,
    which verify (and one changed since is refused); the next slimming deletes them."""
    old = write_checkpoint(tmp_path, 10, deepspeed_state=True)
    write_checkpoint(tmp_path, 20, deepspeed_state=True)
    written = (old / COMPLETE).read_bytes()

    def killed(*_: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(checkpoints, "atomic_write_json", killed)
        with pytest.raises(KeyboardInterrupt):
            slim_checkpoints(tmp_path)
    assert (old / COMPLETE).read_bytes() == written and resumable(old)
    verify_checkpoint(old)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoints, "remove_owned", killed)
        with pytest.raises(KeyboardInterrupt):
            slim_checkpoints(tmp_path)
    leftover = old / DEEPSPEED_DIR / DEEPSPEED_STATE_FILE
    assert leftover.is_file() and not resumable(old)
    verify_checkpoint(old)
    leftover.write_bytes(b"crafted")
    with pytest.raises(CheckpointIntegrityError, match=r"mp_rank_00_model_states\.pt: sha256"):
        verify_checkpoint(old)
    assert slim_checkpoints(tmp_path) == [10]
    assert not (old / DEEPSPEED_DIR).exists()
    verify_checkpoint(old)
