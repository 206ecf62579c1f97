"""The plaid token index against today's IVF-PQ token index and exact sum-of-max, on the token
vectors of real models over real text (``index.kind: plaid``, :mod:`hnce.cluster.stores.plaid`).

One table for each model of ``--models`` and text of ``--texts`` (model by model)
(:mod:`benchmarks.plaid_catalogues`: WordNet's whole catalogue and FOLDOC's entries under
all-MiniLM-L6-v2 pretrained and after a short sum-of-max training, or the synthetic KILT catalogue
under the tests' tiny random model), its rows:

1. **exact**: each mention's exact sum-of-max top-k by brute force over every stored token (float16,
   scored in float32 chunk by chunk), the reference of every recall; its ms a mention is timed one
   mention at a time on the first ``--exact-timed`` mentions.
2. **plaid**, a build per ``--plaid CENTROIDS:PQ_M[:POOL]``, made as the encoder actors make one: a
   quantiser of CENTROIDS centroids placed through HNSW (``auto``: PLAID's 16·√T rounded down to a
   power of two, T the tokens indexed, as ColBERT's indexer chooses, the default) trained on
   the version's ``training_sample`` (40 tokens a centroid,
   ``IndexSpec.train_size``), then each shard of ``--shard-size`` entities placed and coded chunk
   by chunk (``compress_tokens``), its float16 token copy kept beside the codes
   (``index.token_copy``); POOL pools each entity's tokens first (``index.token_pool_factor``;
   exact stays over every token). The mentions are searched one at a time through
   ``ShardedSearcher`` at each ``--nprobes`` × ``--depths`` (search-time knobs, one build), the
   survivors scored once from their decoded codes and once from the copy (the same shards with
   the copy detached, then attached), with the ms of each of PLAID's stages.
3. **IVF-PQ** (``--baseline NLIST PQ_M NPROBE DEPTH``, rescored from the token copy: today's
   compressed sum-of-max) built and searched the same way, on the first ``--baseline-mentions``.
4. **Where plaid loses** (the line under the table), on the first plaid build at the first nprobe
   over the first ``--stage-mentions`` mentions: the candidates' share of the catalogue and the
   exact top-k they hold, what the pruned centroid interaction keeps in its best ``depth``
   (each of ``--depths``) and the full centroid interaction in its best first depth, and what
   exact sum-of-max over every decoded token keeps (the bound the residual codes set).

Bytes a token: what a holder keeps in memory (codes, int64 ids, the plaid inverse, the FAISS files;
a copy on disk counted apart). Build: µs a token, training included, and the seconds a holder
spends building the plaid inverse when it loads the version. A table is rewritten after each
build, so a stopped run keeps what it measured.

    .venv/bin/python -m benchmarks.plaid_index --nice 5 --texts wordnet foldoc \
        --models pretrained trained

The synthetic catalogue on the tiny random model (a prefix of a 1M-entity catalogue):

    .venv/bin/python -m benchmarks.plaid_index --nice 5 --texts synthetic --models tiny \
        --entities 200000 --plaid 65536:32 --baseline 1024 16 32 3200 --baseline-mentions 20
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
from benchmarks.plaid_catalogues import MODELS, TEXTS, TokenCatalogue, token_catalogue
from benchmarks.token_index import catalogue_quantiser, compressed_shard, recall, shard_ranges
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.plaid import centroid_interaction, probe, pruned_interaction, top
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.encoders.token_pooling import pool_tokens
from hnce.progress import progress_bar

#: token vectors scored at once by the exact search (bounds its [tokens, B·Q] score matrix)
EXACT_CHUNK_TOKENS = 400_000
#: entities pooled at once
POOL_CHUNK = 20_000
#: ``--plaid``'s CENTROIDS for PLAID's own choice from the tokens
AUTO = "auto"


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


def plaid_centroids(tokens: int) -> int:
    """PLAID's centroid count for `tokens` token vectors: 16·√T rounded down to a power of two
    (ColBERT's ``CollectionIndexer``, ``int(2 ** floor(log2(16 · sqrt(T))))``)."""
    return int(2 ** np.floor(np.log2(16 * np.sqrt(tokens))))


def build(
    vectors: np.ndarray, ids: np.ndarray, entities: int, spec: IndexSpec, shard_size: int
) -> tuple[list[IndexShard], float]:
    """The shards of the `entities` entities on one quantiser trained on the catalogue's
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
    bounds = np.searchsorted(ids, np.arange(0, int(ids[-1]) + 1 + POOL_CHUNK, POOL_CHUNK))
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


def with_copies(shards: list[IndexShard], copies: list[np.ndarray | None]) -> list[IndexShard]:
    """`shards` scoring their survivors from `copies` (their float16 token copies), or from
    their decoded codes where a copy is None (the shards' inverse is kept: one build, one
    load)."""
    for shard, copy in zip(shards, copies, strict=True):
        shard.vectors = copy
    return shards


class PlaidBuild:
    """One plaid build of a catalogue (``--plaid CENTROIDS:PQ_M[:POOL]``): its shards, each with
    its codes and its float16 token copy, and what building and loading it cost."""

    def __init__(self, args, catalogue: TokenCatalogue, setting: str) -> None:
        centroids, pq_m, *pool = setting.split(":")
        self.pool = int(pool[0]) if pool else 1
        vectors, ids = catalogue.vectors, catalogue.ids
        if self.pool > 1:
            vectors, ids = pooled(vectors, ids, self.pool)
        count = plaid_centroids(len(ids)) if centroids == AUTO else int(centroids)
        self.spec = IndexSpec(
            kind="plaid",
            nlist=count,
            pq_m=int(pq_m),
            token_copy=True,
            token_pool_factor=self.pool,
        )
        self.shards, self.seconds = build(
            vectors, ids, catalogue.entities, self.spec, args.shard_size
        )
        self.copies = [shard.vectors for shard in self.shards]
        loaded = time.perf_counter()
        ShardedSearcher(self.shards, None)  # builds each shard's inverse: what holding costs
        self.inverse_seconds = time.perf_counter() - loaded
        self.tokens = len(ids)
        self.label = f"plaid {self.shards[0].centroids.shape[0]:,} centroids"
        self.label += " (16·√T)" if centroids == AUTO else ""
        self.label += f", pq_m {self.spec.pq_m}"
        if self.pool > 1:
            self.label += f", pooled by {self.pool} ({len(ids) / catalogue.tokens:.2f} of tokens)"

    def codes(self) -> list[IndexShard]:
        return with_copies(self.shards, [None] * len(self.shards))

    def copied(self) -> list[IndexShard]:
        return with_copies(self.shards, self.copies)


def plaid_rows(args, catalogue: TokenCatalogue, exact: np.ndarray, plaid: PlaidBuild) -> list[str]:
    """A row per ``--nprobes`` × ``--depths`` over one plaid build: recall and ms a mention with
    its survivors scored from their decoded codes and from the token copy, the stages' ms of
    the first."""
    dim = catalogue.vectors.shape[1]
    per_token = f"{held_bytes(plaid.codes(), True) / catalogue.tokens:.1f}"
    per_token += f" (copy: + {2 * dim * plaid.tokens / catalogue.tokens:.0f} on disk)"
    build_cost = (
        f"{plaid.seconds / catalogue.tokens * 1e6:.0f} (inverse at load: "
        f"{plaid.inverse_seconds:.1f} s)"
    )
    rows = []
    for nprobe in args.nprobes:
        for shard in plaid.shards:
            faiss.extract_index_ivf(shard.index).nprobe = nprobe
        for depth in args.depths:
            measured = []
            for scored_from in (plaid.codes, plaid.copied):  # one after the other
                searcher = ShardedSearcher(scored_from(), None, candidate_depth=depth)
                searcher.stage_seconds = Counter()
                found, per_mention = timed(searcher, catalogue.queries, args.k)
                measured.append((recall(found, exact), per_mention, searcher.stage_seconds))
            (codes, codes_ms, stages), (copy, copy_ms, _) = measured
            stage_ms = " / ".join(
                f"{1000 * stages[name] / len(catalogue.queries):.1f}"
                for name in ("generation", "interaction", "exact")
            )
            rows.append(
                f"| {plaid.label} | {nprobe} | {depth:,} | {codes:.3f} / {copy:.3f} | "
                f"{1000 * codes_ms:.1f} / {1000 * copy_ms:.1f} | {stage_ms} | {per_token} | "
                f"{build_cost} |"
            )
    return rows


def baseline_row(args, catalogue: TokenCatalogue, exact: np.ndarray) -> str:
    """Today's IVF-PQ token index (``--baseline``, rescored from the token copy), searched for
    the first ``--baseline-mentions`` mentions."""
    nlist, pq_m, nprobe, depth = args.baseline
    spec = IndexSpec(kind="ivfpq", nlist=nlist, pq_m=pq_m, nprobe=nprobe, token_copy=True)
    vectors, ids = catalogue.vectors, catalogue.ids
    shards, seconds = build(vectors, ids, catalogue.entities, spec, args.shard_size)
    searcher = ShardedSearcher(shards, None, candidate_depth=depth)
    count = args.baseline_mentions or len(catalogue.queries)
    found, per_mention = timed(searcher, catalogue.queries[:count], args.k)
    lists = shards[0].centroids.shape[0]
    mentions = "" if count == len(catalogue.queries) else f" ({count} mentions)"
    return (
        f"| ivfpq {lists:,} lists, pq_m {pq_m}, token copy{mentions} | {nprobe} | {depth:,} | "
        f"{recall(found, exact[:count]):.3f} | {1000 * per_mention:.1f} | – | "
        f"{held_bytes(shards, False) / len(ids):.1f} + {2 * vectors.shape[1]} on disk | "
        f"{seconds / len(ids) * 1e6:.0f} |"
    )


def exact_row(args, catalogue: TokenCatalogue) -> str:
    """The brute-force exact search, one mention at a time over the first ``--exact-timed``."""
    count = min(args.exact_timed, len(catalogue.queries))
    started = time.perf_counter()
    for query in catalogue.queries[:count]:
        exact_top_k(query[None], catalogue.vectors, catalogue.ids, args.k)
    per_mention = (time.perf_counter() - started) / count
    return (
        f"| exact sum-of-max, brute force ({count} mentions timed) | – | – | 1.000 | "
        f"{1000 * per_mention:.0f} | – | {2 * catalogue.vectors.shape[1]} (float16) | – |"
    )


def overlap(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of `exact` (one mention's top-k) among the entity ids `found`."""
    return len(np.intersect1d(found, exact)) / len(exact)


def stage_overlaps(
    shards: list[IndexShard], query: np.ndarray, truth: np.ndarray, nprobe: int, depths, k: int
) -> dict[str, float]:
    """What PLAID's stages keep of one mention's exact top-k (`truth`), as plaid_search runs
    them: the candidates' count and the share of `truth` they hold; for each depth, the share
    the pruned centroid interaction keeps in its best ``max(4k, depth)`` and the share the
    centroid interaction keeps in the best quarter of those (what is then scored exactly)."""
    centroids = shards[0].centroids
    by_centroid = np.ascontiguousarray(centroids @ query[np.abs(query).sum(axis=1) > 0].T)
    probed, floor = probe(by_centroid.T, nprobe)
    found = [pruned_interaction(s.postings, by_centroid, probed, floor) for s in shards]
    pairs = list(zip(shards, found, strict=True))
    ids = np.concatenate([s.entity_rows[0][slots] for s, (slots, _) in pairs])
    pruned = np.concatenate([scores for _, scores in found])
    interaction = np.concatenate(
        [np.zeros(0, np.float32)]
        + [
            centroid_interaction(s.postings, by_centroid, *s.candidate_rows(slots))
            for s, (slots, _) in pairs
            if len(slots)
        ]
    )
    kept = {"candidates": len(ids), "held": overlap(ids, truth)}
    for depth in depths:
        survivors = top(pruned, max(4 * k, depth))
        quarter = survivors[top(interaction[survivors], max(4 * k, depth) // 4)]
        kept[f"pruned {depth}"] = overlap(ids[survivors], truth)
        kept[f"quarter {depth}"] = overlap(ids[quarter], truth)
    return kept


def where_plaid_loses(args, catalogue: TokenCatalogue, exact: np.ndarray, plaid: PlaidBuild) -> str:
    """What each stage of `plaid` keeps of the exact top-k at the first ``--nprobes``, over the
    first ``--stage-mentions`` mentions (module docstring, 4.), as one line."""
    nprobe, depths, count = args.nprobes[0], args.depths, args.stage_mentions
    shards = plaid.codes()
    stages = [
        stage_overlaps(shards, query, truth, nprobe, depths, args.k)
        for query, truth in zip(catalogue.queries[:count], exact[:count], strict=False)
    ]
    mean = {name: float(np.mean([kept[name] for kept in stages])) for name in stages[0]}
    decoded = np.concatenate(
        [s.token_vectors(np.arange(len(s.ids))).astype(np.float16) for s in shards]
    )
    ids = np.concatenate([s.ids for s in shards])
    codes = recall(exact_top_k(catalogue.queries[:count], decoded, ids, args.k), exact[:count])
    pruning = " and ".join(f"{mean[f'pruned {d}']:.3f} in its best {d:,}" for d in depths)
    quarter = " and ".join(f"{mean[f'quarter {d}']:.3f}" for d in depths)
    return (
        f"Where plaid loses ({plaid.label}, nprobe {nprobe}, {len(stages)} mentions): the "
        f"candidates are {mean['candidates'] / catalogue.entities:.0%} of the catalogue and hold "
        f"{mean['held']:.3f} of the exact top-{args.k}; the pruned centroid interaction keeps "
        f"{pruning}, the centroid interaction's best quarter of those {quarter}; exact "
        f"sum-of-max over every decoded token keeps {codes:.3f}."
    )


def catalogue_table(args, catalogue: TokenCatalogue, before: list[str]) -> list[str]:
    """The table of one catalogue (module docstring); the result file is written after each
    build, these lines after `before` (the tables measured so far)."""
    lines = [
        f"### {catalogue.title}",
        "",
        "| index | nprobe | depth | recall of exact top-k (codes / copy) | ms a mention "
        "(codes / copy) | stage ms (codes) | bytes a token | build µs a token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    exact = exact_top_k(catalogue.queries, catalogue.vectors, catalogue.ids, args.k)
    lines.append(exact_row(args, catalogue))
    harness.write_result(args.output, before + lines)
    losses = ""
    for setting in args.plaid:
        plaid = PlaidBuild(args, catalogue, setting)
        lines += plaid_rows(args, catalogue, exact, plaid)
        harness.write_result(args.output, before + lines)
        if not losses:
            losses = where_plaid_loses(args, catalogue, exact, plaid)
        del plaid
    if args.baseline[0]:
        lines.append(baseline_row(args, catalogue, exact))
    return [*lines, "", losses, ""]


def main() -> int:
    parser = harness.arguments(
        __doc__,
        "plaid_index",
        work_dir=Path("/work/plaid-bench"),
        entities=0,
        mentions=50,
        k=100,
        shard_size=50_000,
        catalogue=1_000_000,
        baseline_mentions=0,
        stage_mentions=20,
        exact_timed=3,
    )
    parser.add_argument("--texts", nargs="+", choices=TEXTS, default=["wordnet", "foldoc"])
    parser.add_argument(
        "--models", nargs="+", choices=sorted(MODELS), default=["pretrained", "trained"]
    )
    default = IndexSpec()
    parser.add_argument(
        "--plaid",
        nargs="+",
        default=[f"{AUTO}:{default.pq_m}"],
        help="CENTROIDS:PQ_M[:POOL]: plaid builds, CENTROIDS a number or 'auto' (16·√T, a "
        "power of two), entity tokens pooled by POOL first",
    )
    parser.add_argument("--nprobes", type=int, nargs="+", default=[default.probes])
    parser.add_argument("--depths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument(
        "--baseline",
        type=int,
        nargs=4,
        default=[default.nlist, default.pq_m, default.probes, default.candidate_depth],
        metavar=("NLIST", "PQ_M", "NPROBE", "DEPTH"),
        help="today's IVF-PQ token index beside it (0 0 0 0: none)",
    )
    args = harness.parse(parser)
    header = [
        "# The plaid token index against IVF-PQ and exact sum-of-max",
        "",
        f"Sum-of-max; {args.mentions} test mentions of each text searched one at a time; "
        f"recall of the exact top-{args.k} in the searched top-{args.k}. Plaid: `nprobe` "
        "centroids a query token, `depth` entities kept by the pruned centroid interaction "
        "(a quarter of them scored exactly, from their decoded codes or from the float16 token "
        "copy); stage ms: candidate generation with the pruned centroid interaction / centroid "
        "interaction / decoding and exact scoring. Bytes a token: what a holder keeps in memory. "
        f"Build: µs a token, training included. Shards of {args.shard_size:,} entities, one "
        f"holder. Command: `{harness.invocation('benchmarks.plaid_index')}`.",
        "",
    ]
    tables: list[str] = []
    for model, text in itertools.product(args.models, args.texts):
        catalogue = token_catalogue(args, text, model)
        tables += catalogue_table(args, catalogue, header + tables)
        harness.write_result(args.output, header + tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
