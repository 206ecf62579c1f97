"""Resumable stages: a long benchmark records each finished stage, with its wall time, in a
state file, and a run started again skips what is done and says how long each stage took.

The state file (JSON, written atomically after every change by
``hnce.cluster.stores.files.atomic_write_json``) holds the run's identity (``meta``: the sizes
that make two runs comparable; a state file of another run is refused), one record per finished
stage (``seconds``, ``done``, ``notes`` and whatever the stage returned) and the attempts of the
stage under way. A stage that was interrupted (a session that ended, a killed process) is run
again; its wall time is then the sum of its attempts, the gaps between them excluded: an
interrupted attempt counts up to its last sign of activity (``last_activity``: the newest
modification time of its logs), and the stage's notes list the interrupted attempts.

Example::

    state = StageState(work / "state.json", {"entities": 1000}).load()
    if not state.done("index"):
        state.run("index", lambda: {"rates": build_index()})   # timed, recorded, saved
    result = state.once("peer", train_peer)     # a cached result: computed once, then read back
    print(state.stages["index"]["seconds"])
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.harness.timing import Timer
from hnce.cluster.stores.files import atomic_write_json

Record = dict[str, Any]
INTERRUPTED = "interrupted attempts (seconds each, included in the wall time)"
LOAD = "load average (5 min) before/after"


def last_modified(paths: Iterable[Path]) -> float:
    """The newest modification time of the files among ``paths`` (0 when there is none)."""
    return max((path.stat().st_mtime for path in paths if path.is_file()), default=0.0)


class StageState:
    """The state file of one benchmark run: its ``meta``, finished ``stages`` (name: record)
    and the ``attempts`` of unfinished ones."""

    def __init__(
        self,
        path: Path,
        meta: dict[str, Any] | None = None,
        compare: Sequence[str] | None = None,
        absent: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.meta = dict(meta or {})
        self.compare = list(self.meta if compare is None else compare)
        self.absent = dict(absent or {})  # what a field means in a file written before it existed
        self.stages: dict[str, Record] = {}
        self.attempts: dict[str, dict[str, Any]] = {}

    def load(self) -> StageState:
        """Read the state file when there is one; exits when it is another run's (its ``compare``
        fields differ)."""
        if not self.path.is_file():
            return self
        saved = json.loads(self.path.read_text(encoding="utf-8"))
        saved = {**self.absent, **saved}
        differing = {
            key: saved.get(key) for key in self.compare if saved.get(key) != self.meta[key]
        }
        if differing:
            raise SystemExit(
                f"{self.path}: a run of {differing}, not { ({k: self.meta[k] for k in differing}) }; "
                "use another work directory"
            )
        self.stages = saved.get("stages", {})
        self.attempts = saved.get("attempts", {})
        return self

    def save(self) -> None:
        """Write the state file atomically."""
        state = {**self.meta, "stages": self.stages, "attempts": self.attempts}
        atomic_write_json(self.path, state)

    def done(self, name: str) -> bool:
        """Whether stage ``name`` has finished."""
        return bool(self.stages.get(name, {}).get("done"))

    def begin(self, name: str, last_activity: Callable[[], float] | None = None) -> None:
        """Record that ``name`` starts (again); an earlier attempt that never finished counts up
        to ``last_activity()`` (its logs' newest modification time), or not at all without one."""
        attempt = self.attempts.setdefault(name, {"started": None, "interrupted_seconds": []})
        if attempt["started"] is not None and last_activity is not None:
            ended = last_activity()
            attempt["interrupted_seconds"].append(max(0.0, ended - attempt["started"]))
        attempt["started"] = time.time()
        self.save()

    def finish(self, name: str, record: Record, load_before: float | None = None) -> Record:
        """Mark ``name`` done with ``record``: interrupted attempts added to its ``seconds`` and
        listed in its notes, with the load average before/after when ``load_before`` is given."""
        interrupted = self.attempts.pop(name, {}).get("interrupted_seconds", [])
        notes = record.setdefault("notes", {})
        if interrupted:
            record["seconds"] += sum(interrupted)
            notes[INTERRUPTED] = [round(seconds, 1) for seconds in interrupted]
        if load_before is not None:
            # the machine is shared: its 5-minute load average says how contended a stage was
            notes[LOAD] = [load_before, os.getloadavg()[1]]
        record["done"] = True
        self.stages[name] = record
        self.save()
        return record

    def run(
        self,
        name: str,
        stage: Callable[[], Record],
        last_activity: Callable[[], float] | None = None,
    ) -> Record:
        """Run ``stage`` (again, if it was done), timed (its record's ``seconds`` unless it gives
        its own), with the load average before and after; returns its record."""
        load_before = os.getloadavg()[1]
        self.begin(name, last_activity)
        with Timer() as timer:
            record = stage()
        record.setdefault("seconds", timer.seconds)
        return self.finish(name, record, load_before)

    def once(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``'s result (JSON), computed the first time and read back after."""
        record = self.stages.get(name)
        if record is None or not record.get("done"):
            with Timer() as timer:
                result = compute()
            record = self.finish(name, {"seconds": timer.seconds, "result": result})
        return record["result"]

    def results(self) -> dict[str, Any]:
        """The result of every finished :meth:`once` stage, by name."""
        return {
            name: r["result"] for name, r in self.stages.items() if r.get("done") and "result" in r
        }


def run_stages(
    state: StageState,
    stages: Sequence[tuple[str, Callable[[], Record]]],
    is_done: Callable[[str], bool],
    stop_before: str | None = None,
    after_each: Callable[[str, Record], None] = lambda name, record: None,
    last_activity: Callable[[], float] | None = None,
) -> None:
    """Each of ``stages`` (name, function) not ``is_done``, in order, until ``stop_before``;
    ``after_each`` is called with each finished stage (to write the results so far)."""
    with tqdm(stages, desc=state.path.parent.name, unit="stage") as bar:
        for name, stage in bar:
            bar.set_postfix_str(name)
            if is_done(name):
                continue
            if name == stop_before:
                break
            record = state.run(name, stage, last_activity)
            tqdm.write(f"{name}: {record['seconds'] / 60:.1f} min")
            after_each(name, record)
