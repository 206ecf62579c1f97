"""Fault injection, in the spirit of SQLite's crash tests: each command is SIGKILLed (its whole
process group, Ray's processes included, as a machine would lose it) at seeded random moments,
then run again, and the invariants must hold:

- nothing outside the command's output (dataset) or run directory changed;
- every published version verifies (dataset manifests and SHA-256, index and negatives
  versions, complete checkpoints), and no staging directory is left once a run completes;
- the rerun finishes; training resumes and, its sampler being an exact-replay one (random
  negatives, ``resumes_exactly``), ends with exactly the weights of an uninterrupted run; a
  refresh killed and rerun publishes the index a clean refresh of that checkpoint publishes.

The moments are drawn from seeded generators (the seeds are in the test): a random point in a
conversion's wall time, a random training step plus a random delay, a random point in a
refresh. Training is killed once, mid-run, before the rerun: a launch recovers from what it finds
on disk (the newest complete checkpoint, Ray Train's state of an earlier launch, the staging a
killed launch left), which a killed first launch and a killed resumed one leave alike.

Preemption, the gentler fault: SIGTERM with SIGKILL due 30 s later (a spot instance's notice).
Training must stop inside the notice with a checkpoint of the step it reached, its locks free, and
resume from it to the same weights.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_helpers import (
    STEPS,
    kill,
    kill_when,
    only_an_abandoned_build_left,
    run,
    snapshot,
    staging_left,
    start,
    trained_past,
    training_inputs,
    training_recipe,
    verify_run,
    weights,
)

from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.lock_holder import REFRESH, TRAINING, holder_file
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables_read import verify_dataset
from hnce.events import RunEvent
from hnce.pipeline.cli.main import EXIT_TERMINATED
from hnce.pipeline.cli.main import main as hnce_main
from hnce.pipeline.train.preemption import NOTICE_SECONDS, STOP_FILE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_conversion_killed_at_random_moments_reruns_to_a_verified_dataset(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "raw"
    run(["data", "synthetic-kilt", "--out", str(raw), "--pages", "30000", "--workers", "1"])
    out = tmp_path / "work" / "data"
    out.parent.mkdir()
    sources = sorted(str(path) for path in raw.glob("aidayago2-*-kilt.jsonl"))
    kilt = ["data", "kilt", "--knowledge-source", str(raw / "kilt_knowledgesource.json")]
    command = [*kilt, "--aida", *sources, "--out", str(out), "--overwrite"]
    before = snapshot(tmp_path, out.parent)
    moments = random.Random(23).sample(range(300, 2500), 3)  # ms into the conversion
    killed = []
    for moment in moments:
        killed.append(kill_when(command, lambda: True, moment / 1000))
        assert snapshot(tmp_path, out.parent) == before
        if out.exists():
            verify_dataset(out)  # a dataset is there whole or not at all
    assert any(killed), "every kill came after the conversion ended"
    run(command)
    verify_dataset(out)
    assert staging_left(out.parent) == []
    assert snapshot(tmp_path, out.parent) == before


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset and model every run here trains on (``fault_helpers.training_inputs``)."""
    return training_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def recipe(inputs: Path) -> Callable[[Path], list[str]]:
    """The faulted runs' ``hnce train`` arguments (``fault_helpers.training_recipe``)."""
    return training_recipe(inputs)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, recipe) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    log = run(["train", *recipe(run_dir)])
    (run_dir.parent / "output.log").write_text(log)
    return run_dir


def test_a_clean_run_logs_no_engine_start_up_noise(uninterrupted: Path) -> None:
    """DeepSpeed is told the accelerator the recipe chose and Ray's token authentication is
    asked for explicitly, so the log of a clean run holds neither warning."""
    log = (uninterrupted.parent / "output.log").read_text()
    assert "DeepSpeed accelerator cpu" in log and "token authentication: token" in log
    assert "Setting accelerator to" not in log and "Token authentication is" not in log, log


def test_training_killed_at_random_moments_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, inputs: Path, recipe, uninterrupted: Path
) -> None:
    run_dir = tmp_path / "run"
    before = snapshot(inputs, run_dir)
    chooser = random.Random(7)
    # step 7, then 0.19 s: within the next steps (a step takes ~0.05-0.1 s here), before the
    # final checkpoint; a later moment would mostly land in the command's ~10 s of teardown
    step, delay = chooser.randint(2, 10), chooser.random() / 5
    # a run that ended first (the kill came too late) is started over, killed at half the delay
    killed = False
    for attempt in range(3):
        shutil.rmtree(run_dir, ignore_errors=True)
        command = ["train", *recipe(run_dir)]
        killed = kill_when(command, trained_past(run_dir, step), delay / 2**attempt)
        if killed:
            break
    assert killed, "every kill came after training ended"
    verify_run(run_dir)
    run(["train", *recipe(run_dir)])
    verify_run(run_dir)
    assert weights(run_dir, STEPS) == weights(uninterrupted, STEPS)
    assert snapshot(inputs, run_dir) == before
    only_an_abandoned_build_left(run_dir)


def test_training_stopped_by_sigterm_checkpoints_its_step_and_resumes_to_the_same_weights(
    tmp_path: Path, inputs: Path, recipe, uninterrupted: Path
) -> None:
    """SIGTERM to the ``hnce train`` process alone, as a spot notice, Kubernetes or ``ray job
    stop`` reach the command (sent to its whole process group it would also end the local Ray
    instance's GCS and raylet, cutting the driver off: a SIGKILL's case), SIGKILL due 30 s later:
    it exits inside the notice with 143 and one line naming the checkpoint it resumes from, the
    step the worker reached; no lock is held and every store verifies; the rerun resumes from
    it to the uninterrupted run's weights."""
    run_dir = tmp_path / "run"
    # a seeded step whose next two are not checkpoint steps (4, 8, 12), so that the stop (a step
    # or two later here) publishes a checkpoint of its own
    step = random.Random(5).choice([1, 5])
    process = start(["train", *recipe(run_dir)])
    trained = trained_past(run_dir, step)
    while process.poll() is None and not trained():
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[0].decode()[-3000:]
    os.kill(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=NOTICE_SECONDS)
    except subprocess.TimeoutExpired:
        kill(process)  # the instance's SIGKILL
        pytest.fail(f"hnce train still running {NOTICE_SECONDS:.0f} s after SIGTERM")
    log = output.decode()
    assert process.returncode == EXIT_TERMINATED, log[-3000:]
    reached = read_events(run_dir, RunEvent.STEP)[-1]["step"]
    assert newest_checkpoint(run_dir)[0] == reached < STEPS
    said = f"stopped on SIGTERM at step {reached}; the same command resumes {run_dir} from "
    assert f"hnce train: {said}step-{reached}" in log, log[-3000:]
    for released in (holder_file(TRAINING), holder_file(REFRESH), STOP_FILE):
        assert not (run_dir / released).exists(), released
    verify_run(run_dir)
    run(["train", *recipe(run_dir)])
    verify_run(run_dir)
    assert read_events(run_dir, RunEvent.RESUME)[-1]["step"] == reached
    assert weights(run_dir, STEPS) == weights(uninterrupted, STEPS)
    only_an_abandoned_build_left(run_dir)


def test_a_refresh_killed_at_random_moments_publishes_what_a_clean_refresh_does(
    tmp_path: Path, recipe, uninterrupted: Path, ray_session: str
) -> None:
    clean, killed = tmp_path / "clean", tmp_path / "killed"

    def copy_of_the_run(copy: Path) -> None:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(uninterrupted, copy, symlinks=True)
        shutil.rmtree(copy / "ray", ignore_errors=True)

    for copy in (clean, killed):
        copy_of_the_run(copy)
    step = "8"  # both copies refresh it from the same state, whatever the training indexed
    # the clean refresh, the reference, in this process on the session's Ray instance
    assert hnce_main(["refresh", "--step", step, *recipe(clean)]) == 0
    building = killed / "index"
    # ms after the lock is taken; a refresh that ended first is run again on a fresh copy and
    # killed at half the delay
    moment = random.Random(11).randrange(200, 4000)
    kills: list[bool] = []
    while not any(kills) and len(kills) < 3:
        if kills:
            copy_of_the_run(killed)
        took_lock = lambda: (killed / "refresh.lock.json").exists()  # noqa: E731
        command = ["refresh", "--step", step, *recipe(killed)]
        kills.append(kill_when(command, took_lock, moment / 1000 / 2 ** len(kills)))
        verify_run(killed)
    assert any(kills), "every kill came after the refresh ended"
    run(["refresh", "--step", step, *recipe(killed)])
    verify_run(killed)
    published = [IndexStore(run / "index").current() for run in (clean, killed)]
    assert [version.manifest.checkpoint for version in published] == [8, 8]
    assert published[0].shard_checksums == published[1].shard_checksums
    assert staging_left(building) == []
