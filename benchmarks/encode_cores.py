"""Catalogue encoding on every core: one encoder actor on one thread (the refresh beside a
trainer, and before this change version 0 and evaluation too) against the two ways of giving an
encoding pool that runs alone both cores: one actor on two torch threads, or two one-thread
actors sharing the shards.

Real WordNet noun synsets, all-MiniLM-L6-v2's entity tower, the pool's own shard tasks (token
rows read, encoded, FAISS shard written); each layout is timed over every shard after a warm-up
shard, best of ``--repeats``. The pool started with ``free_cpus`` (version 0, evaluation,
linking) is the layout the product uses.

    python -m benchmarks.encode_cores [--entities 4096] [--shard-size 512]

writes ``benchmarks/results/encode_cores.md``.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from pathlib import Path

import ray

from benchmarks import harness
from benchmarks.cluster_encode import build_catalogue, shard_tasks
from hnce.cluster.compute.encoder_actor import node_cores
from hnce.cluster.compute.encoder_pool import EncoderPool, EncoderPoolSettings
from hnce.progress import quiet

LAYOUTS = {
    "1 actor × 1 thread": EncoderPoolSettings(num_encoders=1, batch_size=64),
    "1 actor × 2 threads": EncoderPoolSettings(num_encoders=1, batch_size=64, num_threads=2),
    "2 actors × 1 thread": EncoderPoolSettings(num_encoders=2, batch_size=64),
    "free_cpus (the product's pool alone)": EncoderPoolSettings(batch_size=64, free_cpus=True),
}


def layout_seconds(
    export_dir: Path,
    tokens: Path,
    settings: EncoderPoolSettings,
    bounds: list[tuple[int, int]],
    work: Path,
    repeats: int,
) -> tuple[float, float, dict[str, float]]:
    """(start-up seconds, best seconds over every shard, the pool's request) of one layout."""
    work.mkdir(parents=True)
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        time.sleep(0.2)  # the previous layout's actors give their CPUs back asynchronously
    pool, started = harness.timed(lambda: EncoderPool(export_dir, settings, tokens))
    with pool:
        warm = shard_tasks(work / "warm", bounds[:1])
        pool.index_shards(warm, lambda _: None)
        rounds = itertools.count()

        def every_shard() -> None:
            pool.index_shards(shard_tasks(work / f"round-{next(rounds)}", bounds), lambda _: None)

        best = harness.best_of(every_shard, repeats)
        return started, best, dict(pool.request)


@quiet()
def main() -> None:
    parser = harness.arguments(__doc__, "encode_cores", entities=4096, shard_size=512, repeats=2)
    args = harness.parse(parser)
    cores = node_cores()
    workdir = Path(tempfile.mkdtemp(prefix="hnce-cores-"))
    export_dir, _, tokens, _ = build_catalogue(workdir, args.entities)
    bounds = [
        (start, min(start + args.shard_size, args.entities))
        for start in range(0, args.entities, args.shard_size)
    ]
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    rows, rates = [], {}
    for name, settings in LAYOUTS.items():
        work = workdir / f"layout-{len(rows)}"
        started, seconds, request = layout_seconds(
            export_dir, tokens.directory, settings, bounds, work, args.repeats
        )
        rates[name] = args.entities / seconds
        shutil.rmtree(work)
        rows.append((name, started, rates[name], request.get("CPU", 0)))
    ray.shutdown()
    shutil.rmtree(workdir)
    base = rates["1 actor × 1 thread"]
    lines = [
        "# Catalogue encoding on every core (benchmarks/encode_cores.py)",
        "",
        f"{args.entities:,} WordNet noun synsets, all-MiniLM-L6-v2 entity tower (128 tokens max), "
        f"{len(bounds)} shards of {args.shard_size}, batch 64; Ray with {cores} CPUs on {cores} "
        f"cores; best of {args.repeats} passes over every shard after a warm-up shard. One run "
        "on a shared machine: compare the ratios.",
        "",
        "| layout | CPUs asked per actor | start-up (s) | entities/s | vs 1 × 1 |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {cpus:g} | {started:.1f} | {rate:,.1f} | {rate / base:.2f}× |"
            for name, started, rate, cpus in rows
        ),
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
