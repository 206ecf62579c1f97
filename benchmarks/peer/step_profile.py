"""One hnce training step profiled: torch.profiler over the worker loop in this process (a gloo
group of one, 1 thread as the run's worker), with batch assembly and the optimizer step timed
apart.

Example::

    table, seconds = profile_hnce_step(config)   # operator table, mean seconds per phase
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks import harness
from hnce.pipeline.config import Config
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun

PHASES = ("batch assembly", "train_micro_batch")


def timed_step(run: WorkerRun, index: int, timings: dict[str, list[float]]) -> None:
    """Training step ``index``: its batch assembled, then trained, each phase timed and marked
    for the profiler."""
    from hnce.pipeline.train.step import train_micro_batch

    with harness.Timer() as timer, torch.profiler.record_function("batch assembly"):
        batch = run.micro_batch(index).to(run.device)
    timings["batch assembly"].append(timer.seconds)
    with harness.Timer() as timer, torch.profiler.record_function("train_micro_batch"):
        train_micro_batch(run.engine, batch, run.loss)
    timings["train_micro_batch"].append(timer.seconds)


def profile_hnce_step(config: Config, steps: int = 3) -> tuple[str, dict[str, float]]:
    """torch.profiler over ``steps`` training steps of the hnce worker loop, in this process
    (a gloo group of one; 1 thread as the run's worker), after 2 warm-up steps; returns the
    op table and the mean seconds of batch assembly vs forward + backward + optimizer step."""
    with single_process_group():
        run = WorkerRun.build(
            config, TrainingTask.retriever(config), torch.device("cpu"), 1, lambda *_: None
        )
        run.engine.train()
        timings: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for index in range(2):
            timed_step(run, index, timings)
        for values in timings.values():
            values.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            for index in range(2, 2 + steps):
                timed_step(run, index, timings)
        table = profile.key_averages().table(sort_by="cpu_time_total", row_limit=18)
        return table, {name: float(np.mean(values)) for name, values in timings.items()}
