"""Parquet contracts of a dataset directory (DESIGN.md §2), written and read in record batches.

A dataset directory ``<root>/`` holds::

    entities/part-00000.parquet ...   entity_id int64 (dense 0..N-1), key, title, text, domain
    mentions/{train,dev,test}.parquet mention_id, context_left, mention, context_right, gold,
                                      domain, golds list<int64> (all correct entities, gold first)
    summary.json                      counts written by the converter

Nothing here holds a whole table in Python objects: writers buffer one record batch, readers
stream record batches or decode one row group at a time, and key / title look-ups run on Arrow
columns (sorted once, searched by bisection) instead of Python dicts, so a 5.9M-entity KILT
catalogue stays at a few hundred MB.

A mention whose gold entity is not in the catalogue can be kept for evaluation with
``gold == MISSING_GOLD`` (-1): it must count as an error in unnormalized accuracy and must never be
used as a training positive (see ``pipeline.data.bad_rows``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cluster.files import AtomicPath, atomic_write_json, sha256_file

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
SPLITS = ("train", "dev", "test")


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


class _BatchedParquetWriter:
    """Buffers rows column-wise and writes one row group per ``batch_size`` rows to a temp file,
    renamed into place on a clean close (a reader never sees a half-written file)."""

    def __init__(self, path: Path, schema: pa.Schema, batch_size: int) -> None:
        self.path = path
        self.schema = schema
        self.batch_size = batch_size
        self.rows_written = 0
        self._target = AtomicPath(path)
        self._writer = pq.ParquetWriter(self._target.temporary, schema, compression="zstd")
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
        self._target.commit()

    def abort(self) -> None:
        self._writer.close()
        self._target.abort()


class EntityCatalogueWriter:
    """Writes ``<directory>/entities/part-NNNNN.parquet`` in record batches.

    ``entity_id`` must be dense ``0..N-1`` in write order (checked here). Unique, non-empty keys
    are the converter's job (it knows the file and line to blame). Use as a context manager; on an
    exception the partial files are removed.
    """

    def __init__(
        self, directory: Path, rows_per_file: int = 1_000_000, batch_size: int = 8192
    ) -> None:
        self.directory = Path(directory) / ENTITIES_DIR
        self.rows_per_file = rows_per_file
        self.batch_size = batch_size
        self.count = 0
        self._part = 0
        self._rows_in_file = 0
        self._current: _BatchedParquetWriter | None = None
        self._finished: list[Path] = []
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("part-*.parquet"):
            stale.unlink()

    def write(self, entity: Entity) -> None:
        if entity.entity_id != self.count:
            raise ValueError(
                f"entity_id must be dense in write order: expected {self.count}, "
                f"got {entity.entity_id} (key {entity.key!r})"
            )
        if self._current is None or self._rows_in_file >= self.rows_per_file:
            self._roll()
        assert self._current is not None
        self._current.append(
            (entity.entity_id, entity.key, entity.title, entity.text, entity.domain)
        )
        self._rows_in_file += 1
        self.count += 1

    def _roll(self) -> None:
        if self._current is not None:
            self._current.close()
            self._finished.append(self._current.path)
        path = self.directory / f"part-{self._part:05d}.parquet"
        self._part += 1
        self._current = _BatchedParquetWriter(path, ENTITY_SCHEMA, self.batch_size)
        self._rows_in_file = 0

    def close(self) -> None:
        if self._current is None:
            self._roll()
        assert self._current is not None
        self._current.close()
        self._current = None

    def __enter__(self) -> EntityCatalogueWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        if self._current is not None:
            self._current.abort()
        for path in self._finished:
            path.unlink(missing_ok=True)


class MentionWriter:
    """Writes ``<directory>/mentions/<split>.parquet`` in record batches (context manager)."""

    def __init__(self, directory: Path, split: str, batch_size: int = 8192) -> None:
        self.path = Path(directory) / MENTIONS_DIR / f"{split}.parquet"
        self.split = split
        self.count = 0
        self._writer = _BatchedParquetWriter(self.path, MENTION_SCHEMA, batch_size)

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
        self._writer.close()

    def __enter__(self) -> MentionWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._writer.abort()


def _as_py(scalar: pa.Scalar) -> Any:
    return scalar.as_py()


class _SortedColumn:
    """A string column sorted once by Arrow; exact look-ups by bisection, batch look-ups by
    ``pyarrow.compute.index_in``. Memory: the column itself plus one int64 per row."""

    def __init__(self, values: pa.ChunkedArray) -> None:
        self._values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        self._sorted: pa.Array | None = None
        self._order = np.empty(0, dtype=np.int64)

    def find_all(self, value: str) -> np.ndarray:
        """Row positions holding ``value`` (ascending); sorts the column on first use."""
        if self._sorted is None:
            order = pc.sort_indices(self._values)
            self._sorted = pc.take(self._values, order)
            self._order = order.to_numpy()
        lo = bisect.bisect_left(self._sorted, value, key=_as_py)
        hi = bisect.bisect_right(self._sorted, value, lo=lo, key=_as_py)
        return np.sort(self._order[lo:hi])

    def positions(self, values: Sequence[str] | pa.Array) -> np.ndarray:
        """First row position of each value, ``-1`` where absent (vectorized)."""
        found = pc.index_in(pa.array(values, type=pa.string()), value_set=self._values)
        return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


class EntityCatalogue:
    """Read side of ``entities/*.parquet``: streaming, id look-up and key / title look-up."""

    def __init__(self, files: list[Path], cache_row_groups: int = 8) -> None:
        self.files = files
        self._parquet = [pq.ParquetFile(path) for path in files]
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
        self._keys: _SortedColumn | None = None
        self._titles: _SortedColumn | None = None

    @classmethod
    def open(cls, root: Path) -> EntityCatalogue:
        """Open the catalogue of dataset directory ``root`` (which holds ``entities/``)."""
        directory = Path(root) / ENTITIES_DIR
        files = sorted(directory.glob("part-*.parquet"))
        if not files:
            raise FileNotFoundError(f"no entity catalogue under {directory}")
        return cls(files)

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

    def id_for_key(self, key: str) -> int:
        """The entity_id of a source key; ``KeyError`` naming the key when absent."""
        if self._keys is None:
            self._keys = _SortedColumn(self.keys())
        found = self._keys.find_all(key)
        if len(found) == 0:
            raise KeyError(f"key {key!r} not in the entity catalogue")
        return int(found[0])

    def ids_for_keys(self, keys: Sequence[str]) -> np.ndarray:
        """Vectorized ``id_for_key``: int64 array, ``-1`` where a key is absent."""
        if self._keys is None:
            self._keys = _SortedColumn(self.keys())
        return self._keys.positions(keys)

    def ids_for_titles(self, titles: Sequence[str]) -> np.ndarray:
        """Vectorized title look-up: the first entity_id with each title, ``-1`` where absent."""
        if self._titles is None:
            self._titles = _SortedColumn(self.titles())
        return self._titles.positions(titles)

    def ids_for_title(self, title: str) -> list[int]:
        """All entity_ids with exactly this title (ascending)."""
        if self._titles is None:
            self._titles = _SortedColumn(self.titles())
        return [int(i) for i in self._titles.find_all(title)]


class MentionSplit:
    """Read side of ``mentions/<split>.parquet``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._parquet = pq.ParquetFile(self.path)

    @classmethod
    def open(cls, path: Path) -> MentionSplit:
        """Open a split file, e.g. ``<root>/mentions/train.parquet``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no mention split at {path}")
        return cls(path)

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
    """Hex SHA-256 identifying the catalogue of dataset ``root``: its entity files, in order,
    each by name and contents (streamed). Derived stores (token store) record it and refuse a
    catalogue that changed under them."""
    directory = Path(root) / ENTITIES_DIR
    files = sorted(directory.glob("part-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no entity catalogue under {directory}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def mention_split_path(root: Path, split: str) -> Path:
    """``<root>/mentions/<split>.parquet``."""
    return Path(root) / MENTIONS_DIR / f"{split}.parquet"


def write_summary(root: Path, summary: dict[str, Any]) -> Path:
    """Write ``<root>/summary.json`` atomically."""
    return atomic_write_json(Path(root) / SUMMARY_FILE, summary)


def read_summary(root: Path) -> dict[str, Any]:
    """Read ``<root>/summary.json``."""
    return json.loads((Path(root) / SUMMARY_FILE).read_text(encoding="utf-8"))
