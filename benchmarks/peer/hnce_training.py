"""hnce's side of the comparison: ``hnce train`` as the demo's mixed-50 run (and, with
``--cosine``, with the peer's own strengths), each run's curve over its checkpoints, the mention
ids it trained on, and where its wall-clock went.

Example::

    setup = Setup(work, state, recipe, config, [30, 60], held_out)
    runs = hnce_runs(setup, cosine=False, check_product=False)
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
from hnce.encoders.biencoder import load_biencoder
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.events import read_events
from hnce.pipeline.train.trainer import run_training

DEMO = harness.ROOT / "configs/demo.yaml"

# The peer's own strengths given to hnce: cosine at its temperature, and hard negatives from the
# first step (version 0 mined with the starting model, as mine_hard_negatives does) before the
# asynchronous refresh takes over.
COSINE = ("model.normalize=true", "loss.options={temperature: 0.05}", "negatives.initial=model")


def shared_recipe(work: Path, checkpoints: Sequence[int], overrides: Sequence[str]) -> list[str]:
    """configs/demo.yaml's overrides every method shares: the run under ``work``, trained up to
    the last checkpoint, every checkpoint kept, shared negatives, then ``overrides``."""
    return [
        f"run.dir={work}",
        f"training.steps={checkpoints[-1]}",
        # the demo's checkpoint_every stays: it paces the refresh (a later first checkpoint
        # means a later first index version, i.e. fewer hard negatives)
        "training.keep_checkpoints=10",
        "training.log_every=1",
        "negatives.share=batch",  # every mention scored against every candidate of the step
        # the demo recipe as measured: dot products, version 0 random (COSINE changes both)
        "model.normalize=false",
        "loss.options={}",
        "negatives.initial=random",
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
    """What every method's run shares: the work directory and its state file (each finished
    method), the recipe overrides, the demo config on its subset, the checkpoint steps and the
    held-out set."""

    work: Path
    state: harness.StageState
    recipe: list[str]
    config: Config
    checkpoints: list[int]
    held_out: HeldOut

    def method_config(self, name: str, *overrides: str) -> Config:
        """configs/demo.yaml with the shared recipe, run in ``<work>/<name>`` on the subset."""
        return load_config(
            DEMO,
            [
                *self.recipe,
                f"run.dir={self.work / name}",
                f"data.root={self.config.data.root}",
                *overrides,
            ],
        )


def train_hnce(
    config: Config, checkpoints: Sequence[int], label: str = "hnce"
) -> tuple[Curve, list[str], list[str], float]:
    """``hnce train`` as the demo's mixed-50 run: the curve over its checkpoints (wall seconds
    from the call to each checkpoint's publication), their exports, the mention ids it trained
    on in order, its seconds."""
    timer = harness.Timer()
    run_training(config)
    seconds = timer.stop()
    published = {
        e["step"]: e["time"] - timer.epoch for e in read_events(config.run_dir, "checkpoint")
    }
    trained = [m for e in read_events(config.run_dir, "step") for m in e["mentions"]]
    model_dirs = {s: checkpoint_export(config.run_dir, s) for s in checkpoints}
    switches = read_events(config.run_dir, "negatives")
    curve = Curve(f"{label} (mixed-50, async refresh: {len(switches)} index versions used)")
    curve.points = [(published[s], s, {}) for s in checkpoints]
    return curve, [str(d) for d in model_dirs.values()], trained, seconds


def run_hnce(setup: Setup, config: Config, label: str, check_product: bool) -> Trained:
    """One ``hnce train`` run, its final export checked through the product's path when
    ``check_product`` asks, then its curve by the exact path."""
    curve, model_dirs, trained, seconds = train_hnce(config, setup.checkpoints, label)
    product = None
    if check_product:
        product = evaluate_export(config, Path(model_dirs[-1])).recall
        product = {k: product[k] for k in KS}
    ray.shutdown()
    evaluate_curve(curve, model_dirs, load_biencoder, setup.held_out)
    return Trained(curve, {"total": seconds}, trained, product)


def hnce_runs(setup: Setup, cosine: bool, check_product: bool) -> list[Trained]:
    """hnce, and with ``cosine`` its cosine variant: each from the state file or trained (then
    kept), with where its wall-clock went; they must have trained on the same mentions."""
    variants = {"hnce": ("hnce", ())}
    if cosine:
        variants["hnce-cosine"] = ("hnce, cosine τ 0.05, version 0 from the model", COSINE)
    runs = []
    for key, (label, overrides) in variants.items():

        def train(key: str = key, label: str = label, overrides: Sequence[str] = overrides) -> dict:
            config = setup.method_config(key, *overrides)
            return run_hnce(setup, config, label, check_product).to_json()

        done = Trained.from_json(setup.state.once(key, train))
        done.seconds |= wall_clock_parts(setup.work / key, done.seconds["total"])
        print(key, done.seconds, done.curve.points, flush=True)
        runs.append(done)
    if any(run.trained != runs[0].trained for run in runs):
        raise SystemExit("the hnce runs trained on different mentions: not comparable")
    return runs
