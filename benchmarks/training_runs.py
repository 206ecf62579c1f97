"""A finished ``hnce train`` run read back from its run directory: step rates from its event log,
its checkpoints' exports, the refreshes it published, and where its wall-clock went.

Example::

    rate = steps_per_second(run_dir, 11, 300)          # steps/s over steps (11, 300]
    model = load_biencoder(checkpoint_export(run_dir))  # the newest checkpoint's export
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent


def steps_per_second(run_dir: Path, first: int, last: int) -> float:
    """Steps/s over the step events (first, last]."""
    times = {event["step"]: event["time"] for event in read_events(run_dir, RunEvent.STEP)}
    return (last - first) / (times[last] - times[first])


def window_rate(steps_at: list[tuple[float, int]], start: float, end: float) -> float:
    """Steps/s between the first and last logged step inside [start, end] (steps are logged
    every ``log_every``, so counting log lines would undercount); NaN when fewer than two
    logged steps fall inside (a window shorter than ``log_every`` steps: no rate to measure)."""
    inside = [(t, step) for t, step in steps_at if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] == inside[0][0]:
        return math.nan
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def published_refreshes(run_dir: Path) -> list[dict[str, Any]]:
    """The refreshes the run published (``refresh_log.jsonl``), in order."""
    path = run_dir / "refresh_log.jsonl"
    if not path.is_file():
        return []
    windows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        window
        for window in windows
        if window.get("event", RunEvent.REFRESH) == RunEvent.REFRESH
        and window["outcome"] == "published"
    ]


def checkpoint_export(run_dir: Path, step: int | None = None) -> Path:
    """The export of checkpoint ``step`` (the newest when None) of a run."""
    if step is None:
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise FileNotFoundError(f"{run_dir}: no complete checkpoint")
        return newest[1] / EXPORT_DIR
    return checkpoint_dir(run_dir, step) / EXPORT_DIR


def wall_clock_parts(run_dir: Path, total: float) -> dict[str, float]:
    """Where a run's ``total`` wall seconds went, from its event log: before the first step
    (Ray, Ray Train and DeepSpeed start-up, model load, negatives version 0), inside the steps,
    and the rest (checkpoints, negatives polls, shutdown)."""
    steps = read_events(run_dir, RunEvent.STEP)
    inside = sum(float(e["seconds"]) for e in steps)
    first_step_start = float(steps[0]["time"]) - float(steps[0]["seconds"])
    start = float(read_events(run_dir, RunEvent.START)[0]["time"])
    end = float(read_events(run_dir, RunEvent.END)[-1]["time"])
    before = total - (end - start) + (first_step_start - start)
    return {
        "before first step": before,
        "steps": inside,
        "per step": inside / len(steps),
        "rest": total - before - inside,
    }
