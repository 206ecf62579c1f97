"""Versioned, checksummed store of sharded entity indexes: `<run>/index/` (DESIGN.md §2, §5).

Layout::

    index/CURRENT                       "v7" — replaced atomically
    index/v7/manifest.json              {version, checkpoint, scorer, dim, vectors_per_entity,
                                         num_entities, shards: [{file, ids, sha256, ids_sha256,
                                         count}], index, created_at}
    index/v7/shard-00000.faiss          FAISS index of shard 0
    index/v7/shard-00000.ids.npy        int64 entity id of each vector of shard 0
    index/.building-v8/                 a refresh in progress: progress.json records finished
                                        shards so a restarted refresh resumes; embeddings/ holds
                                        the encoders' output arrays until the shard is indexed

A version becomes visible only by renaming its complete directory to `v<N>` and then replacing
`CURRENT`; the last `keep` versions are retained. Loading verifies every file's SHA-256, and file
names in a manifest must stay inside the version directory.

Example::

    store = IndexStore(run_dir / "index")
    version = store.current()               # None before the first refresh
    entity_ids, scores = version.search(query_vectors, k=64)
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from cluster.files import AtomicPath, atomic_write_text, sha256_file
from cluster.sharded_index import (
    DeviceRequest,
    FaissDevice,
    IndexShard,
    IndexSpec,
    ShardedSearcher,
    resolve_faiss_device,
)
from cluster.versioned_dir import (
    building_dir_name,
    building_versions,
    confined_path,
    next_version,
    publish_version,
    published_versions,
    read_current,
    version_dir_name,
)
from encoders.errors import InputError

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
PROGRESS_FILE = "progress.json"
EMBEDDINGS_DIR = "embeddings"


class ChecksumError(InputError):
    """A shard file does not match the SHA-256 recorded in its manifest."""


@dataclass(frozen=True)
class ShardRecord:
    """One shard of a version, as recorded in the manifest."""

    file: str
    ids: str
    sha256: str
    ids_sha256: str
    count: int

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "ids": self.ids,
            "sha256": self.sha256,
            "ids_sha256": self.ids_sha256,
            "count": self.count,
        }


@dataclass(frozen=True)
class BuildParameters:
    """What a version is built from; a resumed build must match these exactly."""

    checkpoint: int
    checkpoint_path: str
    scorer: dict[str, object]
    dim: int
    vectors_per_entity: int | None
    num_entities: int
    index: dict[str, object] = field(default_factory=lambda: IndexSpec().to_json())

    def to_json(self) -> dict[str, object]:
        return {
            "checkpoint": self.checkpoint,
            "checkpoint_path": self.checkpoint_path,
            "scorer": self.scorer,
            "dim": self.dim,
            "vectors_per_entity": self.vectors_per_entity,
            "num_entities": self.num_entities,
            "index": self.index,
        }


def shard_file_names(shard_no: int) -> tuple[str, str]:
    """(index file, ids file) of shard `shard_no`."""
    return f"shard-{shard_no:05d}.faiss", f"shard-{shard_no:05d}.ids.npy"


class IndexBuilder:
    """An index version under construction in `.building-v<N>/`; resumable shard by shard."""

    def __init__(self, store: IndexStore, version: int, parameters: BuildParameters) -> None:
        self.store = store
        self.version = version
        self.parameters = parameters
        self.directory = store.root / building_dir_name(version)
        self.embeddings_dir = self.directory / EMBEDDINGS_DIR
        self.embeddings_dir.mkdir(parents=True, exist_ok=True)
        progress_path = self.directory / PROGRESS_FILE
        if progress_path.exists():
            progress = json.loads(progress_path.read_text(encoding="utf-8"))
            self._finished = {
                int(number): ShardRecord(**record) for number, record in progress["shards"].items()
            }
        else:
            self._finished = {}
            self._write_progress()

    @property
    def finished_shards(self) -> dict[int, ShardRecord]:
        """Shards already indexed and recorded (skipped by a resumed refresh)."""
        return dict(self._finished)

    def embedding_paths(self, shard_no: int) -> tuple[Path, Path]:
        """Where an encoder writes shard `shard_no`'s vectors and their entity ids (.npy arrays)."""
        stem = self.embeddings_dir / f"shard-{shard_no:05d}"
        return stem.with_suffix(".vectors.npy"), stem.with_suffix(".ids.npy")

    def add_shard(self, shard_no: int, index: faiss.Index, ids: np.ndarray) -> ShardRecord:
        """Write shard `shard_no` (a CPU index and its int64 entity ids) and record it finished."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if len(ids) != index.ntotal:
            raise ValueError(f"shard {shard_no}: {index.ntotal} vectors but {len(ids)} ids")
        file_name, ids_name = shard_file_names(shard_no)
        index_path, ids_path = self.directory / file_name, self.directory / ids_name
        with AtomicPath(index_path) as temporary:
            faiss.write_index(index, str(temporary))
        with AtomicPath(ids_path) as temporary, open(temporary, "wb") as handle:
            np.save(handle, ids, allow_pickle=False)
        record = ShardRecord(
            file=file_name,
            ids=ids_name,
            sha256=sha256_file(index_path),
            ids_sha256=sha256_file(ids_path),
            count=int(index.ntotal),
        )
        self._finished[shard_no] = record
        self._write_progress()
        return record

    def publish(self, num_shards: int) -> IndexVersion:
        """Write the manifest, make the version live, drop old versions; needs every shard done."""
        missing = sorted(set(range(num_shards)) - set(self._finished))
        if missing:
            raise RuntimeError(f"cannot publish v{self.version}: shards {missing} not finished")
        extra = sorted(set(self._finished) - set(range(num_shards)))
        if extra:
            raise RuntimeError(f"cannot publish v{self.version}: unexpected shards {extra}")
        shutil.rmtree(self.embeddings_dir, ignore_errors=False)
        manifest = {
            "version": self.version,
            **self.parameters.to_json(),
            "shards": [self._finished[number].to_json() for number in range(num_shards)],
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        atomic_write_text(self.directory / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
        (self.directory / PROGRESS_FILE).unlink()
        removed = publish_version(self.store.root, self.version, self.store.keep)
        logger.info("published index v%d (removed %s)", self.version, removed or "none")
        return self.store.open(self.version, device=self.store.default_device)

    def _write_progress(self) -> None:
        progress = {
            "version": self.version,
            "parameters": self.parameters.to_json(),
            "shards": {str(number): record.to_json() for number, record in self._finished.items()},
        }
        atomic_write_text(self.directory / PROGRESS_FILE, json.dumps(progress, indent=2) + "\n")


class IndexVersion:
    """A published, verified index version, ready to search."""

    def __init__(self, path: Path, manifest: dict, shards: list[IndexShard]) -> None:
        self.path = path
        self.manifest = manifest
        self.version: int = manifest["version"]
        self.checkpoint: int = manifest["checkpoint"]
        self.num_entities: int = manifest["num_entities"]
        self.vectors_per_entity: int | None = manifest["vectors_per_entity"]
        self.searcher = ShardedSearcher(shards, self.vectors_per_entity)

    @property
    def shard_checksums(self) -> list[str]:
        return [shard["sha256"] for shard in self.manifest["shards"]]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities: (entity_ids int64 [B, k], scores float32 [B, k]); see ShardedSearcher."""
        return self.searcher.search(queries, k)


class IndexStore:
    """The versions under `root` (normally `<run>/index`).

    Args:
        root: store directory (created when building).
        keep: versions retained after a publication (the live one always is).
        device: where loaded shards are searched: auto | cpu | gpu (see resolve_faiss_device).
    """

    def __init__(self, root: Path, keep: int = 3, device: DeviceRequest = "auto") -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.device_request = device
        self._device: FaissDevice | None = None

    @property
    def default_device(self) -> FaissDevice:
        if self._device is None:
            self._device = resolve_faiss_device(self.device_request)
        return self._device

    def versions(self) -> list[int]:
        """Published version numbers, ascending."""
        return published_versions(self.root)

    def current_version(self) -> int | None:
        return read_current(self.root)

    def current(self, verify: bool = True) -> IndexVersion | None:
        """The live version, or None before the first publication.

        If the version named by CURRENT is removed by retention while it is being opened, CURRENT
        has moved on; it is read again.
        """
        for _ in range(10):
            version = self.current_version()
            if version is None:
                return None
            try:
                return self.open(version, verify=verify)
            except FileNotFoundError:
                if self.current_version() == version:
                    raise
        raise RuntimeError(f"{self.root}: CURRENT kept moving while opening it")

    def read_manifest(self, version: int) -> dict:
        path = self.root / version_dir_name(version) / MANIFEST_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}:{error.lineno}: invalid manifest JSON: {error.msg}"
            ) from error

    def open(
        self, version: int, device: FaissDevice | None = None, verify: bool = True
    ) -> IndexVersion:
        """Load version `version`, checking every file's SHA-256 (ChecksumError on mismatch)."""
        directory = self.root / version_dir_name(version)
        manifest_path = directory / MANIFEST_FILE
        manifest = self.read_manifest(version)
        if manifest.get("version") != version:
            raise ValueError(f"{manifest_path}: records version {manifest.get('version')}")
        device = device or self.default_device
        shards = []
        for number, record in enumerate(manifest["shards"]):
            index_path = confined_path(directory, record["file"], manifest_path)
            ids_path = confined_path(directory, record["ids"], manifest_path)
            index_bytes = index_path.read_bytes()
            ids_bytes = ids_path.read_bytes()
            if verify:
                for path, payload, expected in (
                    (index_path, index_bytes, record["sha256"]),
                    (ids_path, ids_bytes, record["ids_sha256"]),
                ):
                    actual = _sha256_bytes(payload)
                    if actual != expected:
                        raise ChecksumError(
                            f"{path}: sha256 {actual} does not match {expected} recorded in "
                            f"{manifest_path} (shard {number}); the file is corrupt"
                        )
            index = faiss.deserialize_index(np.frombuffer(index_bytes, dtype=np.uint8))
            ids = _load_ids(ids_bytes, ids_path)
            if index.ntotal != record["count"] or len(ids) != record["count"]:
                raise ValueError(f"{manifest_path}: shard {number} count mismatch")
            shards.append(IndexShard(device.place(index), ids))
        return IndexVersion(directory, manifest, shards)

    def begin(self, parameters: BuildParameters) -> IndexBuilder:
        """A builder for the next version, resuming an unfinished build of the same parameters.

        Unfinished builds of other parameters (an older checkpoint) are removed: callers hold the
        refresh lock, so nothing else is writing them.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for version in reversed(building_versions(self.root)):
            directory = self.root / building_dir_name(version)
            progress_path = directory / PROGRESS_FILE
            if progress_path.exists():
                progress = json.loads(progress_path.read_text(encoding="utf-8"))
                if progress["parameters"] == json.loads(json.dumps(parameters.to_json())):
                    logger.info(
                        "resuming index v%d (%d shards already finished)",
                        version,
                        len(progress["shards"]),
                    )
                    return IndexBuilder(self, version, parameters)
            logger.info("removing unfinished build %s of other parameters", directory)
            shutil.rmtree(directory)
        return IndexBuilder(self, next_version(self.root), parameters)


def _sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _load_ids(payload: bytes, path: Path) -> np.ndarray:
    ids = np.load(io.BytesIO(payload), allow_pickle=False)
    if ids.dtype != np.int64 or ids.ndim != 1:
        raise ValueError(f"{path}: expected a 1-d int64 id array, got {ids.dtype} {ids.shape}")
    return ids
