"""What the WordNet benchmarks share: the data, the recipe, and a training run through ``hnce train``.

Every run goes through the shipping trainer (``hnce.pipeline.train.trainer.run_training``: DeepSpeed
under Ray Train, the refresh coordinator, the recipe's samplers) and is evaluated through the
cluster like ``hnce eval`` (``hnce.pipeline.evaluate.evaluate_export``). Ray starts once per
benchmark process and serves every run. A run whose result file exists is not run again, so an
interrupted benchmark resumes run by run.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.events import read_events
from hnce.pipeline.train.trainer import run_training

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def prepare_dataset(work: Path, entities: int, train: int, test: int, seed: int = 0) -> Path:
    """WordNet converted once under ``work/wordnet`` and the demo-style subset cut from it:
    every gold, the other senses of the golds' lemmas, random synsets up to ``entities``."""
    full = work / "wordnet"
    if not (full / MANIFEST_FILE).is_file():
        convert_wordnet(DatasetOutput(full, overwrite=True), Path("/usr/share/wordnet"), seed)
    subset = work / f"subset-{entities}-{train}-{test}-s{seed}"
    if not (subset / MANIFEST_FILE).is_file():
        write_demo_subset(full, subset, entities, train, test, "test", seed=seed)
    return subset


def recipe(run_dir: Path, data_root: Path, *overrides: str) -> Config:
    """``configs/demo.yaml`` on ``data_root`` under ``run_dir``, with ``overrides``."""
    return load_config(
        CONFIGS / "demo.yaml",
        [f"run.dir={run_dir}", f"data.root={data_root}", "data.eval_split=test", *overrides],
    )


@dataclass
class RunResult:
    """One training run: recall of its final checkpoint, wall-clock seconds, final loss."""

    name: str
    seed: int
    recall: dict[int, float]
    seconds: float
    final_loss: float
    refreshes: int

    @classmethod
    def load(cls, path: Path) -> RunResult:
        raw = json.loads(path.read_text(encoding="utf-8"))
        raw["recall"] = {int(k): v for k, v in raw["recall"].items()}
        return cls(**raw)


def train_and_evaluate(name: str, seed: int, config: Config, results: Path) -> RunResult:
    """Train ``config`` from scratch (its run directory is replaced) and evaluate its final
    checkpoint; the result is kept in ``results/<name>-s<seed>.json`` and reused when present."""
    path = results / f"{name}-s{seed}.json"
    if path.is_file():
        return RunResult.load(path)
    shutil.rmtree(config.run_dir, ignore_errors=True)  # an interrupted run starts over
    started = time.perf_counter()
    summary = run_training(config, progress=False)
    seconds = time.perf_counter() - started
    report = evaluate_export(config, checkpoint_export(config.run_dir), name, progress=False)
    result = RunResult(name, seed, report.recall, seconds, summary.final_loss, summary.refreshes)
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.__dict__, indent=2) + "\n", encoding="utf-8")
    drop_run_state(config.run_dir)
    return result


def drop_run_state(run_dir: Path) -> None:
    """Delete a finished run's checkpoints and index versions (DeepSpeed state is ~0.4 GB a
    run), keeping its event log and other top-level files for inspection."""
    for child in run_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child)


def checkpoint_export(run_dir: Path, step: int | None = None) -> Path:
    """The export of checkpoint ``step`` (the newest when None) of a run."""
    if step is None:
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise FileNotFoundError(f"{run_dir}: no complete checkpoint")
        return newest[1] / EXPORT_DIR
    return checkpoint_dir(run_dir, step) / EXPORT_DIR


def checkpoint_times(run_dir: Path) -> dict[int, float]:
    """Seconds from the run's start to each checkpoint event (its wall-clock position)."""
    events = read_events(run_dir, "start") + read_events(run_dir, "checkpoint")
    if not events:
        return {}
    start = float(events[0]["time"])
    return {int(e["step"]): float(e["time"]) - start for e in events[1:]}
