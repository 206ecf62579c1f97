"""Faults in the middle of work, each tried many times at seeded moments: the chaos benchmark of
docs/failures.md.

Every try faults the small run of tests/fault_helpers.py (a synthetic catalogue of 80 entities,
the letter model, 12 steps with a checkpoint every 4, random negatives with the asynchronous
refresh beside training) at a moment its seed draws, then recovers as a user would (the same
command again, after the disk is grown where it filled) and checks:

- **held**: the faulted command either finished or ended as docs/failures.md says it ends (the
  exit status the fault's row names, with one line ``hnce <command>: ...`` and no traceback);
  every store verifies after the fault and after the recovery; the recovery finishes with exactly
  the uninterrupted run's weights (a refresh: the shards a clean refresh of that checkpoint
  publishes); nothing outside the run changed;
- **lost**: work published before the fault is gone or changed afterwards: a checkpoint that
  was complete when the fault came, no longer complete or with other weights.

The faults (``--faults``):

- ``train SIGKILL``: ``hnce train``'s whole process group and every Ray process it started
  SIGKILLed, a seeded delay after a seeded step (a machine lost);
- ``train SIGTERM``: SIGTERM to ``hnce train`` after a seeded step, SIGKILL due 30 s later (a spot
  instance's notice): exit 143 inside the notice;
- ``Ray actor SIGKILL``: one of ``hnce train``'s Ray actors (the trainer worker, the train
  controller, the refresh coordinator, an encoder: a seeded choice among those alive) SIGKILLed
  after a seeded step, as when its node dies: the command finishes (Ray restarts it) or ends in
  one line, exit 69;
- ``trainer worker SIGKILL``: the same, always a trainer worker (Ray Train restarts the worker
  group from the newest checkpoint);
- ``refresh SIGKILL``: ``hnce refresh --step 8`` of a copy of the uninterrupted run SIGKILLed a
  seeded time after it takes its lock;
- ``disk full``: the run on a file system (tmpfs) of a seeded share of the whole run's bytes:
  ``hnce train`` exits 74 naming a file of the run; the file system is grown and the rerun
  resumes. Needs root to mount; skipped (its row says so) without.

The table lists, per fault, the tries, how many faults landed (a try whose command ended before
the fault came is drawn again, at most 3 times), held, lost, the median seconds of the recovery,
and the seed of the first try that did not hold, which replays it::

    .venv/bin/python -m benchmarks.chaos --tries 3 --seed 1
    .venv/bin/python -m benchmarks.chaos --faults 'train SIGKILL' --replay 1234567
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness

sys.path.insert(0, str(harness.ROOT / "tests"))  # the run and its checks are the tests' own
from fault_helpers import (
    CHECKPOINT_EVERY,
    MARKER,
    STEPS,
    CommandFailed,
    MountRefused,
    finish,
    kill,
    kill_when,
    run,
    small_disk,
    snapshot,
    start,
    trained_past,
    training_inputs,
    training_recipe,
    verify_run,
    weights,
)
from ray_cluster_helpers import kill_marked, marked_processes

from hnce.cluster.stores.index_store import IndexStore
from hnce.pipeline.cli.main import EXIT_CLUSTER_LOST, EXIT_IO_ERROR, EXIT_TERMINATED
from hnce.pipeline.train.preemption import NOTICE_SECONDS

#: the refreshed checkpoint of ``refresh SIGKILL``
REFRESH_STEP = 8
#: draws of one try's moment before it counts as never landing (each later one sooner)
ATTEMPTS = 3


@dataclass(frozen=True)
class Outcome:
    """One try: whether its fault landed, the invariants held, published work was lost; the
    recovery's seconds; what broke (empty when it held)."""

    landed: bool
    held: bool
    lost: bool
    seconds: float
    broken: str = ""


class Trial:
    """What every try shares: the inputs, the recipe, the uninterrupted run and a clean refresh
    of its checkpoint :data:`REFRESH_STEP` (the references), under one work directory."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.inputs = training_inputs(work / "inputs")
        self.recipe = training_recipe(self.inputs)
        self.uninterrupted = work / "uninterrupted"
        run(["train", *self.recipe(self.uninterrupted)])
        self.final = weights(self.uninterrupted, STEPS)
        self.bytes = sum(f.stat().st_size for f in self.uninterrupted.rglob("*") if f.is_file())
        clean = self.copy("clean-refresh")
        run(["refresh", "--step", str(REFRESH_STEP), *self.recipe(clean)])
        self.clean_shards = IndexStore(clean / "index").current().shard_checksums
        self.outside = self.inputs_now()

    def copy(self, name: str) -> Path:
        """A copy of the uninterrupted run (without Ray Train's own state of its launch)."""
        copy = self.work / name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.uninterrupted, copy, symlinks=True)
        shutil.rmtree(copy / "ray", ignore_errors=True)
        return copy

    def inputs_now(self) -> dict[str, str]:
        """The SHA-256 of every input file (the dataset and the model)."""
        return snapshot(self.inputs, self.work / "try")  # every file: no run lies inside

    def train(self, run_dir: Path) -> list[str]:
        return ["train", *self.recipe(run_dir)]


def published(run_dir: Path) -> dict[int, dict[str, str]]:
    """The complete checkpoints of a run that verify, each step's weights."""
    try:
        return {step: weights(run_dir, step) for step in verify_run(run_dir)}
    except Exception:  # a store that does not verify: its checkpoints count as gone
        return {}


def recovered(trial: Trial, run_dir: Path, before: dict[int, dict[str, str]]) -> Outcome:
    """The rerun of training after a fault, and the checks of both (module docstring)."""
    broken = []
    try:
        verify_run(run_dir)
    except Exception as error:
        broken.append(f"a store does not verify after the fault: {error}")
    clock = time.perf_counter()
    try:
        run(trial.train(run_dir))
    except CommandFailed as error:
        broken.append(f"the rerun failed: {str(error)[-300:]}")
    seconds = time.perf_counter() - clock
    after = published(run_dir)
    lost = any(after.get(step) != kept for step, kept in before.items())
    if not broken and weights(run_dir, STEPS) != trial.final:
        broken.append("the rerun's weights differ from the uninterrupted run's")
    if trial.inputs_now() != trial.outside:
        broken.append("files outside the run changed")
    return Outcome(True, not broken and not lost, lost, seconds, "; ".join(broken))


def one_line(log: str, command: str) -> str:
    """Why `log` is not a one-line failure of ``hnce <command>`` (empty when it is)."""
    if "Traceback" in log:
        return "a traceback: " + log[log.index("Traceback") :][:300]
    if f"hnce {command}: " not in log:
        return f"no 'hnce {command}:' line: {log[-300:]}"
    return ""


def train_sigkill(trial: Trial, seed: int) -> Outcome:
    chooser = random.Random(seed)
    step, delay = chooser.randint(1, STEPS - 2), chooser.random() / 5
    run_dir = trial.work / "try"
    for attempt in range(ATTEMPTS):
        shutil.rmtree(run_dir, ignore_errors=True)
        if kill_when(trial.train(run_dir), trained_past(run_dir, step), delay / 2**attempt):
            return recovered(trial, run_dir, published(run_dir))
    return Outcome(False, True, False, 0.0)


def after_step(trial: Trial, run_dir: Path, step: int) -> subprocess.Popen[bytes] | None:
    """``hnce train`` started on a fresh `run_dir`, once it has trained past `step` (None when
    it ended first)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    process = start(trial.train(run_dir))
    ready = trained_past(run_dir, step)
    while process.poll() is None and not ready():
        time.sleep(0.05)
    if process.poll() is not None:
        finish(process)
        return None
    return process


def train_sigterm(trial: Trial, seed: int) -> Outcome:
    step = random.Random(seed).randint(1, STEPS - 2)
    run_dir = trial.work / "try"
    process = after_step(trial, run_dir, step)
    if process is None:
        return Outcome(False, True, False, 0.0)
    before = published(run_dir)
    os.kill(process.pid, signal.SIGTERM)
    try:
        log = finish(process, timeout=NOTICE_SECONDS)
    except CommandFailed:  # the notice's SIGKILL (finish killed it)
        outcome = recovered(trial, run_dir, before)
        return Outcome(True, False, outcome.lost, outcome.seconds, "still running after 30 s")
    outcome = recovered(trial, run_dir, before)
    if process.returncode not in (0, EXIT_TERMINATED):
        broken = f"exit {process.returncode}: {log[-300:]}"
        return Outcome(True, False, outcome.lost, outcome.seconds, broken)
    return outcome


def ray_actors() -> dict[int, str]:
    """The Ray actor processes of the command (pid: title), idle workers aside."""
    actors = {}
    for pid in marked_processes(MARKER):
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            if title.startswith("ray::") and not title.startswith("ray::IDLE"):
                actors[pid] = title
    return actors


def ray_actor_sigkill(trial: Trial, seed: int, only: str = "ray::") -> Outcome:
    """SIGKILL a seeded choice among the Ray actors of ``hnce train`` whose title starts with
    `only` (any actor by default), after a seeded step."""
    chooser = random.Random(seed)
    step = chooser.randint(1, STEPS - 2)
    run_dir = trial.work / "try"
    process = after_step(trial, run_dir, step)
    if process is None:
        return Outcome(False, True, False, 0.0)
    before = published(run_dir)
    actors = {pid: title for pid, title in ray_actors().items() if title.startswith(only)}
    if not actors:
        kill(process)
        return Outcome(False, True, False, 0.0)
    pid = chooser.choice(sorted(actors))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    log = finish(process)
    outcome = recovered(trial, run_dir, before)
    victim = actors[pid].split(" ")[0]
    print(f"{victim} (pid {pid}) killed after step {step}; hnce train exited {process.returncode}")
    if process.returncode == 0:
        return outcome
    problem = one_line(log, "train")
    if process.returncode != EXIT_CLUSTER_LOST or problem:
        broken = f"{victim} killed: exit {process.returncode}; {problem}"
        return Outcome(True, False, outcome.lost, outcome.seconds, broken)
    return outcome


def refresh_sigkill(trial: Trial, seed: int) -> Outcome:
    moment = random.Random(seed).randrange(200, 4000) / 1000
    for attempt in range(ATTEMPTS):
        run_dir = trial.copy("try")
        command = ["refresh", "--step", str(REFRESH_STEP), *trial.recipe(run_dir)]
        live = IndexStore(run_dir / "index").current()  # training's last refresh, if any
        before = None if live is None else live.shard_checksums
        if not kill_when(command, (run_dir / "refresh.lock.json").exists, moment / 2**attempt):
            continue
        broken = []
        live = IndexStore(run_dir / "index").current()
        if (None if live is None else live.shard_checksums) not in (before, trial.clean_shards):
            broken.append("the live index is neither the one before nor the new one")
        clock = time.perf_counter()
        try:
            run(command)
        except CommandFailed as error:
            broken.append(f"the rerun failed: {str(error)[-300:]}")
        seconds = time.perf_counter() - clock
        if IndexStore(run_dir / "index").current().shard_checksums != trial.clean_shards:
            broken.append("the rerun published other shards than a clean refresh")
        return Outcome(True, not broken, False, seconds, "; ".join(broken))
    return Outcome(False, True, False, 0.0)


def disk_full(trial: Trial, seed: int) -> Outcome:
    share = random.Random(seed).uniform(0.2, 0.95)
    with small_disk(trial.work / "disk", int(trial.bytes * share)) as disk:
        run_dir = disk / "run"
        process = start(trial.train(run_dir))
        log = finish(process)
        if process.returncode == 0:
            return Outcome(False, True, False, 0.0)
        before = published(run_dir)
        problem = one_line(log, "train")
        if process.returncode != EXIT_IO_ERROR or str(run_dir) not in log:
            problem = f"exit {process.returncode}, no path of the run named; {problem}"
        grown = f"remount,size={4 * trial.bytes}"
        subprocess.run(["mount", "-o", grown, str(disk)], check=True)
        outcome = recovered(trial, run_dir, before)
        if problem:
            return Outcome(True, False, outcome.lost, outcome.seconds, problem)
        return outcome


FAULTS: dict[str, Callable[[Trial, int], Outcome]] = {
    "train SIGKILL": train_sigkill,
    "train SIGTERM": train_sigterm,
    "Ray actor SIGKILL": ray_actor_sigkill,
    "trainer worker SIGKILL": functools.partial(ray_actor_sigkill, only="ray::RayTrainWorker"),
    "refresh SIGKILL": refresh_sigkill,
    "disk full": disk_full,
}


def row(name: str, outcomes: list[tuple[int, Outcome]]) -> str:
    """The table's row of one fault's tries (seed, outcome)."""
    landed = [outcome for _, outcome in outcomes if outcome.landed]
    failed = [(seed, outcome) for seed, outcome in outcomes if outcome.landed and not outcome.held]
    seconds = [outcome.seconds for outcome in landed]
    median = f"{statistics.median(seconds):.0f}" if seconds else "–"
    replay = f"`--faults '{name}' --replay {failed[0][0]}`" if failed else "–"
    return (
        f"| {name} | {len(outcomes)} | {len(landed)} | {len(landed) - len(failed)} | "
        f"{sum(outcome.lost for _, outcome in outcomes)} | {median} | {replay} |"
    )


def main() -> int:
    parser = harness.arguments(__doc__, "chaos", work_dir=None, tries=3, seed=1)
    parser.add_argument("--faults", nargs="+", choices=sorted(FAULTS), default=list(FAULTS))
    parser.add_argument("--replay", type=int, help="run one try of each fault with this seed")
    args = harness.parse(parser)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="hnce-chaos-"))
    trial = Trial(work)
    print(f"references: the uninterrupted run ({trial.bytes / 2**20:.1f} MiB) and a clean refresh")
    chooser = random.Random(args.seed)
    rows, notes = [], []
    for name in args.faults:
        seeds = (
            [args.replay] if args.replay else [chooser.randrange(2**31) for _ in range(args.tries)]
        )
        outcomes = []
        for seed in seeds:
            try:
                outcome = FAULTS[name](trial, seed)
            except MountRefused as reason:
                notes.append(f"{name}: not run ({reason}).")
                break
            finally:
                kill_marked(MARKER)  # whatever a try left running, before the next
            print(f"{name}, seed {seed}: {outcome}", flush=True)
            outcomes.append((seed, outcome))
            if outcome.broken:
                notes.append(f"{name}, seed {seed}: {outcome.broken}")
        if outcomes:
            rows.append(row(name, outcomes))
    if args.replay:
        return 0
    lines = [
        "# Faults in the middle of work (chaos)",
        "",
        f"Each fault tried {args.tries} times at moments drawn from seed {args.seed}, on a run of "
        f"{STEPS} steps with a checkpoint every {CHECKPOINT_EVERY} and the asynchronous refresh "
        "(benchmarks/chaos.py says what each fault is and what held means). Landed: the fault "
        "came before the command ended. Lost: work published before the fault gone or changed "
        f"afterwards. Command: `{harness.invocation('benchmarks.chaos')}`.",
        "",
        "| fault | tries | landed | held | lost | recovery s (median) | replay |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *notes,
    ]
    harness.write_result(args.output, lines)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
