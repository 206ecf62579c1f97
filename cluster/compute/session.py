"""Where Ray runs (the ``cluster`` section of a recipe) and the one way hnce starts or joins it.

Every command that needs Ray (``train``, ``refresh``, ``eval``, ``finetune-blink``, ``demo``) calls
:func:`init_ray` once; it either starts a local instance on this machine (its dashboard off and
bound to loopback) or joins ``cluster.address``. The choice,
and the software and devices this process sees (:func:`describe_environment`), are logged.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import faiss
import ray
import torch

from hnce.cluster.compute.gpu_sharing import GpuSharing
from hnce.cluster.compute.local_instance import start_local_instance
from hnce.cluster.stores.faiss_device import faiss_gpu_count
from hnce.errors import InputError
from hnce.settings import Flag, NonNegativeInt, Text, settings

logger = logging.getLogger(__name__)

# JAX stays off the GPUs. bm25s (the lexical sampler) runs a JAX op when it is imported and JAX
# is installed; JAX on a GPU then claims the device (it preallocates 75% of its memory), and on a
# lent H200 NCCL's first allocation in the trainer worker failed ("Failed to CUDA calloc async 4
# bytes") until these were set. hnce runs BM25 on the CPU and never runs JAX on a GPU.
JAX_ON_CPU = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
# Worker processes (Ray Train workers, encoder actors) inherit these (and JAX_ON_CPU through the
# job's runtime environment, with the values this process settled on).
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false"}
DS_ACCELERATOR = "DS_ACCELERATOR"
RAY_AUTH_MODE = "RAY_AUTH_MODE"
_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
# A local instance's dashboard is not started, and where Ray would bind it is loopback: anyone
# who can reach a dashboard can submit jobs to the cluster (docs/failures.md).
DASHBOARD_HOST = "127.0.0.1"


@settings
class ClusterSettings:
    """Where Ray runs.

    Attributes:
        address: ``local`` starts an instance on this machine; ``auto`` or ``host:port`` joins a
            running cluster (``ray start``, the cluster launcher, ``ray job submit``).
        num_cpus: CPUs a local instance advertises (0: enough for the run, at least the cores).
        use_gpu: trainer workers train on GPUs; asking for GPUs that are not there is an error.
        gpu_sharing: ``dedicated``: each trainer worker and each encoder actor takes a GPU of its
            own; ``shared``: half a GPU each, the two sharing a device; ``auto`` (default):
            ``shared`` where the trainer's workers leave no GPU to the encoders beside them
            (:mod:`hnce.cluster.compute.gpu_sharing`).
    """

    address: Text = "local"
    num_cpus: NonNegativeInt = 0
    use_gpu: Flag = False
    gpu_sharing: GpuSharing = "auto"


def init_ray(cluster: ClusterSettings, cpus_needed: float = 0.0) -> None:
    """Join ``cluster.address`` or start a local instance; a no-op when Ray is already up.

    A local instance advertises at least ``cpus_needed`` logical CPUs, so the trainer workers and
    the refresh encoders each hold their own slot even on a 2-core machine.
    """
    if ray.is_initialized():
        return
    keep_sigterm = _SigtermKept()
    try:
        _start_or_join(cluster, cpus_needed)
    finally:
        keep_sigterm.restore()


class _SigtermKept:
    """``ray.init`` installs its own SIGTERM handler in the main thread; the command's own (a
    clean stop with its exit code, or ``hnce refresh``'s stop between refreshes) is put back."""

    def __init__(self) -> None:
        in_main = threading.current_thread() is threading.main_thread()
        self.handler = signal.getsignal(signal.SIGTERM) if in_main else None

    def restore(self) -> None:
        if self.handler is not None:
            signal.signal(signal.SIGTERM, self.handler)


def choose_accelerator(cluster: ClusterSettings) -> str:
    """Tell DeepSpeed which accelerator the recipe chose (``DS_ACCELERATOR``: ``cuda`` with
    ``cluster.use_gpu``, else ``cpu``), for this process and the workers it starts, before
    DeepSpeed is imported; a value the user exported wins. DeepSpeed would otherwise probe, and
    warn "Setting accelerator to CPU" in every process of a CPU run. JAX is kept on the CPU
    here too (:data:`JAX_ON_CPU`), before anything imports bm25s."""
    for name, value in JAX_ON_CPU.items():
        os.environ.setdefault(name, value)
    return os.environ.setdefault(DS_ACCELERATOR, "cuda" if cluster.use_gpu else "cpu")


def _start_or_join(cluster: ClusterSettings, cpus_needed: float) -> None:
    accelerator = choose_accelerator(cluster)
    chosen = {name: os.environ[name] for name in JAX_ON_CPU}  # a value the user exported wins
    runtime_env = {"env_vars": {**WORKER_ENV, **chosen, DS_ACCELERATOR: accelerator}}
    if cluster.address == "local":
        cpus = cluster.num_cpus or max(os.cpu_count() or 1, int(cpus_needed + 0.999))
        with _token_warning_explained():
            start_local_instance(
                lambda: ray.init(
                    address="local",  # a new instance: never one found running here
                    num_cpus=cpus,
                    include_dashboard=False,
                    dashboard_host=DASHBOARD_HOST,
                    runtime_env=runtime_env,
                    log_to_driver=False,
                )
            )
        logger.info(
            "Ray: started a local instance with %d CPUs (token authentication: %s)",
            cpus,
            os.environ.get(RAY_AUTH_MODE, "disabled"),
        )
    else:
        try:
            ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=False)
        except ConnectionError as error:  # the recipe names a cluster that is not there
            said = " ".join(str(error).split())
            raise InputError(
                f"cluster.address {cluster.address!r}: {said} Start the cluster (ray start "
                f"--head on its head node) or set cluster.address: local"
            ) from None
        logger.info("Ray: joined %s (%s)", cluster.address, _resources_line())


@contextmanager
def _token_warning_explained() -> Iterator[None]:
    """Ray turns token authentication on for a new local instance (``RAY_AUTH_MODE``, unless
    the user set it) and warns that it did, in words that read like a problem; the start-up line
    says which mode the instance runs in instead."""
    ray_logger = logging.getLogger(_RAY_AUTH_LOGGER)
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        ray_logger.setLevel(level)


def _resources_line() -> str:
    resources = ray.cluster_resources()
    return ", ".join(f"{name} {value:g}" for name, value in sorted(resources.items()))


def describe_environment() -> str:
    """One line: the torch build and the devices it sees, the FAISS build and its GPUs."""
    if torch.cuda.is_available():
        names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
        torch_devices = f"{torch.cuda.device_count()} CUDA device(s) ({', '.join(sorted(names))})"
    else:
        torch_devices = "no CUDA device"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    faiss_build = "GPU build" if hasattr(faiss, "StandardGpuResources") else "CPU build"
    return (
        f"torch {torch.__version__} ({build}, {torch_devices}); "
        f"faiss {faiss.__version__} ({faiss_build}, {faiss_gpu_count()} GPU(s) visible)"
    )
