"""A training run's refreshes as an operator sees them (local Ray, tiny BERT; slow): refresh
failures stop training with their cause, a normal ``hnce train`` prints no Ray alarm on its
stderr (a separate process, so messages Ray prints late are caught too), and ``hnce status``
reports the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from conftest import write_letter_bert

from cluster.checkpoints import newest_checkpoint
from cluster.index_store import IndexStore
from cluster.negatives_store import NegativesStore
from cluster.refresh_job import RefreshesFailing
from cluster.refresh_log import read_records
from cluster.session import init_ray
from pipeline.cli.main import main
from pipeline.config import load_config
from pipeline.data.synthetic import generate_synthetic_dataset
from pipeline.train.events import read_events
from pipeline.train.refresh_health import FAILED_EVENT, STOP_EVENT
from pipeline.train.trainer import run_training

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RAY_ALARMS = re.compile(r"Task \S+ failed|killed by `ray\.kill`|Unhandled error|RayActorError")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("operations")
    generate_synthetic_dataset(
        root / "data", num_worlds=2, entities_per_world=30, mentions_per_entity=2
    )
    (root / "data" / "mentions" / "broken.parquet").write_bytes(b"not a parquet file")
    return {"data": root / "data", "model": write_letter_bert(root / "model")}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    init_ray(load_config(CONFIGS / "synthetic-test.yaml").cluster, cpus_needed=3)
    yield
    ray.shutdown()


def _overrides(run_dir: Path, inputs: dict[str, Path]) -> list[str]:
    """The test recipe's run, data and model, one trainer worker, quick refreshes."""
    return [
        f"run.dir={run_dir}",
        f"data.root={inputs['data']}",
        f"model.path={inputs['model']}",
        "training.num_workers=1",
        "training.batch_size=8",
        "refresh.poll_seconds=0.2",
        "refresh.shard_size=8",
        "index.faiss_device=cpu",
    ]


def test_a_normal_run_ends_quietly_and_hnce_status_reports_it(
    tmp_path: Path, inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    overrides = [*_overrides(run_dir, inputs), "training.steps=24", "training.checkpoint_every=4"]
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli.main",
            "train",
            "--no-progress",
            "--config",
            str(CONFIGS / "synthetic-test.yaml"),
            *(argument for override in overrides for argument in ("--set", override)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    assert "trained 24 steps" in driver.stdout
    # Ray prints task failures on the driver's stdout (raylet lines), tracebacks on its stderr.
    assert not RAY_ALARMS.search(driver.stdout + driver.stderr), (
        driver.stdout + driver.stderr[-3000:]
    )

    assert main(["status", str(run_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    live_index = IndexStore(run_dir / "index").current_version()
    live_negatives = NegativesStore(run_dir / "negatives").latest()
    published = [r for r in read_records(run_dir)[0] if r.outcome == "published"]
    assert status["training"]["state"] == "ended" and status["training"]["step"] == 24
    assert status["newest_checkpoint"]["step"] == newest_checkpoint(run_dir)[0] == 24
    assert status["checkpoints"][-3:] == [16, 20, 24] and len(status["checkpoints"]) <= 4
    assert status["index"]["version"] == live_index
    assert status["negatives"]["version"] == live_negatives.version
    assert status["negatives"]["checkpoint"] == live_negatives.checkpoint_step
    assert status["lag_steps"] == 24 - live_negatives.checkpoint_step
    assert status["refreshes"] == {
        "published": len(published),
        "failed": 0,
        "failures_in_a_row": 0,
    }
    assert status["lock_holder"] is None
    disk = status["disk_bytes"]
    assert min(disk["checkpoints"], disk["index"], disk["negatives"]) > 0
    assert disk["total"] == sum(size for name, size in disk.items() if name != "total")
    assert main(["status", str(run_dir)]) == 0
    screen = capsys.readouterr().out
    assert f"v{live_index} from step-" in screen and "lock          free" in screen


@pytest.mark.timeout(600)
def test_training_stops_with_the_cause_when_every_refresh_fails(
    tmp_path: Path, inputs: dict[str, Path], local_ray: None
) -> None:
    """Every refresh fails mining a corrupt split: training stops after two, not at the end."""
    steps = 1000
    config = load_config(
        CONFIGS / "synthetic-test.yaml",
        [
            *_overrides(tmp_path / "run", inputs),
            f"training.steps={steps}",
            "training.checkpoint_every=4",
            "training.negatives_check_every=1",
            "refresh.splits=[train, broken]",
            "refresh.max_consecutive_failures=2",
        ],
    )
    with pytest.raises(RefreshesFailing) as raised:
        run_training(config, progress=False)
    run_dir = config.run_dir
    stop = read_events(run_dir, STOP_EVENT)
    assert len(stop) == 1 and stop[0]["step"] < steps
    assert re.search(
        rf"training stopped at step {stop[0]['step']}: 2 refreshes in a row failed .*the last, "
        r"of step-\d+: ArrowInvalid",
        str(raised.value),
    ), raised.value
    failed = read_events(run_dir, FAILED_EVENT)
    assert [event["consecutive"] for event in failed][:2] == [1, 2]  # logged as they happened
    assert failed[0]["step"] <= stop[0]["step"] and "ArrowInvalid" in failed[0]["error"]
    assert not read_events(run_dir, "end")  # the stop is final: no restart trained to the end
    assert max(event["step"] for event in read_events(run_dir, "step")) <= stop[0]["step"]
    records = read_records(run_dir)[0]
    assert len(records) >= 2 and {r.outcome for r in records} == {"failed"}
