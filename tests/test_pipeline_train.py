"""End to end on a local Ray instance: DeepSpeed workers under Ray Train on refreshed negatives.

The session's small synthetic Zeshel-like dataset and tiny random BERT whose WordPiece vocabulary
holds the generator's syllables (fast steps); the recall, killed-worker and killed-launch tests
start from the session's shared trained run.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from training_helpers import (
    REFRESHED,
    TRAINED_RUN_STEPS,
    TWO_WORKERS,
    TrainedRun,
    exact_scores,
    synthetic_config,
)

from hnce.cluster.compute.actors import StopRequested
from hnce.cluster.compute.encoder_actor import node_cores
from hnce.cluster.compute.recall import hits_at
from hnce.cluster.compute.refresh.coordinator import COORDINATOR_ROLE, POLL_SECONDS
from hnce.cluster.compute.refresh.initial import InitialRequest, prepare_initial_negatives
from hnce.cluster.stores.checkpoints import (
    EXPORT_DIR,
    checkpoint_dir,
    complete_checkpoints,
    newest_checkpoint,
    wants_refresh,
)
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import fastest_refresh_seconds, read_log
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.events import RunEvent
from hnce.pipeline.config import Config, config_from_dict, load_config
from hnce.pipeline.evaluate import evaluate_checkpoint, evaluate_export
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.trainer import initial_request, run_training

pytestmark = pytest.mark.slow
#: the asynchronous run's steps: a checkpoint at 20 and 40, each refreshed while training goes on
STEPS = 60


@contextlib.contextmanager
def workers_held_until_a_refresh_lands(run_dir: Path, past_step: int) -> Iterator[list[int]]:
    """While the block runs, a thread stops the run's trainer workers (SIGSTOP) once they have
    logged ``past_step``, unless the coordinator's first refresh has ended by then, and lets them
    go on (SIGCONT) once it has (published, failed or abandoned): however fast this machine trains
    and refreshes, the first refresh ends while training still has steps to take. Yields the
    steps at which the workers were held (none: the refresh ended first). Ray Train waits 10
    minutes for a worker's health check and gloo 30 for a collective, far longer than a hold."""
    held: list[int] = []
    done = threading.Event()

    def refresh_ended() -> bool:
        ended = ("published", "failed", "abandoned")
        return any(
            r.role == COORDINATOR_ROLE and r.outcome in ended for r in read_log(run_dir).records
        )

    def hold() -> None:
        while not done.is_set():
            steps = read_events(run_dir, RunEvent.STEP)
            if refresh_ended():
                return
            if steps and steps[-1]["step"] >= past_step:
                break
            time.sleep(0.05)
        else:
            return
        pids = [int(path.read_text()) for path in (run_dir / "workers").glob("rank-*.pid")]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a worker that failed: restarted
                os.kill(pid, signal.SIGSTOP)
        held.append(read_events(run_dir, RunEvent.STEP)[-1]["step"])
        try:
            deadline = time.monotonic() + 600
            while not refresh_ended() and not done.is_set() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    holder = threading.Thread(target=hold, name="hold-workers")
    holder.start()
    try:
        yield held
    finally:
        done.set()
        holder.join()


def recall(config: Config, export_dir: Path | None, split: str) -> dict[int, float]:
    """Recall@{1, 8} on ``split`` through the cluster (``hnce eval``); None: untrained."""
    tree = config.to_dict()
    tree["data"]["eval_split"] = split
    tree["eval"].update(ks=[1, 8], per_domain_catalogue=False)
    config = config_from_dict(tree)
    if export_dir is None:
        return evaluate_checkpoint(config, "untrained").recall
    return evaluate_export(config, export_dir).recall


def test_training_switches_to_refreshed_negatives_without_waiting(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    """``refresh.mode: async``: training never waits for the coordinator, uses each refresh it
    sees land (the switch comes steps after its checkpoint), and the coordinator goes straight on
    to the newest checkpoint after each refresh. How many refreshes land within the run depends on
    how fast the refresh runs beside training (two alone, one in CI at stop 31), so the test counts
    the coordinator's attempts in the refresh log, which do not depend on it. The first refresh
    lands before the last step on any machine: the workers are held from step 24 until it ends
    (:func:`workers_held_until_a_refresh_lands`), having trained past its checkpoint meanwhile."""
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        *REFRESHED,
        *TWO_WORKERS,
        f"training.steps={STEPS}",
        "training.checkpoint_every=20",
        "training.negatives_check_every=2",
        "training.keep_checkpoints=4",
    )
    with workers_held_until_a_refresh_lands(run_dir, 24) as held:
        summary = run_training(config)

    assert summary.steps == STEPS
    steps = [e["step"] for e in read_events(run_dir, RunEvent.STEP)]
    assert steps == list(range(1, STEPS + 1))
    switches = read_events(run_dir, RunEvent.NEGATIVES)
    attempts = [a for a in read_log(run_dir).records if a.role == COORDINATOR_ROLE]
    assert switches, f"no refreshed negatives were used (held at {held}): {attempts}"
    assert attempts[0].outcome == "published", attempts
    # A newer checkpoint that asked for a refresh (one before the trainer's refreshes ended,
    # hnce.cluster.compute.refresh.modes.asynchronous) and was there a poll after the first refresh finished,
    # early enough for a refresh as fast as the first to publish before the end that every later
    # checkpoint expected (hnce.cluster.compute.refresh.job.publishes_late), was refreshed next
    # (published, or abandoned when training ended); never an older one.
    end_step = read_events(run_dir, RunEvent.REFRESHES_END)[0]["step"]
    later = [
        e for e in read_events(run_dir, RunEvent.CHECKPOINT) if e["step"] > attempts[0].checkpoint
    ]
    newer = [e["time"] for e in later if e["step"] < end_step]
    expected_ends = [e["training_ends_at"] for e in later if e["training_ends_at"] is not None]
    fastest = fastest_refresh_seconds(attempts)
    if newer and expected_ends and fastest is not None:
        polled = max(attempts[0].finished, newer[-1]) + POLL_SECONDS
        if polled + fastest + 1.0 < min(expected_ends):
            assert len(attempts) >= 2, attempts
    refreshed = [a.checkpoint for a in attempts]
    assert refreshed == sorted(set(refreshed)), refreshed
    versions = [s["version"] for s in switches]
    assert versions == sorted(set(versions))
    assert len(IndexStore(run_dir / "index").versions()) >= 1
    for switch in switches:
        # Steps were taken between publishing the checkpoint and using its negatives: the
        # trainer went on training while the refresh encoded, indexed and mined.
        assert switch["lag"] >= 1
        assert switch["step"] > switch["checkpoint_step"]
    assert switches[-1]["step"] < STEPS
    later = [e for e in read_events(run_dir, RunEvent.STEP) if e["step"] > switches[0]["step"]]
    assert later and all(e["negatives_version"] >= switches[0]["version"] for e in later)

    newest = newest_checkpoint(run_dir)
    assert newest is not None and newest[0] == STEPS
    assert (newest[1] / EXPORT_DIR / "scorer.json").is_file()


def test_stale_negatives_ask_for_the_only_refreshes_the_coordinator_runs(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    """``refresh.trigger: stale``: the checkpoints published because the loss on the current
    negatives fell to ``refresh.stale.loss_ratio`` of its first window ask for a refresh, the
    others (every ``checkpoint_every``) do not; the coordinator refreshes only those that ask,
    the first it takes up is the first request, its negatives go live, and any later request
    waits until the one before it is live. Nothing waits on the machine's speed: the workers are
    held at step 150 until that first refresh has ended (:func:`workers_held_until_a_refresh_lands`),
    so it lands with half the run left however slowly it runs. (Whether the loss on refreshed
    negatives falls far enough again for a second request depends on the tiny model's noisy
    loss; the trigger itself is exact in test_pipeline_refresh_handover.py and
    test_pipeline_staleness.py.)"""
    run_dir = tmp_path / "run"
    ratio, steps = 0.9, 300
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        *REFRESHED,
        f"training.steps={steps}",
        "training.checkpoint_every=50",
        "training.negatives_check_every=2",
        "training.keep_checkpoints=20",
        "negatives.initial=model",
        "refresh.trigger=stale",
        f"refresh.stale.loss_ratio={ratio}",
        "refresh.stale.window=4",
    )
    with workers_held_until_a_refresh_lands(run_dir, steps // 2):
        run_training(config)
    # one Ray node on CPUs: the trainer takes the refresh's core while no refresh works (the
    # first steps, before any stale request), and gives it back while one does
    assert read_events(run_dir, RunEvent.LAUNCH)[0]["cores"] == "handover"
    threads = [event["threads"] for event in read_events(run_dir, RunEvent.STEP)]
    assert threads[0] == node_cores() and set(threads) <= {1, node_cores()}, threads
    stale = read_events(run_dir, RunEvent.REFRESH_DECISION)
    assert {event["trigger"] for event in stale} == {"stale"}, stale
    requested = sorted(event["step"] for event in stale)
    assert requested and all(0 < e["loss_ratio"] <= ratio for e in stale), stale
    # a request at the last step asks nothing: no refresh would publish in time
    ended = [event["step"] for event in read_events(run_dir, RunEvent.REFRESHES_END)]
    assert ended and ended[0] <= steps
    asked_for = {step for step in requested if step < ended[0]}
    asks = {step: wants_refresh(path) for step, path in complete_checkpoints(run_dir)}
    assert {step for step, ask in asks.items() if ask} == asked_for
    published = set(range(50, steps + 1, 50)) | set(requested)
    assert {step for step, ask in asks.items() if not ask} == published - asked_for
    refreshed = [r for r in read_log(run_dir).records if r.outcome in ("published", "abandoned")]
    assert {r.checkpoint for r in refreshed} <= set(requested), refreshed
    # no newer request before the first is live: the first refresh taken up is the first request,
    # asked for before the hold, and it landed with steps left to switch to it
    assert requested[0] < steps // 2, requested
    assert refreshed and refreshed[0].checkpoint == requested[0], (requested, refreshed)
    switches = read_events(run_dir, RunEvent.NEGATIVES)
    assert requested[0] in {s["checkpoint_step"] for s in switches}, (requested, switches)
    # one request per version: the next comes only once the refresh it asked for is live
    for before, after in itertools.pairwise(requested):
        live = {s["checkpoint_step"] for s in switches if before < s["step"] <= after}
        assert before in live, (before, after, switches)


def brute_force_recall(config: Config, export_dir: Path) -> dict[int, float]:
    """Recall@``eval.ks`` on the eval split by scoring every mention against every entity of
    its domain with the exported model itself (no index)."""
    root = Path(config.data.root)
    mentions = MentionSplit.open(mention_split_path(root, config.data.eval_split)).read_all()
    catalogue = EntityCatalogue.open(root)
    scores = exact_scores(export_dir, root, mentions)
    domains = np.asarray(catalogue.domain_of().to_pylist())
    scores[domains[None, :] != np.asarray([m.domain for m in mentions])[:, None]] = -np.inf
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, : max(config.eval.ks)]
    hits = hits_at(ranked, [m.golds or (m.gold,) for m in mentions], config.eval.ks)
    return {k: float(hits[:, j].mean()) for j, k in enumerate(config.eval.ks)}


def test_recall_rises_over_the_untrained_model(tmp_path: Path, trained_run: TrainedRun) -> None:
    """The session's trained run (30 DeepSpeed steps of the tiny BERT on random negatives,
    ``training_helpers.build_trained_run``) beats its untrained model at R@1 and R@8 on the
    mentions it trained on, evaluated through the cluster in a directory of this test's own. (On
    held-out real text, with a real encoder, the same rise is the demo's figure: BENCHMARKS.md.)"""
    config = load_config(trained_run.run / "config.yaml", [f"run.dir={tmp_path / 'eval'}"])
    untrained = recall(config, None, "train")
    newest = newest_checkpoint(trained_run.run)
    assert newest is not None and newest[0] == TRAINED_RUN_STEPS
    trained = recall(config, newest[1] / EXPORT_DIR, "train")
    assert trained[1] > untrained[1] + 0.05, (untrained, trained)
    assert trained[8] > untrained[8], (untrained, trained)


def test_killed_worker_resumes_and_repeats_the_uninterrupted_run(
    tmp_path: Path, trained_run: TrainedRun, ray_session: str
) -> None:
    """A worker killed mid-run: Ray Train restarts the group, which resumes from the newest
    checkpoint and then draws exactly the mentions, and computes exactly the losses, of a run
    that was never interrupted: the session's trained run, whose recipe this run repeats with
    a checkpoint every 2 steps (publishing a checkpoint changes no draw and no number)."""
    run_dir = tmp_path / "run"
    config = load_config(
        trained_run.run / "config.yaml",
        [f"run.dir={run_dir}", "training.checkpoint_every=2", "training.max_failures=2"],
    )
    outcome: dict[str, object] = {}

    def train() -> None:
        try:
            outcome["summary"] = run_training(config)
        except Exception as error:  # surfaced by the assertion below
            outcome["error"] = error

    thread = threading.Thread(target=train)
    thread.start()
    deadline = time.time() + 300
    while not (checkpoint_dir(run_dir, 2) / "COMPLETE").is_file():
        assert time.time() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    os.kill(int((run_dir / "workers" / "rank-0.pid").read_text()), signal.SIGKILL)
    thread.join(timeout=600)

    assert "error" not in outcome, outcome
    resumes = read_events(run_dir, RunEvent.RESUME)
    assert resumes, "the restarted worker group did not resume from a checkpoint"
    resumed_at, restarted = resumes[0]["step"], resumes[0]["time"]
    steps = read_events(run_dir, RunEvent.STEP)
    killed_at = max(e["step"] for e in steps if e["time"] < restarted)
    # the newest checkpoint complete at the kill: at most one was being written then
    assert resumed_at % 2 == 0 and killed_at - 2 <= resumed_at <= killed_at, (resumed_at, killed_at)
    assert read_events(run_dir, RunEvent.END)[-1]["step"] == TRAINED_RUN_STEPS
    assert (checkpoint_dir(run_dir, TRAINED_RUN_STEPS) / "COMPLETE").is_file()
    after = [e for e in steps if e["time"] > restarted]
    assert [e["step"] for e in after] == list(range(resumed_at + 1, TRAINED_RUN_STEPS + 1))
    uninterrupted = {e["step"]: e for e in read_events(trained_run.run, RunEvent.STEP)}
    for event in after:
        same = uninterrupted[event["step"]]
        assert event["mentions"] == same["mentions"], event["step"]
        assert event["loss"] == same["loss"], event["step"]


def test_a_launch_killed_while_ray_train_wrote_its_snapshot_resumes_from_the_newest_checkpoint(
    tmp_path: Path, trained_run: TrainedRun, ray_session: str
) -> None:
    """Ray Train writes its checkpoint manager's snapshot in place; a launch killed mid-write
    leaves it empty (as CI once saw), and Ray Train refuses to start from it. The next launch of
    the same command discards that state and resumes from the newest complete checkpoint. The
    launch that left it is a copy of the session's trained run, under the same directory name
    (Ray Train's state is kept under the run directory's name)."""
    run_dir = tmp_path / trained_run.run.name
    shutil.copytree(trained_run.run, run_dir)
    snapshots = list((run_dir / "ray").rglob("checkpoint_manager_snapshot.json"))
    assert len(snapshots) == 1, snapshots
    snapshots[0].write_bytes(b"")

    longer = TRAINED_RUN_STEPS + 2
    config = load_config(
        run_dir / "config.yaml", [f"run.dir={run_dir}", f"training.steps={longer}"]
    )
    summary = run_training(config)

    assert summary.resumed_from == [TRAINED_RUN_STEPS]
    assert summary.steps == longer
    assert (checkpoint_dir(run_dir, longer) / "COMPLETE").is_file()


def test_sync_refreshes_hold_training_until_their_exactly_mined_negatives_are_live(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    """``refresh.mode: sync`` with ``negatives.initial: model``: the initial negatives come from
    the starting model, prepared while the workers start, before step 0, and at every checkpoint
    training waits for the negatives of that very checkpoint (lag 0), as the paper's own code
    does; the last checkpoint asks for no refresh (nothing would train on it), so every refresh
    runs while the trainer waits and can take its cores.

    poly-16 with hard negatives from the index: every version stores each entity's reduced
    vector and mines by exact scoring in the shard holders, and ``hnce eval`` of the newest
    checkpoint equals brute-force recall over every entity."""
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        "model.scorer={name: poly, m: 16}",
        *REFRESHED,
        "negatives.sampler=hard",
        "training.steps=24",
        "training.checkpoint_every=8",
        "training.keep_checkpoints=10",
        "negatives.initial=model",
        "refresh.mode=sync",
    )
    run_training(config)
    # the initial negatives were prepared while the workers started; the first step waited
    [ready] = read_events(run_dir, RunEvent.INITIAL_NEGATIVES)
    assert ready["initial"] == "model" and "error" not in ready
    [waited] = read_events(run_dir, RunEvent.INITIAL_NEGATIVES_WAIT)
    assert waited["step"] == 0
    switches = read_events(run_dir, RunEvent.NEGATIVES)
    assert [(s["step"], s["checkpoint_step"], s["lag"]) for s in switches] == [
        (0, 0, 0),
        (8, 8, 0),
        (16, 16, 0),
    ]
    waits = read_events(run_dir, RunEvent.REFRESH_WAIT)
    assert [w["step"] for w in waits] == [8, 16]
    asks = {step: wants_refresh(path) for step, path in complete_checkpoints(run_dir)}
    assert asks == {8: True, 16: True, 24: False}, asks
    refreshed = {r.checkpoint for r in read_log(run_dir).records if r.outcome == "published"}
    assert refreshed <= {8, 16}, refreshed
    steps = read_events(run_dir, RunEvent.STEP)
    assert all(e["negatives_version"] == (e["step"] - 1) // 8 for e in steps), steps
    indexes = IndexStore(run_dir / "index")
    assert {indexes.open(number).mining for number in indexes.versions()} == {"exact"}

    report = evaluate_checkpoint(config, "newest")
    newest = newest_checkpoint(run_dir)
    assert newest is not None and newest[0] == 24
    assert report.recall == brute_force_recall(config, newest[1] / EXPORT_DIR)


def test_the_initial_index_is_taken_over_from_an_evaluation_of_the_untrained_model(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    ray_session: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``hnce eval --checkpoint untrained`` (the demo's untrained row) and then a run whose
    initial negatives come from that same model: its index version 0 is the evaluation's index,
    its files linked (nothing encoded again), and the initial negatives are mined from it."""
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir, small_dataset, syllable_bert, *REFRESHED, "negatives.initial=model"
    )
    untrained = evaluate_checkpoint(config, "untrained")
    evaluations = IndexStore(run_dir / "eval-index")
    [number] = evaluations.versions()
    evaluated = evaluations.open(number)
    with caplog.at_level("INFO", logger="hnce.cluster.stores.index_store"):
        prepare_initial_negatives(refresh_plan(config), initial_request(config, "model"))
    assert "index v0 taken over from" in caplog.text
    version_zero = IndexStore(run_dir / "index").open(0)
    assert version_zero.checkpoint == 0
    assert version_zero.shard_checksums == evaluated.shard_checksums
    for shard in evaluated.manifest.shards:
        taken = (version_zero.path / shard.file).stat().st_ino
        assert taken == (evaluated.path / shard.file).stat().st_ino
    assert NegativesStore(run_dir / "negatives").current_version() == 0
    # and evaluating the untrained model again finds the version in the run's own store
    assert evaluate_checkpoint(config, "untrained").recall == untrained.recall


@pytest.mark.timeout(240)  # workers that ignored the failure would wait for it forever
def test_failing_initial_negatives_stop_the_waiting_workers_and_reach_the_driver(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    ray_session: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The initial negatives are prepared in the driver while Ray Train starts the workers, which
    hold their first step for them: when they fail, the workers stand down without a step (no
    random-negative training in their place, no worker restarts) and ``run_training`` raises
    the error."""
    import hnce.cluster.compute.refresh.initial as initial

    def fail(
        plan: object, request: InitialRequest, trainer: object = None, stopping: object = None
    ) -> None:
        raise OSError(f"planted: {request.source} initial negatives unreadable")

    monkeypatch.setattr(initial, "prepare_initial_negatives", fail)
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        *REFRESHED,
        "training.steps=8",
        "training.max_failures=1",
        "negatives.initial=model",
    )
    with pytest.raises(OSError, match="planted: model initial negatives unreadable"):
        run_training(config)
    assert read_events(run_dir, RunEvent.START), "the workers started"
    assert not read_events(run_dir, RunEvent.STEP) and not read_events(run_dir, RunEvent.END)
    assert not read_events(run_dir, RunEvent.INITIAL_NEGATIVES_WAIT)
    [failed] = read_events(run_dir, RunEvent.INITIAL_NEGATIVES)
    assert failed["error"] == "OSError: planted: model initial negatives unreadable"


@pytest.mark.timeout(240)
def test_a_failing_trainer_abandons_the_initial_negatives_before_its_error_is_raised(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    ray_session: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainer fails while the initial negatives are still being built beside it: the build is
    told to stop and has ended (its encoder actors released) when ``run_training`` raises the
    trainer's error, so nothing of the run goes on in the driver's process."""
    import hnce.cluster.compute.refresh.initial as initial
    import hnce.pipeline.train.trainer as trainer

    building, stopped = threading.Event(), threading.Event()

    def build_until_stopped(*args: object, stopping: Callable[[], bool], **kwargs: object) -> None:
        building.set()
        deadline = time.monotonic() + 60  # the unstopped build of a broken abandon ends here
        while time.monotonic() < deadline:
            if stopping():
                stopped.set()
                raise StopRequested("planted build: stopped within a batch")
            time.sleep(0.05)

    def worker_dies(*args: object) -> None:
        assert building.wait(120), "the initial negatives never started"
        raise RuntimeError("planted: the worker group failed")

    monkeypatch.setattr(initial, "index_entities", build_until_stopped)
    monkeypatch.setattr(trainer, "fit_interruptibly", worker_dies)
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        *REFRESHED,
        "negatives.initial=model",
        "refresh.enabled=false",
    )
    with pytest.raises(RuntimeError, match="planted: the worker group failed"):
        run_training(config)
    assert stopped.is_set()
    assert not [t for t in threading.enumerate() if t.name == "initial-negatives"]
    assert IndexStore(run_dir / "index").current() is None  # nothing half-built was published
