"""Sharded search vs one flat index over the same vectors: identical results and the QPS ratio
(docs/engines.md). Also FAISS's threaded `IndexShards` over the same shards, for the record.

    .venv/bin/python benchmarks/cluster_search.py     # writes benchmarks/results/cluster_search.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
from report import write_measures

from hnce.cluster.stores.sharded_index import (
    IndexShard,
    IndexSpec,
    ShardedSearcher,
    build_shard_index,
)

RESULTS = Path(__file__).resolve().parent / "results"


def best_time(search, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        search()
        times.append(time.perf_counter() - started)
    return min(times)


def parse_arguments() -> argparse.Namespace:
    """The command line: catalogue and query sizes, repeats and the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--queries", type=int, default=512)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "cluster_search.md")
    return parser.parse_args()


def build_indexes(
    vectors: np.ndarray, num_shards: int
) -> tuple[faiss.IndexFlatIP, ShardedSearcher, faiss.IndexShards]:
    """One flat index over `vectors`, and the same vectors in `num_shards` shards searched
    sequentially (hnce's `ShardedSearcher`) and by FAISS's threaded `IndexShards`."""
    entities, dim = vectors.shape
    flat = faiss.IndexFlatIP(dim)
    flat.add(vectors)
    parts = np.array_split(np.arange(entities), num_shards)
    shards = [IndexShard(build_shard_index(vectors[p], IndexSpec()), p) for p in parts]
    searcher = ShardedSearcher(shards)
    threaded = faiss.IndexShards(dim, True, True)
    for shard in shards:
        threaded.add_shard(shard.index)
    return flat, searcher, threaded


def agreement(
    flat: faiss.IndexFlatIP,
    searcher: ShardedSearcher,
    threaded: faiss.IndexShards,
    queries: np.ndarray,
    k: int,
) -> dict[str, object]:
    """How far the sharded and threaded top-k agree with the flat index's."""
    flat_scores, flat_ids = flat.search(queries, k)
    sharded_ids, sharded_scores = searcher.search(queries, k)
    _, threaded_ids = threaded.search(queries, k)
    return {
        "identical": bool((sharded_ids == flat_ids).all()),
        "position_agreement": float((sharded_ids == flat_ids).mean()),
        # Float summation order differs between one big and several small GEMMs; where ids
        # differ the two entities' scores must be equal within that rounding (a tie), else the
        # merge is wrong.
        "max_score_gap": float(np.abs(sharded_scores - flat_scores).max()),
        "same_sets": float(
            np.mean([set(a) == set(b) for a, b in zip(sharded_ids, flat_ids, strict=True)])
        ),
        "threaded_identical": bool((threaded_ids == flat_ids).all()),
    }


def queries_per_second(
    searches: dict[str, Callable[[], object]], queries: int, repeats: int
) -> dict[str, float]:
    """Queries/s of each search in `searches` (name: callable), best of `repeats` alternated."""
    times = {name: [] for name in searches}
    for _ in range(repeats):  # alternated: the machine is shared
        for name, search in searches.items():
            times[name].append(best_time(search, 1))
    return {name: queries / min(values) for name, values in times.items()}


def write_results(args: argparse.Namespace, same: dict[str, object], qps: dict[str, float]) -> None:
    """The result table: the agreement figures `same` and the queries/s `qps`."""
    rows = [
        ("vectors", f"{args.entities:,} × {args.dim} float32, random"),
        ("queries, k", f"{args.queries}, {args.k}"),
        ("shards", str(args.shards)),
        ("FAISS threads", str(faiss.omp_get_max_threads())),
        ("sharded ids == single IndexFlatIP ids", str(same["identical"])),
        ("ids agreeing position by position", f"{same['position_agreement']:.4f}"),
        ("queries with the same top-k set", f"{same['same_sets']:.4f}"),
        ("max |score difference| at equal ranks (rounding)", f"{same['max_score_gap']:.2e}"),
        ("single IndexFlatIP", f"{qps['flat']:.1f} queries/s"),
        ("sharded, sequential + per-shard top-k merge", f"{qps['sharded']:.1f} queries/s"),
        ("sharded / single QPS", f"{qps['sharded'] / qps['flat']:.3f}"),
        ("faiss.IndexShards threaded (same shards)", f"{qps['threaded']:.1f} queries/s"),
        ("threaded ids == single", str(same["threaded_identical"])),
    ]
    write_measures(
        args.output,
        "Sharded vs single flat index search (benchmarks/cluster_search.py)",
        f"CPU only, best of {args.repeats} alternated runs.",
        rows,
    )


def main() -> None:
    args = parse_arguments()
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.entities, args.dim), dtype=np.float32)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    flat, searcher, threaded = build_indexes(vectors, args.shards)
    same = agreement(flat, searcher, threaded, queries, args.k)
    searches = {
        "flat": lambda: flat.search(queries, args.k),
        "sharded": lambda: searcher.search(queries, args.k),
        "threaded": lambda: threaded.search(queries, args.k),
    }
    write_results(args, same, queries_per_second(searches, args.queries, args.repeats))


if __name__ == "__main__":
    main()
