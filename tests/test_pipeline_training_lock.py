"""The run's training lock: one launch of the trainer per run directory (docs/refresh.md, "The
run lock"). A second launch is refused before it writes or starts anything, on the Python
API and on the command line (exit 75, the holder named); the cluster layer waits out a holder
that provably died and refuses a live one at once; a stand-alone refresh beside a launch that
holds it takes the GPUs that launch leaves."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from training_helpers import synthetic_config

from hnce.cluster.compute import lock
from hnce.cluster.compute.lock import (
    NAMESPACE,
    ClusterLockToken,
    RunLock,
    cluster_lock_name,
)
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.supervisor import beside_training
from hnce.cluster.stores.lock_holder import (
    EXIT_LOCKED,
    REFRESH,
    TRAINING,
    LockHolder,
    RunLocked,
    read_holder,
)
from hnce.events import RunEvent
from hnce.pipeline.cli.main import main as hnce_main
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.trainer import run_training

REPO = Path(__file__).resolve().parents[1]
LOCK_FILES = {"training.lock", "training.lock.json"}


def test_a_second_launch_is_refused_before_it_writes_anything(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    run_dir = tmp_path / "run"
    config = synthetic_config(run_dir, small_dataset, syllable_bert, "training.steps=2")
    with RunLock(run_dir, "the first launch", kind=TRAINING):
        with pytest.raises(RunLocked, match=r"another training launch of .* the first launch"):
            run_training(config)
        assert {path.name for path in run_dir.iterdir()} == LOCK_FILES  # no config.yaml, no log
        assert read_holder(run_dir, TRAINING).role == "the first launch"
        with RunLock(run_dir, "a refresh"):  # the refresh lock is another lock
            assert read_holder(run_dir, REFRESH).role == "a refresh"
    assert read_holder(run_dir, TRAINING) is None


def test_hnce_train_exits_75_naming_the_launch_that_holds_the_run(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``hnce train``'s ``main`` (whose return value the ``hnce`` script exits with, run in this
    process: a new interpreter would spend seconds importing the trainer) returns 75 with one
    line naming the holder on stderr, no traceback printed or logged, nothing written."""
    run_dir = tmp_path / "run"
    command = ["train", "--config", str(REPO / "configs" / "synthetic-test.yaml")]
    for override in (
        f"run.dir={run_dir}",
        f"data.root={small_dataset}",
        f"model.path={syllable_bert}",
    ):
        command += ["--set", override]
    with RunLock(run_dir, "a launch in another terminal", kind=TRAINING):
        assert hnce_main(command) == EXIT_LOCKED
    refused = capsys.readouterr().err
    assert "another training launch" in refused
    assert "a launch in another terminal" in refused
    assert "Traceback" not in refused
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    assert {path.name for path in run_dir.iterdir()} <= LOCK_FILES


def test_a_cluster_lock_held_by_a_dead_holder_is_taken_once_ray_frees_it(
    tmp_path: Path, ray_session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The named actor of a holder whose pid is gone: the contender asks who holds the name,
    and instead of refusing waits for Ray to free it (here: the actor killed once asked)."""
    import ray

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone: the holder provably died
    holder = replace(LockHolder.this_process("killed launch"), pid=dead.pid)
    name = cluster_lock_name(tmp_path, TRAINING)
    token = ClusterLockToken.options(name=name, namespace=NAMESPACE).remote(asdict(holder))
    ray.get(token.holder.remote())
    ask_the_cluster, asked = lock._cluster_holder, []

    def ask_then_free(asked_name: str) -> LockHolder | None:
        found = ask_the_cluster(asked_name)
        asked.append(found)
        ray.kill(token, no_restart=True)
        return found

    monkeypatch.setattr(lock, "_cluster_holder", ask_then_free)
    with RunLock(tmp_path, "the retry", kind=TRAINING):
        assert read_holder(tmp_path, TRAINING).role == "the retry"
    assert asked[0].role == "killed launch"  # the name was held when it first tried


def test_a_cluster_lock_held_by_a_live_holder_refuses_at_once(
    tmp_path: Path, ray_session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that lives (here: this process, as another node's launch would be) is asked
    once and the contender refused, without waiting for the name."""
    name = cluster_lock_name(tmp_path, TRAINING)
    holder = LockHolder.this_process("a launch on another node")
    token = ClusterLockToken.options(name=name, namespace=NAMESPACE).remote(asdict(holder))
    asked = []
    monkeypatch.setattr(lock, "_cluster_holder", lambda n: asked.append(n) or holder)
    import ray

    try:
        ray.get(token.holder.remote())
        with pytest.raises(RunLocked, match="a launch on another node"):
            RunLock(tmp_path, "the second launch", kind=TRAINING).__enter__()
        assert asked == [name]
        assert not (tmp_path / "training.lock.json").exists()  # the holder's record, if any
    finally:
        ray.kill(token, no_restart=True)
    assert cluster_lock_name(tmp_path, REFRESH) != name


@pytest.mark.parametrize(("chosen", "share"), [("shared", 0.5), ("dedicated", 1.0)])
def test_a_standalone_refresh_beside_a_training_launch_takes_the_gpus_it_leaves(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, chosen: str, share: float
) -> None:
    """``hnce refresh`` while a launch trains the run on GPUs: its encoders take the share of a
    GPU the launch chose (half of the one GPU it shares) and count the workers' GPUs as taken;
    once no launch holds the run, the refresh has the cluster's GPUs to itself."""
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        "cluster.use_gpu=true",
        "training.num_workers=2",
    )

    def refresh_plan_beside() -> RefreshPlan:
        return beside_training(
            refresh_plan(config), config.cluster.use_gpu, config.training.num_workers
        )

    alone = refresh_plan_beside()
    assert (alone.encoder_gpus, alone.trainer_gpus) == (1.0, 0.0)
    with RunLock(run_dir, "hnce train (retriever)", kind=TRAINING):
        EventLog(run_dir).write(RunEvent.LAUNCH, gpus=chosen, gpus_reason="a test")
        beside = refresh_plan_beside().pool_settings()
        assert (beside.gpus_per_actor, beside.reserved_gpus) == (share, 2 * share)
    assert refresh_plan_beside().encoder_gpus == 1.0
