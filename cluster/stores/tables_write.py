"""Writing a dataset directory (docs/stores.md, "Dataset directory"): the one writer,
:class:`DatasetBuilder`, builds into a staging sibling of its output, writes the manifest last
and publishes the directory by rename (the contract: :mod:`hnce.cluster.stores.tables`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hnce.cluster.stores.files import (
    ClosedOnExit,
    atomic_write_json,
    directory_lock,
    publish_directory,
    remove_owned,
    sha256_file,
    staging_directory,
)
from hnce.cluster.stores.tables import (
    ENTITIES_DIR,
    ENTITY_SCHEMA,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    MENTION_SCHEMA,
    SUMMARY_FILE,
    CatalogueDigest,
    DatasetExistsError,
    Entity,
    Mention,
    mention_split_path,
    open_parquet,
    with_dataset_id,
)
from hnce.cluster.stores.tables_read import DatasetManifest, EntityCatalogue
from hnce.errors import naming_refused_writes


class _BatchedParquetWriter:
    """Buffers rows column-wise and writes one row group (with page checksums) per
    ``batch_size`` rows into the dataset being built."""

    def __init__(self, path: Path, schema: pa.Schema, batch_size: int) -> None:
        self.path = path
        self.schema = schema
        self.batch_size = batch_size
        self.rows_written = 0
        self._failure: OSError | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        with naming_refused_writes(path):
            self._writer = pq.ParquetWriter(
                path, schema, compression="zstd", write_page_checksum=True
            )
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
        self._write(lambda: self._writer.write_batch(batch, row_group_size=count))
        self.rows_written += count
        for column in self._columns.values():
            column.clear()

    def close(self) -> None:
        self.flush()
        self._write(self._writer.close)

    def _write(self, write: Callable[[], None]) -> None:
        """One of pyarrow's writes into the file. Its first OS error (a full disk) is kept,
        naming the file, and raised again by every later write or close: pyarrow closes the
        file on it, so what pyarrow says next ("Operation on closed file") would hide it."""
        if self._failure is not None:
            raise self._failure
        try:
            with naming_refused_writes(self.path):
                write()
        except OSError as error:
            self._failure = error
            raise


class EntityCatalogueWriter(ClosedOnExit):
    """Writes ``entities/part-NNNNN.parquet`` of a dataset being built, in record batches.

    Made by :meth:`DatasetBuilder.entities`. ``entity_id`` must be dense ``0..N-1`` in write
    order (checked here). Unique, non-empty keys are the converter's job (it knows the file and
    line to blame).
    """

    def __init__(
        self, directory: Path, dataset_id: str, rows_per_file: int, batch_size: int
    ) -> None:
        self.directory = Path(directory) / ENTITIES_DIR
        self.schema = with_dataset_id(ENTITY_SCHEMA, dataset_id)
        self.rows_per_file = rows_per_file
        self.batch_size = batch_size
        self.count = 0
        self.files: list[Path] = []
        self.rows: list[int] = []
        self.closed = False
        self.digest = CatalogueDigest()
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
        self.digest.add(entity)
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


class MentionWriter(ClosedOnExit):
    """Writes ``mentions/<split>.parquet`` of a dataset being built (made by
    :meth:`DatasetBuilder.mentions`, once per split)."""

    def __init__(self, directory: Path, split: str, dataset_id: str, batch_size: int) -> None:
        self.path = mention_split_path(directory, split)
        self.split = split
        self.count = 0
        self.closed = False
        schema = with_dataset_id(MENTION_SCHEMA, dataset_id)
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
        self.root = staging_directory(self.out)
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
        return EntityCatalogue(files, [open_parquet(path) for path in files])

    def publish(self, summary: dict[str, Any]) -> DatasetManifest:
        """Write ``summary.json`` and the manifest (last), then rename the directory to ``out``.

        An old dataset there (``overwrite``) is first renamed aside and removed after the new one
        is in place: a crash between the two renames leaves ``out`` missing, never mixed; a
        rename the machine refuses puts the old one back.
        """
        if self._entities is None or not self._entities.closed:
            raise ValueError(f"{self.out}: a dataset needs a closed catalogue")
        for writer in self._splits.values():
            writer.close()
        atomic_write_json(self.root / SUMMARY_FILE, summary)
        manifest = self._manifest()
        atomic_write_json(self.root / MANIFEST_FILE, manifest)
        # Check and rename under one lock: of two conversions racing to the same new output,
        # the second finds the first's dataset and refuses (or, asked to, replaces it whole).
        with directory_lock(self.out.parent):
            check_output(self.out, self.overwrite)
            if self.out.is_dir() and not any(self.out.iterdir()):
                self.out.rmdir()
            retired = self.root.with_name(f".retired-{self.out.name}-{self.dataset_id[:8]}")
            if self.out.exists():
                os.rename(self.out, retired)
            try:
                publish_directory(self.root, self.out)
            except OSError:
                if retired.exists() and not self.out.exists():
                    os.rename(retired, self.out)
                raise
        remove_owned(retired, retired.parent)
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
            "catalogue": self._entities.digest.hexdigest(),
            "entity_files": entity_files,
            "files": files,
        }

    def abort(self) -> None:
        """Remove the directory being built; ``out`` is untouched. It is removed also when
        closing a writer fails (a full disk refuses a failed writer's last rows again)."""
        try:
            if self._entities is not None:
                self._entities.close()
            for writer in self._splits.values():
                writer.close()
        finally:
            remove_owned(self.root, self.root.parent)

    def __enter__(self) -> DatasetBuilder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None or self.published is None:
            self.abort()


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
