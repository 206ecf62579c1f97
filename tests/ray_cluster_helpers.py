"""A real multi-node Ray cluster on this machine, for tests of jobs that run on one.

:class:`LocalRayCluster` starts Ray nodes with ``ray start --block`` (no GPUs; each node gets the
custom resources it is given), submits jobs through the cluster's job server and lists its nodes
and actors through the state API. It is a context manager, and tearing it down stops every node
it started and then kills, by pid, whatever process of its own outlived them::

    with LocalRayCluster() as cluster:
        cluster.add_node({"hnce_encoder": 1}, head=True)
        cluster.add_node({"hnce_trainer": 1})
        code, status, logs = cluster.run_job("train", "hnce", "train", ...)
    assert not cluster.leftover_processes()

``ray stop`` is never used: it would stop every Ray instance of the machine, other tests' too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

import psutil
from conftest import free_port

#: the environment variable that marks every process a cluster starts (its value: the cluster's)
MARKER_VARIABLE = "HNCE_TEST_CLUSTER"
PR_SET_PDEATHSIG = 1
#: resources Ray defines itself; a node type's other resources are custom ones
BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
# Ports a node opens besides the head's GCS and dashboard ports; each gets a free one.
_NODE_PORTS = (
    "dashboard-agent-listen",
    "dashboard-agent-grpc",
    "metrics-export",
    "runtime-env-agent",
)


def _die_with_the_test() -> None:
    """In the child: SIGTERM when the test process dies, so a killed test leaves no Ray node."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def marked_processes(marker: str) -> list[int]:
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


def kill_marked(marker: str, pids: list[int] | None = None) -> None:
    """SIGKILL the processes marked ``marker`` (or those of ``pids``), the ones already gone
    aside."""
    for pid in marked_processes(marker) if pids is None else pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def hang_report(marker: str) -> str:
    """Where the processes marked ``marker`` are stuck: each one's Python stacks (``py-spy
    dump``), then the end of the raylet logs of the Ray sessions they started, for the message
    of a test that gave up waiting on a command."""
    report = []
    for pid in marked_processes(marker):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        py_spy = Path(sys.executable).with_name("py-spy")
        dump = subprocess.run(
            [str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        report.append(f"--- pid {pid}: {command[:200]}\n{dump.stdout or dump.stderr}")
        sessions = Path(tempfile.gettempdir(), "ray").glob(f"session_2*_{pid}")
        for log in sorted(session / "logs" / "raylet.err" for session in sessions):
            if log.is_file():
                report.append(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(report)


class LocalRayCluster:
    """Ray nodes started with ``ray start --block`` in a temporary directory of their own.

    Every process it starts, and every process those start (raylets, workers, job drivers),
    inherits a unique marker variable; :meth:`shutdown` terminates the ``ray start`` processes
    (each stops its node's processes) and then kills whatever still carries the marker, by pid.
    Leaving a ``with`` block shuts it down, also when starting a node failed; and each
    ``ray start`` process gets SIGTERM if the test process dies first.
    """

    def __init__(self) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hnce-ray-", dir="/tmp"))  # short: sockets
        self.marker = uuid.uuid4().hex
        self.port, self.dashboard_port = free_port(), free_port()
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

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.shutdown()

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start_node(self, resources: dict[str, float], head: bool) -> subprocess.Popen:
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
            *(f"--{name}-port={free_port()}" for name in _NODE_PORTS),
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
                with contextlib.suppress(AssertionError, OSError, ValueError):
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
        """``ray <args>`` against this cluster."""
        return subprocess.run(
            ["ray", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def _get(self, path: str) -> object:
        """The dashboard's JSON answer to ``GET <path>``, with the cluster's token: what the
        ``ray`` CLI and SDK ask, read in this process instead of a ``ray`` process a call
        (each takes seconds of CPU to start, and a node's start polls several)."""
        request = urllib.request.Request(
            f"{self.dashboard}{path}",
            headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    def listing(self, kind: str) -> list[dict]:
        """The state API's ``kind`` (``nodes``, ``actors``, ...) in detail, as ``ray list <kind>
        --detail`` lists it."""
        query = urllib.parse.urlencode({"limit": 10000, "detail": "true", "timeout": 30})
        answer = self._get(f"/api/v0/{kind}?{query}")
        assert isinstance(answer, dict) and answer["result"], answer
        return answer["data"]["result"]["result"]

    def run_job(self, job_id: str, *entrypoint: str) -> tuple[int, str, str]:
        """``ray job submit`` (blocking); its exit code, the job's status and status message
        (``ray job status``: e.g. ``FAILED: Job entrypoint command failed with exit code 3``) and
        its logs (``ray job logs``)."""
        address = f"--address={self.dashboard}"
        submitted = self.ray(
            "job", "submit", address, f"--submission-id={job_id}", "--", *entrypoint, timeout=600
        )
        info = self._get(f"/api/jobs/{job_id}")
        logs = self._get(f"/api/jobs/{job_id}/logs")
        assert isinstance(info, dict) and isinstance(logs, dict), (info, logs)
        return submitted.returncode, f"{info['status']}: {info['message']}", logs["logs"]

    def submit_job(self, job_id: str, *entrypoint: str) -> None:
        """``ray job submit --no-wait``: the job runs while the caller goes on."""
        address = f"--address={self.dashboard}"
        submitted = self.ray(
            "job", "submit", "--no-wait", address, f"--submission-id={job_id}", "--", *entrypoint
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    def wait_for_job(self, job_id: str, timeout: float = 600) -> tuple[str, str]:
        """The job's status and status message, and its logs, once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            info = self._get(f"/api/jobs/{job_id}")
            assert isinstance(info, dict), info
            if info["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            assert time.monotonic() < deadline, f"job {job_id} still {info['status']}"
            time.sleep(1.0)
        logs = self._get(f"/api/jobs/{job_id}/logs")
        assert isinstance(logs, dict), logs
        return f"{info['status']}: {info['message']}", logs["logs"]

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index`` (in the order added) and every process it runs, as a machine
        that loses power; its ``ray start`` is dropped from the cluster's nodes."""
        node = self.nodes.pop(index)
        tree = psutil.Process(node.pid)
        for process in [*tree.children(recursive=True), tree]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        node.wait(timeout=60)
        deadline = time.monotonic() + 120  # until the cluster has seen it die
        while len([n for n in self.listing("nodes") if n["state"] == "ALIVE"]) > len(self.nodes):
            assert time.monotonic() < deadline, "the killed node is still listed alive"
            time.sleep(1.0)

    def leftover_processes(self) -> list[int]:
        """Pids of the processes this cluster started that are still running."""
        return marked_processes(self.marker)

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
        while (left := self.leftover_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        kill_marked(self.marker, left)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
