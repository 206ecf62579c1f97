"""hnce's side of the comparison: ``hnce train`` with the demo recipe as shipped, its curve over
its checkpoints, the mention ids it trained on, and where its wall-clock went.

Example::

    setup = Setup(work, state, recipe, config, [30, 60], held_out)
    run = hnce_run(setup, check_product=False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray

from benchmarks import harness
from benchmarks.peer.curves import KS, Curve, Trained
from benchmarks.peer.evaluation import HeldOut, evaluate_curve
from benchmarks.training_runs import checkpoint_export, wall_clock_parts
from hnce.cluster.stores.run_events import read_events
from hnce.encoders.biencoder import load_biencoder
from hnce.events import RunEvent
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.trainer import run_training

DEMO = harness.ROOT / "configs/demo.yaml"

#: the name of hnce's rows
HNCE = "hnce (demo recipe: mixed-50, cosine τ 0.05, version 0 from the model, async refresh)"


def shared_recipe(work: Path, checkpoints: Sequence[int], overrides: Sequence[str]) -> list[str]:
    """configs/demo.yaml's overrides every method shares: the run under ``work``, trained up to
    the last checkpoint, every checkpoint kept and every step logged, then ``overrides``."""
    return [
        f"run.dir={work}",
        f"training.steps={checkpoints[-1]}",
        # the demo's checkpoint_every stays: it paces the refresh (a later first checkpoint
        # means a later first index version, i.e. fewer fresh hard negatives)
        "training.keep_checkpoints=10",
        "training.log_every=1",
        *overrides,
    ]


def check_checkpoints(checkpoints: Sequence[int], every: int) -> None:
    """Exit unless every step of ``--checkpoints`` is a multiple of ``every`` and the run keeps
    them all (10 checkpoints)."""
    if any(step % every for step in checkpoints) or checkpoints[-1] // every > 10:
        raise SystemExit(
            f"--checkpoints: multiples of checkpoint_every ({every}), up to {10 * every}"
        )


@dataclass
class Setup:
    """What both methods' runs of one seed share: the seed's work directory and its state file
    (each finished method), the recipe overrides (the seed's included), the demo config on its
    subset, the checkpoint steps and the held-out set."""

    work: Path
    state: harness.StageState
    recipe: list[str]
    config: Config
    checkpoints: list[int]
    held_out: HeldOut

    def method_config(self, name: str) -> Config:
        """configs/demo.yaml with the shared recipe, run in ``<work>/<name>`` on the subset."""
        return load_config(
            DEMO,
            [*self.recipe, f"run.dir={self.work / name}", f"data.root={self.config.data.root}"],
        )


def train_hnce(
    config: Config, checkpoints: Sequence[int]
) -> tuple[Curve, list[str], list[str], float]:
    """``hnce train`` with the demo recipe: the curve over its checkpoints (wall seconds from the
    call to each checkpoint's publication), their exports, the mention ids it trained on in
    order, its seconds."""
    timer = harness.Timer()
    run_training(config)
    seconds = timer.stop()
    published = {
        e["step"]: e["time"] - timer.epoch for e in read_events(config.run_dir, RunEvent.CHECKPOINT)
    }
    trained = [m for e in read_events(config.run_dir, RunEvent.STEP) for m in e["mentions"]]
    model_dirs = [str(checkpoint_export(config.run_dir, s)) for s in checkpoints]
    curve = Curve(HNCE, [(published[s], s, {}) for s in checkpoints])
    return curve, model_dirs, trained, seconds


def hnce_run(setup: Setup, check_product: bool) -> Trained:
    """hnce's run from the state file, or trained (its final export checked through the
    product's path when ``check_product`` asks, then its curve by the exact path) and kept;
    with where its wall-clock went."""

    def train() -> dict:
        config = setup.method_config("hnce")
        curve, model_dirs, trained, seconds = train_hnce(config, setup.checkpoints)
        product = None
        if check_product:
            product = evaluate_export(config, Path(model_dirs[-1])).recall
            product = {k: product[k] for k in KS}
        ray.shutdown()
        evaluate_curve(curve, model_dirs, load_biencoder, setup.held_out)
        return Trained(curve, {"total": seconds}, trained, product).to_json()

    done = Trained.from_json(setup.state.once("hnce", train))
    done.seconds |= wall_clock_parts(setup.work / "hnce", done.seconds["total"])
    print("hnce", done.seconds, done.curve.points, flush=True)
    return done
