"""Linking under load: one `hnce.EntityLinker` called from 1, 2, 4 and 8 threads, and 1, 2 and 4
processes each holding a linker of its own (as several `hnce link` or service processes on one
machine do), all against one index version: mentions per second, latency of a call of one
mention (p50, p99), peak memory, and every answer checked against the single client's.

Catalogue, model and mentions are link_throughput's (a seeded synthetic catalogue; the packaged
all-MiniLM-L6-v2 exported untrained as a dual bi-encoder; one encoder actor). Each client links
its share of the mentions one text per call, as a service is called. Clients start together once
each is warm (its linker answered once: Ray started, the index version found and held); a
process's warm-up, reported as its first answer, includes waiting for the evaluation store's
lock while the others open theirs. Each process starts its own Ray instance, as `hnce link` does.

    nice -n 5 .venv/bin/python -m benchmarks.link_load   # benchmarks/results/link_load.md
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.link_throughput import prepare
from hnce.pipeline.config import Config
from hnce.pipeline.link import EntityLinker
from hnce.progress import quiet

THREADS = (1, 2, 4, 8)
PROCESSES = (1, 2, 4)

Answer = tuple[tuple[str, ...], tuple[float, ...]]  # a mention's candidate keys and scores


@dataclass
class Served:
    """One client's calls: each mention's answer by its position in the texts, each call's
    seconds, and when its first call started and its last ended (``time.monotonic``, one clock
    for every process of the machine)."""

    answers: dict[int, Answer]
    latencies: list[float]
    began: float
    ended: float


def serve(linker: EntityLinker, texts: list[str], share: range, k: int) -> Served:
    """Link the texts of ``share`` one per call."""
    answers, latencies = {}, []
    began = time.monotonic()
    for position in share:
        timer = harness.Timer()
        (item,) = linker.link([texts[position]], k)
        latencies.append(timer.stop())
        answers[position] = (
            tuple(c.key for c in item.candidates),
            tuple(c.score for c in item.candidates),
        )
    return Served(answers, latencies, began, time.monotonic())


def shares(count: int, clients: int) -> list[range]:
    return [range(client, count, clients) for client in range(clients)]


def in_threads(linker: EntityLinker, texts: list[str], clients: int, k: int) -> list[Served]:
    """``clients`` threads of one (warm) linker, started together."""
    barrier = threading.Barrier(clients)

    def client(share: range) -> Served:
        barrier.wait()
        return serve(linker, texts, share, k)

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(client, shares(len(texts), clients)))


def client_process(
    config: Config, export: Path, texts: list[str], share: range, k: int, ready: Any, go: Any
) -> None:
    """One client process: its own linker (and Ray instance), warmed, then ``share`` served once
    ``go`` is set; puts (seconds to the first answer) on ``ready``, then its :class:`Served`."""
    timer = harness.Timer()
    with quiet(), EntityLinker.from_config(config, export=export) as linker:
        linker.link([texts[share[0]]], k)
        ready.put(timer.stop())
        go.wait()
        ready.put(serve(linker, texts, share, k))


def in_processes(
    config: Config, export: Path, texts: list[str], clients: int, k: int
) -> tuple[list[Served], float]:
    """``clients`` processes (spawned: nothing of this one's Ray or torch state is inherited),
    started together once every one is warm; their results and the slowest first answer."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Queue(), context.Event()
    processes = [
        context.Process(target=client_process, args=(config, export, texts, share, k, ready, go))
        for share in shares(len(texts), clients)
    ]
    for process in processes:
        process.start()
    first_answer = max(received(ready, processes) for _ in processes)
    go.set()
    served = [received(ready, processes) for _ in processes]
    for process in processes:
        process.join(timeout=120)
    return served, first_answer


def received(queue: Any, processes: list[Any]) -> Any:
    """The next thing a client process puts on ``queue``; a RuntimeError once one has died."""
    while True:
        with contextlib.suppress(Empty):
            return queue.get(timeout=5)
        if any(process.exitcode not in (None, 0) for process in processes):
            codes = [process.exitcode for process in processes]
            raise RuntimeError(f"a client process failed (exit codes {codes})")


def row(
    label: str,
    run: Callable[[], tuple[list[Served], float | None]],
    alone: dict[int, Answer] | None,
) -> tuple[list[str], dict[int, Answer]]:
    """One setting's table row (and its answers), ``run`` under the peak-memory sampler."""
    with harness.PeakMemory() as memory:
        served, first_answer = run()
    answers = {position: a for client in served for position, a in client.answers.items()}
    latencies = np.asarray([seconds for client in served for seconds in client.latencies]) * 1000
    wall = max(client.ended for client in served) - min(client.began for client in served)
    equal = sum(answers[position] == answer for position, answer in (alone or answers).items())
    cells = [
        label,
        f"{len(answers) / wall:.1f}",
        f"{np.percentile(latencies, 50):.0f}",
        f"{np.percentile(latencies, 99):.0f}",
        f"{memory.as_gib()['all processes']:.2f}",
        "–" if first_answer is None else f"{first_answer:.0f}",
        f"{equal}/{len(answers)}",
    ]
    print(" | ".join(cells), flush=True)
    return cells, answers


def measure(config: Config, export: Path, texts: list[str], k: int) -> tuple[int, list[list[str]]]:
    """The catalogue's size and every setting's row: the threads of one linker, then the
    processes (this process's linker and its Ray instance stopped first)."""
    rows, alone = [], None
    with EntityLinker.from_config(config, export=export) as linker:
        linker.link(texts[:1], k)  # builds the index version on a first run
        entities = len(linker.catalogue)
        for clients in THREADS:
            cells, answers = row(
                f"{clients} thread{'s' * (clients > 1)}",
                lambda c=clients: (in_threads(linker, texts, c, k), None),
                alone,
            )
            alone = alone or answers
            rows.append(cells)
    for clients in PROCESSES:
        cells, _ = row(
            f"{clients} process{'es' * (clients > 1)}",
            lambda c=clients: in_processes(config, export, texts, c, k),
            alone,
        )
        rows.append(cells)
    return entities, rows


def write_results(args: argparse.Namespace, entities: int, rows: list[list[str]]) -> None:
    headers = [
        "clients",
        "mentions/s",
        "p50 ms",
        "p99 ms",
        "peak memory, GiB",
        "first answer, s",
        "answers equal to 1 thread's",
    ]
    lines = [
        "# Linking under load: threads and processes (benchmarks/link_load.py)",
        "",
        f"CPU only (2 cores), one run. {entities:,} synthetic entities, all-MiniLM-L6-v2 dual "
        f"(exported untrained), one encoder actor per linker; {args.queries} mentions linked one "
        f"per call, k {args.k}, shared out among the clients. Peak memory: every process of the "
        "benchmark's tree at one instant (the benchmark's own process, each linker's Ray "
        "instance and encoder actor). First answer: a process's warm-up (imports, Ray, the index "
        "version found and held), the slowest of them. Answers: ids and scores exactly equal. "
        "Threads share one linker's encoder actor, which serves one call at a time: throughput "
        "stays that of one client, a call waits behind the others', memory stays flat. Each "
        "process starts its own Ray instance and actor over every core, so processes on one "
        "machine compete for its cores, and each adds its memory.",
        "",
        "| " + " | ".join(headers) + " |",
        "|---|" + "---:|" * (len(headers) - 2) + "---|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]
    harness.write_result(args.output, lines)


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = harness.arguments(__doc__, "link_load", work_dir=None, entities=1000, queries=240, k=8)
    args = harness.parse(parser)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="hnce-link-load-"))
    config, export, texts = prepare(work, args)
    write_results(args, *measure(config, export, texts, args.k))


if __name__ == "__main__":
    main()
