"""The fault harness that tests/test_fault_injection.py and benchmarks/chaos.py share: ``hnce``
commands in process groups of their own, run to their end, killed, or stopped; the small run
they train; and the invariants a fault must leave behind (every store verifies, a step's
weights, the files outside a run unchanged, no staging left).

Every process a command starts carries :data:`MARKER` in its environment, so a kill reaches
Ray's processes too, wherever they went (``kill_marked``)::

    process = start(["train", *training_recipe(inputs)(run_dir)])
    kill(process)                      # a machine that loses power
    run(["train", *training_recipe(inputs)(run_dir)])
    assert weights(run_dir, 12) == weights(uninterrupted, 12)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import write_letter_bert
from ray_cluster_helpers import MARKER_VARIABLE, hang_report, kill_marked
from training_helpers import CONFIGS

from hnce.cluster.stores.checkpoints import EXPORT_DIR, complete_checkpoints, verify_checkpoint
from hnce.cluster.stores.files import STAGING_PREFIX
from hnce.cluster.stores.index_store import PROGRESS_FILE, IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import read_log
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.mining.samplers import SAMPLER_SPECS
from hnce.pipeline.data.synthetic import generate_synthetic_dataset

HNCE = [sys.executable, "-m", "hnce.pipeline.cli.main"]
MARKER = f"fault-injection-{os.getpid()}"
#: the seconds a command may take before it counts as stuck
STUCK_SECONDS = 600
#: the training recipe's steps, and its checkpoints (every 4 steps)
STEPS, CHECKPOINT_EVERY = 12, 4


class MountRefused(Exception):
    """This machine does not let a file system be mounted here (not root, no tmpfs)."""


@contextmanager
def small_disk(where: Path, size: int | str) -> Iterator[Path]:
    """A real file system of ``size`` (tmpfs; bytes, or ``64m``) mounted at ``where``, unmounted
    lazily afterwards (a failed test's frames may still hold a file open there);
    :class:`MountRefused` where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise MountRefused(
            f"cannot mount a tmpfs: {mounted.stderr.decode(errors='replace').strip()}"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


class CommandFailed(AssertionError):
    """A command that should have finished did not: its exit status and the end of its log."""


def start(arguments: list[str]) -> subprocess.Popen[bytes]:
    """``hnce <arguments>`` in its own process group, with a local Ray instance of its own (as
    from a user's shell); every process it starts carries :data:`MARKER` in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env[MARKER_VARIABLE] = MARKER
    return subprocess.Popen(
        [*HNCE, *arguments, "--no-progress"],
        stdout=subprocess.PIPE,  # DeepSpeed logs to stdout, the rest to stderr: one stream
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command and every process it started (Ray's too, wherever they went), as a
    machine that loses power would."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    kill_marked(MARKER)


def finish(process: subprocess.Popen[bytes], timeout: float = STUCK_SECONDS) -> str:
    """Wait for a started command (its log: stdout and stderr); one still running after
    `timeout` seconds is killed, and :class:`CommandFailed` carries its processes' stacks."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stuck = hang_report(MARKER)
        kill(process)
        raise CommandFailed(f"hnce still running after {timeout:.0f} s:\n{stuck}") from None
    return output.decode(errors="replace")


def run(arguments: list[str]) -> str:
    """Run ``hnce <arguments>`` to its end; its log. :class:`CommandFailed` (an AssertionError)
    when it exits with a status other than 0 or runs past :data:`STUCK_SECONDS`."""
    process = start(arguments)
    log = finish(process)
    if process.returncode != 0:
        raise CommandFailed(f"hnce {arguments[0]} exited {process.returncode}:\n{log[-3000:]}")
    return log


def kill_when(arguments: list[str], ready: Callable[[], bool], delay: float) -> bool:
    """Start the command, wait for ``ready()``, then ``delay`` seconds, then SIGKILL it; False
    when it finished first, successfully (the kill came too late); a command that failed on its
    own raises :class:`CommandFailed` with its log."""
    process = start(arguments)
    while process.poll() is None and not ready():
        time.sleep(0.05)
    deadline = time.monotonic() + delay
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.poll() is not None:
        log = finish(process)
        if process.returncode != 0:
            raise CommandFailed(f"hnce {arguments[0]} exited {process.returncode}:\n{log[-3000:]}")
        return False
    kill(process)
    return True


def snapshot(root: Path, inside: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` but those under ``inside``."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_relative_to(inside)
    }


def staging_left(root: Path) -> list[Path]:
    """The staging directories and files left under ``root``."""
    return list(root.rglob(f"{STAGING_PREFIX}*"))


def only_an_abandoned_build_left(run_dir: Path) -> None:
    """No staging directory is left but the index build of a refresh that the end of training
    abandoned (the refresh log's last record says so), which the next refresh resumes."""
    left = staging_left(run_dir)
    if left:
        assert read_log(run_dir).records[-1].outcome == "abandoned", left
        assert [path.parent for path in left] == [run_dir / "index"], left
        assert "shards" in json.loads((left[0] / PROGRESS_FILE).read_text())  # resumable


def weights(run_dir: Path, step: int) -> dict[str, str]:
    """SHA-256 of each weight file of the export in checkpoint ``step``."""
    export = run_dir / "checkpoints" / f"step-{step}" / EXPORT_DIR
    return {
        str(path.relative_to(export)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(export.rglob("*.safetensors"))
    }


def verify_run(run_dir: Path) -> list[int]:
    """Verify every store of a run (each complete checkpoint against its manifest, the live
    index version's shards, the live negatives version); the complete checkpoints' steps."""
    steps = []
    for step, directory in complete_checkpoints(run_dir):
        verify_checkpoint(directory)
        steps.append(step)
    index = IndexStore(run_dir / "index").current()
    if index is not None:
        index.load()  # manifest, every shard's SHA-256 and ids
    if NegativesStore(run_dir / "negatives").current_version() is not None:
        assert NegativesStore(run_dir / "negatives").latest() is not None
    return steps


def trained_past(run_dir: Path, step: int) -> Callable[[], bool]:
    """Whether the run's event log has a step at or past `step`."""

    def ready() -> bool:
        steps = read_events(run_dir, RunEvent.STEP)
        return bool(steps) and steps[-1]["step"] >= step

    return ready


def training_inputs(root: Path) -> Path:
    """The dataset (``data/``) and model (``model/``) every faulted run trains on, under
    `root`."""
    generate_synthetic_dataset(root / "data", num_worlds=2, entities_per_world=40)
    write_letter_bert(root / "model")
    return root


def training_recipe(inputs: Path) -> Callable[[Path], list[str]]:
    """``hnce train`` of a small run with the asynchronous refresh, random negatives (an
    exact-replay sampler), a checkpoint every 4 of 12 steps, all kept, and a fixed thread count
    (``training.cores: reserved``: with ``handover`` a step's threads, and so the order its CPU
    matmuls sum in, depend on when the refreshes run); its arguments for a run directory."""
    assert SAMPLER_SPECS["random"].resumes_exactly
    settings = [
        f"data.root={inputs / 'data'}",
        f"model.path={inputs / 'model'}",
        "negatives.source=index",  # the refresh mines, the sampler stays random
        "refresh.enabled=true",
        "training.zero_stage=1",  # resumed from DeepSpeed's partitioned optimizer state
        f"training.steps={STEPS}",
        f"training.checkpoint_every={CHECKPOINT_EVERY}",
        "training.keep_checkpoints=10",
        "training.batch_size=8",
        "training.cores=reserved",
        "refresh.shard_size=16",
        "index.faiss_device=cpu",
    ]

    def arguments(run_dir: Path) -> list[str]:
        overrides = [*settings, f"run.dir={run_dir}"]
        return ["--config", str(CONFIGS / "synthetic-test.yaml")] + [
            item for setting in overrides for item in ("--set", setting)
        ]

    return arguments
