"""The ``index`` section of a recipe (:class:`IndexSpec`), and the index's fixed choices that are
constants rather than settings, each with its reason (docs/indexes.md).

A key stays a setting when it moves a measured figure (BENCHMARKS.md: ``kind``, ``nlist``,
``pq_m``, ``nprobe``, ``candidate_depth``, ``token_copy``, ``token_pool_factor``) or fits a
deployment (``faiss_device``: the devices; ``keep_versions``: the disk). The HNSW graph's degree
and beam were never measured here and are FAISS's usual values; the quantiser's training sample is
computed from the lists it trains (:attr:`IndexSpec.train_size`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator

from hnce.cluster.stores.faiss_device import DeviceRequest
from hnce.settings import PositiveInt, settings

IndexKind = Literal["flat", "ivfpq", "hnsw", "plaid"]
#: bits of each product-quantiser code, and the centroids each sub-quantiser trains
PQ_BITS = 8
PQ_CENTROIDS = 2**PQ_BITS
#: graph degree of every HNSW graph hnce builds: an ``hnsw`` shard's, and a plaid quantiser's
#: graph of its centroids (placing a token through it with FAISS's default beam of 16: 4 µs a
#: token at 8,192 centroids, d = 32, where a degree of 64 took 12). No figure here depends on it.
HNSW_M = 32
#: search beam of an ``hnsw`` shard (FAISS's efSearch): a few times the k that mining asks for;
#: no figure here depends on it
HNSW_EF_SEARCH = 128
#: training vectors a quantiser gets a list (centroid): FAISS's k-means asks at least 39 and warns
#: below; more only lengthens the training, which is most of a plaid build (BENCHMARKS.md: the
#: plaid index's 2^16 centroids were trained on 40 a centroid)
TRAIN_POINTS_PER_LIST = 40
#: the fewest training vectors a quantiser gets: what FAISS's product quantiser trains each
#: sub-quantiser's 256 centroids on (256 a centroid)
MIN_TRAIN_SIZE = PQ_CENTROIDS * PQ_CENTROIDS
#: IVF lists probed per query where ``index.nprobe`` is unset (dual, sum-of-max)
DEFAULT_NPROBE = 32
#: hits a query vector rescored exactly where ``index.candidate_depth`` is unset (flat, ivfpq,
#: hnsw)
DEFAULT_CANDIDATE_DEPTH = 256
#: entities plaid's pruned centroid interaction keeps where ``index.candidate_depth`` is unset:
#: on a trained MiniLM's tokens of WordNet's 117,659 synsets the least depth that keeps 0.95 of
#: the exact top-100 (the survivors scored from the token copy), in 91 ms a mention on 2 cores
#: (BENCHMARKS.md, the plaid token index)
PLAID_CANDIDATE_DEPTH = 10_240


@settings
class IndexSpec:
    """The ``index`` section of a recipe: how each shard is indexed, where it is searched, and
    how many versions the stores keep.

    `flat` (exact inner product) is the default, since mining wants exact top-N; `ivfpq` and
    `hnsw` are approximate options for serving a large catalogue; `plaid` is the token index of
    late interaction at scale (sum-of-max and multi-m, :mod:`hnce.cluster.stores.plaid`).

    Attributes:
        kind: flat | ivfpq | hnsw | plaid: exactness against bytes an entity and search time
            (docs/indexes.md's table).
        nlist: IVF lists (ivfpq), or centroids (plaid: 2^16 and more at scale), the same in
            every shard; clipped so each gets training points. Moves recall and build time
            (BENCHMARKS.md).
        pq_m: PQ sub-quantisers (ivfpq, plaid); the vectors' width must be divisible by it
            (checked before Ray starts, :meth:`width_problem`). 8 bits each.
            Bytes a vector, and the codes' recall (BENCHMARKS.md).
        nprobe: IVF lists visited per query (ivfpq), or centroids probed per query token
            (plaid); at most `nlist`. Unset: see :func:`default_nprobe` (a recipe resolves it
            when it loads). Recall against search time (BENCHMARKS.md).
        candidate_depth: sum-of-max: entity tokens retrieved per query token, across the shards
            one holder holds, before the exact rescoring; compressed multi-m: vectors retrieved
            before it (at least k·m); plaid: entities kept by the pruned centroid interaction
            (PLAID's ndocs, at least 4k), whose best quarter is decompressed and scored
            exactly. Unset: see :func:`default_candidate_depth` (a recipe resolves it when it
            loads). Recall against search time (BENCHMARKS.md).
        token_copy: sum-of-max over ivfpq or plaid: in place of the standalone PQ codes
            (pq_m bytes a token; plaid: beside its codes), keep a float16 copy of every token
            vector on disk, memory-mapped (2·d bytes a token), and rescore candidates from it
            exactly. Compressed multi-m always keeps such a copy. Recall against disk
            (BENCHMARKS.md).
        token_pool_factor: sum-of-max: each entity's token vectors after the first pooled by
            this factor at index time (Clavié et al. 2024; 1: every token kept,
            :mod:`hnce.encoders.token_pooling`). Bytes and time against recall (BENCHMARKS.md).
        faiss_device: auto | cpu | gpu: where shards are searched (GPU: fp16 flat); `gpu`
            without one is an error, never a silent CPU fallback. The deployment's devices.
        keep_versions: index and negatives versions retained after a publication: what the
            deployment's disk holds (a 5.9M-entity token index keeps one).
    """

    kind: IndexKind = "flat"
    nlist: PositiveInt = 1024
    pq_m: PositiveInt = 64
    nprobe: PositiveInt | None = None
    candidate_depth: PositiveInt | None = None
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

    def width_problem(self, dim: int) -> str | None:
        """Why a version of this index cannot store vectors of width ``dim``, worded after the
        key (``'index.pq_m' is 48, which ...``), or None: a quantised kind's ``pq_m``
        sub-quantisers each code ``dim / pq_m`` of a vector's components, so ``pq_m`` must
        divide ``dim``."""
        if not self.quantised or dim % self.pq_m == 0:
            return None
        fitting = max(m for m in range(1, min(dim, self.pq_m) + 1) if dim % m == 0)
        return (
            f"is {self.pq_m}, which does not divide the width {dim} of the vectors an "
            f"index.kind {self.kind} stores (each sub-quantiser codes d / pq_m of a vector's "
            f"components); set a divisor of {dim}, such as {fitting}"
        )

    @property
    def probes(self) -> int:
        """Lists visited per query: ``nprobe``, or where unset the default for a scorer with one
        query vector per entity vector (:func:`default_nprobe`)."""
        return self.nprobe if self.nprobe is not None else default_nprobe(self.nlist, False)

    @property
    def depth(self) -> int:
        """``candidate_depth``, or where unset the default for this kind
        (:func:`default_candidate_depth`)."""
        if self.candidate_depth is not None:
            return self.candidate_depth
        return default_candidate_depth(self.kind)

    @property
    def train_size(self) -> int:
        """Vectors (sum-of-max: tokens) sampled from the whole catalogue to train a version's
        one quantiser, which every shard of the version shares: :data:`TRAIN_POINTS_PER_LIST`
        a list, at least :data:`MIN_TRAIN_SIZE` (65,536 at the default 1,024 lists)."""
        return max(MIN_TRAIN_SIZE, TRAIN_POINTS_PER_LIST * self.nlist)

    def to_json(self) -> dict[str, object]:
        """What decides the bytes of a built shard (recorded in a version's manifest; a resumed
        build, or a version reused, must match it): the settings and the constants in their
        place."""
        return {
            "kind": self.kind,
            "nlist": self.nlist,
            "pq_m": self.pq_m,
            "nprobe": self.probes,
            "hnsw_m": HNSW_M,
            "ef_search": HNSW_EF_SEARCH,
            "train_size": self.train_size,
            "token_copy": self.token_copy,
            "token_pool_factor": self.token_pool_factor,
        }


def default_nprobe(nlist: int, multi_vector: bool) -> int:
    """IVF lists to probe per query where ``index.nprobe`` is unset: 32 (at most ``nlist``), or
    half of ``nlist`` for multi-m. Multi-m's one query vector (the mention's) finds its best entity
    vectors spread over many lists: at 20,000 MiniLM entities, 32 of 1,024 lists kept 0.40 of the
    exact multi-8 top-100 and 512 kept 0.99 (docs/indexes.md, "Compressed multi-m")."""
    return max(1, nlist // 2) if multi_vector else min(DEFAULT_NPROBE, nlist)


def default_candidate_depth(kind: str) -> int:
    """``index.candidate_depth`` where it is unset: :data:`PLAID_CANDIDATE_DEPTH` entities for
    plaid (PLAID's ndocs: its candidates are ranked by centroid scores, so recall needs
    thousands), :data:`DEFAULT_CANDIDATE_DEPTH` hits a query vector for the other kinds."""
    return PLAID_CANDIDATE_DEPTH if kind == "plaid" else DEFAULT_CANDIDATE_DEPTH
