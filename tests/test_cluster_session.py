"""The environment hnce's processes run with: JAX kept off the GPUs in the driver and in every Ray
worker, and bm25s (which runs a JAX op when imported) imported only where BM25 is used."""

from __future__ import annotations

import os
import subprocess
import sys

import ray

from hnce.cluster.compute.session import JAX_ON_CPU


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
        "hnce.mining.samplers.lexical, hnce.cluster.compute.lexical; "
        "print(sorted(m for m in ('bm25s', 'jax') if m in sys.modules))"
    )
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
