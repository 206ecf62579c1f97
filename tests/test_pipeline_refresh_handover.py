"""A worker's side of the refreshes on its own (:mod:`hnce.cluster.compute.refresh.handover`):
no engine, no micro-batch, no process group; the negatives it reads and switches are a stand-in
whose versions arrive one switch at a time. The triggers and modes are driven step by step, so
nothing here depends on the machine's speed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from training_helpers import CONFIGS, REFRESHED

from hnce.cluster.compute.refresh import handover as handover_module
from hnce.cluster.compute.refresh.drawn import NegativeFreshness
from hnce.cluster.compute.refresh.handover import Cadence, RefreshHandover
from hnce.cluster.compute.refresh.initial import initial_negatives_error
from hnce.cluster.stores.checkpoints import REFRESH_REQUEST, REFRESHES_END, TRAINING_ENDS_AT
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import load_config
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.task import TrainingTask


@pytest.fixture(autouse=True)
def quick_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting worker looks again at once: the stand-in's versions arrive one look at a time."""
    monkeypatch.setattr(handover_module, "WAIT_POLL_SECONDS", 0.01)


@dataclass
class Version:
    """A negatives version: its number and the step of the checkpoint it was mined with."""

    version: int
    checkpoint_step: int


@dataclass
class Source:
    """The version in use (None before the first)."""

    current: Version | None = None

    @property
    def version(self) -> int:
        return -1 if self.current is None else self.current.version


@dataclass
class ArrivingNegatives:
    """Negatives whose next version (mined with the checkpoint of the next of ``arrivals``, or
    none where it says None) is live after each switch; ``switches``: the steps it switched at."""

    arrivals: list[int | None] = field(default_factory=list)
    source: Source = field(default_factory=Source)
    switches: list[int] = field(default_factory=list)
    freshness: NegativeFreshness = field(default_factory=NegativeFreshness)

    def switch(self, step: int, log: EventLog | None) -> None:
        self.switches.append(step)
        checkpoint = self.arrivals.pop(0) if self.arrivals else None
        if checkpoint is not None:
            self.source.current = Version(self.source.version + 1, checkpoint)


def handover(
    tmp_path: Path,
    *overrides: str,
    arrivals: tuple[int | None, ...] = (),
    since: float | None = None,
) -> tuple[RefreshHandover, ArrivingNegatives]:
    """The retriever's hand-over on the test recipe with its refresh (12 steps, a checkpoint every 4, a look
    for negatives every 3), rank 0 of a lone worker, logging to ``tmp_path``."""
    config = load_config(
        CONFIGS / "synthetic-test.yaml",
        [
            f"run.dir={tmp_path}",
            *REFRESHED,
            "training.steps=12",
            "training.checkpoint_every=4",
            "training.negatives_check_every=3",
            *overrides,
        ],
    )
    negatives = ArrivingNegatives(list(arrivals))
    task = TrainingTask.retriever(config)
    settings = task.settings(config)
    cadence = Cadence(settings.steps, settings.negatives_check_every, settings.checkpoint_every)
    refresh = config.refresh if task.refreshes(config) else None
    log = EventLog(tmp_path)
    collectives = Collectives(torch.device("cpu"))
    return RefreshHandover(
        refresh, cadence, tmp_path, collectives, log, negatives, since
    ), negatives


def asks(run: RefreshHandover, step: int, asked: bool = False) -> bool:
    """Whether the checkpoint of ``step`` asks the coordinator for a refresh."""
    return bool(run.checkpoint_request(step, asked)[REFRESH_REQUEST])


def test_a_worker_looks_for_newer_negatives_every_few_steps_and_at_each_start(
    tmp_path: Path,
) -> None:
    """``negatives_check_every`` 3: steps 0, 3, 6 and 9, and the first step of a resume (5);
    asynchronous refreshes never make it wait, and every checkpoint asks for one."""
    run, negatives = handover(tmp_path)
    assert not any(run.poll(step, first=step == 0) for step in range(12))
    assert not run.poll(5, first=True)
    assert negatives.switches == [0, 3, 6, 9, 5]
    assert [step for step in range(1, 13) if run.publishes_at(step)] == [4, 8, 12]
    assert read_events(tmp_path, RunEvent.REFRESH_WAIT) == []


def test_with_trigger_checkpoints_every_checkpoint_asks_until_the_last(tmp_path: Path) -> None:
    """``refresh.trigger: checkpoints``: each checkpoint asks, none logs a decision."""
    run, _ = handover(tmp_path, "refresh.trigger=checkpoints")
    assert [asks(run, step) for step in (4, 8, 12)] == [True, True, False]
    assert read_events(tmp_path, RunEvent.REFRESH_DECISION) == []


def test_a_sync_worker_waits_for_the_negatives_of_its_checkpoint(tmp_path: Path) -> None:
    """``refresh.mode: sync``: at each checkpoint (every 4 steps) training waits until a version
    mined with that checkpoint is live (an older one does not do); every checkpoint but the last
    asks for its refresh (nothing would train on the last one's)."""
    run, negatives = handover(tmp_path, "refresh.mode=sync", arrivals=(None, 0, None, 4))
    assert run.trigger is not None and run.trigger_name == "checkpoints"
    assert not run.poll(3)
    assert not run.poll(4)
    assert negatives.switches == [3, 4, 4, 4] and negatives.source.current == Version(1, 4)
    (wait,) = read_events(tmp_path, RunEvent.REFRESH_WAIT)
    assert wait["step"] == 4 and wait["seconds"] > 0
    assert [step for step in range(1, 13) if run.publishes_at(step)] == [4, 8, 12]
    assert [asks(run, step) for step in (4, 8, 12)] == [True, True, False]


def test_a_checkpoint_asks_for_no_refresh_once_refreshes_end(tmp_path: Path) -> None:
    """The last checkpoint ends the run's refreshes (nothing would train on them): its state
    asks for none and says so, and only the first checkpoint that ends them logs why."""
    run, _ = handover(tmp_path)
    assert run.checkpoint_request(4) == {
        REFRESH_REQUEST: True,
        REFRESHES_END: False,
        TRAINING_ENDS_AT: None,
    }
    for _ in range(2):
        request = run.checkpoint_request(12)
        assert request[REFRESHES_END] and not request[REFRESH_REQUEST]
    assert [e["step"] for e in read_events(tmp_path, RunEvent.REFRESHES_END)] == [12]


def test_stale_negatives_make_their_checkpoint_ask_for_a_refresh(tmp_path: Path) -> None:
    """``refresh.trigger: stale``: once the loss on a version falls to the ratio, the next look
    (every 3 steps) finds it stale, logs why (a ``refresh_decision`` of the stale trigger), and
    the checkpoint published for it asks; the version is asked for once, and the checkpoints of
    the cadence do not ask."""
    run, negatives = handover(
        tmp_path,
        "refresh.trigger=stale",
        "refresh.stale.window=1",
        "refresh.stale.loss_ratio=0.5",
        arrivals=(0,),
    )
    run.poll(0, first=True)
    losses = [4.0, 4.0, 1.0, 1.0, 1.0, 1.0]
    stale = [run.after_step(step, loss, 1.0) for step, loss in enumerate(losses, 1)]
    assert stale == [False, False, True, False, False, False]
    (event,) = read_events(tmp_path, RunEvent.REFRESH_DECISION)
    assert event["trigger"] == "stale" and event["loss_ratio"] == 0.25
    assert (event["step"], event["version"]) == (3, negatives.source.version)
    assert asks(run, 3, asked=True) and not asks(run, 4)


def test_with_trigger_payoff_a_checkpoint_asks_when_the_negatives_it_drew_have_aged(
    tmp_path: Path,
) -> None:
    """``refresh.trigger: payoff`` (A = 6, 24 steps of 0.5 s, the initial negatives took 1 s: 2 steps): the
    checkpoint of step 4 drew negatives 2 steps old and asks for nothing; that of step 8 drew
    them 7 steps old (its own draws only) and asks; each decision is an event with its numbers."""
    run, negatives = handover(
        tmp_path, "refresh.trigger=payoff", "refresh.payoff.max_negative_age=6", "training.steps=24"
    )
    EventLog(tmp_path).write(RunEvent.INITIAL_NEGATIVES, initial="model", seconds=1.0, encoded=True)
    hard = torch.ones(2, 3, dtype=torch.bool)
    for step, age in enumerate([2, 2, 2, 2, 7, 7, 7, 7], 1):
        negatives.freshness.observe(hard, torch.full((2, 3), age))
        run.after_step(step, loss=1.0, seconds=0.5)
        if step in (4, 8):
            assert run.checkpoint_request(step)[REFRESH_REQUEST] == (step == 8)
    decisions = read_events(tmp_path, RunEvent.REFRESH_DECISION)
    assert [(d["step"], d["refresh"], d["reason"], d["mean_age"]) for d in decisions] == [
        (4, False, "fresh", 2.0),
        (8, True, "pays", 7.0),
    ]
    assert (decisions[1]["latency_steps"], decisions[1]["steps_left"]) == (2.0, 16)
    assert decisions[1]["hard_negatives"] == 24
    assert decisions[1]["cost_source"] == "initial negatives"
    assert {d["trigger"] for d in decisions} == {"payoff"}


def test_the_first_step_waits_for_the_initial_negatives_or_stands_down_when_they_failed(
    tmp_path: Path,
) -> None:
    """The initial negatives prepared beside the workers' start: the first step waits for them
    (an ``initial_negatives_wait`` event); when the driver reports that it failed, the worker
    stands down instead; without such a driver nothing waits."""
    ready, negatives = handover(tmp_path / "ready", arrivals=(None, None, 0), since=0.0)
    assert not ready.wait_for_initial_negatives(0)
    assert negatives.switches == [0, 0, 0]
    assert [
        e["step"] for e in read_events(tmp_path / "ready", RunEvent.INITIAL_NEGATIVES_WAIT)
    ] == [0]
    failing, _ = handover(tmp_path / "failing", since=0.0)
    EventLog(tmp_path / "failing").write(RunEvent.INITIAL_NEGATIVES, error="no index")
    assert initial_negatives_error(tmp_path / "failing", 0.0) == "no index"
    assert failing.wait_for_initial_negatives(0)
    unprepared, negatives = handover(tmp_path / "unprepared")
    assert not unprepared.wait_for_initial_negatives(0) and negatives.switches == []
