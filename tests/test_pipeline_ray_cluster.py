"""ray_cluster.yaml is a valid launcher config naming exactly the custom resources the code asks
for, and the jobs it is for run on a real multi-node Ray cluster started on this machine."""

from __future__ import annotations

import ast
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import write_letter_bert
from ray_cluster_helpers import BUILTIN_RESOURCES, LocalRayCluster
from store_helpers import write_checkpoint
from training_helpers import REFRESHED

from hnce.cluster.compute import resources
from hnce.cluster.compute.resources import ENCODER_RESOURCE, TRAINER_RESOURCE
from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import read_log
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.synthetic import generate_synthetic_dataset

ROOT = Path(__file__).resolve().parents[1]
TRAINED_STEPS = 12
ENCODER_NODE_TYPE = "gpu_encoder"
RAY_ALARMS = re.compile(r"Task \S+ failed|killed by `ray\.kill`|Unhandled error|RayActorError")
REQUIRED = (
    "cluster_name",
    "max_workers",
    "provider",
    "auth",
    "available_node_types",
    "head_node_type",
    "setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


def launcher_config() -> dict:
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())


def requested_resources() -> set[str]:
    """Resource names the code passes to `custom_resource_request` (pipeline/ and cluster/)."""
    names = {"ENCODER_RESOURCE": resources.ENCODER_RESOURCE}
    names["TRAINER_RESOURCE"] = resources.TRAINER_RESOURCE
    found = set()
    for path in [*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("cluster/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None))
                == "custom_resource_request"
                and node.args
            ):
                argument = node.args[0]
                if isinstance(argument, ast.Name) and argument.id in names:
                    found.add(names[argument.id])
                elif isinstance(argument, ast.Constant):
                    found.add(argument.value)
    return found


def test_the_launcher_config_has_the_required_fields_and_passes_rays_schema() -> None:
    from ray.autoscaler._private.util import validate_config

    config = launcher_config()
    for key in REQUIRED:
        assert key in config, key
    assert config["head_node_type"] in config["available_node_types"]
    validate_config(config)  # Ray's own JSON schema + consistency checks


def test_the_encoder_and_trainer_node_types_each_have_a_gpu() -> None:
    node_types = launcher_config()["available_node_types"]
    by_resource = {name: node for node in node_types.values() for name in node.get("resources", {})}
    assert by_resource[resources.ENCODER_RESOURCE]["resources"].get("GPU", 0) >= 1
    assert by_resource[resources.TRAINER_RESOURCE]["resources"].get("GPU", 0) >= 1


def test_custom_resources_are_exactly_those_requested() -> None:
    node_types = launcher_config()["available_node_types"].values()
    advertised = {name for node in node_types for name in node.get("resources", {})}
    advertised -= BUILTIN_RESOURCES
    assert advertised == set(resources.CUSTOM_RESOURCES)
    assert requested_resources() == set(resources.CUSTOM_RESOURCES)


def test_setup_installs_the_project_and_dashboard_is_local() -> None:
    config = launcher_config()
    setup = "\n".join(config["setup_commands"])
    assert "pip install" in setup and "-e" in setup and "constraints.txt" in setup
    head = "\n".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head


def test_onprem_variant_is_valid_and_each_host_declares_its_role() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    text = (ROOT / "ray_cluster_onprem.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    validate_config(prepare_config(config))  # what `ray up` does with a local provider
    for commands in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = config[commands][-1]
        assert "ray start" in start and '--resources="$(cat ~/hnce-resources.json' in start
    assert "--dashboard-host=127.0.0.1" in config["head_start_ray_commands"][-1]
    for name in resources.CUSTOM_RESOURCES:  # the roles it documents are those the code asks
        assert f'{{"{name}": ' in text


# A real multi-node Ray cluster on this machine (ray_cluster_helpers): one node per node type of
# ray_cluster.yaml, started with `ray start` (no GPUs; the node types' custom resources), jobs
# through the job server, torn down by terminating exactly the processes the test started.


def _hnce(inputs: dict[str, Path], run_dir: Path, command: str, *extra: str) -> list[str]:
    """An ``hnce`` entrypoint on the test recipe, joining the cluster it runs in."""
    return [
        "hnce",
        command,
        *("--config", str(ROOT / "configs" / "synthetic-test.yaml")),
        *("--set", "cluster.address=auto", "--set", f"run.dir={run_dir}"),
        *("--set", f"data.root={inputs['data']}", "--set", f"model.path={inputs['model']}"),
        *("--set", "index.faiss_device=cpu", "--set", "refresh.shard_size=16"),
        *extra,
    ]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What an operator does on a cluster of ray_cluster.yaml's node types (a head and one node
    per worker node type, with its custom resources), as Ray jobs: a training run with its
    refresh coordinator, then a serving run refreshed from the trained checkpoint. Entries: the
    ``cluster``, the ``run`` and ``serving`` directories, and per job (``ray job submit`` exit
    code, ``ray job status``, ``ray job logs``). (A refresh's exit code where there is no
    checkpoint, 3, and its JSON line are test_cluster_refresh_job.py's.)"""
    root = tmp_path_factory.mktemp("cluster-run")
    generate_synthetic_dataset(
        root / "data", num_worlds=2, entities_per_world=30, mentions_per_entity=2
    )
    inputs = {"data": root / "data", "model": write_letter_bert(root / "model")}
    run_dir, serving = root / "run", root / "serving"
    node_types = launcher_config()["available_node_types"]
    head_type = launcher_config()["head_node_type"]
    custom = {
        name: {k: v for k, v in node["resources"].items() if k not in BUILTIN_RESOURCES}
        for name, node in node_types.items()
    }
    with LocalRayCluster() as cluster:
        cluster.add_node(custom[head_type], head=True)
        for name in node_types:
            if name != head_type:
                cluster.add_node(custom[name])
        done: dict[str, Any] = {"cluster": cluster, "run": run_dir, "serving": serving}
        done["inputs"], done["encoder_node"] = inputs, custom[ENCODER_NODE_TYPE]
        done["encoder_index"] = 1 + [n for n in node_types if n != head_type].index(
            ENCODER_NODE_TYPE
        )
        train = _hnce(
            inputs,
            run_dir,
            "train",
            "--no-progress",
            *(part for setting in REFRESHED for part in ("--set", setting)),
            *("--set", f"training.steps={TRAINED_STEPS}", "--set", "training.checkpoint_every=4"),
        )
        done["train"] = cluster.run_job("train", *train)
        assert done["train"][0] == 0, done["train"][1] + done["train"][2][-3000:]
        step, directory = newest_checkpoint(run_dir)
        shutil.copytree(directory, checkpoint_dir(serving, step))
        done["refresh"] = cluster.run_job("refresh", *_hnce(inputs, serving, "refresh"))
        yield done
    assert not cluster.leftover_processes(), "Ray processes outlived the teardown"


def _refresh_line(logs: str) -> dict:
    return json.loads(next(line for line in logs.splitlines() if line.startswith('{"event"')))


@pytest.mark.slow
def test_exit_codes_and_output_come_back_through_ray_jobs(jobs: dict[str, Any]) -> None:
    submitted, status, logs = jobs["train"]
    assert submitted == 0 and status.startswith("SUCCEEDED: "), status + logs[-3000:]
    assert f"trained {TRAINED_STEPS} steps" in logs
    submitted, status, logs = jobs["refresh"]
    assert submitted == 0 and status.startswith("SUCCEEDED: "), status + logs[-3000:]
    published = _refresh_line(logs)
    assert (published["outcome"], published["checkpoint"]) == ("published", TRAINED_STEPS)


@pytest.mark.slow
def test_encoders_and_trainer_workers_land_where_their_resources_are(jobs: dict[str, Any]) -> None:
    """Every encoder actor (the training coordinator's and the serving refresh's) is on a node
    with the encoder resource, the trainer's worker on one with the trainer resource. One worker
    shows it: each worker asks for the same resource (several workers and ZeRO are
    test_pipeline_train's)."""
    cluster = jobs["cluster"]
    resources = {node["node_id"]: node["resources_total"] for node in cluster.listing("nodes")}
    actors = cluster.listing("actors")
    # An encoder that a refresh abandoned at the end of training may die before it is placed.
    never_placed = [a for a in actors if a["node_id"] is None]
    assert all(a["state"] == "DEAD" for a in never_placed), never_placed
    placed = [a for a in actors if a["node_id"] is not None]
    encoders = [a for a in placed if a["class_name"] == "EntityEncoderActor"]
    workers = [a for a in placed if a["class_name"] == "RayTrainWorker"]
    assert encoders and all(ENCODER_RESOURCE in resources[a["node_id"]] for a in encoders)
    assert len(workers) == 1 and all(TRAINER_RESOURCE in resources[a["node_id"]] for a in workers)


@pytest.mark.slow
def test_a_normal_training_job_ends_without_ray_alarms(jobs: dict[str, Any]) -> None:
    """The job's logs are the driver's stdout and stderr, where Ray prints task failures."""
    _, _, logs = jobs["train"]
    assert not RAY_ALARMS.search(logs), logs[-3000:]


@pytest.mark.slow
def test_hnce_status_reports_the_trained_run(
    jobs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = jobs["run"]
    assert main(["status", str(run_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    records = read_log(run_dir).records
    assert status["training"]["state"] == "ended"
    assert status["training"]["step"] == status["newest_checkpoint"]["step"] == TRAINED_STEPS
    assert status["checkpoints"][-3:] == [4, 8, 12] and len(status["checkpoints"]) <= 4
    live_index = IndexStore(run_dir / "index").current_version()
    assert (status["index"] or {}).get("version") == live_index
    negatives = NegativesStore(run_dir / "negatives").latest()
    if negatives is not None:  # a refresh of the coordinator was published before the end
        assert status["negatives"]["checkpoint"] == negatives.checkpoint_step
        assert status["index"]["checkpoint"] == negatives.checkpoint_step
        assert status["lag_steps"] == TRAINED_STEPS - negatives.checkpoint_step
    assert status["refreshes"] == {
        "published": sum(r.outcome == "published" for r in records),
        "failed": 0,
        "failures_in_a_row": 0,
    }
    assert status["lock_holder"] is None and status["training_holder"] is None
    disk = status["disk_bytes"]
    assert disk["checkpoints"] > 0
    assert disk["total"] == sum(size for name, size in disk.items() if name != "total")
    assert main(["status", str(jobs["serving"])]) == 0
    screen = capsys.readouterr().out
    assert f"v1 from step-{TRAINED_STEPS}" in screen and "refresh lock  free" in screen
    assert f"published, step-{TRAINED_STEPS} → index v1, negatives v1" in screen


@pytest.mark.slow
def test_a_refresh_whose_encoder_node_dies_completes_once_a_node_is_back(
    jobs: dict[str, Any],
) -> None:
    """The node that holds the only encoder actor is killed once that actor has started for a
    refresh job (loading, encoding, holding shards or mining: wherever the refresh is then).
    The job either completes (Ray restarts the actor on the node that replaces it) or ends in
    one line with exit 69 (EX_UNAVAILABLE) and nothing unfinished published; run again, it
    publishes what is missing. This module's cluster serves it: the dead node is replaced, so
    the tests after it would see the same node types."""
    cluster, serving = jobs["cluster"], jobs["serving"]
    step = TRAINED_STEPS + 1
    write_checkpoint(serving, step, checkpoint_dir(serving, TRAINED_STEPS) / EXPORT_DIR)
    refresh = _hnce(jobs["inputs"], serving, "refresh")
    cluster.submit_job("refresh-node-dies", *refresh)
    deadline = time.monotonic() + 300
    while not any(
        actor["class_name"] == "EntityEncoderActor" and actor["state"] == "ALIVE"
        for actor in cluster.listing("actors")
    ):  # the refresh's encoder actor has started on the node
        assert time.monotonic() < deadline, "the refresh's encoder actor never started"
        time.sleep(0.2)
    cluster.kill_node(jobs["encoder_index"])
    cluster.add_node(jobs["encoder_node"])
    status, logs = cluster.wait_for_job("refresh-node-dies")
    if not status.startswith("SUCCEEDED: "):
        assert "exit code 69" in status, status + logs[-3000:]
        said = [line for line in logs.splitlines() if line.startswith("hnce refresh: ")]
        assert len(said) == 1 and "Actor" in said[0], logs[-3000:]
        assert 'bin/hnce", line' not in logs, logs[-3000:]  # no traceback of the command's
        assert NegativesStore(serving / "negatives").latest().checkpoint_step == TRAINED_STEPS
        cluster.submit_job("refresh-again", *refresh)
        status, logs = cluster.wait_for_job("refresh-again")
        assert status.startswith("SUCCEEDED: "), status + logs[-3000:]
    published = _refresh_line(logs)
    assert (published["outcome"], published["checkpoint"]) == ("published", step), published
    version = IndexStore(serving / "index").current()
    assert version is not None and version.checkpoint == step
    searcher = version.load()
    ids = np.concatenate([shard.ids for shard in searcher.shards])
    np.testing.assert_array_equal(np.sort(ids), np.arange(len(ids)))
    assert NegativesStore(serving / "negatives").latest().checkpoint_step == step
