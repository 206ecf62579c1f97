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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hnce.errors import InputError

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


def with_dataset_id(schema: pa.Schema, dataset_id: str) -> pa.Schema:
    return schema.with_metadata({DATASET_ID_KEY: dataset_id.encode()})


class CatalogueDigest:
    """The catalogue's identity (the manifest's ``catalogue``; see :func:`catalogue_fingerprint`):
    SHA-256 over its rows in ``entity_id`` order, each field of a row (key, title, text, domain)
    prefixed by its length in bytes, so no two catalogues share it by a shifted field boundary.

    It is a fingerprint of what the entities are, not of the files holding them: the entity
    files carry the dataset's fresh id in their footers, so a digest of the files differed for
    every conversion, and two datasets of one catalogue (other mentions, or converted again)
    could share nothing derived from it. Now a token store, an index version or a negatives
    version built over one serves the other: their entity ids name the same entities.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def add(self, entity: Entity) -> None:
        """The next row (``entity_id`` one more than the last one added)."""
        for value in (entity.key, entity.title, entity.text, entity.domain):
            data = value.encode()
            self._digest.update(len(data).to_bytes(8, "little") + data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def open_parquet(path: Path) -> pq.ParquetFile:
    """A Parquet file whose page checksums are verified on every read."""
    with parquet_read(path):
        return pq.ParquetFile(path, page_checksum_verification=True)


@contextmanager
def parquet_read(path: Path) -> Iterator[None]:
    """Arrow's complaints about a Parquet file's bytes (a footer or page that does not parse, a
    page whose checksum fails) as a :class:`DatasetError` naming the file; the machine's refusals
    (an ``OSError`` with an errno) stay what they are."""
    try:
        yield
    except (pa.ArrowException, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:
            raise
        said = " ".join(str(error).split())
        raise DatasetError(f"{path}: not a readable Parquet file ({said})") from None


def mention_split_path(root: Path, split: str) -> Path:
    """``<root>/mentions/<split>.parquet``."""
    return Path(root) / MENTIONS_DIR / f"{split}.parquet"
