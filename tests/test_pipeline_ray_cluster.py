"""ray_cluster.yaml is a valid launcher config naming exactly the custom resources the code asks
for, and the jobs it is for run on a real multi-node Ray cluster started on this machine."""

from __future__ import annotations

import ast
import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_letter_bert

from hnce.cluster.compute import resources
from hnce.cluster.compute.resources import ENCODER_RESOURCE, TRAINER_RESOURCE
from hnce.cluster.stores.checkpoints import checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import read_records
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.synthetic import generate_synthetic_dataset

ROOT = Path(__file__).resolve().parents[1]
MARKER_VARIABLE = "HNCE_TEST_CLUSTER"
TRAINED_STEPS = 12
RAY_ALARMS = re.compile(r"Task \S+ failed|killed by `ray\.kill`|Unhandled error|RayActorError")
PR_SET_PDEATHSIG = 1
BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}
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


def test_required_fields_and_ray_schema() -> None:
    from ray.autoscaler._private.util import validate_config

    config = launcher_config()
    for key in REQUIRED:
        assert key in config, key
    assert config["head_node_type"] in config["available_node_types"]
    validate_config(config)  # Ray's own JSON schema + consistency checks


def test_gpu_encoder_and_trainer_nodes() -> None:
    node_types = launcher_config()["available_node_types"]
    by_resource = {name: node for node in node_types.values() for name in node.get("resources", {})}
    assert by_resource[resources.ENCODER_RESOURCE]["resources"].get("GPU", 0) >= 1
    assert by_resource[resources.TRAINER_RESOURCE]["resources"].get("GPU", 0) >= 1


def test_custom_resources_are_exactly_those_requested() -> None:
    node_types = launcher_config()["available_node_types"].values()
    advertised = {name for node in node_types for name in node.get("resources", {})} - BUILTIN
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


# --------------------------------------------------------------------------------------------
# A real multi-node Ray cluster on this machine: one node per node type of ray_cluster.yaml,
# started with `ray start` (no GPUs; the node types' custom resources), jobs through the job
# server, torn down by terminating exactly the processes the test started.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_the_test() -> None:
    """In the child: SIGTERM when the test process dies, so a killed test leaves no Ray node."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class LocalRayCluster:
    """Ray nodes started with ``ray start --block`` in a temporary directory of their own.

    Every process it starts, and every process those start (raylets, workers, job drivers),
    inherits a unique marker variable; :meth:`shutdown` terminates the ``ray start`` processes
    (each stops its node's processes) and then kills whatever still carries the marker, by pid.
    ``ray stop`` is never used: it stops every Ray instance of the machine.
    """

    def __init__(self) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hnce-ray-", dir="/tmp"))  # short: sockets
        self.marker = uuid.uuid4().hex
        self.port, self.dashboard_port = _free_port(), _free_port()
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # nothing to drain: stop at once
            MARKER_VARIABLE: self.marker,
        }
        self.nodes: list[subprocess.Popen] = []

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start_node(self, resources: dict[str, float], head: bool) -> subprocess.Popen:
        ports = (
            "dashboard-agent-listen",
            "dashboard-agent-grpc",
            "metrics-export",
            "runtime-env-agent",
        )
        head_only = [
            "--head",
            f"--port={self.port}",
            f"--temp-dir={self.temp_dir}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
        ]
        where = head_only if head else [f"--address=127.0.0.1:{self.port}"]
        command = [
            "ray",
            "start",
            "--block",
            *where,
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--num-gpus=0",
            f"--resources={json.dumps(resources)}",
            "--object-store-memory=100000000",
            *(f"--{name}-port={_free_port()}" for name in ports),
            "--disable-usage-stats",
        ]
        log = (self.temp_dir / f"node-{len(self.nodes)}.log").open("a")
        return subprocess.Popen(
            command,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_the_test,
        )

    def add_node(self, resources: dict[str, float], head: bool = False) -> None:
        """Start a node (2 CPUs, no GPU, ``resources``) and wait until it is alive.

        ``ray start`` gives a node 30 s to register; on a loaded machine that can pass, so a
        node that gave up is started once more.
        """
        for _ in range(2):
            node = self._start_node(resources, head)
            deadline = time.monotonic() + 120
            while node.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(AssertionError, json.JSONDecodeError):
                    alive = [n for n in self.listing("nodes") if n["state"] == "ALIVE"]
                    if len(alive) == len(self.nodes) + 1:
                        self.nodes.append(node)
                        return
                time.sleep(1.0)
            node.terminate()
            node.wait(timeout=60)
        log = self.temp_dir / f"node-{len(self.nodes)}.log"
        raise AssertionError(f"a Ray node did not come up:\n{log.read_text()[-3000:]}")

    def ray(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``ray <args>`` against this cluster (job server or state API)."""
        return subprocess.run(
            ["ray", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def listing(self, kind: str) -> list[dict]:
        result = self.ray(
            "list",
            kind,
            f"--address=127.0.0.1:{self.port}",
            "--detail",
            "--format=json",
            "--limit=10000",
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def run_job(self, job_id: str, *entrypoint: str) -> tuple[int, str, str]:
        """``ray job submit`` (blocking); its exit code, ``ray job status`` and ``ray job logs``."""
        address = f"--address={self.dashboard}"
        submitted = self.ray(
            "job", "submit", address, f"--submission-id={job_id}", "--", *entrypoint, timeout=600
        )
        status = self.ray("job", "status", address, job_id)
        logs = self.ray("job", "logs", address, job_id)
        assert status.returncode == 0 and logs.returncode == 0, status.stderr + logs.stderr
        return submitted.returncode, status.stdout + status.stderr, logs.stdout

    def shutdown(self) -> None:
        """Stop every node, then kill by pid whatever of ours outlived it."""
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
        deadline = time.monotonic() + 30
        while (left := _marked_processes(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _marked_processes(marker: str) -> list[int]:
    """Pids of this user's processes whose environment carries ``MARKER_VARIABLE=marker``."""
    wanted = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    """A head and one node per worker node type of ray_cluster.yaml, with its custom resources."""
    node_types = launcher_config()["available_node_types"]
    head_type = launcher_config()["head_node_type"]
    local = LocalRayCluster()
    try:
        custom = {
            name: {k: v for k, v in node["resources"].items() if k not in BUILTIN}
            for name, node in node_types.items()
        }
        local.add_node(custom[head_type], head=True)
        for name in node_types:
            if name != head_type:
                local.add_node(custom[name])
        yield local
    finally:
        local.shutdown()
    assert not _marked_processes(local.marker), "Ray processes outlived the teardown"


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
def jobs(cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What an operator does, as Ray jobs: a refresh before there is a checkpoint, a training
    run with its refresh coordinator, then a serving run refreshed from the trained checkpoint.
    Each entry: (``ray job submit`` exit code, ``ray job status``, ``ray job logs``)."""
    root = tmp_path_factory.mktemp("cluster-run")
    generate_synthetic_dataset(
        root / "data", num_worlds=2, entities_per_world=30, mentions_per_entity=2
    )
    inputs = {"data": root / "data", "model": write_letter_bert(root / "model")}
    run_dir, serving = root / "run", root / "serving"
    done: dict[str, Any] = {"run": run_dir, "serving": serving}
    done["early"] = cluster.run_job("refresh-early", *_hnce(inputs, run_dir, "refresh"))
    train = _hnce(
        inputs,
        run_dir,
        "train",
        "--no-progress",
        *("--set", f"training.steps={TRAINED_STEPS}", "--set", "training.checkpoint_every=4"),
        *("--set", "refresh.poll_seconds=0.5"),
    )
    done["train"] = cluster.run_job("train", *train)
    step, directory = newest_checkpoint(run_dir)
    shutil.copytree(directory, checkpoint_dir(serving, step))
    done["refresh"] = cluster.run_job("refresh", *_hnce(inputs, serving, "refresh"))
    return done


def _refresh_line(logs: str) -> dict:
    return json.loads(next(line for line in logs.splitlines() if line.startswith('{"event"')))


@pytest.mark.slow
def test_exit_codes_and_output_come_back_through_ray_jobs(jobs: dict[str, Any]) -> None:
    submitted, status, logs = jobs["early"]  # no checkpoint yet: exit code 3
    assert submitted == 1 and "failed" in status and "exit code 3" in status, status
    assert _refresh_line(logs)["outcome"] == "no-checkpoint"
    submitted, status, logs = jobs["train"]
    assert submitted == 0 and "succeeded" in status, status + logs[-3000:]
    assert f"trained {TRAINED_STEPS} steps" in logs
    submitted, status, logs = jobs["refresh"]
    assert submitted == 0 and "succeeded" in status, status + logs[-3000:]
    published = _refresh_line(logs)
    assert (published["outcome"], published["checkpoint"]) == ("published", TRAINED_STEPS)


@pytest.mark.slow
def test_encoders_and_trainer_workers_land_where_their_resources_are(
    cluster: LocalRayCluster, jobs: dict[str, Any]
) -> None:
    resources = {node["node_id"]: node["resources_total"] for node in cluster.listing("nodes")}
    actors = cluster.listing("actors")
    encoders = [a for a in actors if a["class_name"] == "EntityEncoderActor"]
    workers = [a for a in actors if a["class_name"] == "RayTrainWorker"]
    assert encoders and all(ENCODER_RESOURCE in resources[a["node_id"]] for a in encoders)
    assert len(workers) == 2 and all(TRAINER_RESOURCE in resources[a["node_id"]] for a in workers)


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
    records = read_records(run_dir)[0]
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
    assert status["lock_holder"] is None
    disk = status["disk_bytes"]
    assert disk["checkpoints"] > 0
    assert disk["total"] == sum(size for name, size in disk.items() if name != "total")
    assert main(["status", str(jobs["serving"])]) == 0
    screen = capsys.readouterr().out
    assert f"v1 from step-{TRAINED_STEPS}" in screen and "lock          free" in screen
    assert f"published, step-{TRAINED_STEPS} → index v1, negatives v1" in screen
