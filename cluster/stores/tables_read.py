"""Reading a published dataset directory (docs/stores.md, "Dataset directory"): the manifest
with its cheap checks on every open, the full SHA-256 check on demand, and the catalogue and
mention readers, which stream record batches or decode one row group at a time (the contract and
what is checked where: :mod:`hnce.cluster.stores.tables`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, TypeAdapter, ValidationError

from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.tables import (
    DATASET_ID_KEY,
    ENTITIES_DIR,
    ENTITY_SCHEMA,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    MENTIONS_DIR,
    SUMMARY_FILE,
    DatasetError,
    Entity,
    Mention,
    open_parquet,
    parquet_read,
)
from hnce.cluster.stores.versioned_dir import Count, Sha256
from hnce.documents import document_record, read_document, schema_problems

_FINGERPRINT_SLICE = 65_536
Summary = TypeVar("Summary")


@document_record
class _FileEntry:
    bytes: Count
    sha256: Sha256
    rows: Count | None = None


@document_record
class _Converter:
    name: str
    version: Count


@document_record
class _Input:
    role: str
    path: str
    bytes: Count
    sha256: Sha256


@document_record
class _ManifestSchema:
    """What a dataset's ``manifest.json`` must hold (every key, typed; no other key)."""

    format: Literal[1]
    dataset_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    created_at: str
    converter: _Converter
    inputs: list[_Input]
    counts: dict[str, Any]
    catalogue: Sha256
    entity_files: list[str]
    files: dict[str, _FileEntry]


_SCHEMA = TypeAdapter(_ManifestSchema)


def _check_names(manifest: _ManifestSchema, root: Path, path: Path) -> None:
    """Every file a manifest names is a relative path inside the dataset (no ``..``, not
    absolute, no link out of it) and every entity file is listed with its row count."""
    for name in [*manifest.files, *manifest.entity_files]:
        parts = PurePosixPath(name).parts
        inside = (root / name).resolve().is_relative_to(root.resolve())
        if not name or PurePosixPath(name).is_absolute() or ".." in parts or not inside:
            raise DatasetError(f"{path}: file {name!r} must be a relative path inside {root}")
    for name in manifest.entity_files:
        if name not in manifest.files or manifest.files[name].rows is None:
            raise DatasetError(f"{path}: entity file {name!r} is not listed with its rows")


def _counted(
    batches: Iterator[pa.RecordBatch], expected: int, path: Path
) -> Iterator[pa.RecordBatch]:
    """``batches``, then a check that they held the ``expected`` rows: a damaged page header
    can decode as fewer rows without any error of its own."""
    seen = 0
    with parquet_read(path):
        for batch in batches:
            seen += batch.num_rows
            yield batch
    check_rows(seen, expected, path)


def check_rows(seen: int, expected: int, path: Path) -> None:
    """DatasetError unless ``seen`` rows were read of the ``expected``."""
    if seen != expected:
        raise DatasetError(
            f"{path}: read {seen} rows but its footer and manifest say {expected}; the file is "
            f"damaged (hnce data verify checks every file against the manifest's SHA-256)"
        )


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
            text = path.read_text(encoding="utf-8")
            payload = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetError(f"{path}: unreadable manifest: {error}") from None
        if not isinstance(payload, dict) or payload.get("format") != MANIFEST_FORMAT:
            raise DatasetError(f"{path}: not a dataset manifest of format {MANIFEST_FORMAT}")
        try:
            checked = _SCHEMA.validate_json(text)
        except ValidationError as error:
            raise DatasetError(
                f"{path}: not a valid dataset manifest: {schema_problems(error)}"
            ) from None
        _check_names(checked, root, path)
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
        parquet = open_parquet(path)
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
        """Stream the catalogue in ``entity_id`` order as Arrow record batches (each file's rows
        counted against its footer)."""
        for path, parquet in zip(self.files, self._parquet, strict=True):
            batches = parquet.iter_batches(batch_size=batch_size, columns=columns)
            yield from _counted(batches, parquet.metadata.num_rows, path)

    def column(self, name: str) -> pa.ChunkedArray:
        """One whole column as Arrow (no Python objects)."""
        parts = []
        for path, parquet in zip(self.files, self._parquet, strict=True):
            with parquet_read(path):
                part = parquet.read(columns=[name]).column(name).combine_chunks()
            check_rows(len(part), parquet.metadata.num_rows, path)
            parts.append(part)
        return pa.chunked_array(parts, type=ENTITY_SCHEMA.field(name).type)

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
            parquet = self._parquet[file_index]
            with parquet_read(self.files[file_index]):
                table = parquet.read_row_group(group)
            expected = parquet.metadata.row_group(group).num_rows
            check_rows(table.num_rows, expected, self.files[file_index])
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
        """Stream the split as Arrow record batches (its rows counted against its footer)."""
        batches = self._parquet.iter_batches(batch_size=batch_size, columns=columns)
        yield from _counted(batches, len(self), self.path)

    def iter_batches(self, batch_size: int = 1024) -> Iterator[list[Mention]]:
        """Stream the split as lists of at most ``batch_size`` mentions."""
        for batch in self.iter_record_batches(batch_size):
            yield [_mention_from_row(row) for row in batch.to_pylist()]

    def read_all(self) -> list[Mention]:
        """Every mention as Python objects: for small splits only (dev/test, unit tests)."""
        return [mention for batch in self.iter_batches() for mention in batch]

    def column(self, name: str) -> pa.ChunkedArray:
        with parquet_read(self.path):
            column = self._parquet.read(columns=[name]).column(name)
        check_rows(len(column), len(self), self.path)
        return column

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


#: a dataset's ``summary.json`` as the store knows it: a JSON object (what it holds is the
#: converter's; a conversion's summary is read with its own schema,
#: :data:`hnce.pipeline.data.conversion.CONVERSION_SUMMARY`)
_SUMMARY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def read_summary(root: Path, schema: TypeAdapter[Summary] = _SUMMARY) -> Summary:
    """The ``summary.json`` of the published dataset ``root`` (its manifest checked first),
    validated against ``schema``; a :class:`DatasetError` naming the file (and line or key)
    otherwise."""
    DatasetManifest.open(root)
    return read_document(Path(root) / SUMMARY_FILE, schema, "dataset summary", DatasetError)
