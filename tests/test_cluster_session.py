"""The environment hnce's processes run with: JAX kept off the GPUs in the driver and in every Ray
worker, and bm25s (which runs a JAX op when imported) imported only where BM25 is used; and a
local start that survives a raylet dying while it starts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import ray
from ray_cluster_helpers import MARKER_VARIABLE, kill_marked

from hnce.cluster.compute.session import JAX_ON_CPU, ClusterSettings, init_ray
from hnce.errors import InputError


def test_the_driver_and_every_ray_worker_keep_jax_on_the_cpu(ray_session: str) -> None:
    @ray.remote(num_cpus=0)
    def worker_environment() -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in JAX_ON_CPU}

    assert JAX_ON_CPU == {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert {name: os.environ.get(name) for name in JAX_ON_CPU} == JAX_ON_CPU
    assert ray.get(worker_environment.remote()) == JAX_ON_CPU
    # A local worker inherits the driver's environment; a worker on another node gets the job's.
    job_env = ray.get_runtime_context().runtime_env.get("env_vars", {})
    assert {name: job_env.get(name) for name in JAX_ON_CPU} == JAX_ON_CPU


def test_importing_the_trainer_and_the_samplers_does_not_import_bm25s() -> None:
    code = (
        "import sys, hnce.pipeline.train.trainer, hnce.pipeline.train.worker, "
        "hnce.mining.samplers.lexical, hnce.cluster.stores.bm25_store; "
        "print(sorted(m for m in ('bm25s', 'jax') if m in sys.modules))"
    )
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


# Holds the first dashboard agent of the process's local instance stopped until the raylet that
# started it has died (a raylet gives its agent 15 s to write its port files, then aborts in
# NodeManager::WaitForDashboardAgentPorts, as it did on a loaded 2-core machine), then lets it go
# on, as a slow agent would; calls init_ray and reports what it saw. The suite's Ray waits 600 s
# for a raylet (conftest), so the watcher starts the command over; it waits 5 s, not 45, after
# the raylet died (no start can succeed then), as _STUCK_START's 1 s.
_SLOW_FIRST_AGENT = """
import contextlib, json, logging, os, signal, threading, time
from pathlib import Path
import psutil, ray
from ray._common.utils import get_default_ray_temp_dir
from hnce.cluster.compute import local_instance
from hnce.cluster.compute.session import ClusterSettings, init_ray

local_instance.STUCK_SECONDS = 5.0

def hold_the_first_agent():
    while True:
        for child in psutil.Process().children(recursive=True):
            try:
                if child.name() != "raylet" and any(a.endswith("dashboard/agent.py") for a in child.cmdline()):
                    raylet = child.parent()
                    child.send_signal(signal.SIGSTOP)
                    break
            except psutil.Error:
                pass
        else:
            time.sleep(0.005)
            continue
        with contextlib.suppress(psutil.NoSuchProcess):  # gone: dead and reaped
            while raylet.status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.1)
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signal.SIGCONT)
        return

if "HNCE_RAY_START_ATTEMPT" not in os.environ:  # not after a start over
    threading.Thread(target=hold_the_first_agent, daemon=True).start()
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
init_ray(ClusterSettings(num_cpus=1))
started = ray._private.worker._global_node.session_name
ours = sorted(p.name for p in Path(get_default_ray_temp_dir()).glob(f"session_*_{os.getpid()}"))
failed = [name for name in ours if name != started]
left = []
for child in psutil.Process().children(recursive=True):
    with contextlib.suppress(psutil.Error):
        if child.status() != psutil.STATUS_ZOMBIE and any(
            name in a for name in failed for a in child.cmdline()
        ):
            left.append(child.name())
print(json.dumps({"cpus": ray.cluster_resources().get("CPU"), "failed_sessions": failed,
                  "left_of_them": left}))
ray.shutdown()
"""


def _run_python(
    code: str, *arguments: str, attempt: str | None = None
) -> tuple[subprocess.CompletedProcess, int]:
    """``python -c code arguments`` in its own session (``HNCE_RAY_START_ATTEMPT`` set to
    ``attempt``), then everything it started killed; what it did, and its pid."""
    marker = f"raylet-start-{os.getpid()}"
    env = {**os.environ, MARKER_VARIABLE: marker, "DS_ACCELERATOR": "cpu"}
    env.pop("RAY_ADDRESS", None)
    if attempt is not None:
        env["HNCE_RAY_START_ATTEMPT"] = attempt
    process = subprocess.Popen(
        [sys.executable, "-c", code, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(marker)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), process.pid


@pytest.mark.slow
def test_a_raylet_that_dies_starting_is_reported_and_the_instance_started_again() -> None:
    done, _ = _run_python(_SLOW_FIRST_AGENT)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-3000:]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["cpus"] == 1.0 and len(seen["failed_sessions"]) == 1, seen
    assert seen["left_of_them"] == [], seen
    warning = next(line for line in err.splitlines() if "raylet died while starting" in line)
    log = rf"{seen['failed_sessions'][0]}/logs/raylet\.err:\d+: \[[^\]]* C \d+ \d+\] \(raylet\)"
    assert re.search(log, warning), warning
    assert "(attempt 2)" in warning  # started again in this process, or the process over


# A ray.init that never returns after its raylet died (a copy of sleep named raylet, gone at
# once): the watcher starts the command over, and the second start is a real one (a plain
# ray.init under start_local_instance, as init_ray makes it, without importing torch for it).
_STUCK_START = """
import json, logging, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
import ray
from hnce.cluster.compute import local_instance

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
local_instance.STUCK_SECONDS = 1.0
if "HNCE_RAY_START_ATTEMPT" not in os.environ or sys.argv[1:] == ["always"]:
    raylet = Path(tempfile.mkdtemp()) / "raylet"
    shutil.copy(shutil.which("sleep"), raylet)
    def stuck():
        subprocess.Popen([str(raylet), "0.2"])
        time.sleep(600)
    local_instance.start_local_instance(stuck)
local_instance.start_local_instance(
    lambda: ray.init(address="local", num_cpus=1, include_dashboard=False)
)
print(json.dumps({"pid": os.getpid(), "cpus": ray.cluster_resources().get("CPU")}))
ray.shutdown()
"""


def test_a_start_stuck_after_its_raylet_died_starts_the_command_over_in_the_same_process() -> None:
    done, pid = _run_python(_STUCK_START)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"pid": pid, "cpus": 1.0}  # exec'd: the same process, Ray started
    warning = next(line for line in done.stderr.splitlines() if "raylet died" in line)
    assert "ray.init has not returned 1 s later; starting this command over (attempt 2)" in warning


def test_the_last_start_stuck_ends_the_command_with_the_reason() -> None:
    done, _ = _run_python(_STUCK_START, "always", attempt="2")
    assert done.returncode == 69, done.stderr[-3000:]
    assert "ray.init has not returned 1 s later (2 attempts); giving up" in done.stderr


def test_a_cluster_address_with_no_cluster_is_one_error_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray says it found no cluster as a ConnectionError (a traceback from every command); the
    recipe's setting is what to fix. (Ray's own failure is stood in for: joining an address
    where nothing listens retries for minutes.)"""

    def no_cluster(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    with pytest.raises(InputError, match=r"^cluster.address 'auto': Could not find any running"):
        init_ray(ClusterSettings(address="auto"))
