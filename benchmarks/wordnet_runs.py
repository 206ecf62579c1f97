"""What the WordNet benchmarks share: the data, the recipe, and a training run through ``hnce train``.

Every run goes through the shipping trainer (``hnce.pipeline.train.trainer.run_training``: DeepSpeed
under Ray Train, the refresh coordinator, the recipe's samplers) and is evaluated through the
cluster like ``hnce eval`` (``hnce.pipeline.evaluate.evaluate_export``). Ray starts once per
benchmark process and serves every run. A finished run is kept in the benchmark's state file
(:class:`benchmarks.harness.StageState`) and not run again, so an interrupted benchmark resumes
run by run.

Example::

    args = harness.parse(wordnet_arguments(__doc__, "example", Path("runs/example"), 1000, steps=30))
    data = prepare_dataset(work, 1000, 1000, 300)
    state = StageState(work / "state.json").load()
    result = train_and_evaluate("dual-random", 0, recipe(work / "run", data), state)
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.training_runs import checkpoint_export
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.trainer import run_training

CONFIGS = harness.ROOT / "configs"


def wordnet_arguments(
    doc: str | None,
    name: str,
    work_dir: Path,
    entities: int,
    train_mentions: int = 1000,
    test_mentions: int = 300,
    **sizes: object,
) -> argparse.ArgumentParser:
    """The command line of a WordNet benchmark (:func:`benchmarks.harness.arguments`): its work
    directory, the subset's sizes (:func:`prepare_dataset`), then its own ``sizes``."""
    subset = {
        "entities": entities,
        "train_mentions": train_mentions,
        "test_mentions": test_mentions,
    }
    return harness.arguments(doc, name, work_dir, **subset, **sizes)


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


def every_checkpoint_kept(steps: int, every: int) -> list[str]:
    """The overrides of a run of ``steps`` steps with a checkpoint every ``every`` steps, all
    kept (each is evaluated)."""
    return [
        f"training.steps={steps}",
        f"training.checkpoint_every={every}",
        f"training.keep_checkpoints={steps // every + 1}",
    ]


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
    def from_json(cls, raw: dict[str, Any]) -> RunResult:
        """A result read back from the state file (its recall keyed by strings there)."""
        return cls(**{**raw, "recall": {int(k): v for k, v in raw["recall"].items()}})


def run_key(name: str, seed: int) -> str:
    """The state file's name of run ``name`` with ``seed``."""
    return f"{name}-s{seed}"


def train_and_evaluate(
    name: str, seed: int, config: Config, state: harness.StageState
) -> RunResult:
    """Train ``config`` from scratch (its run directory is replaced) and evaluate its final
    checkpoint; the result is kept in ``state`` and read back when it is there."""

    def run() -> dict[str, Any]:
        shutil.rmtree(config.run_dir, ignore_errors=True)  # an interrupted run starts over
        summary, seconds = harness.timed(lambda: run_training(config))
        report = evaluate_export(config, checkpoint_export(config.run_dir), name)
        result = RunResult(
            name, seed, report.recall, seconds, summary.final_loss, summary.refreshes
        )
        drop_run_state(config.run_dir)
        return asdict(result)

    return RunResult.from_json(state.once(run_key(name, seed), run))


def drop_run_state(run_dir: Path) -> None:
    """Delete a finished run's checkpoints and index versions (DeepSpeed state is ~0.4 GB a
    run), keeping its event log and other top-level files for inspection."""
    for child in run_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
