"""``hnce status RUN_DIR``: the state of a run on one screen, for an operator (docs/refresh.md).

Read from the run directory alone (no Ray, no recipe, nothing written), so it works from any
machine that mounts the run's storage, while training or a refresh runs:

- training: the last step logged and whether the run ended, stopped or is going on;
- checkpoints kept and the newest, with when it was written;
- the live index and negatives versions and the checkpoints they came from;
- the lag: steps from the negatives' checkpoint to the newest one, and minutes the newest has
  waited for its refresh; none for a newest checkpoint that asks for no refresh (its state's
  ``refresh`` and ``refreshes_end``), such as the last checkpoint of a run that ended, which by
  design no refresh of the training run takes;
- the last refresh that ran (outcome, checkpoint, duration, who ran it), refreshes published
  and failed, failures in a row;
- the last held-out recall a refresh scored (``refresh.heldout_recall``);
- which checkpoints are refreshed (``refresh.trigger`` in the run's ``config.yaml``) and the
  trigger's decisions: how many asked, and the last (its line,
  :mod:`hnce.cluster.compute.refresh.triggers`);
- who holds the run's refresh lock, and what it is encoding;
- disk use of each store under the run (checkpoints, index, negatives, tokens, Ray Train's
  state) and of the rest.

:func:`run_status` gathers a :class:`RunStatus`; :meth:`RunStatus.render` is the screen and
:meth:`RunStatus.to_json` the same for monitoring (``hnce status --json``). :func:`plot_training`
(``hnce status --plot FILE.png``, the one file it writes) draws the loss, the negatives lag and the
held-out recall against steps and wall-clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.cluster.stores.checkpoints import (
    CHECKPOINTS_DIR,
    COMPLETE,
    complete_checkpoints,
    refresh_requests,
)
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.index_store import INDEX_DIR, IndexStore
from hnce.cluster.stores.jsonl import finite_json
from hnce.cluster.stores.lock_holder import TRAINING, LockHolder, read_holder
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR, NegativesVersion
from hnce.cluster.stores.refresh_log import HeldoutRecall, RefreshLog, RefreshRecord, read_log
from hnce.cluster.stores.run_events import LOG_FILE, read_events
from hnce.cluster.stores.versioned_dir import read_current, version_dir_name
from hnce.errors import InputError
from hnce.events import RunEvent
from hnce.pipeline.config import read_recipe
from hnce.pipeline.run import RUN_RECIPE

STORES = (CHECKPOINTS_DIR, INDEX_DIR, NEGATIVES_DIR, "tokens", "ray")
_MIB = 1024 * 1024


@dataclass
class RunStatus:
    """What ``hnce status`` reports; fields are None where the run has none yet."""

    run_dir: str
    checked_at: float
    training: dict[str, Any] | None
    checkpoints: list[int]
    newest_checkpoint: dict[str, Any] | None
    index: dict[str, Any] | None
    negatives: dict[str, Any] | None
    lag_steps: int | None
    lag_minutes: float | None
    last_refresh: dict[str, Any] | None
    refreshes: dict[str, int]
    lock_holder: dict[str, Any] | None
    training_holder: dict[str, Any] | None = None
    heldout_recall: dict[str, Any] | None = None
    refresh_trigger: dict[str, Any] | None = None
    disk_bytes: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Strict JSON (a NaN loss is null)."""
        return finite_json(asdict(self))

    def render(self) -> str:
        """The operator's screen: one line per concern."""
        rows = [
            ("run", self.run_dir),
            ("training", _training_line(self.training)),
            ("checkpoints", _checkpoints_line(self.checkpoints, self.newest_checkpoint)),
            ("index", _version_line(self.index)),
            ("negatives", _version_line(self.negatives)),
            (
                "lag",
                _lag_line(self.lag_steps, self.lag_minutes, self.newest_checkpoint, self.training),
            ),
            ("last refresh", _refresh_line(self.last_refresh)),
            (
                "refreshes",
                f"{self.refreshes['published']} published, {self.refreshes['failed']} failed "
                f"({self.refreshes['failures_in_a_row']} in a row)",
            ),
            ("held-out", _heldout_line(self.heldout_recall)),
            ("trigger", _trigger_line(self.refresh_trigger)),
            ("refresh lock", _holder_line(self.lock_holder)),
            ("training lock", _holder_line(self.training_holder)),
            ("disk", _disk_line(self.disk_bytes)),
            *(("problem", problem) for problem in self.problems),
        ]
        return "\n".join(f"{name:<13} {value}" for name, value in rows)


def run_status(run_dir: Path) -> RunStatus:
    """Gather the status of the run in ``run_dir`` (InputError when it is not a run)."""
    run_dir = Path(run_dir)
    if not any((run_dir / name).exists() for name in (CHECKPOINTS_DIR, INDEX_DIR, RUN_RECIPE)):
        raise InputError(
            f"{run_dir}: not a run directory (no {CHECKPOINTS_DIR}/, {INDEX_DIR}/ or config.yaml)"
        )
    now = time.time()
    problems: list[str] = []

    def read(what: str, reader: Callable[[], Any]) -> Any:
        """``reader()``, or None with the problem recorded: a corrupt or half-written run file
        is reported on its own line, never the end of ``hnce status``."""
        try:
            return reader()
        except (InputError, OSError, ValueError, KeyError, TypeError, IndexError) as error:
            problems.append(f"{what}: {error}")
            return None

    checkpoints = read("checkpoints", lambda: complete_checkpoints(run_dir)) or []
    newest = None
    if checkpoints:
        step, directory = checkpoints[-1]
        asks = read("newest checkpoint", lambda: _asks_for_refresh(checkpoints[-1]))
        newest = {
            "step": step,
            "written_at": (directory / COMPLETE).stat().st_mtime,
            "asks_for_refresh": asks is not False,  # unreadable: as a checkpoint that asks
        }
    negatives = read("negatives", lambda: _live_negatives(run_dir / NEGATIVES_DIR))
    index = read("index", lambda: _live_index(run_dir / INDEX_DIR))
    live = negatives or index
    lag_steps = lag_minutes = None
    if newest is not None and live is not None:
        lag_steps = newest["step"] - live["checkpoint"]
        waited = (now - newest["written_at"]) / 60 if newest["asks_for_refresh"] else None
        lag_minutes = waited if lag_steps > 0 else 0.0
    log = read("refresh log", lambda: read_log(run_dir, problems=problems)) or RefreshLog()
    records = log.records
    holder = read("lock", lambda: read_holder(run_dir))
    trainer = read("training lock", lambda: read_holder(run_dir, TRAINING))
    return RunStatus(
        run_dir=str(run_dir),
        checked_at=now,
        training=read("training log", lambda: _training(run_dir)),
        checkpoints=[step for step, _ in checkpoints],
        newest_checkpoint=newest,
        index=index,
        negatives=negatives,
        lag_steps=lag_steps,
        lag_minutes=lag_minutes,
        last_refresh=records[-1].to_json() if records else None,
        refreshes=_refresh_counts(records),
        lock_holder=_holder(holder),
        training_holder=_holder(trainer),
        heldout_recall=asdict(log.heldout[-1]) if log.heldout else None,
        refresh_trigger=read("refresh trigger", lambda: _refresh_trigger(run_dir)),
        disk_bytes=read("disk", lambda: _disk_use(run_dir)) or {},
        problems=problems,
    )


def _asks_for_refresh(checkpoint: tuple[int, Path]) -> bool:
    """Whether the newest checkpoint asks for a refresh, and so waits for one
    (:func:`~hnce.cluster.stores.checkpoints.refresh_requests`): a checkpoint from which no
    refresh would publish before training ends (under the asynchronous refresh the trainer's last
    one always) asks for none."""
    return bool(refresh_requests([checkpoint]))


def _holder(holder: LockHolder | None) -> dict[str, Any] | None:
    return None if holder is None else {**asdict(holder), "by": holder.describe()}


def _holder_line(holder: dict[str, Any] | None) -> str:
    return "free" if holder is None else f"held by {holder['by']}"


def _live_index(root: Path) -> dict[str, Any] | None:
    store = IndexStore(root)
    version = store.current_version()
    if version is None:
        return None
    manifest = store.read_manifest(version)
    return {
        "version": version,
        "checkpoint": int(manifest["checkpoint"]),
        "created_at": manifest["created_at"],
    }


def _live_negatives(root: Path) -> dict[str, Any] | None:
    version = read_current(root)
    if version is None:
        return None
    splits = sorted((root / version_dir_name(version)).glob("*.parquet"))
    mined = NegativesVersion(splits[0])
    return {
        "version": version,
        "checkpoint": mined.checkpoint_step,
        "splits": [path.stem for path in splits],
    }


def _training(run_dir: Path) -> dict[str, Any] | None:
    """The last step logged and whether the run ended, stopped, or is going on."""
    events = read_events(run_dir)
    steps = [event for event in events if event["event"] == RunEvent.STEP]
    stops = (RunEvent.REFRESH_STOP, RunEvent.NONFINITE_STOP)
    lifecycle = [
        e for e in events if e["event"] in (RunEvent.START, RunEvent.RESUME, RunEvent.END, *stops)
    ]
    if not lifecycle:
        return None
    last = lifecycle[-1]
    state = (
        "ended" if last["event"] == RunEvent.END else "stopped" if last["event"] in stops else None
    )
    state = state or "running or interrupted"
    return {
        "state": state,
        "step": int(steps[-1]["step"]) if steps else int(last["step"]),
        "last_event_at": events[-1]["time"],
        "cause": last.get("cause"),
    }


def _refresh_trigger(run_dir: Path) -> dict[str, Any] | None:
    """``refresh.trigger`` of the run's ``config.yaml`` (None without one), how many of its
    decisions asked for a refresh, and the trigger's line of them
    (:class:`~hnce.cluster.compute.refresh.policy.TriggerSpec`'s ``summary``)."""
    path = run_dir / RUN_RECIPE
    if not path.is_file():
        return None
    recipe, _ = read_recipe(path)
    refresh = recipe.get("refresh") or {}
    if not isinstance(refresh, dict):
        raise InputError(f"{path}: refresh is not a section of settings")
    trigger = refresh.get("trigger", "payoff")
    spec = TRIGGER_SPECS.get(trigger)
    if spec is None:
        raise InputError(f"{path}: refresh.trigger {trigger!r} is not a trigger")
    decisions = [
        decision
        for decision in read_events(run_dir, RunEvent.REFRESH_DECISION)
        if decision.get("trigger", trigger) == trigger
    ]
    return {
        "trigger": trigger,
        "requests": sum(1 for decision in decisions if decision.get("refresh")),
        "summary": spec.summary(decisions) if spec.summary is not None else trigger,
    }


def _refresh_counts(records: list[RefreshRecord]) -> dict[str, int]:
    return {
        "published": sum(record.outcome == "published" for record in records),
        "failed": sum(record.outcome == "failed" for record in records),
        "failures_in_a_row": records[-1].consecutive_failures if records else 0,
    }


def _disk_use(run_dir: Path) -> dict[str, int]:
    """Bytes allocated per store under the run, the rest as ``other``, and ``total``."""
    use = {name: _allocated(run_dir / name) for name in STORES if (run_dir / name).exists()}
    total = _allocated(run_dir)
    return {**use, "other": total - sum(use.values()), "total": total}


def _allocated(path: Path) -> int:
    """Bytes allocated on disk to the files under ``path`` (like ``du``)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:  # removed by retention while we walked
                continue
    return total


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _training_line(training: dict[str, Any] | None) -> str:
    if training is None:
        return "no training logged"
    line = f"step {training['step']}, {training['state']} (last event {_clock(training['last_event_at'])})"
    return line + (f": {training['cause']}" if training["cause"] else "")


def _checkpoints_line(steps: list[int], newest: dict[str, Any] | None) -> str:
    if newest is None:
        return "none complete"
    kept = ", ".join(f"step-{step}" for step in steps)
    return f"{len(steps)} kept ({kept}); newest step-{newest['step']} written {_clock(newest['written_at'])}"


def _version_line(live: dict[str, Any] | None) -> str:
    if live is None:
        return "none published"
    line = f"v{live['version']} from step-{live['checkpoint']}"
    if "created_at" in live:
        line += f", created {live['created_at']}"
    if "splits" in live:
        line += f", splits {', '.join(live['splits'])}"
    return line


def _lag_line(
    steps: int | None,
    minutes: float | None,
    newest: dict[str, Any] | None,
    training: dict[str, Any] | None,
) -> str:
    if steps is None or newest is None:
        return "unknown (no checkpoint or no refresh yet)"
    if steps <= 0:
        return "0 steps: the newest checkpoint is live"
    if minutes is not None:
        return f"{steps} steps; the newest checkpoint has waited {minutes:.1f} min for its refresh"
    if training is not None and training["state"] == "ended":
        return (
            f"{steps} steps; the run ended at step {training['step']} (its end event), and its "
            f"last checkpoint step-{newest['step']} is not refreshed by design: nothing trains on "
            f"what a refresh of it would mine (hnce refresh refreshes it on demand)"
        )
    return (
        f"{steps} steps; the newest checkpoint step-{newest['step']} asks for no refresh (none "
        f"would publish before training ends, or refresh.trigger: stale did not ask)"
    )


def _refresh_line(record: dict[str, Any] | None) -> str:
    if record is None:
        return "none recorded"
    line = f"{record['outcome']}, step-{record['checkpoint']}"
    if record["outcome"] == "published":
        line += f" → index v{record['index_version']}, negatives v{record['negatives_version']}"
    elif record["outcome"] != "up-to-date":
        line += f": {record['message']}"
    return f"{line}, {record['seconds']:.1f} s, by {record['role']} at {_clock(record['started'])}"


def _heldout_line(heldout: dict[str, Any] | None) -> str:
    if heldout is None:
        return "none recorded (refresh.heldout_recall)"
    return f"{HeldoutRecall(**heldout).line()} at {_clock(heldout['time'])}"


def _trigger_line(trigger: dict[str, Any] | None) -> str:
    if trigger is None:
        return "unknown (no config.yaml in the run)"
    return str(trigger["summary"])


def _disk_line(disk: dict[str, int]) -> str:
    parts = [f"{name} {size / _MIB:.1f} MiB" for name, size in disk.items() if name != "total"]
    return f"{', '.join(parts)}; total {disk['total'] / _MIB:.1f} MiB"


@dataclass
class Series:
    """One line of a plot: its label and its points' steps, minutes since the run started and
    values."""

    label: str
    steps: list[float] = field(default_factory=list)
    minutes: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def training_panels(run_dir: Path) -> list[tuple[str, list[Series]]]:
    """What :func:`plot_training` draws, one panel per quantity: the loss and the negatives lag
    of the ``step`` events, and held-out recall@k when refreshes scored it (the refresh log's
    ``heldout_recall`` lines, at the step of the checkpoint scored). InputError when the run
    has logged no step."""
    events = read_events(run_dir)
    steps = [event for event in events if event["event"] == RunEvent.STEP]
    if not steps:
        raise InputError(
            f"{Path(run_dir) / LOG_FILE}: no step logged yet; nothing to plot (has the run "
            f"trained a step?)"
        )
    origin = events[0]["time"]
    loss, lag = Series("loss"), Series("negatives lag")
    for event in steps:
        for series, value in ((loss, event.get("loss")), (lag, event.get("lag"))):
            if value is not None:
                _add_point(series, event["step"], (event["time"] - origin) / 60, value)
    recall: dict[str, Series] = {}
    for heldout in read_log(run_dir).heldout:
        for k, value in heldout.recall.items():
            series = recall.setdefault(k, Series(f"R@{k}"))
            _add_point(series, heldout.step, (heldout.time - origin) / 60, value)
    panels = [("loss", [loss]), ("negatives lag (steps)", [lag])]
    if recall:
        ordered = [recall[k] for k in sorted(recall, key=int)]
        panels.append(("held-out recall", ordered))
    return panels


def _add_point(series: Series, step: float, minutes: float, value: float) -> None:
    series.steps.append(step)
    series.minutes.append(minutes)
    series.values.append(value)


def plot_training(run_dir: Path, out: Path) -> Path:
    """Draw :func:`training_panels` against steps (left) and minutes since the run's first event
    (right) into the PNG ``out``, published atomically; returns ``out``."""
    from matplotlib.figure import Figure  # no pyplot: no display, no global state

    panels = training_panels(run_dir)
    figure = Figure(figsize=(11, 3 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 2, squeeze=False)
    for row, (quantity, lines) in enumerate(panels):
        for column, (axis, label) in enumerate((("steps", "step"), ("minutes", "minutes"))):
            plot = axes[row][column]
            for series in lines:
                plot.plot(getattr(series, axis), series.values, marker=".", label=series.label)
            plot.set_xlabel(label)
            plot.set_ylabel(quantity)
            if len(lines) > 1:
                plot.legend()
    figure.suptitle(str(run_dir))
    with AtomicPath(out) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
    return Path(out)
