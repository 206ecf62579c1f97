"""A worker's checkpoints on their own (:class:`hnce.pipeline.train.checkpointing.WorkerCheckpoints`):
one DeepSpeed engine in a one-rank gloo group, with no training data, negatives or training loop."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from training_helpers import synthetic_config

from hnce.cluster.stores.checkpoints import REFRESH_REQUEST, STATE_FILE, checkpoint_dir
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.recipe_models import build_trainable
from hnce.pipeline.train.checkpointing import WorkerCheckpoints
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import start_engine

CPU = torch.device("cpu")


def test_a_worker_publishes_resumes_and_refuses_non_finite_weights(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    """A published checkpoint holds the state and the refresh request it was given and is
    reported; a later resume finds it and loads its weights back; weights that are not finite
    publish nothing, report nothing, ask the coordinator nothing and log a stop."""
    run_dir = tmp_path / "run"
    config = synthetic_config(run_dir, small_dataset, syllable_bert)
    reports: list[tuple[int, float, int]] = []
    asked: list[int] = []

    def request(step: int) -> dict[str, bool]:
        asked.append(step)
        return {REFRESH_REQUEST: True}

    with single_process_group():
        model = build_trainable(config, "retriever")
        engine = start_engine(model, config.training, CPU)
        log = EventLog(run_dir)
        checkpoints = WorkerCheckpoints(
            engine, model, run_dir, Collectives(CPU), 2, log, lambda *r: reports.append(r)
        )
        assert checkpoints.resume(None, {}) is None
        published = _weights(model)
        assert checkpoints.publish({"step": 3, "loss": 0.5}, lambda: request(3))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
        assert checkpoints.resume(None, {"engine": 1.0}) == 3
        resumed = _weights(model)
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
        assert not checkpoints.publish({"step": 4, "loss": 0.5}, lambda: request(4))
    assert reports == [(3, 0.5, 0)] and asked == [3]
    state = json.loads((checkpoint_dir(run_dir, 3) / STATE_FILE).read_text())
    assert (state["step"], state["loss"], state[REFRESH_REQUEST]) == (3, 0.5, True)
    assert resumed.keys() == published.keys()
    assert all(torch.equal(resumed[name], published[name]) for name in published)
    (resume,) = read_events(run_dir, RunEvent.RESUME)
    assert (resume["step"], resume["setup_seconds"]) == (3, {"engine": 1.0})
    assert not checkpoint_dir(run_dir, 4).exists()
    (stop,) = read_events(run_dir, RunEvent.NONFINITE_STOP)
    assert stop["step"] == 4


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}
