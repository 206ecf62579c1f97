"""Sharded search vs one flat index over the same vectors: identical results and the QPS ratio
(docs/engines.md). Also FAISS's threaded `IndexShards` over the same shards, for the record.

    .venv/bin/python -m benchmarks.cluster_search    # writes benchmarks/results/cluster_search.md
"""

from __future__ import annotations

import argparse

import faiss
import numpy as np

from benchmarks import harness
from hnce.cluster.stores.faiss_index import build_shard_index
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.sharded_searcher import ShardedSearcher


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
    harness.write_measures(
        args.output,
        "Sharded vs single flat index search (benchmarks/cluster_search.py)",
        f"CPU only, best of {args.repeats} alternated runs.",
        rows,
    )


def main() -> None:
    parser = harness.arguments(
        __doc__, "cluster_search", entities=200_000, dim=384, queries=512, k=64, repeats=3, seed=0
    )
    parser.add_argument("--shards", type=int, default=8)
    args = harness.parse(parser)
    rng = np.random.default_rng(args.seed)
    vectors = rng.standard_normal((args.entities, args.dim), dtype=np.float32)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    flat, searcher, threaded = build_indexes(vectors, args.shards)
    same = agreement(flat, searcher, threaded, queries, args.k)
    searches = {
        "flat": lambda: flat.search(queries, args.k),
        "sharded": lambda: searcher.search(queries, args.k),
        "threaded": lambda: threaded.search(queries, args.k),
    }
    seconds = harness.alternated_best(searches, args.repeats)  # alternated: the machine is shared
    write_results(args, same, {name: args.queries / s for name, s in seconds.items()})


if __name__ == "__main__":
    main()
