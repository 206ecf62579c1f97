"""Compressed multi-vector indexes against exact search: sum-of-max over IVF-PQ token
shards with rescoring from the tokens' codes, and multi-8 over IVF-PQ, at 200,000 entities, at the
towers' width and through a ``model.projection_size`` projection.

The catalogue is the synthetic KILT generator's (the full-scale benchmark's first stages,
:mod:`benchmarks.fullscale`, in the same work directory layout: generated and converted once,
resumed after). The model is the packaged MiniLM (d = 384), or with ``--model tiny`` the tests'
tiny model: a random 2-layer BERT of width 32 with MiniLM's vocabulary, drawn with σ = 0.5 as
``tests/test_full_path.py`` draws it. At BERT's usual σ = 0.02 its vectors are all but identical
(multi-8 scores of one mention against 20,000 entities: 32.0 ± 2·10⁻⁵), so its exact top-k
would rank float noise that no quantiser can keep; at 0.5 they spread, but the geometry is a
random model's, not a trained one's: MiniLM measures what compression loses on real geometry.

1. The catalogue is encoded once per scorer, as the encoder actors encode it
   (``entity_index_vectors``: sum-of-max every real token's vector, position 0 pooled; multi-8
   each entity's 8 leftmost, a short entity's missing ones repeating y_1), with the query vectors
   of ``--mentions`` test mentions, and cached in the work directory. Multi-8 alone keeps 8
   vectors an entity, so it reaches catalogues whose every token would not fit in memory.
2. For each width of ``--codes WIDTH:PQ_M`` other than the towers' own, every vector goes through
   one fresh :class:`~hnce.encoders.biencoder.TowerProjection` (``model.projection_size``'s layer,
   seeded, in eval mode: W·v + b; padded query rows stay zero). Both sides go through the same
   layer, so scores keep the model's geometry as a trained projection would (two independent
   untrained layers would score noise).
3. The exact top-k is computed by brute force (sum-of-max: Σ_i max_j ⟨x_i, y_j⟩ over every token
   of every entity, in chunks; multi-8: max_t ⟨x, y_t⟩).
4. The catalogue is indexed the way the encoder actors index it (one IVF-PQ quantiser trained
   on the catalogue's ``training_sample``, as ``train_quantiser`` does; then sum-of-max:
   ``compress_tokens`` on it, chunk by chunk; multi-8: ``build_shard_index`` on it and the
   float16 copy of the shard's vectors its candidates are rescored from), in shards of
   ``--shard-size`` entities, the same mentions are searched (``ShardedSearcher``, as the shard
   holders search, at each of ``--depths`` and each of ``--nprobes``: lists probed per query,
   a search-time knob, so one build serves them all) and the recall of the exact top-k is
   reported, with the index's bytes per vector, the build time and the search time per mention.

    .venv/bin/python -m benchmarks.token_index --nice 5 --codes 384:96 128:64 128:128

writes ``benchmarks/results/token_index.md``. Multi-8 alone, at several candidate depths:

    .venv/bin/python -m benchmarks.token_index --entities 20000 --shard-size 10000 \
        --scorers multi-8 --codes 128:32 128:64 --depths 800 1600 --nprobes 32 128 512 \
        --output benchmarks/results/token_index_multi.md

Both scorers at the issue's 200,000 entities with the tiny model (about an hour on 2 cores, most
of it building sum-of-max's ``pq_m`` 32 shards):

    .venv/bin/python -m benchmarks.token_index --model tiny --entities 200000 --shard-size 50000 \
        --mentions 100 --codes 32:16 32:32 --depths 256 800 --nprobes 32 256 \
        --scorers multi-8 som --output benchmarks/results/token_index_tiny.md

Sum-of-max rescored from its decoded codes and from a float16 token copy (``index.token_copy``),
each its own build, at 200,000 entities:

    .venv/bin/python -m benchmarks.token_index --model tiny --entities 200000 --shard-size 50000 \
        --mentions 100 --codes 32:16 --depths 256 800 --scorers som --rescore codes copy \
        --output benchmarks/results/token_index_copy.md
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import torch

from benchmarks import harness
from benchmarks.fullscale.run import Run, write_model
from benchmarks.fullscale.stages import STAGES, is_done
from benchmarks.harness.models import write_random_bert
from hnce.cluster.compute.encoder_actor import SAMPLE_SEED
from hnce.cluster.compute.entity_encoding import (
    COMPRESSED_CHUNK_ENTITIES,
    compress_tokens,
    encode_entities,
    training_sample,
)
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import build_shard_index, train_index
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder, TowerProjection, build_biencoder, minilm_path
from hnce.progress import progress_bar

#: the catalogue's preparation: generate, convert (:mod:`benchmarks.fullscale.stages`)
PREPARATION = STAGES[:2]
MODELS = {
    "minilm": "the packaged all-MiniLM-L6-v2 (d = 384)",
    "tiny": "the tests' tiny random BERT (2 layers, d = 32, drawn with σ = 0.5)",
}
#: token vectors scored at once by the exact sum-of-max (bounds the [B·Q, chunk] score matrix)
EXACT_CHUNK_TOKENS = 50_000


def prepare(run: Run) -> None:
    """The catalogue generated and converted (skipped when done)."""
    write_model(run)
    harness.run_stages(
        run.state,
        [(name, lambda m=measure: m(run).record()) for name, measure in PREPARATION],
        lambda name: is_done(run, name),
    )


def scoring_model(run: Run, model: str, scorer: str) -> tuple[BiEncoder, TokenStore]:
    """MiniLM or the tiny random BERT (seed 0) under ``scorer``, as ``hnce train`` would start
    it, and the catalogue's token store for its tokenizer (built the first time)."""
    if model == "minilm":
        path = minilm_path()
    else:
        path = write_random_bert(
            run.workdir / "model-tiny", minilm_path(), 2, 32, head_width=32, initializer_range=0.5
        )
    torch.manual_seed(0)
    encoder = build_biencoder(path, scorer, entity_length=run.entity_length).eval()
    return encoder, TokenStore.ensure(run.data, encoder.tokenizer, run.entity_length)


def mention_queries(run: Run, model: BiEncoder, count: int) -> np.ndarray:
    """Query vectors [B, Q, d] of the first `count` test mentions."""
    mentions = MentionSplit.open(mention_split_path(run.data, "test")).read_all()[:count]
    with torch.inference_mode():
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        return model.mention_query_vectors(tokens["input_ids"], tokens["attention_mask"]).numpy()


def encoded(run: Run, args, scorer: str) -> dict[str, np.ndarray]:
    """``scorer``'s encoding of the first ``args.entities`` entities and ``args.mentions`` test
    mentions at the towers' width (`queries` [B, Q, d], index `vectors` [V, d], entity `ids` [V],
    token `lengths` of the catalogue), cached in the work directory after the first run."""
    cache = run.workdir / f"{scorer}-{args.model}-{args.entities}-{args.mentions}.npz"
    if cache.is_file():
        with np.load(cache) as saved:
            return dict(saved)
    model, tokens = scoring_model(run, args.model, scorer)
    vectors, ids, _ = encode_entities(model, tokens, np.arange(args.entities), 64)
    arrays = {
        "queries": mention_queries(run, model, args.mentions),
        "vectors": vectors,
        "ids": ids,
        "lengths": np.asarray(tokens.lengths),
    }
    with AtomicPath(cache) as temporary, open(temporary, "wb") as handle:
        np.savez(handle, **arrays)
    return arrays


def projected(queries: np.ndarray, vectors: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    """Queries and index vectors through one fresh ``model.projection_size`` layer of `width`
    (seed 0, eval mode: W·v + b); padded (all-zero) query rows stay zero."""
    if width == vectors.shape[1]:
        return queries, vectors
    torch.manual_seed(0)
    layer = TowerProjection(vectors.shape[1], width).additional_linear.eval()
    with torch.inference_mode():
        live = torch.from_numpy(np.abs(queries).sum(axis=2, keepdims=True) > 0)
        query_out = layer(torch.from_numpy(queries)) * live
        vector_out = torch.cat([layer(part) for part in torch.from_numpy(vectors).split(65_536)])
    return query_out.numpy(), vector_out.numpy()


def exact_sum_of_max(
    queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int
) -> np.ndarray:
    """The exact sum-of-max top-k entities [B, k] over every token (brute force in chunks of
    whole entities)."""
    batch, width, dim = queries.shape
    live = torch.from_numpy((np.abs(queries).sum(axis=2) > 0).astype(np.float32))
    flat = torch.from_numpy(np.ascontiguousarray(queries.reshape(batch * width, dim)))
    entities, first = np.unique(ids, return_index=True)
    bounds = np.append(first, len(ids))
    best_ids = np.full((batch, 0), -1, np.int64)
    best_scores = torch.full((batch, 0), -np.inf)
    per_chunk = max(1, EXACT_CHUNK_TOKENS * len(entities) // len(ids))
    for start in progress_bar(range(0, len(entities), per_chunk), desc="exact sum-of-max"):
        stop = min(start + per_chunk, len(entities))
        rows = slice(int(bounds[start]), int(bounds[stop]))
        token_scores = torch.from_numpy(vectors[rows]) @ flat.T  # [chunk tokens, B·Q]
        lengths = torch.from_numpy(np.diff(bounds[start : stop + 1]))
        per_entity = torch.segment_reduce(token_scores, "max", lengths=lengths)  # [chunk, B·Q]
        scores = (per_entity.T.reshape(batch, width, -1) * live[:, :, None]).sum(dim=1)
        merged = torch.cat([best_scores, scores], dim=1)
        top = merged.topk(min(k, merged.shape[1]), dim=1)
        candidates = np.concatenate(
            [best_ids, np.broadcast_to(entities[start:stop], (batch, stop - start))], axis=1
        )
        best_ids = np.take_along_axis(candidates, top.indices.numpy(), axis=1)
        best_scores = top.values
    return best_ids


def exact_multi(queries: np.ndarray, vectors: np.ndarray, m: int, k: int) -> np.ndarray:
    """The exact multi-m top-k entities [B, k]: s = max_t ⟨x, y_t⟩."""
    scores = torch.from_numpy(queries[:, 0]) @ torch.from_numpy(vectors).T
    return scores.view(len(queries), -1, m).amax(dim=2).topk(k, dim=1).indices.numpy()


def shard_ranges(entities: int, shard_size: int) -> Iterator[np.ndarray]:
    for start in range(0, entities, shard_size):
        yield np.arange(start, min(start + shard_size, entities), dtype=np.int64)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each mention's exact top-k found in its searched top-k."""
    return float(
        np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact, strict=True)])
    )


def index_bytes(shards: list[IndexShard]) -> int:
    """Bytes a version of these shards holds in memory: FAISS files, int64 ids and token codes
    (a float16 copy stays on disk, memory-mapped: counted apart)."""
    total = 0
    for shard in shards:
        total += faiss.serialize_index(shard.storage).nbytes + shard.ids.nbytes
        total += 0 if shard.codes is None else shard.codes.nbytes
    return total


def probing(shards: list[IndexShard], nprobe: int) -> list[IndexShard]:
    """``shards`` with each IVF index probing ``nprobe`` lists per query (at most its own
    ``nlist``: FAISS clamps it); the codes stay as built."""
    for shard in shards:
        faiss.extract_index_ivf(shard.index).nprobe = nprobe
    return shards


def searches(
    args, shards: list[IndexShard], m: int | None, queries: np.ndarray
) -> Iterator[tuple[int, int, np.ndarray, float]]:
    """For each of ``--nprobes`` × ``--depths``: (nprobe, depth, found top-k, seconds per
    mention) of ``queries`` through ``ShardedSearcher`` over ``shards``. Multi-m searches at
    least k·m vectors, so the depths below that are one search, run once at k·m."""
    depths = args.depths if m is None else sorted({max(d, args.k * m) for d in args.depths})
    for nprobe in args.nprobes:
        for depth in depths:
            searcher = ShardedSearcher(probing(shards, nprobe), m, candidate_depth=depth)
            yield nprobe, depth, *timed_search(searcher, queries, args.k)


def timed_search(
    searcher: ShardedSearcher, queries: np.ndarray, k: int
) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    found, _ = searcher.search(queries, k)
    return found, (time.perf_counter() - started) / len(queries)


def catalogue_quantiser(
    vectors: np.ndarray, ids: np.ndarray, lengths: np.ndarray, spec: IndexSpec
) -> faiss.Index:
    """The version's one IVF-PQ quantiser, as ``EntityEncoderActor.train_quantiser`` trains it:
    on the vectors of a sample of the whole catalogue's entities (`lengths`: vectors each)."""
    sample = training_sample(lengths, spec.train_size, SAMPLE_SEED)
    first = np.searchsorted(ids, sample)
    last = np.searchsorted(ids, sample, side="right")
    rows = np.concatenate([np.arange(a, b) for a, b in zip(first, last, strict=True)])
    return train_index(vectors[rows], spec, SAMPLE_SEED)


def compressed_shard(
    vectors: np.ndarray,
    ids: np.ndarray,
    entity_ids: np.ndarray,
    trained: faiss.Index,
    spec: IndexSpec,
) -> IndexShard:
    """The compressed shard of `entity_ids` that an encoder actor would write on the version's
    `trained` quantiser, made from the catalogue's encoded token `vectors` (entity `ids`)
    instead of encoding them again."""
    first = np.searchsorted(ids, entity_ids)
    last = np.searchsorted(ids, entity_ids, side="right")
    chunks = (
        (vectors[first[s] : last[e - 1]], ids[first[s] : last[e - 1]], 0)
        for s, e in (
            (s, min(s + COMPRESSED_CHUNK_ENTITIES, len(entity_ids)))
            for s in range(0, len(entity_ids), COMPRESSED_CHUNK_ENTITIES)
        )
    )
    built = compress_tokens(trained, chunks, spec)
    cpu = resolve_faiss_device("cpu")
    return IndexShard.on_device(built.index, built.ids, cpu, built.codes, built.vectors)


def sum_of_max_rows(
    args,
    queries: np.ndarray,
    vectors: np.ndarray,
    ids: np.ndarray,
    lengths: np.ndarray,
    pq_ms: list[int],
) -> list[str]:
    """One row per ``pq_m``, what the candidates are rescored from (``--rescore``: the decoded
    codes, or the float16 copy of ``index.token_copy``) and candidate depth, all against one
    exact top-k."""
    exact = exact_sum_of_max(queries, vectors, ids, args.k)
    rows = []
    for pq_m in pq_ms:
        for rescore in args.rescore:
            spec = IndexSpec(
                kind="ivfpq", nlist=args.nlist, pq_m=pq_m, token_copy=rescore == "copy"
            )
            started = time.perf_counter()
            trained = catalogue_quantiser(vectors, ids, lengths, spec)
            shards = [
                compressed_shard(vectors, ids, entity_ids, trained, spec)
                for entity_ids in shard_ranges(args.entities, args.shard_size)
            ]
            build_seconds = time.perf_counter() - started
            per_token = f"{index_bytes(shards) / len(ids):.1f}"
            if spec.token_copy:
                per_token += f" + {2 * vectors.shape[1]} on disk"
            for nprobe, depth, found, seconds in searches(args, shards, None, queries):
                rows.append(
                    f"| som, {rescore} | {vectors.shape[1]} | {pq_m} | {nprobe} | {depth} | "
                    f"{recall(found, exact):.3f} | "
                    f"{per_token} (flat: {4 * vectors.shape[1] + 8}) | {build_seconds:.0f} | "
                    f"{1000 * seconds:.0f} |"
                )
    return rows


def multi_rows(
    args, queries: np.ndarray, vectors: np.ndarray, pq_ms: list[int], m: int = 8
) -> list[str]:
    """One row per ``pq_m`` and candidate depth, all against one exact top-k: IVF-PQ shards with
    the float16 copy of their vectors the encoder actors keep, so the candidates (the entities
    of the ``max(depth, k·m)`` nearest vectors across the shards) are rescored exactly."""
    exact = exact_multi(queries, vectors, m, args.k)
    ids = np.repeat(np.arange(args.entities, dtype=np.int64), m)
    rows = []
    for pq_m in pq_ms:
        spec = IndexSpec(kind="ivfpq", nlist=args.nlist, pq_m=pq_m)
        started = time.perf_counter()
        trained = catalogue_quantiser(vectors, ids, np.full(args.entities, m), spec)
        shards = []
        for entity_ids in shard_ranges(args.entities, args.shard_size):
            rows_of = slice(int(entity_ids[0]) * m, (int(entity_ids[-1]) + 1) * m)
            index = build_shard_index(vectors[rows_of], spec, trained=trained)
            copy = vectors[rows_of].astype(np.float16)
            cpu = resolve_faiss_device("cpu")
            shards.append(IndexShard.on_device(index, ids[rows_of], cpu, vectors=copy))
        build_seconds = time.perf_counter() - started
        per_vector = index_bytes(shards) / len(ids)
        for nprobe, depth, found, seconds in searches(args, shards, m, queries):
            rows.append(
                f"| multi-{m} | {vectors.shape[1]} | {pq_m} | {nprobe} | {depth} | "
                f"{recall(found, exact):.3f} | {per_vector:.1f} + {2 * vectors.shape[1]} on disk "
                f"(flat: {4 * vectors.shape[1] + 8}) | {build_seconds:.0f} | {1000 * seconds:.0f} |"
            )
    return rows


def scorer_labels(args) -> list[str]:
    """The runs of one invocation as its title names them (several invocations share a
    catalogue size and a model), e.g. ``som rescored from codes and copy``, ``multi-8``."""
    return [
        f"som rescored from {' and '.join(args.rescore)}" if scorer == "som" else scorer
        for scorer in args.scorers
    ]


def code_settings(values: list[str]) -> dict[int, list[int]]:
    """``WIDTH:PQ_M`` pairs (e.g. 384:96 128:64), each width divisible by its pq_m, as each
    width's pq_m values in the order given (a width is projected and searched exactly once)."""
    widths: dict[int, list[int]] = {}
    for value in values:
        width, _, pq_m = value.partition(":")
        if not (width.isdigit() and pq_m.isdigit()) or int(width) % int(pq_m):
            raise SystemExit(f"--codes {value}: expected WIDTH:PQ_M with PQ_M dividing WIDTH")
        widths.setdefault(int(width), []).append(int(pq_m))
    return widths


def main() -> int:
    parser = harness.arguments(
        __doc__,
        "token_index",
        work_dir=Path("/work/token-index"),
        entities=200_000,
        mentions=200,
        k=100,
        shard_size=50_000,
        nlist=1024,
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument(
        "--codes",
        nargs="+",
        default=["384:48", "384:96", "128:64", "128:128"],
        help="WIDTH:PQ_M pairs: vectors projected to WIDTH (the towers' own: unprojected), "
        "PQ_M sub-quantisers",
    )
    parser.add_argument("--depths", type=int, nargs="+", default=[256])
    parser.add_argument(
        "--nprobes",
        type=int,
        nargs="+",
        default=[32],
        help="IVF lists probed per query, each searched over the same build",
    )
    parser.add_argument(
        "--scorers", nargs="+", choices=["som", "multi-8"], default=["som", "multi-8"]
    )
    parser.add_argument(
        "--rescore",
        nargs="+",
        choices=["codes", "copy"],
        default=["codes"],
        help="sum-of-max: rescore candidates from their decoded codes, or from the float16 "
        "token copy of index.token_copy (each a build of its own)",
    )
    args = harness.parse(parser)
    settings = code_settings(args.codes)
    run = Run(args.work_dir, args.entities, 128, 32, 2, "auto").load()
    prepare(run)
    rows = []
    for scorer in args.scorers:
        arrays = encoded(run, args, scorer)
        for width, pq_ms in settings.items():
            queries, vectors = projected(arrays["queries"], arrays["vectors"], width)
            if scorer == "som":
                lengths = arrays["lengths"]
                rows += sum_of_max_rows(args, queries, vectors, arrays["ids"], lengths, pq_ms)
            else:
                rows += multi_rows(args, queries, vectors, pq_ms)
    lines = [
        f"# Compressed multi-vector indexes against exact search: {args.entities:,} entities, "
        f"{args.model}; {', '.join(scorer_labels(args))}",
        "",
        f"{args.entities:,} synthetic KILT entities of up to 128 tokens, "
        f"{MODELS[args.model]} under each scorer, its vectors at their own width or through a "
        "fresh `model.projection_size` layer (the same one on both sides: see the module's "
        f"docstring); {args.mentions} test mentions; recall of the "
        f"exact top-{args.k} in the searched top-{args.k}. IVF-PQ: one quantiser of {args.nlist} "
        "lists (fewer where its sample has under 39 vectors a list), trained on a sample of the "
        f"whole catalogue and shared by every shard of {args.shard_size:,} entities, `nprobe` "
        "of them probed, 8-bit codes; build s includes training it. Sum-of-max rescores "
        "every candidate (its query tokens' `candidate depth` nearest tokens' entities across "
        "all the shards, which one shard holder holds here) from its "
        "tokens' decoded codes (`som, codes`) or from the float16 copy of its tokens kept on disk "
        "instead of the codes (`som, copy`: `index.token_copy`); multi-8 rescores the entities "
        "of its `candidate depth` (at least k x m) nearest vectors across the shards from the "
        "float16 copy of its vectors kept on disk. Bytes per "
        "vector: the FAISS file, the int64 id and (som, codes) the standalone code; the copies "
        "apart. Command: "
        f"`{harness.invocation('benchmarks.token_index')}`.",
        "",
        "| scorer | width | pq_m | nprobe | candidate depth | recall of exact top-k | "
        "bytes per vector | build s | search ms per mention |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    harness.write_result(args.output, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
