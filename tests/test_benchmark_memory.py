"""The benchmarks' memory sampler tells a process's own memory from the files it maps: a search
over a memory-mapped index raises the resident set by every page it touches, which the kernel
can drop at any time and other readers share."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from benchmarks.harness.memory import GIB, PeakMemory

MAPPED = 256 << 20


def test_mapped_file_pages_count_in_the_peak_but_not_as_private(tmp_path: Path) -> None:
    path = tmp_path / "index.bin"
    path.write_bytes(np.ones(MAPPED, dtype=np.uint8).tobytes())
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with PeakMemory(interval=0.05) as memory:
            touched = np.frombuffer(mapped, dtype=np.uint8)[::4096].sum()  # one byte a page
        del touched
    peak, private = memory.as_gib()["driver"], memory.private_as_gib()["driver"]
    assert peak * GIB >= MAPPED
    assert (peak - private) * GIB >= 0.9 * MAPPED, (peak, private)
