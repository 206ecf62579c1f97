"""A 5.9M-entity index on one machine: build time, queries/s, recall and peak memory (docs/engines.md).

The KILT catalogue has 5,903,530 pages; BLINK's entity vectors are 1024-d. Flat float32 would be
24.2 GB, more than a 24 GiB machine can hold next to anything else, so the store is built with
IVF-PQ shards (one trained quantiser shared by all shards; PQ codes of `pq_m` bytes per vector).
Vectors come from a cheap seeded generator (clustered Gaussians, unit norm), not a model, chunk
by chunk, so the full float32 matrix is never in memory. Ground truth is exact inner-product
top-k over the same regenerated chunks.

    .venv/bin/python -m benchmarks.cluster_scale      # writes benchmarks/results/cluster_scale.md
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from benchmarks import harness
from hnce.cluster.compute.index_build import index_parameters
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import build_shard_index, train_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import BuildParameters, IndexStore
from hnce.cluster.stores.sharded_searcher import ShardedSearcher


def chunk_vectors(
    start: int, stop: int, generator: tuple[np.ndarray, np.ndarray], seed: int
) -> np.ndarray:
    """Vectors start..stop-1: a cluster center plus noise in a 64-d subspace, unit norm.

    The same rows for the same seed; the noise is drawn in 64 dimensions and projected, so
    generating 5.9M × 1024 floats costs one matrix product rather than 6e9 Gaussian draws.
    """
    centers, noise_basis = generator
    rng = np.random.default_rng([seed, start])
    assign = rng.integers(0, len(centers), size=stop - start)
    noise = rng.standard_normal((stop - start, noise_basis.shape[0]), dtype=np.float32)
    vectors = centers[assign] + noise @ noise_basis
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def parse_arguments() -> argparse.Namespace:
    """The command line: catalogue size and dimension, index parameters, queries and output."""
    catalogue = {"entities": 5_903_530, "dim": 1024, "shard_size": 500_000, "seed": 0}
    index = {"nlist": 1024, "pq_m": 128, "nprobe": 64, "queries": 256, "k": 10}
    parser = harness.arguments(__doc__, "cluster_scale", **catalogue, **index)
    return harness.parse(parser)


def vector_generator(rng: np.random.Generator, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The (cluster centers, noise basis) that `chunk_vectors` draws the catalogue from."""
    centers = rng.standard_normal((4096, dim), dtype=np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    # 64 noise directions of norm ~0.15 each: within a cluster, cosine to the center ~0.5.
    noise_basis = 0.15 * rng.standard_normal((64, dim), dtype=np.float32) / np.sqrt(dim)
    return centers, noise_basis


def build_parameters(args: argparse.Namespace, spec: IndexSpec) -> BuildParameters:
    """The store's manifest fields for the synthetic catalogue (no model, no checkpoint)."""
    return BuildParameters(
        checkpoint=0,
        checkpoint_path="synthetic",
        model="0" * 64,
        catalogue="0" * 64,
        source="synthetic clustered vectors",
        scorer={"name": "dual"},
        dim=args.dim,
        vectors_per_entity=1,
        num_entities=args.entities,
        index=index_parameters(spec, args.shard_size),
    )


def build_shards(
    store: IndexStore,
    args: argparse.Namespace,
    generator: tuple[np.ndarray, np.ndarray],
    bounds: list[int],
    spec: IndexSpec,
    trained: faiss.Index,
) -> float:
    """Add, write and publish every shard of `bounds` on the shared quantiser `trained`; returns
    the seconds spent generating vectors (left out of the build time)."""
    builder = store.begin(build_parameters(args, spec))
    generate_seconds = 0.0
    with tqdm(total=args.entities, desc="building", unit="entities", unit_scale=True) as bar:
        for shard_no, (start, stop) in enumerate(itertools.pairwise(bounds)):
            vectors, seconds = harness.timed(chunk_vectors, start, stop, generator, args.seed)
            generate_seconds += seconds
            index = build_shard_index(vectors, spec, trained=trained)
            ids = np.arange(start, stop, dtype=np.int64)
            builder.add_shard(shard_no, index, ids, (start, stop))
            del vectors, index
            bar.update(stop - start)
    builder.publish(len(bounds) - 1)
    return generate_seconds


def noisy_queries(
    rng: np.random.Generator,
    args: argparse.Namespace,
    generator: tuple[np.ndarray, np.ndarray],
    bounds: list[int],
) -> tuple[np.ndarray, np.ndarray]:
    """Noisy copies of random catalogue entities, whose source should come back first:
    (source entity ids, query vectors)."""
    sources = np.sort(rng.choice(args.entities, args.queries, replace=False))
    queries = np.empty((args.queries, args.dim), np.float32)
    for start, stop in itertools.pairwise(bounds):
        inside = (sources >= start) & (sources < stop)
        if inside.any():
            queries[inside] = chunk_vectors(start, stop, generator, args.seed)[
                sources[inside] - start
            ]
    queries += 0.02 * rng.standard_normal(queries.shape, dtype=np.float32) / np.sqrt(args.dim)
    return sources, queries


def timed_search(version: ShardedSearcher, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Top-`k` ids of `queries` and the seconds the search took, after an 8-query warm-up."""
    version.search(queries[:8], k)  # warm-up
    (found, _), seconds = harness.timed(lambda: version.search(queries, k))
    return found, seconds


def exact_top_k(
    queries: np.ndarray,
    k: int,
    generator: tuple[np.ndarray, np.ndarray],
    bounds: list[int],
    seed: int,
) -> np.ndarray:
    """Ids of each query's exact inner-product top `k`, over the regenerated chunks."""
    exact = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start, stop in tqdm(list(itertools.pairwise(bounds)), desc="ground truth"):
        scores = queries @ chunk_vectors(start, stop, generator, seed).T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        exact.add_result(np.take_along_axis(scores, top, 1), top + start)
    exact.finalize()
    return exact.I


def write_results(
    args: argparse.Namespace, spec: IndexSpec, num_shards: int, m: dict[str, float]
) -> None:
    """The result table of one run, with the 1024-d (BLINK) sizes it extrapolates to."""
    blink_fp32 = args.entities * 1024 * 4 / 2**30
    blink_pq = args.entities * 128 / 2**30
    ids_gib = args.entities * 8 / 2**30
    rows = [
        ("entities", f"{args.entities:,}"),
        ("dimension", str(args.dim)),
        ("shards", f"{num_shards} × {args.shard_size:,}"),
        ("index", f"IVF{spec.nlist},PQ{spec.pq_m} (8 bit), nprobe {spec.nprobe}, shared quantiser"),
        ("train (65,536-vector sample)", f"{m['train']:.1f} s"),
        ("build (add + write + sha256, generator time excluded)", f"{m['build']:.1f} s"),
        ("vector generation", f"{m['generate']:.1f} s"),
        ("store on disk", f"{m['store bytes'] / 2**30:.2f} GiB"),
        ("load (memory-mapped) + verify sha256 (streamed) + check ids", f"{m['load']:.1f} s"),
        (
            f"search {args.queries} queries, k={args.k}",
            f"{args.queries / m['search']:.1f} queries/s",
        ),
        (f"recall@{args.k} vs exact inner product", f"{m['recall']:.3f}"),
        ("source entity at rank 1", f"{m['source at 1']:.3f}"),
        (
            "peak resident memory: generate + build + load + search",
            f"{m['peak build search']:.2f} GiB",
        ),
        ("peak resident memory incl. exact ground truth", f"{m['peak']:.2f} GiB"),
        (
            "at 1024-d (BLINK): flat float32 / float16 / IVF-PQ128 codes",
            f"{blink_fp32:.1f} / {blink_fp32 / 2:.1f} / {blink_pq:.2f} GiB "
            f"(+ {ids_gib:.2f} GiB ids; build holds one {args.shard_size:,}-row float32 chunk: "
            f"{args.shard_size * 1024 * 4 / 2**30:.1f} GiB)",
        ),
        ("total wall time", f"{m['total']:.0f} s"),
    ]
    harness.write_measures(
        args.output,
        f"5.9M-entity index on one machine, {args.dim}-d (benchmarks/cluster_scale.py)",
        f"Machine: {faiss.omp_get_max_threads()} FAISS threads, CPU only. One run.",
        rows,
    )


def measure(args: argparse.Namespace, spec: IndexSpec, bounds: list[int]) -> dict[str, float]:
    """Build, load and search the store in a scratch directory, then the exact ground truth:
    seconds of each (the build's include training, not vector generation), the store's bytes,
    recall, and the peak memory before and after the ground truth."""
    rng = np.random.default_rng(args.seed)
    generator = vector_generator(rng, args.dim)
    workdir = Path(tempfile.mkdtemp(prefix="hnce-scale-"))
    store = IndexStore(workdir / "index", keep=1)
    timer = harness.Timer()
    sample = chunk_vectors(0, min(spec.train_size, args.entities), generator, args.seed + 1)
    trained = train_index(sample, spec, args.seed)
    m = {"train": timer.elapsed()}
    m["generate"] = build_shards(store, args, generator, bounds, spec, trained)
    m["build"] = timer.elapsed() - m["generate"]
    m["store bytes"] = sum(p.stat().st_size for p in (workdir / "index").rglob("*") if p.is_file())
    version, m["load"] = harness.timed(
        lambda: store.current().load(device=resolve_faiss_device("cpu"))
    )
    sources, queries = noisy_queries(rng, args, generator, bounds)
    found, m["search"] = timed_search(version, queries, args.k)
    m["peak build search"] = harness.own_peak_bytes() / harness.GIB  # before the ground truth
    exact_ids = exact_top_k(queries, args.k, generator, bounds, args.seed)
    overlap = [len(set(f) & set(e)) / args.k for f, e in zip(found, exact_ids, strict=True)]
    m["recall"] = float(np.mean(overlap))
    m["source at 1"] = float(np.mean(found[:, 0] == sources))
    m["total"] = timer.elapsed()
    m["peak"] = harness.own_peak_bytes() / harness.GIB
    shutil.rmtree(workdir)
    return m


def main() -> None:
    args = parse_arguments()
    bounds = [*list(range(0, args.entities, args.shard_size)), args.entities]
    spec = IndexSpec(kind="ivfpq", nlist=args.nlist, pq_m=args.pq_m, nprobe=args.nprobe)
    write_results(args, spec, len(bounds) - 1, measure(args, spec, bounds))


if __name__ == "__main__":
    main()
