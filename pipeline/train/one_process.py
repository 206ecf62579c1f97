"""A training worker in this process: the gloo process group of one rank that Ray Train would
give a worker, so that DeepSpeed and hnce's worker loop run where a profiler, a memory
high-water mark or a test can see them (the benchmarks' step profile and memory plan, the
engine tests).

Example::

    with single_process_group():
        engine = start_engine(model, config.training, torch.device("cpu"))
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
from deepspeed.comm import comm as deepspeed_comm


@contextmanager
def single_process_group() -> Iterator[None]:
    """A gloo process group of one rank in this process, torn down afterwards together with
    the environment it needed (and with DeepSpeed's cached groups, once an engine used it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    environment = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        _destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _destroy_process_group() -> None:
    """Through DeepSpeed when an engine initialised its communication, so that DeepSpeed also
    drops the world group it cached (a later engine in this process would find it stale)."""
    backend = deepspeed_comm.cdb
    if backend is not None and backend.is_initialized():
        deepspeed_comm.destroy_process_group()
    else:
        dist.destroy_process_group()
