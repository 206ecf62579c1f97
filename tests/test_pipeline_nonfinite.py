"""Training never goes on, or publishes, on a diverged model: a loss that stops being finite
stops training at that step with its cause (one line for the user, exit 2: ``hnce train`` on
Ray Train), before any checkpoint of that state; with ``training.on_nonfinite: warn`` it goes
on, but a checkpoint of non-finite weights is still never published (DeepSpeed skips an update
whose gradients are not finite, so the weights it keeps stay finite). That policy is the
worker's alone, so its test runs the worker's loop in this process (one-rank gloo group)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import CONFIGS, synthetic_config

from hnce.cluster.stores.checkpoints import EXPORT_DIR, complete_checkpoints
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.cli.main import EXIT_INPUT_ERROR, main
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.nonfinite import (
    nonfinite_ranks,
    raise_if_diverged,
    weights_are_finite,
)
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun

# Adam moves every weight by about the learning rate per step: 1e30 is finite, the second step's
# activations are not.
DIVERGING = (
    "training.learning_rate=1e30",
    "training.warmup_steps=0",
    "training.max_grad_norm=1e30",
)


def test_one_process_names_itself_when_its_number_is_not_finite() -> None:
    alone = Collectives(torch.device("cpu"))
    assert nonfinite_ranks(alone, True) == [] and nonfinite_ranks(alone, False) == [0]
    layer = torch.nn.Linear(2, 2)
    assert weights_are_finite(layer)
    with torch.no_grad():
        layer.weight[0, 1] = float("nan")
    assert not weights_are_finite(layer)


def _train(tmp_path: Path, dataset: Path, model: Path, *overrides: str) -> int:
    settings = [
        f"run.dir={tmp_path / 'run'}",
        f"data.root={dataset}",
        f"model.path={model}",
        "training.steps=6",
        "training.num_workers=1",
        "refresh.enabled=false",
        "negatives.source=none",
        "negatives.sampler=random",
        *DIVERGING,
        *overrides,
    ]
    arguments = ["train", "--config", str(CONFIGS / "synthetic-test.yaml")]
    return main([*arguments, *(item for setting in settings for item in ("--set", setting))])


@pytest.mark.slow
def test_a_diverging_run_stops_at_the_first_non_finite_loss_before_any_checkpoint(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    ray_session: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _train(tmp_path, small_dataset, syllable_bert, "training.checkpoint_every=2")
    assert code == EXIT_INPUT_ERROR
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("hnce train: step 2: the training loss is not finite"), error
    (stop,) = read_events(tmp_path / "run", RunEvent.NONFINITE_STOP)
    assert stop["step"] == 2
    assert [e["step"] for e in read_events(tmp_path / "run", RunEvent.STEP)] == [1]
    assert complete_checkpoints(tmp_path / "run") == []


@pytest.mark.slow
def test_warn_goes_on_and_publishes_only_finite_weights(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    """The worker's loop in this process: every non-finite loss from step 2 on is logged and
    training goes on to the end, publishing checkpoints 3 and 6 whose weights are all finite;
    the driver then has no divergence to raise."""
    run_dir = tmp_path / "run"
    config = synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        "training.steps=6",
        "training.checkpoint_every=3",
        "training.on_nonfinite=warn",
        # ZeRO's optimizer skips a step whose gradients are not finite, so the weights stay
        # finite (without ZeRO they are not, and training stops: the other test's path)
        "training.zero_stage=1",
        *DIVERGING,
    )
    started = time.time()
    with single_process_group():
        task = TrainingTask.retriever(config)
        WorkerRun.build(config, task, torch.device("cpu"), 1, lambda *_: None).train()
    raise_if_diverged(run_dir, started)
    assert [e["step"] for e in read_events(run_dir, RunEvent.END)] == [6]
    assert [e["step"] for e in read_events(run_dir, RunEvent.NONFINITE_LOSS)] == [2, 3, 4, 5, 6]
    published = complete_checkpoints(run_dir)
    assert [step for step, _ in published] == [3, 6]
    for _, directory in published:
        weights = load_file(directory / EXPORT_DIR / "mention" / "model.safetensors")
        assert all(torch.isfinite(tensor).all() for tensor in weights.values())
