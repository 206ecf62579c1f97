"""Versioned, checksummed store of sharded entity indexes: `<run>/index/` (docs/stores.md, docs/refresh.md).

Layout::

    index/CURRENT                       "v7" — replaced atomically
    index/v7/manifest.json              {format, version, checkpoint, checkpoint_path, model,
                                         catalogue, source, scorer, dim, vectors_per_entity,
                                         num_entities, index, shards: [{file, ids, sha256,
                                         ids_sha256, count, entities: [start, stop], codes,
                                         codes_sha256, vectors, vectors_sha256}], created_at}
    index/v7/shard-00000.faiss          FAISS index of shard 0
    index/v7/shard-00000.ids.npy        int64 entity id of each vector of shard 0
    index/v7/shard-00000.codes.npy      a compressed sum-of-max shard only (index.kind ivfpq):
                                        uint8 standalone code of each token vector, in entity
                                        order, that rescoring decodes (pq_codes.token_codes)
    index/v7/shard-00000.vectors.npy    a compressed multi-m shard (index.kind ivfpq or hnsw),
                                        or a compressed sum-of-max shard with index.token_copy
                                        in place of its codes: float16 copy of each vector, in
                                        entity order, memory-mapped, that rescoring reads for
                                        the candidates
    index/.building-v8/                 a build in progress: progress.json records finished
                                        shards, so a restarted build resumes; an ivfpq build's
                                        quantiser.faiss is the version's one trained (empty)
                                        IVF-PQ index, which every shard is a copy of plus its
                                        vectors (removed when the version is published: each
                                        shard's file carries it)

`model` is the SHA-256 fingerprint of the exported model the vectors were encoded with
(`hnce.cluster.compute.index_build.model_fingerprint`) and `catalogue` the catalogue's
(`hnce.cluster.stores.tables_read.catalogue_fingerprint`), so a version can be found again for the same model and
catalogue. Shard i covers the contiguous entity range `entities` = [start, stop) and holds every
vector of those entities.

A version becomes visible only by renaming its complete directory to `v<N>` and then replacing
`CURRENT`; the last `keep` versions are retained. Nothing in a manifest is trusted: opening a
version checks the manifest's schema, its version against the directory, that the shards' entity
ranges tile 0..num_entities-1 exactly (no shard dropped or repeated) with the vector count the
scorer implies; loading a shard streams its files through SHA-256, checks that its ids lie in its
range (each entity exactly once for one-vector scorers, m times for multi-m, in order for
sum-of-max), that a compressed shard's token codes or vector copy match its vectors, and
memory-maps the FAISS file, the codes and the copy. File names must stay inside the version
directory. Every failure is a `StoreError` (an `InputError`) naming the file.

Example::

    store = IndexStore(run_dir / "index")
    version = store.current()               # None before the first refresh; manifest verified
    searcher = version.load()               # every shard, verified, in this process
    entity_ids, scores = searcher.search(query_vectors, k=64)
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import faiss
import numpy as np
import torch
from pydantic import Field

from hnce.cluster.stores.exact_search import ExactSearcher
from hnce.cluster.stores.faiss_device import FaissDevice, resolve_faiss_device
from hnce.cluster.stores.files import PROGRESS_FILE, atomic_link
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.shard_files import QUANTISER_FILE, ShardRecord, read_shard, write_shard
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.cluster.stores.versioned_dir import (
    MANIFEST_FILE,
    Count,
    ManifestFile,
    Positive,
    Sha256,
    StoreError,
    VersionedStore,
    VersionMissing,
    confined_path,
    created_at,
    verify_sha256,
)
from hnce.documents import document_record
from hnce.encoders.scorers import Scorer, ScorerConfig
from hnce.errors import naming_refused_writes
from hnce.progress import progress_bar

logger = logging.getLogger(__name__)

FORMAT = 1
#: the index store's directory in a run (``<run>/index``)
INDEX_DIR = "index"


@document_record
class BuildParameters:
    """What a version is built from; a resumed build must match these exactly.

    `checkpoint` is the run's checkpoint step (None for a model that is not one, e.g. the
    untrained model evaluated); `source` is ``encoded`` or ``encodings <file>`` (precomputed
    vectors, BLINK's ``.t7``).
    """

    checkpoint: int | None
    checkpoint_path: str
    model: Sha256
    catalogue: Sha256
    source: str
    scorer: dict[str, Any]
    dim: Positive
    vectors_per_entity: Positive | None
    num_entities: Positive
    index: dict[str, Any]


@document_record
class IndexManifest(BuildParameters):
    """`manifest.json` of a published version (docs/stores.md)."""

    format: Literal[1]
    version: Count
    shards: Annotated[list[ShardRecord], Field(min_length=1)]
    created_at: str

    @property
    def num_vectors(self) -> int:
        return sum(shard.count for shard in self.shards)


@document_record
class IndexBuildProgress:
    """`progress.json` of an unfinished build: its parameters and the shards already written."""

    version: Count
    parameters: BuildParameters
    shards: dict[int, ShardRecord]


_MANIFEST = ManifestFile(IndexManifest)
_PROGRESS = ManifestFile(IndexBuildProgress, PROGRESS_FILE, versioned=False)


def check_layout(manifest: IndexManifest, manifest_path: Path) -> None:
    """The shards' entity ranges tile 0..num_entities-1 in order, each with the vector count its
    scorer implies, and no file is listed twice (StoreError naming the manifest otherwise)."""
    files = [name for shard in manifest.shards for name, _ in shard.files()]
    repeated = sorted({name for name in files if files.count(name) > 1})
    if repeated:
        raise StoreError(f"{manifest_path}: lists {repeated[0]} more than once")
    covered = 0
    for number, shard in enumerate(manifest.shards):
        start, stop = shard.entities
        if start < covered:
            raise StoreError(
                f"{manifest_path}: shard {number} repeats entities {start}..{covered - 1}"
            )
        if start > covered:
            raise StoreError(
                f"{manifest_path}: entities {covered}..{start - 1} are in no shard (one dropped?)"
            )
        if stop <= start:
            raise StoreError(f"{manifest_path}: shard {number} covers no entity [{start}, {stop})")
        if (shard.codes is None) != (shard.codes_sha256 is None):
            raise StoreError(f"{manifest_path}: shard {number} lists codes without a SHA-256")
        if (shard.vectors is None) != (shard.vectors_sha256 is None):
            raise StoreError(f"{manifest_path}: shard {number} lists vectors without a SHA-256")
        _check_count(shard, number, manifest.vectors_per_entity, manifest_path)
        covered = stop
    if covered != manifest.num_entities:
        raise StoreError(
            f"{manifest_path}: shards cover entities 0..{covered - 1} but num_entities is "
            f"{manifest.num_entities}"
        )


def _check_count(
    shard: ShardRecord, number: int, vectors_per_entity: int | None, manifest_path: Path
) -> None:
    entities = shard.entities[1] - shard.entities[0]
    expected = entities * (vectors_per_entity or 1)
    wrong = shard.count < expected if vectors_per_entity is None else shard.count != expected
    if wrong:
        per = f"{vectors_per_entity} per entity" if vectors_per_entity else "at least 1 per entity"
        raise StoreError(
            f"{manifest_path}: shard {number} records {shard.count} vectors for {entities} "
            f"entities ({per})"
        )


class IndexBuilder:
    """An index version under construction in `.building-v<N>/`; resumable shard by shard.

    Shards are written into `directory` by whoever encodes them (`write_shard`, in the encoder
    actors) and recorded here; :meth:`publish` writes the manifest and makes the version live.
    """

    def __init__(self, store: IndexStore, version: int, parameters: BuildParameters) -> None:
        self.store = store
        self.version = version
        self.parameters = parameters
        self.directory = store.building_dir(version)
        self.directory.mkdir(parents=True, exist_ok=True)
        progress_path = self.directory / PROGRESS_FILE
        if progress_path.exists():
            progress = _PROGRESS.read(self.directory)
            if progress.parameters != parameters:
                raise StoreError(
                    f"{progress_path}: an unfinished build of other parameters; remove "
                    f"{self.directory} to build v{version} again"
                )
            self._finished = dict(progress.shards)
        else:
            self._finished = {}
            self._write_progress()

    @property
    def quantiser_path(self) -> Path:
        """Where this build's shared IVF-PQ quantiser is (:func:`write_quantiser`)."""
        return self.directory / QUANTISER_FILE

    @property
    def finished_shards(self) -> dict[int, ShardRecord]:
        """Shards already written and recorded (skipped by a resumed build)."""
        return dict(self._finished)

    def record_shard(self, shard_no: int, record: ShardRecord) -> None:
        """Record shard `shard_no` (already written into `directory`) as finished."""
        self._finished[shard_no] = record
        self._write_progress()

    def add_shard(
        self,
        shard_no: int,
        index: faiss.Index,
        ids: np.ndarray,
        entities: tuple[int, int],
        codes: np.ndarray | None = None,
        vectors: np.ndarray | None = None,
    ) -> ShardRecord:
        """Write shard `shard_no` from this process (a CPU index, its ids, a compressed
        shard's token codes or vector copy) and record it."""
        record = write_shard(
            self.directory,
            shard_no,
            index,
            ids,
            entities,
            self.parameters.vectors_per_entity,
            codes,
            vectors,
        )
        self.record_shard(shard_no, record)
        return record

    def take_over(self, source: IndexVersion) -> IndexVersion:
        """Publish this version from `source`'s shard files, hard-linked (copied across file
        systems), where `source` was built from the same model, catalogue and index parameters
        under another checkpoint label (the untrained model's version an evaluation built
        becomes a run's version 0): nothing is encoded again. StoreError when it was not."""
        own = dataclasses.asdict(self.parameters)
        theirs = dataclasses.asdict(source.manifest)
        differing = sorted(
            key
            for key, value in own.items()
            if key not in ("checkpoint", "checkpoint_path") and theirs[key] != value
        )
        if differing:
            raise StoreError(
                f"{source.path / MANIFEST_FILE}: built with other {', '.join(differing)} than "
                f"v{self.version} of {self.store.root}"
            )
        for number, record in enumerate(source.manifest.shards):
            for name, _ in record.files():
                atomic_link(source.path / name, self.directory / name)
            self.record_shard(number, record)
        logger.info("index v%d taken over from %s (nothing encoded)", self.version, source.path)
        return self.publish(len(source.manifest.shards))

    def publish(self, num_shards: int) -> IndexVersion:
        """Write the manifest (checked like any reader checks it), make the version live, drop
        old versions; needs every shard done."""
        missing = sorted(set(range(num_shards)) - set(self._finished))
        if missing:
            raise RuntimeError(f"cannot publish v{self.version}: shards {missing} not finished")
        extra = sorted(set(self._finished) - set(range(num_shards)))
        if extra:
            raise RuntimeError(f"cannot publish v{self.version}: unexpected shards {extra}")
        manifest = IndexManifest(
            **dataclasses.asdict(self.parameters),
            format=FORMAT,
            version=self.version,
            shards=[self._finished[number] for number in range(num_shards)],
            created_at=created_at(),
        )
        check_layout(manifest, self.directory / MANIFEST_FILE)
        _MANIFEST.write(self.directory, manifest)
        (self.directory / PROGRESS_FILE).unlink()
        (self.directory / QUANTISER_FILE).unlink(missing_ok=True)
        removed = self.store.publish_build(self.version)
        logger.info("published index v%d (removed %s)", self.version, removed or "none")
        return self.store.open(self.version)

    def _write_progress(self) -> None:
        _PROGRESS.write(
            self.directory, IndexBuildProgress(self.version, self.parameters, self._finished)
        )


class IndexVersion:
    """A published version whose manifest has been verified; its shards are loaded on demand
    (:meth:`load`), in this process or in shard-holder actors. Small and picklable."""

    def __init__(self, path: Path, manifest: IndexManifest) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self.version = manifest.version
        self.checkpoint = manifest.checkpoint
        self.num_entities = manifest.num_entities
        self.vectors_per_entity = manifest.vectors_per_entity
        self.num_vectors = manifest.num_vectors

    @property
    def shard_checksums(self) -> list[str]:
        return [shard.sha256 for shard in self.manifest.shards]

    @property
    def mining(self) -> str:
        """``index`` (searched by FAISS, :meth:`load`) or ``exact`` (the shards store reduced
        vectors scored by the model's scorer, :meth:`load_exact`): asked of the scorer."""
        return ScorerConfig.from_dict(self.manifest.scorer).mining

    def copy_to(self, target: Path) -> None:
        """This version's manifest and files in the new directory `target` (``hnce export``),
        each file copied (never hard-linked: a user who rewrites an exported file in place must
        not change the run's version) and then checked against the manifest: the copy is exactly
        the version the manifest describes, or a StoreError naming the file (one corrupted, or
        removed meanwhile by the store's retention)."""
        manifest_path = self.path / MANIFEST_FILE
        Path(target).mkdir()
        listed = [pair for shard in self.manifest.shards for pair in shard.files()]
        for name, digest in progress_bar(
            listed, desc=f"copying index v{self.version}", unit="file"
        ):
            source = confined_path(self.path, name, manifest_path)
            try:
                with naming_refused_writes(Path(target) / name):
                    copied = Path(shutil.copyfile(source, Path(target) / name))
            except FileNotFoundError:
                raise VersionMissing(
                    f"{source}: listed in {manifest_path} but gone (removed by the store's "
                    f"retention meanwhile?); ask again"
                ) from None
            assert digest is not None  # check_layout: every file listed has its SHA-256
            verify_sha256(copied, digest, manifest_path)
        _MANIFEST.write(Path(target), self.manifest)

    def load(
        self,
        shard_numbers: Sequence[int] | None = None,
        device: FaissDevice | None = None,
        candidate_depth: int = 256,
        verify: bool = True,
    ) -> ShardedSearcher:
        """A searcher over shards `shard_numbers` (default: all), each verified (`load_shard`)
        and placed on `device` (default: `resolve_faiss_device("auto")`)."""
        if self.mining == "exact":
            raise StoreError(
                f"{self.path / MANIFEST_FILE}: scorer {self.manifest.scorer['name']!r} is mined "
                f"exactly; its shards are searched with the model's scorer (load_exact)"
            )
        numbers = range(len(self.manifest.shards)) if shard_numbers is None else shard_numbers
        device = device or resolve_faiss_device("auto")
        shards = [self.load_shard(number, device, verify) for number in numbers]
        return ShardedSearcher(shards, self.vectors_per_entity, candidate_depth)

    def load_exact(
        self,
        shard_numbers: Sequence[int],
        scorer: Scorer,
        device: torch.device,
        verify: bool = True,
    ) -> ExactSearcher:
        """An exact searcher over shards `shard_numbers`, each verified (`load_shard`) and kept
        on the CPU, scored by `scorer` (the version's own model's) on `device`."""
        manifest_path = self.path / MANIFEST_FILE
        if scorer.config.to_dict() != self.manifest.scorer:
            raise StoreError(
                f"{manifest_path}: encoded with scorer {self.manifest.scorer}, not "
                f"{scorer.config.to_dict()}"
            )
        cpu = FaissDevice("cpu")
        shards = [self.load_shard(number, cpu, verify) for number in shard_numbers]
        return ExactSearcher(shards, scorer, device)

    def entity_vectors(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each shard's entities and their stored vectors, shard by shard: (entity ids [n],
        float32 vectors [n, m, d]) for a scorer with m vectors an entity (dual: 1; multi-m: m),
        each shard verified first; what a trainer's negative cache is filled from
        (``hnce.pipeline.train.trainer_cache``). A StoreError for a scorer whose entities have
        varying numbers of vectors (sum-of-max keeps one a token)."""
        per_entity = self.vectors_per_entity
        if per_entity is None:
            raise StoreError(
                f"{self.path / MANIFEST_FILE}: scorer {self.manifest.scorer['name']!r} stores a "
                f"varying number of vectors an entity; they cannot be read back per entity"
            )
        for number in range(len(self.manifest.shards)):
            shard = self.load_shard(number, FaissDevice("cpu"))
            vectors = shard.stored_vectors().reshape(-1, per_entity, self.manifest.dim)
            yield shard.ids[::per_entity], vectors

    def load_shard(self, number: int, device: FaissDevice, verify: bool = True) -> IndexShard:
        """Shard `number`, verified and placed on `device` (`read_shard`)."""
        return read_shard(
            self.path,
            number,
            self.manifest.shards[number],
            self.path / MANIFEST_FILE,
            vectors_per_entity=self.vectors_per_entity,
            kind=self.manifest.index["kind"],
            dim=self.manifest.dim,
            device=device,
            verify=verify,
        )


class IndexStore(VersionedStore):
    """The versions under `root` (`<run>/index` for the refresh; `<run>/eval-index` for versions
    built only to evaluate, see `hnce.cluster.compute.retrieval`).

    Args:
        root: store directory (created when building).
        keep: versions retained after a publication (the live one always is).
        keep_used: retain the most recently used versions instead of the newest
            (:class:`VersionedStore`; the evaluation store).
    """

    def current(self) -> IndexVersion | None:
        """The live version, or None before the first publication.

        If the version named by CURRENT is removed by retention while it is being opened, CURRENT
        has moved on; it is read again.
        """
        return self.follow_current(self.open, StoreError)

    def read_manifest(self, version: int) -> dict[str, Any]:
        """Version `version`'s verified manifest as a plain dict."""
        return dataclasses.asdict(self.open(version).manifest)

    def open(self, version: int) -> IndexVersion:
        """Version `version` with its manifest verified (schema, version, shard layout)."""
        directory = self.version_dir(version)
        manifest_path = directory / MANIFEST_FILE
        manifest = _MANIFEST.read(directory)
        check_layout(manifest, manifest_path)
        for shard in manifest.shards:
            confined_path(directory, shard.file, manifest_path)
            confined_path(directory, shard.ids, manifest_path)
        return IndexVersion(directory, manifest)

    def find(self, model: str, catalogue: str, index: dict[str, Any]) -> IndexVersion | None:
        """The newest published version of model fingerprint `model` over catalogue `catalogue`
        built with index parameters `index`, or None. A version is found to be used, so a store
        keeping its used versions stamps it (:meth:`mark_used`)."""
        for version in reversed(self.versions()):
            try:
                found = self.open(version)
            except StoreError as error:
                logger.warning("skipping unreadable index version: %s", error)
                continue
            manifest = found.manifest
            if (manifest.model, manifest.catalogue, manifest.index) == (model, catalogue, index):
                self.mark_used(version)
                return found
        return None

    def begin(self, parameters: BuildParameters) -> IndexBuilder:
        """A builder for the next version, resuming an unfinished build of the same parameters.

        Unfinished builds of other parameters (an older checkpoint) are removed: callers hold the
        store's lock (the refresh lock, or the evaluation store's), so nothing else writes them.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for version in reversed(self.unfinished_versions()):
            directory = self.building_dir(version)
            if (directory / PROGRESS_FILE).exists():
                progress = _PROGRESS.read(directory)
                if progress.parameters == parameters:
                    logger.info(
                        "resuming index v%d (%d shards already finished)",
                        version,
                        len(progress.shards),
                    )
                    return IndexBuilder(self, version, parameters)
            logger.info(
                "removing unfinished build %s (of other parameters, or with no progress record "
                "left: a publication that failed past its shards)",
                directory,
            )
            self.remove_building(version)
        return IndexBuilder(self, self.next_version(), parameters)
