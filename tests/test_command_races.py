"""Commands that race on one run: ``hnce train`` (resuming, with its refresh coordinator), a second
``hnce train``, ``hnce refresh``, ``hnce eval``, ``hnce export`` and ``hnce link`` started together
on the same run directory, as an operator's scheduled jobs and a user's shell would. Every
command either does its work (exit 0) or refuses naming the holder of the lock it needs; no store
is ever read half-written (each command verifies what it reads, so a half-written version would
fail one), and afterwards every checkpoint, index and negatives version verifies. (The refresh
lock's two holders in a deterministic order are test_cluster_refresh_lock.py's.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import TrainedRun

from hnce.cluster.stores.checkpoints import complete_checkpoints, verify_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.lock_holder import TRAINING, read_holder
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import read_log

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
#: what the resumed training adds to the shared run's 30 steps: a checkpoint every 5, refreshed
MORE_STEPS = ("training.steps=40", "training.checkpoint_every=5", "refresh.enabled=true")


def test_train_refresh_eval_export_and_link_at_once_each_work_or_name_the_holder(
    trained_run: TrainedRun, ray_session: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.run, run_dir, symlinks=True)
    shutil.rmtree(run_dir / "ray", ignore_errors=True)  # the shared run's Ray Train state
    recipe = ["--config", str(run_dir / "config.yaml"), "--set", f"run.dir={run_dir}"]
    joined = ["--set", f"cluster.address={ray_session}"]

    def setting(*settings: str) -> list[str]:
        return [part for item in settings for part in ("--set", item)]

    commands = {
        "train": ["train", *recipe, *joined, *setting(*MORE_STEPS), "--no-progress"],
        "train again": ["train", *recipe, *joined, *setting(*MORE_STEPS), "--no-progress"],
        "refresh": ["refresh", *recipe, *joined],
        "eval": ["eval", *recipe, *joined, "--no-progress", "--out", str(tmp_path / "eval.json")],
        "export": ["export", str(run_dir), "--out", str(tmp_path / "export"), "--no-progress"],
        "link": [
            "link",
            *recipe,
            *joined,
            "--json",
            "--no-progress",
            "the [START_ENT] x [END_ENT]",
        ],
    }
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "hnce.pipeline.cli.main", *arguments],
            cwd=REPO,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, arguments in commands.items()
    }
    outputs = {name: process.communicate(timeout=600)[0] for name, process in started.items()}
    codes = {name: process.returncode for name, process in started.items()}

    # the first `hnce train` to take the training lock trains; the other is refused, naming it
    trained = [name for name in ("train", "train again") if codes[name] == 0]
    assert len(trained) == 1, (codes, {name: outputs[name][-2000:] for name in outputs})
    (refused,) = {"train", "train again"} - set(trained)
    assert codes[refused] != 0 and "pid" in outputs[refused], outputs[refused][-2000:]
    assert str(started[trained[0]].pid) in outputs[refused], outputs[refused][-2000:]
    # the refresh job published, found its checkpoint live, or was refused naming the holder
    if codes["refresh"] != 0:
        assert "pid" in outputs["refresh"], outputs["refresh"][-2000:]
    for name in ("eval", "export", "link"):
        assert codes[name] == 0, (name, outputs[name][-3000:])
    linked = [json.loads(line) for line in outputs["link"].splitlines() if line.startswith("{")]
    assert linked and linked[0]["candidates"], outputs["link"][-2000:]
    # afterwards every version of every store verifies, and no lock is left held
    steps = [step for step, _ in complete_checkpoints(run_dir)]
    assert steps[-1] == 40, steps
    for _, directory in complete_checkpoints(run_dir):
        verify_checkpoint(directory)
    index = IndexStore(run_dir / "index")
    for number in index.versions():
        index.open(number).load()
    negatives = NegativesStore(run_dir / "negatives")
    assert negatives.latest() is not None
    assert all(record.outcome != "failed" for record in read_log(run_dir).records)
    assert read_holder(run_dir) is None and read_holder(run_dir, TRAINING) is None
