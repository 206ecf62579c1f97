"""Parquet contracts of a dataset directory (docs/stores.md), published whole like an index version.

A dataset directory ``<root>/`` holds::

    manifest.json                     written last: dataset id, converter, inputs with their
                                      SHA-256, counts per split, every file with size and SHA-256
    entities/part-00000.parquet ...   entity_id int64 (dense 0..N-1), key, title, text, domain
    mentions/<split>.parquet          mention_id, context_left, mention, context_right, gold,
                                      domain, golds list<int64> (all correct entities, gold first)
    summary.json                      what the converter counted
    rejects.jsonl                     rejected input rows (skip mode), when there were any

The only writer is :class:`DatasetBuilder`: it writes into a fresh temporary sibling of
``<root>``, writes the manifest last and publishes the directory by rename, replacing an old
dataset only when asked to (``overwrite``) and then entirely. A reader never sees a half-written
dataset, and no split of an older conversion survives next to a new catalogue.

Every reader opens through the manifest (:meth:`DatasetManifest.open`) and refuses what does not
belong to it. What is checked where, and why:

- on every open (cheap at any size: one small JSON file, a ``stat`` and a Parquet footer per
  file): the manifest lists the file, its size matches, no unlisted Parquet file lies in
  ``entities/`` or ``mentions/``, and the file's footer names this dataset's id and row count.
  A split copied in from another dataset, a stale file, or a truncated or rewritten file is
  refused here;
- on every read: each Parquet page carries a CRC32 that pyarrow verifies as it decodes, so a
  flipped byte inside a file of the right size fails the read that touches it;
- on demand (:func:`verify_dataset`, ``hnce data verify``): the SHA-256 of every file against the
  manifest. Hashing a 5.9M-entity catalogue takes seconds, so it is not paid by every open (the
  trainer, each encoder actor and each refresh open the catalogue).

Nothing here holds a whole table in Python objects: writers buffer one record batch, readers
stream record batches or decode one row group at a time, and key / title look-ups run on a
sorted array of 64-bit fingerprints built once per catalogue (16 bytes per entity) instead of
Python dicts, so a 5.9M-entity KILT catalogue stays at a few hundred MB.

A mention whose gold entity is not in the catalogue can be kept for evaluation with
``gold == MISSING_GOLD`` (-1): it must count as an error in unnormalized accuracy and must never be
used as a training positive (see ``hnce.pipeline.data.bad_rows``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hnce.cluster.files import atomic_write_json, publish_directory, sha256_file
from hnce.encoders.errors import InputError

ENTITY_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("entity_id", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
    ]
)

MENTION_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("mention_id", pa.string(), nullable=False),
        pa.field("context_left", pa.string(), nullable=False),
        pa.field("mention", pa.string(), nullable=False),
        pa.field("context_right", pa.string(), nullable=False),
        pa.field("gold", pa.int64(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("golds", pa.list_(pa.int64()), nullable=False),
    ]
)

#: ``gold`` of a mention kept although its gold entity is absent from the catalogue.
MISSING_GOLD = -1

ENTITIES_DIR = "entities"
MENTIONS_DIR = "mentions"
SUMMARY_FILE = "summary.json"
MANIFEST_FILE = "manifest.json"
REJECTS_FILE = "rejects.jsonl"
SPLITS = ("train", "dev", "test")
MANIFEST_FORMAT = 1
#: Parquet footer key naming the dataset a file was written for.
DATASET_ID_KEY = b"hnce.dataset_id"
_FINGERPRINT_SLICE = 65_536


class DatasetError(InputError):
    """A dataset directory that is missing, unpublished, or does not match its manifest."""


class DatasetExistsError(InputError):
    """The output of a conversion already holds a dataset (or other files) and may not be
    replaced."""


@dataclass(frozen=True)
class Entity:
    """One catalogue row. ``entity_id`` is the dense row id; ``key`` the source id."""

    entity_id: int
    key: str
    title: str
    text: str
    domain: str = ""


@dataclass(frozen=True)
class Mention:
    """One mention row. ``golds`` always starts with ``gold`` (normalized on construction)."""

    mention_id: str
    context_left: str
    mention: str
    context_right: str
    gold: int
    domain: str = ""
    golds: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        others = tuple(g for g in dict.fromkeys(self.golds) if g != self.gold)
        object.__setattr__(self, "golds", (self.gold, *others))


def _with_dataset_id(schema: pa.Schema, dataset_id: str) -> pa.Schema:
    return schema.with_metadata({DATASET_ID_KEY: dataset_id.encode()})


class _BatchedParquetWriter:
    """Buffers rows column-wise and writes one row group (with page checksums) per
    ``batch_size`` rows into the dataset being built."""

    def __init__(self, path: Path, schema: pa.Schema, batch_size: int) -> None:
        self.path = path
        self.schema = schema
        self.batch_size = batch_size
        self.rows_written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(path, schema, compression="zstd", write_page_checksum=True)
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}

    def append(self, row: Sequence[Any]) -> None:
        for column, value in zip(self._columns.values(), row, strict=True):
            column.append(value)
        if len(self._columns[self.schema.names[0]]) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        count = len(self._columns[self.schema.names[0]])
        if count == 0:
            return
        batch = pa.RecordBatch.from_pydict(self._columns, schema=self.schema)
        self._writer.write_batch(batch, row_group_size=count)
        self.rows_written += count
        for column in self._columns.values():
            column.clear()

    def close(self) -> None:
        self.flush()
        self._writer.close()


class EntityCatalogueWriter:
    """Writes ``entities/part-NNNNN.parquet`` of a dataset being built, in record batches.

    Made by :meth:`DatasetBuilder.entities`. ``entity_id`` must be dense ``0..N-1`` in write
    order (checked here). Unique, non-empty keys are the converter's job (it knows the file and
    line to blame).
    """

    def __init__(
        self, directory: Path, dataset_id: str, rows_per_file: int, batch_size: int
    ) -> None:
        self.directory = Path(directory) / ENTITIES_DIR
        self.schema = _with_dataset_id(ENTITY_SCHEMA, dataset_id)
        self.rows_per_file = rows_per_file
        self.batch_size = batch_size
        self.count = 0
        self.files: list[Path] = []
        self.rows: list[int] = []
        self.closed = False
        self._current: _BatchedParquetWriter | None = None

    def write(self, entity: Entity) -> None:
        if entity.entity_id != self.count:
            raise ValueError(
                f"entity_id must be dense in write order: expected {self.count}, "
                f"got {entity.entity_id} (key {entity.key!r})"
            )
        if self._current is None or self.rows[-1] >= self.rows_per_file:
            self._roll()
        assert self._current is not None
        self._current.append(
            (entity.entity_id, entity.key, entity.title, entity.text, entity.domain)
        )
        self.rows[-1] += 1
        self.count += 1

    def _roll(self) -> None:
        if self._current is not None:
            self._current.close()
        path = self.directory / f"part-{len(self.files):05d}.parquet"
        self.files.append(path)
        self.rows.append(0)
        self._current = _BatchedParquetWriter(path, self.schema, self.batch_size)

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        self.closed = True

    def __enter__(self) -> EntityCatalogueWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MentionWriter:
    """Writes ``mentions/<split>.parquet`` of a dataset being built (made by
    :meth:`DatasetBuilder.mentions`, once per split)."""

    def __init__(self, directory: Path, split: str, dataset_id: str, batch_size: int) -> None:
        self.path = mention_split_path(directory, split)
        self.split = split
        self.count = 0
        self.closed = False
        schema = _with_dataset_id(MENTION_SCHEMA, dataset_id)
        self._writer = _BatchedParquetWriter(self.path, schema, batch_size)

    def write(self, mention: Mention) -> None:
        self._writer.append(
            (
                mention.mention_id,
                mention.context_left,
                mention.mention,
                mention.context_right,
                mention.gold,
                mention.domain,
                list(mention.golds),
            )
        )
        self.count += 1

    def close(self) -> None:
        if not self.closed:
            self._writer.close()
            self.closed = True

    def __enter__(self) -> MentionWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def catalogue_digest(entity_files: Iterable[tuple[str, str]]) -> str:
    """SHA-256 over ``name:sha256`` lines of the entity files in order: the catalogue's identity
    (recorded in the manifest; see :func:`catalogue_fingerprint`)."""
    digest = hashlib.sha256()
    for name, sha256 in entity_files:
        digest.update(f"{name}:{sha256}\n".encode())
    return digest.hexdigest()


def _is_dataset(directory: Path) -> bool:
    """A directory some hnce converter wrote (today's manifest, or the older layout)."""
    markers = (MANIFEST_FILE, SUMMARY_FILE, ENTITIES_DIR)
    return any((directory / marker).exists() for marker in markers)


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an output that holds anything, unless ``overwrite`` and it is a dataset (never
    delete a directory of other files because a path was mistyped)."""
    if out.exists() and not out.is_dir():
        raise DatasetExistsError(f"{out}: exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise DatasetExistsError(
            f"{out}: already holds a dataset or other files; replace the whole dataset with "
            "--overwrite (hnce data), or choose another output directory"
        )
    if not _is_dataset(out):
        raise DatasetExistsError(
            f"{out}: holds files that are not a dataset (no {MANIFEST_FILE}, {SUMMARY_FILE} or "
            f"{ENTITIES_DIR}/); refusing to delete them, choose another output directory"
        )


class DatasetBuilder:
    """The one way to write a dataset directory: into a temporary sibling, published by rename.

    Args:
        out: the dataset directory to publish.
        converter: name of what wrote it (``kilt``, ``zeshel``, ``wordnet``, ...).
        converter_version: bumped by a converter whenever its output changes for the same input.
        overwrite: replace a dataset already at ``out`` (all of it); without it such an ``out``
            is refused here, before any work.

    Use as a context manager; an exception removes everything written so far and leaves ``out``
    as it was. Example::

        with DatasetBuilder(out, "fixture", 1) as dataset:
            with dataset.entities() as writer:
                writer.write(Entity(0, "k0", "Title", "text"))
            with dataset.mentions("train") as writer:
                writer.write(Mention("m0", "", "Title", "", 0))
            dataset.publish({"entities": 1})
    """

    def __init__(
        self, out: Path, converter: str, converter_version: int, overwrite: bool = False
    ) -> None:
        self.out = Path(out)
        self.overwrite = overwrite
        check_output(self.out, overwrite)
        self.converter = {"name": converter, "version": converter_version}
        self.dataset_id = uuid.uuid4().hex
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.root = (
            self.out.parent / f".building-{self.out.name}-{os.getpid()}-{self.dataset_id[:8]}"
        )
        self.root.mkdir()
        self.published: DatasetManifest | None = None
        self._inputs: list[dict[str, Any]] = []
        self._entities: EntityCatalogueWriter | None = None
        self._splits: dict[str, MentionWriter] = {}

    def add_input(self, role: str, path: Path) -> None:
        """Record an input file with its size and SHA-256 (streamed) in the manifest."""
        path = Path(path)
        self._inputs.append(
            {
                "role": role,
                "path": str(path.resolve()),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        )

    def entities(
        self, rows_per_file: int = 1_000_000, batch_size: int = 8192
    ) -> EntityCatalogueWriter:
        """The catalogue's writer (one per dataset)."""
        if self._entities is not None:
            raise ValueError(f"{self.out}: the catalogue of a dataset is written once")
        self._entities = EntityCatalogueWriter(
            self.root, self.dataset_id, rows_per_file, batch_size
        )
        return self._entities

    def mentions(self, split: str, batch_size: int = 8192) -> MentionWriter:
        """The writer of one split (one per split: several inputs of a split go through it in
        order, never over each other)."""
        if split in self._splits:
            raise ValueError(f"{self.out}: split {split!r} is written once")
        self._splits[split] = MentionWriter(self.root, split, self.dataset_id, batch_size)
        return self._splits[split]

    def catalogue(self) -> EntityCatalogue:
        """The catalogue written so far (its writer closed), to resolve mentions against."""
        if self._entities is None or not self._entities.closed:
            raise ValueError("write and close the catalogue before reading it")
        files = self._entities.files
        return EntityCatalogue(files, [_parquet_file(path) for path in files])

    def publish(self, summary: dict[str, Any]) -> DatasetManifest:
        """Write ``summary.json`` and the manifest (last), then rename the directory to ``out``.

        An old dataset there (``overwrite``) is first renamed aside and removed after the new one
        is in place: a crash between the two renames leaves ``out`` missing, never mixed.
        """
        if self._entities is None or not self._entities.closed:
            raise ValueError(f"{self.out}: a dataset needs a closed catalogue")
        check_output(self.out, self.overwrite)  # again: something may have appeared meanwhile
        for writer in self._splits.values():
            writer.close()
        atomic_write_json(self.root / SUMMARY_FILE, summary)
        manifest = self._manifest()
        atomic_write_json(self.root / MANIFEST_FILE, manifest)
        if self.out.is_dir() and not any(self.out.iterdir()):
            self.out.rmdir()
        retired = self.root.with_name(f".retired-{self.out.name}-{self.dataset_id[:8]}")
        if self.out.exists():
            os.rename(self.out, retired)
        publish_directory(self.root, self.out)
        shutil.rmtree(retired, ignore_errors=True)
        self.published = DatasetManifest(self.out, manifest)
        return self.published

    def _manifest(self) -> dict[str, Any]:
        files = {
            path.relative_to(self.root).as_posix(): {
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
            for path in sorted(self.root.rglob("*"))
            if path.is_file() and path.name != MANIFEST_FILE
        }
        assert self._entities is not None
        entity_files = [path.relative_to(self.root).as_posix() for path in self._entities.files]
        rows = dict(zip(entity_files, self._entities.rows, strict=True))
        for writer in self._splits.values():
            rows[writer.path.relative_to(self.root).as_posix()] = writer.count
        for name, count in rows.items():
            files[name]["rows"] = count
        return {
            "format": MANIFEST_FORMAT,
            "dataset_id": self.dataset_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "converter": self.converter,
            "inputs": self._inputs,
            "counts": {
                "entities": self._entities.count,
                "mentions": {split: writer.count for split, writer in self._splits.items()},
            },
            "catalogue": catalogue_digest(
                (Path(name).name, files[name]["sha256"]) for name in entity_files
            ),
            "entity_files": entity_files,
            "files": files,
        }

    def abort(self) -> None:
        """Remove the directory being built; ``out`` is untouched."""
        if self._entities is not None:
            self._entities.close()
        for writer in self._splits.values():
            writer.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DatasetBuilder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None or self.published is None:
            self.abort()


def _parquet_file(path: Path) -> pq.ParquetFile:
    """A Parquet file whose page checksums are verified on every read."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def write_dataset(
    out: Path,
    entities: Iterable[Entity],
    mentions: dict[str, Iterable[Mention]] | None = None,
    converter: str = "fixture",
    rows_per_file: int = 1_000_000,
    overwrite: bool = False,
) -> DatasetManifest:
    """A small dataset from Python objects, through :class:`DatasetBuilder` (test fixtures,
    benchmark inputs)."""
    with DatasetBuilder(out, converter, 1, overwrite) as dataset:
        with dataset.entities(rows_per_file) as writer:
            for entity in entities:
                writer.write(entity)
        counts: dict[str, int] = {}
        for split, rows in (mentions or {}).items():
            with dataset.mentions(split) as mention_writer:
                for mention in rows:
                    mention_writer.write(mention)
            counts[split] = mention_writer.count
        return dataset.publish({"format": converter, "entities": writer.count, "mentions": counts})


@dataclass(frozen=True)
class DatasetManifest:
    """A published dataset's ``manifest.json``; :meth:`open` runs the cheap checks of the
    module docstring, :meth:`verify` the full one."""

    root: Path
    payload: dict[str, Any]

    @classmethod
    def open(cls, root: Path) -> DatasetManifest:
        root = Path(root)
        path = root / MANIFEST_FILE
        if not path.is_file():
            what = "no dataset" if not root.exists() else f"no {MANIFEST_FILE}"
            raise DatasetError(
                f"{root}: {what}; a dataset is published by `hnce data ...` (convert it again, "
                "with --overwrite when an older conversion is there)"
            )
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetError(f"{path}: unreadable manifest: {error}") from None
        if not isinstance(payload, dict) or payload.get("format") != MANIFEST_FORMAT:
            raise DatasetError(f"{path}: not a dataset manifest of format {MANIFEST_FORMAT}")
        manifest = cls(root, payload)
        manifest._check_files()
        return manifest

    def _check_files(self) -> None:
        listed = self.files
        for name, entry in listed.items():
            path = self.root / name
            if not path.is_file():
                raise DatasetError(f"{path}: listed in {self.path} but missing")
            if path.stat().st_size != entry["bytes"]:
                raise DatasetError(
                    f"{path}: {path.stat().st_size} bytes, {self.path} says {entry['bytes']}; "
                    "the file was changed after the dataset was published"
                )
        for directory in (ENTITIES_DIR, MENTIONS_DIR):
            for path in sorted((self.root / directory).glob("*.parquet")):
                if path.relative_to(self.root).as_posix() not in listed:
                    raise DatasetError(
                        f"{path}: not part of the dataset published in {self.root} (not in "
                        f"{self.path}); remove it or convert again"
                    )

    @property
    def path(self) -> Path:
        return self.root / MANIFEST_FILE

    @property
    def dataset_id(self) -> str:
        return str(self.payload["dataset_id"])

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return dict(self.payload["files"])

    @property
    def catalogue(self) -> str:
        return str(self.payload["catalogue"])

    def entity_files(self) -> list[Path]:
        return [self.root / name for name in self.payload["entity_files"]]

    def open_parquet(self, path: Path) -> pq.ParquetFile:
        """A Parquet file of this dataset, its footer checked against the manifest; pages are
        CRC-checked as they are read."""
        name = Path(path).relative_to(self.root).as_posix()
        entry = self.files.get(name)
        if entry is None:
            raise DatasetError(f"{path}: not part of the dataset published in {self.root}")
        parquet = _parquet_file(path)
        written_for = (parquet.schema_arrow.metadata or {}).get(DATASET_ID_KEY, b"").decode()
        if written_for != self.dataset_id:
            raise DatasetError(
                f"{path}: written for dataset {written_for or 'unknown'!r}, not for "
                f"{self.dataset_id!r} of {self.path}"
            )
        if parquet.metadata.num_rows != entry["rows"]:
            raise DatasetError(
                f"{path}: {parquet.metadata.num_rows} rows, {self.path} says {entry['rows']}"
            )
        return parquet

    def verify(self) -> None:
        """Every listed file's SHA-256 against the manifest (streamed)."""
        for name, entry in self.files.items():
            actual = sha256_file(self.root / name)
            if actual != entry["sha256"]:
                raise DatasetError(
                    f"{self.root / name}: sha256 {actual} does not match {self.path}; "
                    "the file is corrupt or was changed"
                )


def verify_dataset(root: Path) -> DatasetManifest:
    """Open ``root`` and check the SHA-256 of every file it lists."""
    manifest = DatasetManifest.open(root)
    manifest.verify()
    return manifest


def _fingerprints(values: pa.Array | pa.ChunkedArray | Sequence[str]) -> np.ndarray:
    """64-bit fingerprints (Python's string hash, fixed within a process) of string values,
    decoded a slice at a time so that a 5.9M-row column never becomes 5.9M Python strings."""
    if not isinstance(values, pa.Array | pa.ChunkedArray):
        return np.fromiter(map(hash, values), np.int64, len(values))
    parts = [
        np.fromiter(map(hash, values.slice(start, _FINGERPRINT_SLICE).to_pylist()), np.int64)
        for start in range(0, len(values), _FINGERPRINT_SLICE)
    ]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


class _ColumnIndex:
    """Exact look-ups in one string column, built once: every row's fingerprint, sorted (a
    stable sort, so equal values keep row order). A batch of look-ups is a vectorised binary
    search followed by an exact comparison of the candidates, so a fingerprint collision can
    never return a wrong row. Memory: 16 bytes per row besides the column itself."""

    def __init__(self, values: pa.ChunkedArray) -> None:
        self._values = values
        fingerprints = _fingerprints(values)
        self._order = np.argsort(fingerprints, kind="stable")
        self._sorted = fingerprints[self._order]

    def _ranges(self, queries: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        wanted = _fingerprints(queries)
        return (
            np.searchsorted(self._sorted, wanted, side="left"),
            np.searchsorted(self._sorted, wanted, side="right"),
        )

    def find_all(self, value: str) -> np.ndarray:
        """Row positions holding exactly ``value`` (ascending)."""
        (lo,), (hi,) = self._ranges([value])
        rows = self._order[lo:hi]
        equal = pc.equal(self._values.take(pa.array(rows)), value).to_numpy(zero_copy_only=False)
        return rows[equal.astype(bool)]

    def positions(self, queries: Sequence[str]) -> np.ndarray:
        """First row holding each query, ``-1`` where absent."""
        queries = list(queries)
        lo, hi = self._ranges(queries)
        found = np.full(len(queries), -1, dtype=np.int64)
        single = np.flatnonzero(hi - lo == 1)
        if len(single):
            rows = self._order[lo[single]]
            candidates = self._values.take(pa.array(rows))
            asked = pa.array([queries[i] for i in single], type=pa.string())
            equal = pc.equal(candidates, asked).to_numpy(zero_copy_only=False).astype(bool)
            found[single[equal]] = rows[equal]
        for i in np.flatnonzero(hi - lo > 1):
            matches = self.find_all(queries[i])
            found[i] = matches[0] if len(matches) else -1
        return found


class EntityCatalogue:
    """Read side of ``entities/*.parquet``: streaming, id look-up and key / title look-up."""

    def __init__(
        self, files: list[Path], parquet: list[pq.ParquetFile], cache_row_groups: int = 8
    ) -> None:
        self.files = files
        self._parquet = parquet
        starts: list[int] = []
        locations: list[tuple[int, int]] = []
        total = 0
        for file_index, parquet in enumerate(self._parquet):
            metadata = parquet.metadata
            for group in range(metadata.num_row_groups):
                starts.append(total)
                locations.append((file_index, group))
                total += metadata.row_group(group).num_rows
        self._starts = np.asarray(starts, dtype=np.int64)
        self._locations = locations
        self._length = total
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cache_size = cache_row_groups
        self._keys: _ColumnIndex | None = None
        self._titles: _ColumnIndex | None = None

    @classmethod
    def open(cls, root: Path) -> EntityCatalogue:
        """Open the catalogue of the published dataset ``root`` (checked against its manifest)."""
        manifest = DatasetManifest.open(root)
        files = manifest.entity_files()
        return cls(files, [manifest.open_parquet(path) for path in files])

    def __len__(self) -> int:
        return self._length

    def iter_batches(
        self, batch_size: int = 4096, columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the catalogue in ``entity_id`` order as Arrow record batches."""
        for parquet in self._parquet:
            yield from parquet.iter_batches(batch_size=batch_size, columns=columns)

    def column(self, name: str) -> pa.ChunkedArray:
        """One whole column as Arrow (no Python objects)."""
        return pa.chunked_array(
            [
                parquet.read(columns=[name]).column(name).combine_chunks()
                for parquet in self._parquet
            ],
            type=ENTITY_SCHEMA.field(name).type,
        )

    def keys(self) -> pa.ChunkedArray:
        return self.column("key")

    def titles(self) -> pa.ChunkedArray:
        return self.column("title")

    def texts(self) -> pa.ChunkedArray:
        return self.column("text")

    def domains(self) -> list[str]:
        """Distinct domains, sorted (``[""]`` when the catalogue has none)."""
        return sorted(pc.unique(self.column("domain")).to_pylist())

    def domain_of(self) -> pa.ChunkedArray:
        """The ``domain`` column, one value per entity_id."""
        return self.column("domain")

    def _row_group(self, index: int) -> pa.Table:
        table = self._cache.get(index)
        if table is None:
            file_index, group = self._locations[index]
            table = self._parquet[file_index].read_row_group(group)
            self._cache[index] = table
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(index)
        return table

    def _check(self, entity_id: int) -> int:
        entity_id = int(entity_id)
        if not 0 <= entity_id < self._length:
            raise IndexError(f"entity_id {entity_id} outside the catalogue (0..{self._length - 1})")
        return entity_id

    def get(self, entity_id: int) -> Entity:
        """The entity with this dense id (decodes one cached row group)."""
        return self.get_many([entity_id])[0]

    def get_many(self, entity_ids: Sequence[int]) -> list[Entity]:
        """Entities in the order of ``entity_ids``, each needed row group decoded once."""
        ids = np.asarray([self._check(i) for i in entity_ids], dtype=np.int64)
        groups = np.searchsorted(self._starts, ids, side="right") - 1
        result: list[Entity | None] = [None] * len(ids)
        for group in np.unique(groups):
            positions = np.nonzero(groups == group)[0]
            table = self._row_group(int(group)).take(pa.array(ids[positions] - self._starts[group]))
            for position, row in zip(positions, table.to_pylist(), strict=True):
                result[position] = Entity(**row)
        return [entity for entity in result if entity is not None]

    def _key_index(self) -> _ColumnIndex:
        if self._keys is None:
            self._keys = _ColumnIndex(self.keys())
        return self._keys

    def _title_index(self) -> _ColumnIndex:
        if self._titles is None:
            self._titles = _ColumnIndex(self.titles())
        return self._titles

    def id_for_key(self, key: str) -> int:
        """The entity_id of a source key; ``KeyError`` naming the key when absent."""
        found = self._key_index().find_all(key)
        if len(found) == 0:
            raise KeyError(f"key {key!r} not in the entity catalogue")
        return int(found[0])

    def ids_for_keys(self, keys: Sequence[str]) -> np.ndarray:
        """Vectorized ``id_for_key``: int64 array, ``-1`` where a key is absent. Keys compare
        exactly as written (no numeric normalisation)."""
        return self._key_index().positions(keys)

    def ids_for_titles(self, titles: Sequence[str]) -> np.ndarray:
        """Vectorized title look-up: the first entity_id with each title, ``-1`` where absent."""
        return self._title_index().positions(titles)

    def ids_for_title(self, title: str) -> list[int]:
        """All entity_ids with exactly this title (ascending)."""
        return [int(i) for i in self._title_index().find_all(title)]


class MentionSplit:
    """Read side of ``mentions/<split>.parquet``."""

    def __init__(self, path: Path, parquet: pq.ParquetFile) -> None:
        self.path = Path(path)
        self._parquet = parquet

    @classmethod
    def open(cls, path: Path) -> MentionSplit:
        """Open a split file of a published dataset, e.g. ``<root>/mentions/train.parquet``;
        refused unless it belongs to the dataset its manifest describes."""
        path = Path(path)
        if not path.is_file():
            raise DatasetError(f"no mention split at {path}")
        manifest = DatasetManifest.open(path.parent.parent)
        return cls(path, manifest.open_parquet(path))

    def __len__(self) -> int:
        return self._parquet.metadata.num_rows

    def iter_record_batches(
        self, batch_size: int = 1024, columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the split as Arrow record batches."""
        yield from self._parquet.iter_batches(batch_size=batch_size, columns=columns)

    def iter_batches(self, batch_size: int = 1024) -> Iterator[list[Mention]]:
        """Stream the split as lists of at most ``batch_size`` mentions."""
        for batch in self.iter_record_batches(batch_size):
            yield [_mention_from_row(row) for row in batch.to_pylist()]

    def read_all(self) -> list[Mention]:
        """Every mention as Python objects: for small splits only (dev/test, unit tests)."""
        return [mention for batch in self.iter_batches() for mention in batch]

    def column(self, name: str) -> pa.ChunkedArray:
        return self._parquet.read(columns=[name]).column(name)

    def domains(self) -> list[str]:
        """Distinct domains, sorted."""
        return sorted(pc.unique(self.column("domain")).to_pylist())


def _mention_from_row(row: dict[str, Any]) -> Mention:
    row["golds"] = tuple(row["golds"] or ())
    return Mention(**row)


def catalogue_fingerprint(root: Path) -> str:
    """Hex SHA-256 identifying the catalogue of dataset ``root``: over its entity files, in
    order, each by name and SHA-256. Derived stores (the token store) record it and refuse a
    catalogue that changed under them.

    It is read from the manifest, whose SHA-256s were taken when the dataset was published, so
    asking costs the cheap checks of :meth:`DatasetManifest.open` (sizes, unlisted files), not a
    hash of the catalogue; a file changed in place at the same size is caught by the page
    checksums when it is read, or by :func:`verify_dataset`.
    """
    return DatasetManifest.open(root).catalogue


def mention_split_path(root: Path, split: str) -> Path:
    """``<root>/mentions/<split>.parquet``."""
    return Path(root) / MENTIONS_DIR / f"{split}.parquet"


def read_summary(root: Path) -> dict[str, Any]:
    """Read the ``summary.json`` of the published dataset ``root``."""
    DatasetManifest.open(root)
    return json.loads((Path(root) / SUMMARY_FILE).read_text(encoding="utf-8"))
