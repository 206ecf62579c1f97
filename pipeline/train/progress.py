"""The driver's progress line for a training run, fed by the run's event log.

The Ray Train workers run in other processes (other machines on a cluster), so the driver follows
``<run>/train_log.jsonl`` (``pipeline.train.events``) instead of holding the training loop.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tqdm import tqdm

from pipeline.train.events import read_events


def follow_progress(run_dir: Path, steps: int, done: threading.Event) -> None:
    """A progress bar fed by the run's event log (the workers run in other processes)."""
    with tqdm(total=steps, desc="training", unit="step") as bar:
        while not done.is_set():
            events = read_events(run_dir, "step")
            if events and int(events[-1]["step"]) != bar.n:
                last = events[-1]
                bar.n = min(int(last["step"]), steps)
                bar.set_postfix(
                    loss=f"{last['loss']:.3f}", negatives=f"v{last['negatives_version']}"
                )
                bar.refresh()
            done.wait(1.0)
        events = read_events(run_dir, "end")
        if events:
            bar.n = steps
            bar.refresh()
