"""Sharded FAISS index over entity vectors, and the searcher that merges its shards (DESIGN.md §5, §7).

Each shard is one FAISS index plus an `ids` array giving the entity id of every vector in it
(one vector per entity for dual, m per entity for multi-m, one per token for sum-of-max). Shards
are searched one after another and their top-k lists merged with FAISS's `ResultHeap` (a C++
heap): on a 2-core machine threaded `IndexShards` is slower than sequential search (DESIGN.md §7).

Score functions (DESIGN.md §3, eq. 9 of papers/000 restated there):

- dual: s(x, y) = ⟨x_1, y_1⟩ — one vector per entity, the heap merge is exact.
- multi-m: s(x, y) = max_{t≤m} ⟨x_1, y_t⟩ — the index holds m vectors per entity. Walking vector
  hits in descending score order, an entity's first hit is its max, so the first k distinct
  entities are exactly the top-k entities; and the top k·m vector hits contain at least k distinct
  entities (each contributes at most m). Searching k·m vectors deep is therefore exact.
- som: s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ — a token-level index proposes candidates (each query token's
  nearest entity tokens), then the candidates are rescored exactly from their stored token vectors
  (ColBERT-style). Exact when `candidate_depth` covers the catalogue; meant for small catalogues.

The device is chosen in one place, `resolve_faiss_device`: FAISS GPU shards (fp16 flat) when faiss
has GPU support and a GPU is visible, CPU otherwise; the choice is logged, and asking for `gpu`
without one raises instead of falling back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import faiss
import numpy as np
from pydantic import ValidationInfo, field_validator

from encoders.settings import PositiveInt, settings

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "ivfpq", "hnsw"]
DeviceRequest = Literal["auto", "cpu", "gpu"]


@settings
class IndexSpec:
    """The ``index`` section of a recipe: how each shard is indexed, where it is searched, and
    how many versions the stores keep.

    `flat` (exact inner product) is the default, since mining wants exact top-N; `ivfpq` and
    `hnsw` are approximate options for serving a large catalogue.

    Attributes:
        kind: flat | ivfpq | hnsw.
        nlist: IVF lists per shard (ivfpq); clipped so each list gets training points.
        pq_m: PQ sub-quantisers (ivfpq); `dim` must be divisible by it. 8 bits each.
        nprobe: IVF lists visited per query (ivfpq); at most `nlist`.
        hnsw_m: graph degree (hnsw).
        ef_search: search beam (hnsw).
        train_size: vectors sampled per shard to train IVF-PQ.
        candidate_depth: sum-of-max only: entity tokens retrieved per query token before the
            exact rerank.
        faiss_device: auto | cpu | gpu: where shards are searched (GPU: fp16 flat); `gpu`
            without one is an error, never a silent CPU fallback.
        keep_versions: index and negatives versions retained after a publication.
    """

    kind: IndexKind = "flat"
    nlist: PositiveInt = 1024
    pq_m: PositiveInt = 64
    nprobe: PositiveInt = 32
    hnsw_m: PositiveInt = 32
    ef_search: PositiveInt = 128
    train_size: PositiveInt = 65_536
    candidate_depth: PositiveInt = 256
    faiss_device: DeviceRequest = "auto"
    keep_versions: PositiveInt = 2

    @field_validator("nprobe")
    @classmethod
    def _probe_at_most_every_list(cls, nprobe: int, info: ValidationInfo) -> int:
        nlist = info.data.get("nlist", nprobe)
        if nprobe > nlist:
            raise ValueError(f"({nprobe}) cannot exceed nlist ({nlist})")
        return nprobe

    def to_json(self) -> dict[str, object]:
        """The fields that decide the bytes of a built shard (recorded in a version's manifest;
        a resumed build must match them)."""
        return {
            "kind": self.kind,
            "nlist": self.nlist,
            "pq_m": self.pq_m,
            "nprobe": self.nprobe,
            "hnsw_m": self.hnsw_m,
            "ef_search": self.ef_search,
            "train_size": self.train_size,
        }


def build_shard_index(
    vectors: np.ndarray, spec: IndexSpec, seed: int = 0, trained: faiss.Index | None = None
) -> faiss.Index:
    """A CPU FAISS index over `vectors` [n, d] (float32, inner product), built per `spec`.

    Built on the CPU so the bytes written to the store do not depend on the device; searching
    places it on the device (`FaissDevice.place`). Deterministic for a given input and seed.
    `trained` (from `train_index`) lets all shards share one trained IVF-PQ instead of training
    each shard on its own sample.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"shard vectors must be [n, d], got shape {vectors.shape}")
    if trained is not None:
        index = faiss.clone_index(trained)
        index.add(vectors)
        return index
    index = train_index(vectors, spec, seed)
    index.add(vectors)
    return index


def train_index(sample: np.ndarray, spec: IndexSpec, seed: int = 0) -> faiss.Index:
    """An empty index of kind `spec.kind`, trained on `sample` where the kind needs training."""
    vectors = np.ascontiguousarray(sample, dtype=np.float32)
    dim = vectors.shape[1]
    if spec.kind == "flat":
        index: faiss.Index = faiss.IndexFlatIP(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = spec.ef_search
    else:
        if dim % spec.pq_m:
            raise ValueError(f"ivfpq needs dim ({dim}) divisible by pq_m ({spec.pq_m})")
        # FAISS wants ~39 training points per centroid; fewer lists for a small shard.
        nlist = max(1, min(spec.nlist, len(vectors) // 39))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, spec.pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.pq.cp.seed = seed
        rng = np.random.default_rng(seed)
        train = vectors
        if len(vectors) > spec.train_size:
            train = vectors[np.sort(rng.choice(len(vectors), spec.train_size, replace=False))]
        index.train(train)
        index.nprobe = spec.nprobe
    return index


@dataclass
class FaissDevice:
    """Where shard indexes are searched: `cpu`, or one GPU with fp16 flat storage."""

    kind: Literal["cpu", "gpu"]
    gpu_id: int = 0
    float16: bool = True
    resources: object | None = None  # faiss.StandardGpuResources on a GPU

    def place(self, index: faiss.Index) -> faiss.Index:
        """`index` ready to search on this device (the CPU index itself on `cpu`)."""
        if self.kind == "cpu":
            return index
        if isinstance(index, faiss.IndexHNSW):
            raise ValueError("FAISS has no GPU HNSW; use --faiss-device cpu for hnsw shards")
        if isinstance(index, faiss.IndexFlat):
            config = faiss.GpuIndexFlatConfig()
            config.device = self.gpu_id
            config.useFloat16 = self.float16
            gpu_index = faiss.GpuIndexFlatIP(self.resources, index.d, config)
            gpu_index.copyFrom(index)
            return gpu_index
        options = faiss.GpuClonerOptions()
        options.useFloat16 = self.float16
        return faiss.index_cpu_to_gpu(self.resources, self.gpu_id, index, options)


def faiss_gpu_count() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu (no `StandardGpuResources`) or no visible GPU."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def resolve_faiss_device(requested: DeviceRequest = "auto", gpu_id: int = 0) -> FaissDevice:
    """The device for shard search: the only place that chooses between CPU and GPU.

    `auto` takes a GPU when FAISS has GPU support and sees one, else the CPU; `gpu` without one
    raises `RuntimeError` (never a silent fallback); `cpu` forces the CPU. The choice is logged.
    """
    if requested not in ("auto", "cpu", "gpu"):
        raise ValueError(f"faiss device must be auto, cpu or gpu, got {requested!r}")
    gpus = faiss_gpu_count()
    if requested == "gpu" and gpus == 0:
        reason = (
            "this faiss build has no GPU support (install the `gpu` extra, faiss-gpu-cu12)"
            if not hasattr(faiss, "StandardGpuResources")
            else "faiss sees no GPU"
        )
        raise RuntimeError(f"GPU index shards requested but {reason}")
    if requested == "cpu" or gpus == 0:
        logger.info("FAISS shards on CPU (%s)", "forced" if requested == "cpu" else "no GPU")
        return FaissDevice("cpu")
    if gpu_id >= gpus:
        raise RuntimeError(f"FAISS GPU {gpu_id} requested but only {gpus} visible")
    logger.info("FAISS shards on GPU %d (fp16 flat storage)", gpu_id)
    return FaissDevice("gpu", gpu_id=gpu_id, resources=faiss.StandardGpuResources())


@dataclass
class IndexShard:
    """One searchable shard: a FAISS index and the entity id of each of its vectors."""

    index: faiss.Index
    ids: np.ndarray  # int64 [ntotal]

    def __post_init__(self) -> None:
        if len(self.ids) != self.index.ntotal:
            raise ValueError(
                f"shard has {self.index.ntotal} vectors but {len(self.ids)} entity ids"
            )


class ShardedSearcher:
    """Fans a query batch out to every shard in turn and merges per-shard top-k with a heap.

    Args:
        shards: the shards (already placed on their device).
        vectors_per_entity: 1 (dual), m (multi-m) or None (one vector per token: sum-of-max).
        candidate_depth: sum-of-max only: entity tokens retrieved per query token before the
            exact rerank.
    """

    def __init__(
        self,
        shards: Sequence[IndexShard],
        vectors_per_entity: int | None = 1,
        candidate_depth: int = 256,
    ) -> None:
        if not shards:
            raise ValueError("a sharded index needs at least one shard")
        if vectors_per_entity is not None and vectors_per_entity < 1:
            raise ValueError(f"vectors_per_entity must be >= 1 or None, got {vectors_per_entity}")
        self.shards = list(shards)
        self.vectors_per_entity = vectors_per_entity
        self.candidate_depth = candidate_depth
        self.dim = self.shards[0].index.d
        self.ntotal = sum(shard.index.ntotal for shard in self.shards)
        self._token_vectors: np.ndarray | None = None
        self._token_offsets: np.ndarray | None = None
        self._token_entities: np.ndarray | None = None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities per query: (entity_ids int64 [B, k], scores float32 [B, k]).

        `queries` is [B, d], or [B, Q, d] (Q = 1 for dual / multi-m; Q query tokens for
        sum-of-max, zero rows for padding). Rows with fewer than k entities are padded with
        id -1 and score -inf.
        """
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim == 3 and self.vectors_per_entity is not None:
            if queries.shape[1] != 1:
                raise ValueError(f"one query vector per mention expected, got {queries.shape}")
            queries = queries[:, 0]
        if self.vectors_per_entity is None:
            if queries.ndim == 2:
                queries = queries[:, None, :]
            return self._search_sum_of_max(queries, k)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be [B, {self.dim}], got {queries.shape}")
        depth = k * self.vectors_per_entity
        ids, scores = self.search_vectors(queries, depth)
        if self.vectors_per_entity == 1:
            return ids, scores
        return _first_distinct(ids, scores, k)

    def search_vectors(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`depth` vector hits over all shards, labelled with entity ids, best first."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        heap = faiss.ResultHeap(len(queries), depth, keep_max=True)
        for shard in self.shards:
            shard_depth = min(depth, shard.index.ntotal)
            if shard_depth == 0:
                continue
            scores, positions = shard.index.search(queries, shard_depth)
            labels = np.where(positions >= 0, shard.ids[np.maximum(positions, 0)], -1)
            scores = np.where(positions >= 0, scores, -np.inf).astype(np.float32)
            heap.add_result(scores, labels)
        heap.finalize()
        # Unfilled heap slots hold id -1 and -FLT_MAX, as do the -inf hits pushed above.
        filled = heap.I >= 0
        return np.where(filled, heap.I, -1), np.where(filled, heap.D, -np.inf).astype(np.float32)

    def _token_store(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All entity token vectors grouped by entity (reconstructed once from flat shards)."""
        if self._token_vectors is None:
            vectors, entities = [], []
            for shard in self.shards:
                if not isinstance(shard.index, faiss.IndexFlat):
                    raise ValueError("sum-of-max rerank needs flat shards (exact token vectors)")
                vectors.append(shard.index.reconstruct_n(0, shard.index.ntotal))
                entities.append(shard.ids)
            all_entities = np.concatenate(entities)
            order = np.argsort(all_entities, kind="stable")
            self._token_vectors = np.concatenate(vectors)[order]
            self._token_entities = np.unique(all_entities[order])
            sorted_entities = all_entities[order]
            self._token_offsets = np.searchsorted(
                sorted_entities, np.append(self._token_entities, self._token_entities[-1] + 1)
            )
        return self._token_vectors, self._token_offsets, self._token_entities

    def _search_sum_of_max(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Sum-of-max: token-level candidate generation, then s = Σ_i max_j ⟨x_i, y_j⟩ exactly."""
        batch, num_query, dim = queries.shape
        if dim != self.dim:
            raise ValueError(f"query vectors must have dim {self.dim}, got {dim}")
        token_vectors, offsets, entities = self._token_store()
        depth = min(self.candidate_depth, self.ntotal)
        hit_ids, _ = self.search_vectors(queries.reshape(batch * num_query, dim), depth)
        hit_ids = hit_ids.reshape(batch, num_query * depth)
        out_ids = np.full((batch, k), -1, dtype=np.int64)
        out_scores = np.full((batch, k), -np.inf, dtype=np.float32)
        for row in range(batch):
            live = np.abs(queries[row]).sum(axis=1) > 0
            candidates = np.unique(hit_ids[row][hit_ids[row] >= 0])
            slots = np.searchsorted(entities, candidates)
            scores = np.empty(len(candidates), dtype=np.float32)
            for position, slot in enumerate(slots):
                tokens = token_vectors[offsets[slot] : offsets[slot + 1]]
                scores[position] = (queries[row][live] @ tokens.T).max(axis=1).sum()
            order = np.lexsort((candidates, -scores))[:k]
            out_ids[row, : len(order)] = candidates[order]
            out_scores[row, : len(order)] = scores[order]
        return out_ids, out_scores


def _first_distinct(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first k distinct entity ids of a best-first hit list (its max per entity)."""
    out_ids = np.full((len(ids), k), -1, dtype=np.int64)
    out_scores = np.full((len(ids), k), -np.inf, dtype=np.float32)
    for row in range(len(ids)):
        valid = ids[row] >= 0
        _, first = np.unique(ids[row][valid], return_index=True)
        keep = np.sort(first)[:k]
        out_ids[row, : len(keep)] = ids[row][valid][keep]
        out_scores[row, : len(keep)] = scores[row][valid][keep]
    return out_ids, out_scores
