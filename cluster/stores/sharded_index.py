"""Sharded FAISS index over entity vectors, and the searcher that merges its shards (docs/refresh.md, docs/engines.md).

Each shard is one FAISS index plus an `ids` array giving the entity id of every vector in it
(one vector per entity for dual, m per entity for multi-m, one per token for sum-of-max). A shard
covers a contiguous range of entities and holds every vector of each of them, so each shard can
rank its own entities exactly and a search is a merge of per-shard entity top-k lists
(`hnce.search.merge_entity_lists`): the same merge joins the shards one process holds
(:class:`ShardedSearcher`, searched one after another: on a 2-core machine threaded
`IndexShards` is slower than sequential search, docs/engines.md) and the lists of several shard-holder
actors (`hnce.cluster.compute.shard_holders`).

Score functions (docs/math.md, eq. 9 of Zhang & Stratos 2021), per shard:

- dual: s(x, y) = ⟨x_1, y_1⟩ — one vector per entity; the top-k vectors are the top-k entities.
- multi-m: s(x, y) = max_{t≤m} ⟨x_1, y_t⟩ — the shard holds m vectors per entity. Walking vector
  hits in descending score order, an entity's first hit is its max, so the first k distinct
  entities are exactly the top-k entities; and the top k·m vector hits contain at least k distinct
  entities (each contributes at most m). Searching a flat shard k·m vectors deep is therefore
  exact. A compressed shard (`ivfpq`, `hnsw`) ranks by approximate scores, which at 8-bit codes
  keep a quarter of the exact top-100 (BENCHMARKS.md); it proposes candidates instead (the
  entities of the mention's `max(candidate_depth, k·m)` nearest vectors), and the candidates are
  rescored exactly from a float16 copy of the shard's vectors kept on disk and memory-mapped
  (`IndexShard.vectors`): max_t ⟨x_1, y_t⟩ is sum-of-max with one query vector, so it is the
  same late-interaction rescoring as below, reading the candidates' rows only.
- som: s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ — the token-level shards propose candidates (each query
  token's `candidate_depth` nearest entity tokens: ColBERT's k' per query embedding, 1,000 in
  its end-to-end retrieval), then each candidate is rescored in its shard from its token vectors
  (late interaction, Khattab & Zaharia 2020, ColBERT §3.6 and §4.4). A flat shard rescores from
  its stored vectors, so the result is exact whenever `candidate_depth` covers what one index
  would need. An `ivfpq` token shard is the compressed index of ColBERTv2 (Santhanam et
  al. 2022, §3.3): each token vector is stored as its IVF centroid plus a product-quantised
  residual, once in the IVF lists (candidate generation) and once in entity order as standalone
  codes (`IndexShard.codes`, FAISS's `sa_encode`), which rescoring decodes for the candidates
  only; the full-precision token vectors are never held. With `index.token_copy` the shard
  keeps, instead of those codes, a float16 copy of its token vectors on disk, memory-mapped,
  as compressed multi-m does: the candidates' scores are then exact (up to float16), so recall
  is bounded by candidate generation alone, at 2·d bytes a token on disk (BENCHMARKS.md).

- plaid (som and multi-m): PLAID's token index, searched in its stages (candidates from the
  query tokens' nearest centroids, centroid interaction with and without pruning, exact scoring
  of the survivors' decoded residuals), :mod:`hnce.cluster.stores.plaid`; its shards share the
  version's quantiser, which holds their centroids, and keep their tokens' codes alone.

Candidates (sum-of-max and compressed multi-m above) are the `candidate_depth` best hits across
all the shards one process holds, not per shard: the hits of one index over them, since their approximate scores
come from the version's one quantiser. So a holder rescores at most Q·`candidate_depth` entities
a mention however many shards it holds (237 at 5.9M entities); per shard, the candidates, and
the time to rescore them, would grow with the catalogue. For the same reason the shared
quantiser is searched once per query for all the shards a process holds, and each shard scans
the lists it found (FAISS's ``search_preassigned``, :func:`shared_quantizer`), for every scorer.

Because every entity lives in one shard, merging per-shard top-k lists by score is exact. Scorers
whose query depends on the entity (poly-m, genpoly-m, general) are not searched here: their flat
shards store reduced entity vectors scored by the scorer itself (`hnce.cluster.stores.exact_search`).

:class:`ShardedSearcher` is a `hnce.search.Searcher` of query vectors: the same search shape
and padding as every other searcher of the catalogue. The device a shard is searched on is
chosen in one place (`hnce.cluster.stores.faiss_device`). Shard files are read memory-mapped
(:func:`read_index_file`), so a shard's vectors live in the page cache, not twice in memory.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import faiss
import numpy as np
from faiss.contrib.ivf_tools import add_preassigned
from pydantic import ValidationInfo, field_validator

from hnce.cluster.stores.faiss_device import DeviceRequest, FaissDevice
from hnce.cluster.stores.plaid import (
    CentroidPostings,
    centroid_ids,
    centroid_interaction,
    probe,
    pruned_interaction,
    top,
)
from hnce.errors import InputError
from hnce.search import PAD_ID, PAD_SCORE, Searcher, merge_entity_lists, no_results
from hnce.settings import PositiveInt, settings

IndexKind = Literal["flat", "ivfpq", "hnsw", "plaid"]
#: bits of each product-quantiser code, and the centroids each sub-quantiser trains
PQ_BITS = 8
PQ_CENTROIDS = 2**PQ_BITS
NO_TOKEN_VECTORS = (
    "sum-of-max rescoring needs a flat, ivfpq or plaid token index; set index.kind: flat, ivfpq "
    "or plaid"
)
#: graph degree of a plaid index's HNSW quantiser (its beam when it places a token is FAISS's
#: default 16: 4 µs a token at 8,192 centroids, d = 32, where 64 took 12)
PLAID_HNSW_M = 32


@settings
class IndexSpec:
    """The ``index`` section of a recipe: how each shard is indexed, where it is searched, and
    how many versions the stores keep.

    `flat` (exact inner product) is the default, since mining wants exact top-N; `ivfpq` and
    `hnsw` are approximate options for serving a large catalogue; `plaid` is the token index of
    late interaction at scale (sum-of-max and multi-m, :mod:`hnce.cluster.stores.plaid`).

    Attributes:
        kind: flat | ivfpq | hnsw | plaid.
        nlist: IVF lists (ivfpq), or centroids (plaid: 2^16 and more at scale), the same in
            every shard; clipped so each gets training points.
        pq_m: PQ sub-quantisers (ivfpq); `dim` must be divisible by it. 8 bits each.
        nprobe: IVF lists visited per query (ivfpq), or centroids probed per query token
            (plaid); at most `nlist`. Unset: see :func:`default_nprobe` (a recipe resolves it
            when it loads).
        hnsw_m: graph degree (hnsw).
        ef_search: search beam (hnsw).
        train_size: vectors (sum-of-max: tokens) sampled from the whole catalogue to train a
            version's one IVF-PQ quantiser, which every shard of the version shares.
        candidate_depth: sum-of-max: entity tokens retrieved per query token, across the shards
            one holder holds, before the exact rescoring; compressed multi-m: vectors retrieved
            before it (at least k·m); plaid: entities kept by the pruned centroid interaction
            (PLAID's ndocs, at least 4k), whose best quarter is decompressed and scored
            exactly.
        token_pool_factor: sum-of-max: each entity's token vectors after the first pooled by
            this factor at index time (Clavié et al. 2024; 1: every token kept,
            :mod:`hnce.encoders.token_pooling`).
        token_copy: sum-of-max over ivfpq or plaid: in place of the standalone PQ codes
            (pq_m bytes a token; plaid: beside its codes), keep a float16 copy of every token
            vector on disk, memory-mapped (2·d bytes a token), and rescore candidates from it
            exactly. Compressed multi-m always keeps such a copy.
        faiss_device: auto | cpu | gpu: where shards are searched (GPU: fp16 flat); `gpu`
            without one is an error, never a silent CPU fallback.
        keep_versions: index and negatives versions retained after a publication.
    """

    kind: IndexKind = "flat"
    nlist: PositiveInt = 1024
    pq_m: PositiveInt = 64
    nprobe: PositiveInt | None = None
    hnsw_m: PositiveInt = 32
    ef_search: PositiveInt = 128
    train_size: PositiveInt = 65_536
    candidate_depth: PositiveInt = 256
    token_copy: bool = False
    token_pool_factor: PositiveInt = 1
    faiss_device: DeviceRequest = "auto"
    keep_versions: PositiveInt = 2

    @field_validator("nprobe")
    @classmethod
    def _probe_at_most_every_list(cls, nprobe: int | None, info: ValidationInfo) -> int | None:
        nlist = info.data.get("nlist", nprobe)
        if nprobe is not None and nprobe > nlist:
            raise ValueError(f"({nprobe}) cannot exceed nlist ({nlist})")
        return nprobe

    @property
    def quantised(self) -> bool:
        """Whether a version of this kind trains one quantiser that all its shards share and
        code their vectors on (ivfpq, plaid)."""
        return self.kind in ("ivfpq", "plaid")

    @property
    def probes(self) -> int:
        """Lists visited per query: ``nprobe``, or where unset the default for a scorer with one
        query vector per entity vector (:func:`default_nprobe`)."""
        return self.nprobe if self.nprobe is not None else default_nprobe(self.nlist, False)

    def to_json(self) -> dict[str, object]:
        """The fields that decide the bytes of a built shard (recorded in a version's manifest;
        a resumed build must match them)."""
        return {
            "kind": self.kind,
            "nlist": self.nlist,
            "pq_m": self.pq_m,
            "nprobe": self.probes,
            "hnsw_m": self.hnsw_m,
            "ef_search": self.ef_search,
            "train_size": self.train_size,
            "token_copy": self.token_copy,
            "token_pool_factor": self.token_pool_factor,
        }


#: IVF lists probed per query where ``index.nprobe`` is unset (dual, sum-of-max)
DEFAULT_NPROBE = 32


def default_nprobe(nlist: int, multi_vector: bool) -> int:
    """IVF lists to probe per query where ``index.nprobe`` is unset: 32 (at most ``nlist``), or
    half of ``nlist`` for multi-m. Multi-m's one query vector (the mention's) finds its best entity
    vectors spread over many lists: at 20,000 MiniLM entities, 32 of 1,024 lists kept 0.40 of the
    exact multi-8 top-100 and 512 kept 0.99 (README, "Compressed multi-m")."""
    return max(1, nlist // 2) if multi_vector else min(DEFAULT_NPROBE, nlist)


def build_shard_index(
    vectors: np.ndarray, spec: IndexSpec, seed: int = 0, trained: faiss.Index | None = None
) -> faiss.Index:
    """A CPU FAISS index over `vectors` [n, d] (float32, inner product), built per `spec`.

    Built on the CPU so the bytes written to the store do not depend on the device; searching
    places it on the device (`FaissDevice.place`). Deterministic for a given input and seed. An
    IVF-PQ shard adds its vectors to a copy of `trained`, the quantiser its version trained
    once on a sample of the whole catalogue (`train_index`; the encoder actors' builds always
    pass one); without it, to a quantiser trained on a sample of `vectors` alone.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"shard vectors must be [n, d], got shape {vectors.shape}")
    index = train_index(vectors, spec, seed) if trained is None else faiss.clone_index(trained)
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
            raise ValueError(f"{spec.kind} needs dim ({dim}) divisible by pq_m ({spec.pq_m})")
        if min(len(vectors), spec.train_size) < PQ_CENTROIDS:
            raise InputError(
                f"{spec.kind} trains {PQ_CENTROIDS} centroids per sub-quantiser on at most "
                f"index.train_size ({spec.train_size}) vectors, and the catalogue's sample has "
                f"{len(vectors)}; raise index.train_size, or for a catalogue this small set "
                f"index.kind: flat"
            )
        # FAISS wants ~39 training points per centroid; fewer lists for a small sample.
        nlist = max(1, min(spec.nlist, len(vectors) // 39))
        if spec.kind == "plaid":
            # placement through an HNSW graph of the centroids: a few µs a token at 2^16 of them,
            # where a flat quantiser's cost grows with their number (plaid module docstring)
            quantizer = faiss.IndexHNSWFlat(dim, PLAID_HNSW_M, faiss.METRIC_INNER_PRODUCT)
        else:
            quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(
            quantizer, dim, nlist, spec.pq_m, PQ_BITS, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.seed = seed
        index.pq.cp.seed = seed
        rng = np.random.default_rng(seed)
        train = vectors
        if len(vectors) > spec.train_size:
            train = vectors[np.sort(rng.choice(len(vectors), spec.train_size, replace=False))]
        index.train(train)
        index.nprobe = spec.probes
    return index


def write_index_file(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` through a Python file: a write the machine refuses (a full
    disk) is then the ``OSError`` itself, with its errno, where ``faiss.write_index(index,
    filename)`` said only a RuntimeError's text."""
    with Path(path).open("wb") as handle:
        faiss.write_index(index, faiss.PyCallbackIOWriter(handle.write))


def read_index_file(path: Path, kind: IndexKind) -> faiss.Index:
    """A shard's FAISS index, memory-mapped where FAISS allows it.

    Flat and HNSW storage is mapped from the file (`IO_FLAG_MMAP_IFC`: the vectors stay in the page
    cache, shared and evictable, instead of a private copy); IVF-PQ maps its inverted lists
    (`IO_FLAG_MMAP`). The mapping outlives the file's removal by retention.
    """
    flag = faiss.IO_FLAG_MMAP if kind in ("ivfpq", "plaid") else faiss.IO_FLAG_MMAP_IFC
    return faiss.read_index(str(path), flag)


def is_plaid(index: faiss.Index) -> bool:
    """Whether `index` is a plaid token index: an IVF-PQ whose quantiser is an HNSW graph and
    whose lists stay empty (its tokens live in their standalone codes, :func:`plaid_codes`)."""
    return isinstance(index, faiss.IndexIVFPQ) and isinstance(
        faiss.downcast_index(index.quantizer), faiss.IndexHNSW
    )


def stored_count(index: faiss.Index, codes: np.ndarray | None) -> int:
    """Vectors a shard holds: its FAISS index's, or a plaid shard's codes'."""
    return len(codes) if codes is not None and is_plaid(index) else int(index.ntotal)


def token_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The standalone codes (uint8 [n, code size], FAISS ``sa_encode``) of `vectors` that a
    compressed token shard keeps beside its IVF lists, so that sum-of-max rescoring can decode
    any entity's tokens (module docstring). Only IVF-PQ has them: flat shards rescore from their
    storage, and sum-of-max over HNSW is refused."""
    if not isinstance(index, faiss.IndexIVFPQ):
        raise InputError(NO_TOKEN_VECTORS)
    return index.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32))


def add_token_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """`vectors` added to the IVF-PQ `index`'s lists, and their standalone codes
    (:func:`token_codes`), each vector assigned to its list once for both: ``add`` and
    ``sa_encode`` would each search the quantiser, the larger part of a compressed build's time
    (16,384 lists at d = 32: 24 µs of 27 a token on one core). Same index bytes and codes as
    ``index.add(vectors)`` then ``token_codes(index, vectors)``."""
    vectors, lists, codes = _assigned_codes(index, vectors)
    add_preassigned(index, vectors, lists)
    return codes


def plaid_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The standalone codes of `vectors` on a plaid `index` (each its centroid id, then the
    product code of its residual: PLAID's compression, Santhanam et al. 2022, §3.3 of
    ColBERTv2), placed through the index's HNSW quantiser; nothing is added to its lists."""
    if not is_plaid(index):
        raise InputError("plaid codes need a plaid index (index.kind: plaid)")
    return _assigned_codes(index, vectors)[2]


def _assigned_codes(
    index: faiss.Index, vectors: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`vectors` as contiguous float32, each one's list, its standalone code) on an IVF-PQ
    `index`, each vector assigned once. The code is FAISS's ``encode_vectors`` format (the list
    number in ``coarse_code_size()`` little-endian bytes, then the residual's product code),
    computed here from the residuals in one ``pq.compute_codes`` call: FAISS's own loop took 19
    µs a token (d = 32, pq_m 32), the product quantiser's 1."""
    if not isinstance(index, faiss.IndexIVFPQ):
        raise InputError(NO_TOKEN_VECTORS)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    _, nearest = index.quantizer.search(vectors, 1)
    lists = np.ascontiguousarray(nearest[:, 0])
    residuals = vectors - index.quantizer.reconstruct_batch(lists)
    width = index.coarse_code_size()
    list_bytes = (lists[:, None] >> (8 * np.arange(width))) & 0xFF
    codes = np.concatenate([list_bytes.astype(np.uint8), index.pq.compute_codes(residuals)], axis=1)
    return vectors, lists, np.ascontiguousarray(codes)


@dataclass
class IndexShard:
    """One searchable shard: a FAISS index and the entity id of each of its vectors.

    `vectors` is the shard's stored vectors (a view of a flat CPU index's storage, `storage`, kept
    alive with it), or a compressed shard's float16 copy of them, memory-mapped; `codes`
    a compressed token shard's standalone codes (:func:`token_codes`), which `storage`, the CPU
    index, decodes. Rescoring reads one or the other (:meth:`token_vectors`); both are None for
    other shards.
    """

    index: faiss.Index
    ids: np.ndarray  # int64 [ntotal]
    vectors: np.ndarray | None = None
    storage: faiss.Index | None = None
    codes: np.ndarray | None = None

    def __post_init__(self) -> None:
        count = stored_count(self.index, self.codes)
        if len(self.ids) != count:
            raise ValueError(f"shard has {count} vectors but {len(self.ids)} entity ids")
        if self.codes is not None and len(self.codes) != len(self.ids):
            raise ValueError(f"shard has {len(self.ids)} vectors but {len(self.codes)} codes")

    @classmethod
    def on_device(
        cls,
        index: faiss.Index,
        ids: np.ndarray,
        device: FaissDevice,
        codes: np.ndarray | None = None,
        vectors: np.ndarray | None = None,
    ) -> IndexShard:
        """A shard of the CPU `index` placed on `device`, keeping its flat storage (or the
        CPU index that decodes `codes`, or the copy of its `vectors`) readable."""
        if isinstance(index, faiss.IndexFlat):
            vectors = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
            vectors = vectors.reshape(index.ntotal, index.d)
        # a plaid index is never searched by FAISS (its lists are empty): it stays where its
        # codes are decoded, and the search's kernels run beside it (plaid module docstring)
        placed = index if is_plaid(index) else device.place(index)
        return cls(placed, ids, vectors, storage=index, codes=codes)

    @functools.cached_property
    def entity_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids, first row of each) of a shard whose ids are sorted entity by entity; an
        entity's vectors are rows ``first[e] .. first[e + 1]`` (the last up to ``ntotal``)."""
        entities, first = np.unique(self.ids, return_index=True)
        return entities, np.append(first, len(self.ids))

    def candidate_rows(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token rows, each entity's first position among them) of the entities at `slots`
        (positions in :attr:`entity_rows`, in order): one run of rows an entity."""
        _, first = self.entity_rows
        lengths = first[slots + 1] - first[slots]
        offsets = np.cumsum(lengths) - lengths
        return np.repeat(first[slots] - offsets, lengths) + np.arange(lengths.sum()), offsets

    @functools.cached_property
    def postings(self) -> CentroidPostings:
        """A plaid shard's centroid → entity inverse, built from its codes (plaid module)."""
        if not is_plaid(self.index) or self.codes is None:
            raise ValueError("centroid postings belong to a plaid shard")
        _, first = self.entity_rows
        ivf = faiss.extract_index_ivf(self.index)
        return CentroidPostings.build(centroid_ids(self.codes, ivf), first, ivf.nlist)

    @functools.cached_property
    def centroids(self) -> np.ndarray:
        """An IVF shard's centroids (float32 [nlist, d]), read from its quantiser."""
        ivf = faiss.extract_index_ivf(self.storage if self.storage is not None else self.index)
        return ivf.quantizer.reconstruct_n(0, ivf.nlist)

    def token_vectors(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of `rows` (float32 [len(rows), d]): read from flat storage, or decoded
        from a compressed shard's codes."""
        if self.vectors is not None:
            return np.asarray(self.vectors[rows], dtype=np.float32)
        if self.codes is not None and self.storage is not None:
            return self.storage.sa_decode(np.ascontiguousarray(self.codes[rows]))
        raise InputError(NO_TOKEN_VECTORS)

    def stored_vectors(self) -> np.ndarray:
        """Every vector of the shard (float32 [ntotal, d]), in id order: read from flat storage or
        the float16 copy, decoded from a compressed shard's codes, else reconstructed by FAISS
        (an HNSW graph's storage, an IVF-PQ index's codes: the approximations it searches)."""
        if self.vectors is not None or self.codes is not None:
            return self.token_vectors(np.arange(len(self.ids)))
        index = self.storage if self.storage is not None else self.index
        if isinstance(index, faiss.IndexIVF):
            index.make_direct_map()
        return index.reconstruct_n(0, index.ntotal)

    @property
    def rescorable(self) -> bool:
        """Whether its FAISS index ranks by approximate scores (every kind but flat) and a copy
        of its vectors is kept to rescore candidates from (compressed multi-m)."""
        cpu_index = self.storage if self.storage is not None else self.index
        return not isinstance(cpu_index, faiss.IndexFlat) and self.vectors is not None

    def search_vectors(
        self,
        queries: np.ndarray,
        depth: int,
        allowed: np.ndarray | None = None,
        coarse: CoarseAssignment | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-`depth` vector hits (entity ids, scores), best first; -1 / -inf where fewer exist.

        `allowed` (sorted entity ids) restricts the search to those entities' vectors. `coarse`
        is the queries' IVF lists, already found by the quantiser this shard shares
        (:func:`shared_quantizer`): its lists are scanned without searching the quantiser again.
        """
        depth = min(depth, self.index.ntotal)
        empty = no_results(len(queries), 0)
        if depth == 0:
            return empty
        params = None
        if allowed is not None:
            positions = np.flatnonzero(np.isin(self.ids, allowed))
            if positions.size == 0:
                return empty
            params = _restricted(self.index, faiss.IDSelectorBatch(positions.astype(np.int64)))
        if coarse is None:
            scores, positions = self.index.search(queries, depth, params=params)
        else:
            scores, positions = self.index.search_preassigned(
                queries, depth, coarse.lists, coarse.scores, params=params
            )
        found = positions >= 0
        labels = np.where(found, self.ids[np.maximum(positions, 0)], PAD_ID)
        return labels, np.where(found, scores, PAD_SCORE).astype(np.float32)


@dataclass(frozen=True)
class CoarseAssignment:
    """Each query's `nprobe` nearest IVF lists (ids [n, nprobe]) and their centroid scores."""

    scores: np.ndarray
    lists: np.ndarray


def shared_quantizer(shards: Sequence[IndexShard]) -> faiss.IndexIVF | None:
    """The IVF index of the first shard when every shard is a CPU IVF index on the same
    quantiser (the same centroids and `nprobe`: a version's shards share one, trained on the
    catalogue's sample), else None. Its quantiser is then searched once per query for all the
    shards (FAISS ``search_preassigned``), not once in each: at 237 shards and 16,384 lists that
    search alone would cost a mention's 32 query tokens 4·10⁹ multiply-adds."""
    indexes = [shard.index for shard in shards]
    if len(indexes) < 2 or not all(isinstance(index, faiss.IndexIVF) for index in indexes):
        return None
    first = indexes[0]
    centroids = first.quantizer.reconstruct_n(0, first.nlist)
    for index in indexes[1:]:
        if (index.nlist, index.nprobe) != (first.nlist, first.nprobe) or not np.array_equal(
            index.quantizer.reconstruct_n(0, index.nlist), centroids
        ):
            return None
    return first


def _restricted(index: faiss.Index, selector: faiss.IDSelector) -> faiss.SearchParameters:
    """Search parameters that keep `index`'s own knobs and add an id selector."""
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=index.nprobe)
    if isinstance(index, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(sel=selector, efSearch=index.hnsw.efSearch)
    return faiss.SearchParameters(sel=selector)


class ShardedSearcher(Searcher[np.ndarray]):
    """The shards one process holds; ranks each shard's entities and merges the lists (sum-of-max
    and compressed multi-m: candidates from all the shards' hits, module docstring). A
    `hnce.search.Searcher` of query vectors: dual, multi-m, and with ``vectors_per_entity``
    None the token index of late interaction (sum-of-max).

    Args:
        shards: the shards (already placed on their device); each holds every vector of the
            entities it covers, and no two shards cover the same entity.
        vectors_per_entity: 1 (dual), m (multi-m) or None (one vector per token: sum-of-max).
        candidate_depth: sum-of-max: entity tokens retrieved per query token, across every
            shard here, before the exact rescoring; compressed multi-m: vectors retrieved
            (at least k·m); plaid: entities kept by the pruned centroid interaction (at least
            4k) (`index.candidate_depth`).
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
        _check_disjoint(self.shards)
        if len({shard.rescorable for shard in self.shards}) > 1:
            raise ValueError("the shards of one index must all be compressed, or none")
        plaid = {is_plaid(shard.index) for shard in self.shards}
        if len(plaid) > 1:
            raise ValueError("the shards of one index must all be plaid shards, or none")
        self.plaid = plaid == {True}
        #: seconds spent in each of PLAID's stages by this searcher (generation: candidates and
        #: their pruned centroid interaction; interaction; exact: decoding and exact scoring)
        self.stage_seconds: Counter[str] = Counter()
        self.quantized = shared_quantizer(self.shards)
        if self.plaid:
            if len(self.shards) > 1 and self.quantized is None:
                raise ValueError("plaid shards must share their version's one quantiser")
            for shard in self.shards:  # held means ready to search: the inverse is built now
                _ = shard.postings

    def search(
        self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities per query: (entity_ids int64 [B, k], scores float32 [B, k]), best
        first (`hnce.search.Searcher`).

        `queries` is [B, d], or [B, Q, d] (Q = 1 for dual / multi-m; Q query tokens for
        sum-of-max, zero rows for padding). `allowed` (entity ids) restricts the search to those
        entities (a Zeshel world). Rows with fewer than k entities are padded with id -1 and
        score -inf.
        """
        queries = self._shape(queries)
        if self.plaid:
            return self._plaid(queries if queries.ndim == 3 else queries[:, None, :], k, allowed)
        if self.vectors_per_entity is None:
            return self._late_interaction(queries, k, self.candidate_depth, allowed)
        depth = k * self.vectors_per_entity
        if self.rescored:
            # compressed multi-m: candidates, rescored exactly (module docstring)
            depth = max(self.candidate_depth, depth)
            return self._late_interaction(queries[:, None, :], k, depth, allowed)
        # k·m vector hits hold each shard's top-k entities (module docstring); the merge keeps
        # each entity's first, i.e. best, hit.
        coarse = self._coarse(queries, allowed)
        parts = [shard.search_vectors(queries, depth, allowed, coarse) for shard in self.shards]
        return merge_entity_lists(parts, k)

    def _shape(self, queries: np.ndarray) -> np.ndarray:
        """Queries as [B, d] for dual / multi-m, [B, Q, d] for sum-of-max (float32, contiguous)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self.vectors_per_entity is None:
            queries = queries[:, None, :] if queries.ndim == 2 else queries
        elif queries.ndim == 3:
            if queries.shape[1] != 1:
                raise ValueError(f"one query vector per mention expected, got {queries.shape}")
            queries = queries[:, 0]
        if queries.shape[-1] != self.dim:
            raise ValueError(f"query vectors must have dim {self.dim}, got {queries.shape}")
        return np.ascontiguousarray(queries)

    def _late_interaction(
        self, queries: np.ndarray, k: int, depth: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sum-of-max over every shard held here: each query token's `depth` best vector hits
        across the shards (one index's hits: the shards' approximate scores share one quantiser),
        their entities rescored in their own shards (:func:`_rescored_top_k`), then merged."""
        batch, num_query, dim = queries.shape
        live = np.abs(queries).sum(axis=2) > 0  # [B, Q]: a padded row would hit noise
        searched = np.flatnonzero(live.ravel())
        flat = np.ascontiguousarray(queries.reshape(batch * num_query, dim)[searched])
        coarse, hits = self._coarse(flat, allowed), None
        for shard in self.shards:
            found = shard.search_vectors(flat, depth, allowed, coarse)
            hits = found if hits is None else best_hits([hits, found], depth)
        bounds = np.searchsorted(searched // num_query, np.arange(batch + 1))  # rows a mention
        candidates = [
            np.unique(block[block >= 0])
            for block in (hits[0][start:stop] for start, stop in itertools.pairwise(bounds))
        ]
        rows = [mention[kept] for mention, kept in zip(queries, live, strict=True)]
        parts = [_rescored_top_k(shard, rows, candidates, k) for shard in self.shards]
        return merge_entity_lists(parts, k)

    def _plaid(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """PLAID's four stages over every shard held here (plaid module docstring): candidates
        from the query tokens' `nprobe` nearest centroids, pruned centroid interaction keeping
        `candidate_depth` entities (at least 4k), centroid interaction keeping a quarter of
        them, then exact sum-of-max on their decoded residuals, merged across shards."""
        centroids = self.shards[0].centroids
        nprobe = faiss.extract_index_ivf(self.shards[0].index).nprobe
        kept_by_interaction = max(4 * k, self.candidate_depth)  # PLAID: ndocs, at least 4k
        decoded = kept_by_interaction // 4
        live = np.abs(queries).sum(axis=2) > 0
        rows = [mention[kept] for mention, kept in zip(queries, live, strict=True)]
        # a Zeshel world: its entities alone are candidates (each shard's slots, once a search)
        in_world = (
            None
            if allowed is None
            else [np.isin(shard.entity_rows[0], allowed) for shard in self.shards]
        )
        candidates, clock = [], time.perf_counter()
        for mention in rows:
            by_centroid = np.ascontiguousarray(centroids @ mention.T)  # Sᵀ [K, Q]
            probed, floor = probe(by_centroid.T, nprobe)
            found = [
                pruned_interaction(shard.postings, by_centroid, probed, floor)
                for shard in self.shards
            ]
            if in_world is not None:
                found = [
                    (slots[world[slots]], scores[world[slots]])
                    for (slots, scores), world in zip(found, in_world, strict=True)
                ]
            survivors = _survivors(found, kept_by_interaction)
            clock = self._timed("generation", clock)
            rescored = []
            for shard, slots in zip(self.shards, survivors, strict=True):
                token_rows, starts = shard.candidate_rows(slots)
                scores = (
                    centroid_interaction(shard.postings, by_centroid, token_rows, starts)
                    if len(slots)
                    else np.zeros(0, np.float32)
                )
                rescored.append((slots, scores))
            final = _survivors(rescored, decoded)
            ids = [
                shard.entity_rows[0][slots] for shard, slots in zip(self.shards, final, strict=True)
            ]
            candidates.append(np.sort(np.concatenate(ids)))
            clock = self._timed("interaction", clock)
        parts = [_rescored_top_k(shard, rows, candidates, k) for shard in self.shards]
        self._timed("exact", clock)
        return merge_entity_lists(parts, k)

    def _timed(self, stage: str, since: float) -> float:
        """Add the seconds since `since` to `stage`'s; returns now."""
        now = time.perf_counter()
        self.stage_seconds[stage] += now - since
        return now

    def _coarse(self, queries: np.ndarray, allowed: np.ndarray | None) -> CoarseAssignment | None:
        """The queries' IVF lists from the shards' shared quantiser, or None without one. A
        search restricted to `allowed` entities (a Zeshel world) lets each shard search its own
        lists: FAISS's Python ``search_preassigned`` takes no id selector."""
        if self.quantized is None or allowed is not None:
            return None
        scores, lists = self.quantized.quantizer.search(queries, self.quantized.nprobe)
        return CoarseAssignment(scores, lists)

    @property
    def rescored(self) -> bool:
        """Whether the shards are compressed multi-m shards, whose candidates are rescored from
        a copy of their vectors."""
        return self.vectors_per_entity is not None and self.shards[0].rescorable


def _check_disjoint(shards: Sequence[IndexShard]) -> None:
    """Shards must cover disjoint entity ranges (the merge relies on each entity being in one)."""
    ranges = sorted(
        (int(shard.ids.min()), int(shard.ids.max())) for shard in shards if len(shard.ids)
    )
    for (_, last), (first, _) in itertools.pairwise(ranges):
        if first <= last:
            raise ValueError(
                f"shards overlap in entity ids ({first} <= {last}): every entity's vectors must "
                f"lie in one shard"
            )


def _survivors(found: Sequence[tuple[np.ndarray, np.ndarray]], count: int) -> list[np.ndarray]:
    """Each shard's (entity slots, scores) cut to the slots among the `count` best scores across
    all the shards, sorted per shard."""
    sizes = [len(slots) for slots, _ in found]
    kept = top(np.concatenate([scores for _, scores in found]), count)
    bounds = np.cumsum([0, *sizes])
    return [
        np.sort(slots[kept[(kept >= start) & (kept < stop)] - start])
        for (slots, _), start, stop in zip(found, bounds[:-1], bounds[1:], strict=True)
    ]


def _rescored_top_k(
    shard: IndexShard, live: Sequence[np.ndarray], candidates: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """One shard's top-k of each row's candidates (sorted entity ids, the shard's among them),
    by s = Σ_i max_j ⟨x_i, y_j⟩ over the row's `live` query vectors and each candidate's vectors
    (stored, or decoded from a compressed shard's codes)."""
    out_ids, out_scores = no_results(len(live), k)
    entities, _ = shard.entity_rows
    if not len(entities):
        return out_ids, out_scores
    for row, (queries, row_candidates) in enumerate(zip(live, candidates, strict=True)):
        low, high = np.searchsorted(row_candidates, [entities[0], entities[-1] + 1])
        mine = row_candidates[low:high]  # shards cover disjoint ranges (_check_disjoint)
        if not len(mine):
            continue
        rows, offsets = shard.candidate_rows(np.searchsorted(entities, mine))
        token_scores = queries @ shard.token_vectors(rows).T  # [live query tokens, tokens]
        # max_j per candidate (its tokens are one run of columns), then Σ_i
        scores = np.maximum.reduceat(token_scores, offsets, axis=1).sum(0)
        order = np.lexsort((mine, -scores))[:k]
        out_ids[row, : len(order)] = mine[order]
        out_scores[row, : len(order)] = scores[order]
    return out_ids, out_scores


def best_hits(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """The `depth` best of several hit lists (ids, scores [N, ·] each), per row, in no order;
    rows with fewer keep them all (padding -1 / -inf included)."""
    ids = np.concatenate([part[0] for part in parts], axis=1)
    scores = np.concatenate([part[1] for part in parts], axis=1)
    if ids.shape[1] <= depth:
        return ids, scores
    keep = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
    return np.take_along_axis(ids, keep, axis=1), np.take_along_axis(scores, keep, axis=1)
