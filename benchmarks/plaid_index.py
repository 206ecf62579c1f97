"""The plaid token index against today's IVF-PQ token index and exact sum-of-max, at growing
catalogue sizes (``index.kind: plaid``, :mod:`hnce.cluster.stores.plaid`).

The catalogue is the synthetic KILT generator's at ``--catalogue`` entities (of up to 128
tokens), the model the tests' tiny random BERT (d = 32, drawn with σ = 0.5, as
``benchmarks/token_index.py`` explains), the scorer sum-of-max. Each size is a prefix of the
catalogue:

1. Every token vector of the catalogue is encoded once, as the encoder actors encode it, and
   kept in the work directory as a float16 array (8 GB at 1M entities), with the query vectors of
   ``--mentions`` test mentions. Exact search, training and building all read those stored
   vectors, so "exact" is sum-of-max over the vectors every index was built from.
2. The exact top-k of each mention is computed by brute force over every token of the prefix.
3. A plaid index is built as the encoder actors build one: a quantiser of ``--centroids``
   centroids (HNSW placement) trained on the version's ``training_sample`` (40 tokens a
   centroid, ``IndexSpec.train_size``), then each shard of
   ``--shard-size`` entities placed and coded chunk by chunk (``compress_tokens``). The mentions
   are searched through ``ShardedSearcher`` at each ``--nprobes`` × ``--depths`` (search-time
   knobs, one build), with the time of each of PLAID's stages per mention.
4. Today's IVF-PQ token index (``--baseline``, e.g. 1024 lists, 16 codes, 32 probed, 3,200
   candidate tokens a query token, rescored from the float16 token copy: the setting that kept
   0.961 of the exact top-100 at 200,000 entities) is built and searched the same way, on the
   first ``--baseline-mentions`` mentions (it takes seconds a mention).

Each row reports recall of the exact top-k, ms a mention (and per stage), bytes a token
(what a holder keeps in memory: codes, int64 ids, the plaid inverse, the FAISS files), and the
build's seconds per million tokens. The table is rewritten after each size, so an interrupted
run keeps what it measured.

    .venv/bin/python -m benchmarks.plaid_index --nice 5 --sizes 200000 1000000
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import torch

from benchmarks import harness
from benchmarks.fullscale.run import Run
from benchmarks.token_index import (
    catalogue_quantiser,
    compressed_shard,
    mention_queries,
    prepare,
    recall,
    scoring_model,
    shard_ranges,
)
from hnce.cluster.compute.entity_encoding import encode_entities
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.encoders.token_pooling import pool_tokens
from hnce.progress import progress_bar

#: entities encoded at once into the stored token array
ENCODE_CHUNK = 20_000
#: token vectors scored at once by the exact search (bounds its [tokens, B·Q] score matrix)
EXACT_CHUNK_TOKENS = 400_000


def stored_tokens(run: Run, entities: int, mentions: int) -> dict[str, np.ndarray]:
    """Token vectors (float16 [T, d], memory-mapped), their entity ids [T] and the queries
    [B, Q, d] of the first `entities` entities and `mentions` test mentions; encoded the first
    time, read after."""
    stem = run.workdir / f"som-tiny-{entities}"
    paths = {name: Path(f"{stem}.{name}.npy") for name in ("vectors", "ids", "queries")}
    if not all(path.is_file() for path in paths.values()):
        model, tokens = scoring_model(run, "tiny", "som")
        total = int(np.asarray(tokens.lengths[:entities], dtype=np.int64).sum())
        with AtomicPath(paths["vectors"]) as temporary:
            vectors = np.lib.format.open_memmap(temporary, "w+", np.float16, (total, 32))
            ids, row = [], 0
            for start in progress_bar(range(0, entities, ENCODE_CHUNK), desc="encoding"):
                chunk = np.arange(start, min(start + ENCODE_CHUNK, entities))
                encoded, chunk_ids, _ = encode_entities(model, tokens, chunk, 256)
                vectors[row : row + len(encoded)] = encoded
                ids.append(chunk_ids)
                row += len(encoded)
            if row != total:
                raise RuntimeError(f"encoded {row} token vectors, expected {total}")
            vectors.flush()
            del vectors
        for name, array in (
            ("ids", np.concatenate(ids)),
            ("queries", mention_queries(run, model, mentions)),
        ):
            with AtomicPath(paths[name]) as temporary, open(temporary, "wb") as handle:
                np.save(handle, array)
    return {
        "vectors": np.load(paths["vectors"], mmap_mode="r"),
        "ids": np.load(paths["ids"]),
        "queries": np.load(paths["queries"]),
    }


def exact_top_k(queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """The exact sum-of-max top-k entities [B, k] over every token row of `vectors` (entity
    `ids`, in order), by brute force in chunks of whole entities."""
    batch, width, dim = queries.shape
    live = torch.from_numpy((np.abs(queries).sum(axis=2) > 0).astype(np.float32))
    flat = torch.from_numpy(np.ascontiguousarray(queries.reshape(batch * width, dim)))
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    bounds = np.append(starts, len(ids))
    best_ids = np.zeros((batch, 0), np.int64)
    best_scores = torch.zeros((batch, 0))
    step = max(1, EXACT_CHUNK_TOKENS * len(starts) // len(ids))
    for first in progress_bar(range(0, len(starts), step), desc="exact sum-of-max"):
        last = min(first + step, len(starts))
        rows = slice(int(bounds[first]), int(bounds[last]))
        chunk = torch.from_numpy(np.asarray(vectors[rows], dtype=np.float32))
        lengths = torch.from_numpy(np.diff(bounds[first : last + 1]))
        per_entity = torch.segment_reduce(chunk @ flat.T, "max", lengths=lengths)
        scores = (per_entity.T.reshape(batch, width, -1) * live[:, :, None]).sum(dim=1)
        merged = torch.cat([best_scores, scores], dim=1)
        kept = merged.topk(min(k, merged.shape[1]), dim=1)
        candidates = np.concatenate(
            [best_ids, np.broadcast_to(ids[starts[first:last]], (batch, last - first))], axis=1
        )
        best_ids = np.take_along_axis(candidates, kept.indices.numpy(), axis=1)
        best_scores = kept.values
    return best_ids


def build(
    vectors: np.ndarray, ids: np.ndarray, entities: int, spec: IndexSpec, shard_size: int
) -> tuple[list[IndexShard], float]:
    """The shards of the first `entities` entities on one quantiser trained on the catalogue's
    sample, as a version's build makes them, and the build's seconds."""
    started = time.perf_counter()
    lengths = np.bincount(ids, minlength=entities)
    trained = catalogue_quantiser(vectors, ids, lengths, spec)
    shards = [
        compressed_shard(vectors, ids, entity_ids, trained, spec)
        for entity_ids in progress_bar(
            list(shard_ranges(entities, shard_size)), desc=f"{spec.kind} shards"
        )
    ]
    return shards, time.perf_counter() - started


def pooled(vectors: np.ndarray, ids: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens pooled by `factor` as an encoder actor pools them (``pool_tokens``), a chunk
    of whole entities at a time, kept as float16."""
    bounds = np.searchsorted(ids, np.arange(0, int(ids[-1]) + 1 + ENCODE_CHUNK, ENCODE_CHUNK))
    parts = [
        pool_tokens(np.asarray(vectors[start:stop], np.float32), ids[start:stop], factor)
        for start, stop in progress_bar(
            list(itertools.pairwise(bounds)), desc=f"pooling by {factor}"
        )
        if stop > start
    ]
    return (
        np.concatenate([part[0] for part in parts]).astype(np.float16),
        np.concatenate([part[1] for part in parts]),
    )


def held_bytes(shards: list[IndexShard], plaid: bool) -> int:
    """Bytes a holder of these shards keeps in memory: codes, int64 ids, FAISS files (a plaid
    version's quantiser once, its shards share it) and the plaid inverse (a float16 token copy
    stays on disk, memory-mapped: not counted)."""
    files = [faiss.serialize_index(shard.storage).nbytes for shard in shards]
    total = files[0] if plaid else sum(files)
    for shard in shards:
        total += shard.ids.nbytes + (0 if shard.codes is None else shard.codes.nbytes)
        total += shard.postings.nbytes if plaid else 0
    return total


def timed(searcher: ShardedSearcher, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """The top-k of every mention, searched one mention at a time as mining asks a holder, and
    the seconds a mention."""
    started = time.perf_counter()
    found = np.concatenate([searcher.search(query[None], k)[0] for query in queries])
    return found, (time.perf_counter() - started) / len(queries)


def plaid_rows(
    args, data, entities: int, exact: np.ndarray, pq_m: int, rescore: str, pool: int
) -> list[str]:
    """A row per ``--nprobes`` × ``--depths`` over one plaid build of the first `entities`,
    its survivors scored from their decoded codes or the float16 token copy (`rescore`), each
    entity's tokens pooled by `pool` first (``index.token_pool_factor``; exact search stays
    over every token)."""
    ids = data["ids"][: np.searchsorted(data["ids"], entities)]
    vectors = data["vectors"][: len(ids)]
    tokens = len(ids)
    if pool > 1:
        vectors, ids = pooled(vectors, ids, pool)
    spec = IndexSpec(
        kind="plaid",
        nlist=args.centroids,
        pq_m=pq_m,
        token_copy=rescore == "copy",
        token_pool_factor=pool,
    )
    shards, seconds = build(vectors, ids, entities, spec, args.shard_size)
    loaded = time.perf_counter()
    ShardedSearcher(shards, None)  # builds each shard's inverse: what holding a version costs
    inverse = time.perf_counter() - loaded
    per_token = f"{held_bytes(shards, True) / tokens:.1f}"
    if spec.token_copy:
        per_token += f" + {2 * vectors.shape[1] * len(ids) / tokens:.0f} on disk"
    label = f"plaid {spec.nlist} centroids, pq_m {spec.pq_m}, {rescore}"
    if pool > 1:
        label += f", pooled by {pool} ({len(ids) / tokens:.2f} of the tokens)"
    rows = []
    for nprobe in args.nprobes:
        for shard in shards:
            faiss.extract_index_ivf(shard.index).nprobe = nprobe
        for depth in args.depths:
            searcher = ShardedSearcher(shards, None, candidate_depth=depth)
            searcher.stage_seconds = Counter()
            found, per_mention = timed(searcher, data["queries"], args.k)
            stages = " / ".join(
                f"{1000 * searcher.stage_seconds[name] / len(found):.1f}"
                for name in ("generation", "interaction", "exact")
            )
            rows.append(
                f"| {entities:,} | {label} | "
                f"{nprobe} | {depth} | {recall(found, exact):.3f} | {1000 * per_mention:.1f} | "
                f"{stages} | {per_token} | {seconds / tokens * 1e6:.0f} (inverse at load: "
                f"{inverse:.1f} s) |"
            )
    return rows


def baseline_rows(args, data, entities: int, exact: np.ndarray) -> list[str]:
    """Today's IVF-PQ token index (``--baseline``) over the first `entities`, searched for the
    first ``--baseline-mentions`` mentions."""
    ids = data["ids"][: np.searchsorted(data["ids"], entities)]
    vectors = data["vectors"][: len(ids)]
    nlist, pq_m, nprobe, depth = args.baseline
    spec = IndexSpec(
        kind="ivfpq",
        nlist=nlist,
        pq_m=pq_m,
        nprobe=nprobe,
        token_copy=True,
    )
    shards, seconds = build(vectors, ids, entities, spec, args.shard_size)
    searcher = ShardedSearcher(shards, None, candidate_depth=depth)
    count = args.baseline_mentions
    found, per_mention = timed(searcher, data["queries"][:count], args.k)
    per_token = held_bytes(shards, False) / len(ids)
    return [
        f"| {entities:,} | ivfpq {nlist} lists, pq_m {pq_m}, token copy ({count} mentions) | "
        f"{nprobe} | {depth} | {recall(found, exact[:count]):.3f} | {1000 * per_mention:.1f} | "
        f"– | {per_token:.1f} + {2 * vectors.shape[1]} on disk | "
        f"{seconds / len(ids) * 1e6:.0f} |"
    ]


def main() -> int:
    parser = harness.arguments(
        __doc__,
        "plaid_index",
        work_dir=Path("/work/plaid-bench"),
        mentions=100,
        k=100,
        shard_size=50_000,
        centroids=65_536,
        baseline_mentions=20,
        catalogue=1_000_000,
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument(
        "--plaid",
        nargs="+",
        default=["32:codes", "8:copy"],
        help="PQ_M:codes|copy[:POOL]: plaid builds, survivors scored from decoded codes or the "
        "token copy, entity tokens pooled by POOL first",
    )
    parser.add_argument("--nprobes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--depths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument(
        "--baseline",
        type=int,
        nargs=4,
        default=[1024, 16, 32, 3200],
        metavar=("NLIST", "PQ_M", "NPROBE", "DEPTH"),
        help="today's IVF-PQ token index beside it (0 0 0 0: none)",
    )
    args = harness.parse(parser)
    if max(args.sizes) > args.catalogue:
        raise SystemExit(f"--sizes {max(args.sizes)} exceeds --catalogue {args.catalogue}")
    run = Run(args.work_dir, args.catalogue, 128, 32, 2, "auto").load()
    prepare(run)
    data = stored_tokens(run, args.catalogue, args.mentions)
    header = [
        "# The plaid token index against IVF-PQ and exact sum-of-max",
        "",
        f"Synthetic KILT entities of up to 128 tokens, the tests' tiny random BERT (d = 32), "
        f"sum-of-max; {args.mentions} test mentions searched one at a time; recall of the exact "
        f"top-{args.k} in the searched top-{args.k}. Plaid: `nprobe` centroids a query token, "
        "`depth` entities kept by the pruned centroid interaction (a quarter of them scored "
        "exactly, from their decoded codes or from the float16 token copy); stage ms: candidate generation with the pruned centroid interaction / "
        "centroid interaction / decoding and exact scoring. Bytes a token: what a holder keeps in "
        "memory. Build: µs a token, training included. "
        f"Shards of {args.shard_size:,} entities, one holder. Command: "
        f"`{harness.invocation('benchmarks.plaid_index')}`.",
        "",
        "| entities | index | nprobe | depth | recall of exact top-k | ms a mention | stage ms | "
        "bytes a token | build µs a token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows: list[str] = []
    for entities in args.sizes:
        ids = data["ids"][: np.searchsorted(data["ids"], entities)]
        exact = exact_top_k(data["queries"], data["vectors"][: len(ids)], ids, args.k)
        for variant in args.plaid:
            pq_m, rescore, *pool = variant.split(":")
            pool_factor = int(pool[0]) if pool else 1
            rows += plaid_rows(args, data, entities, exact, int(pq_m), rescore, pool_factor)
            harness.write_result(args.output, header + rows)
        if args.baseline[0]:
            rows += baseline_rows(args, data, entities, exact)
            harness.write_result(args.output, header + rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
