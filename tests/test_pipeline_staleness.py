"""``refresh.trigger: stale``: the loss ratio that decides a refresh is stale, the checkpoints that
ask for one, and the coordinator's choice among them (hnce.cluster.compute.refresh.triggers.stale;
the end to end run is in test_pipeline_train.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from store_helpers import publish_index, write_checkpoint
from training_helpers import CONFIGS, REFRESHED

from hnce.cluster.compute.refresh.engine import NoCheckpointError
from hnce.cluster.compute.refresh.job import refresh_target
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.triggers.stale import StalenessMonitor
from hnce.cluster.stores.checkpoints import (
    complete_checkpoints,
    prune_checkpoints,
    refresh_requests,
    wants_refresh,
)
from hnce.cluster.stores.index_store import IndexStore
from hnce.pipeline.config import ConfigError, load_config


def _fed(monitor: StalenessMonitor, version: int, losses: list[float]) -> StalenessMonitor:
    for loss in losses:
        monitor.observe(version, loss)
    return monitor


def test_the_loss_ratio_is_the_last_windows_mean_over_the_first_windows() -> None:
    monitor = _fed(StalenessMonitor(ratio=0.5, window=2), 3, [4.0, 4.0, 3.0])
    assert monitor.loss_ratio() is None and not monitor.stale()  # fewer than 2W steps
    monitor.observe(3, 2.0)
    assert monitor.loss_ratio() == (3.0 + 2.0) / 2 / 4.0  # 0.625: not yet stale
    assert not monitor.stale()
    monitor.observe(3, 1.0)
    assert monitor.loss_ratio() == (2.0 + 1.0) / 2 / 4.0  # 0.375 <= 0.5
    assert monitor.stale()
    monitor.asked(0)
    monitor.observe(3, 0.5)
    assert not monitor.stale()  # asked once per version


def test_a_new_version_is_measured_from_its_own_first_steps() -> None:
    monitor = _fed(StalenessMonitor(ratio=0.5, window=2), 1, [4.0, 4.0, 1.0, 1.0])
    monitor.asked(0)
    _fed(monitor, 2, [3.0, 3.0, 2.0])
    assert monitor.version == 2 and monitor.losses == [3.0, 3.0, 2.0]
    assert not monitor.requested and not monitor.stale()
    monitor.observe(2, 1.0)
    assert monitor.loss_ratio() == 0.5 and monitor.stale()


def test_non_finite_losses_are_left_out_of_both_windows() -> None:
    monitor = _fed(StalenessMonitor(ratio=0.9, window=1), 0, [2.0, math.nan, math.inf, 1.0])
    assert monitor.losses == [2.0, 1.0] and monitor.loss_ratio() == 0.5


def _plan(run_dir: Path) -> RefreshPlan:
    return RefreshPlan(run_dir, run_dir / "data")


def test_the_coordinator_refreshes_the_newest_checkpoint_that_asks(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10)  # written before the key existed: asks
    write_checkpoint(tmp_path, 20, refresh=True)
    write_checkpoint(tmp_path, 30, refresh=False)  # only to resume from
    assert [wants_refresh(directory) for _, directory in complete_checkpoints(tmp_path)] == [
        True,
        True,
        False,
    ]
    assert [step for step, _ in refresh_requests(complete_checkpoints(tmp_path))] == [10, 20]
    plan = _plan(tmp_path)
    assert refresh_target(plan, requests_only=True) == (20, True)
    assert refresh_target(plan) == (30, True)  # `hnce refresh`: the newest, request or not
    publish_index(IndexStore(tmp_path / "index"), 20, np.zeros((6, 16), np.float32))
    assert refresh_target(plan, requests_only=True)[0] == 20  # live index; negatives still due
    publish_index(IndexStore(tmp_path / "index"), 30, np.zeros((6, 16), np.float32))
    assert refresh_target(plan, requests_only=True) == (20, False)  # never back to an older one
    assert refresh_target(plan) == (30, True)  # its negatives are still to mine


def test_no_request_yet_is_no_checkpoint_for_the_coordinator(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10, refresh=False)
    with pytest.raises(NoCheckpointError, match="asks for a refresh"):
        refresh_target(_plan(tmp_path), requests_only=True)
    assert refresh_target(_plan(tmp_path)) == (10, True)


def test_pruning_spares_the_newest_request(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, refresh=True)
    write_checkpoint(tmp_path, 10, refresh=True)
    for step in (15, 20, 25):
        write_checkpoint(tmp_path, step, refresh=False)
    assert prune_checkpoints(tmp_path, keep=2) == [5, 15]
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [10, 20, 25]


def test_the_stale_trigger_needs_the_asynchronous_coordinator() -> None:
    recipe = CONFIGS / "synthetic-test.yaml"
    stale = [*REFRESHED, "refresh.trigger=stale"]
    config = load_config(recipe, [*stale, "refresh.stale.loss_ratio=0.7"])
    assert (config.refresh.trigger, config.refresh.stale.loss_ratio) == ("stale", 0.7)
    with pytest.raises(ConfigError, match=r"refresh\.trigger.*async"):
        load_config(recipe, [*stale, "refresh.mode=sync"])
    with pytest.raises(ConfigError, match=r"refresh\.stale\.loss_ratio"):
        load_config(recipe, ["refresh.stale.loss_ratio=1.5"])
    with pytest.raises(ConfigError, match="stale_loss_ratio"):  # the flat key of before: unknown
        load_config(recipe, ["refresh.stale_loss_ratio=0.7"])
