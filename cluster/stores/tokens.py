"""The token store: a catalogue tokenized once per (tokenizer, entity length) (docs/stores.md).

Layout, under the dataset directory::

    tokens/<tokenizer fingerprint[:16]>-<entity length>/
        ids.npy          uint16 (int32 for vocabularies over 65,535) [N, L]: BLINK entity layout,
                         right-padded with the tokenizer's pad id
        lengths.npy      uint16 [N]: real tokens of each row
        entity_ids.npy   int64 [N]: the entity of each row (row i is entity_id i)
        manifest.json    format, tokenizer fingerprint, entity length, catalogue fingerprint,
                         pad id, rows, dtype and the SHA-256 of each array

Every reader (the trainer's step, the encoder actors of every refresh, evaluation) memory-maps
the arrays and reads rows by entity id in O(batch): nothing decodes Parquet or re-tokenizes the
catalogue per step or per refresh. :meth:`TokenStore.ensure` builds the store the first time it
is asked for (under a file lock, into ``tokens/.building-<name>/``, published by rename) and
reuses it afterwards; a different tokenizer or entity length gets its own store, and a store whose
catalogue changed is refused (rebuild it by deleting its directory). A build records the rows it
has finished every few batches (``progress.json``, written after the arrays are flushed), so one
that was killed resumes there for the same tokenizer, length and catalogue (5.9M entities took
31 minutes of one core here) and starts again for anything else.

Mentions are not stored: the trainer's mentions, and those the reranker scores, are tokenized
once in memory (:class:`MentionTokens`) and read by row the same way, trimmed to the longest.

Example::

    store = TokenStore.ensure(data_root, model.tokenizer, model.entity_length)
    batch = store.batch(np.array([3, 17, 42]))   # {"input_ids", "attention_mask"} trimmed
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from filelock import FileLock
from pydantic import TypeAdapter
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from hnce.cluster.stores.files import (
    PROGRESS_FILE,
    STAGING_PREFIX,
    atomic_write_json,
    publish_directory,
    remove_leftovers,
    remove_owned,
    sha256_file,
)
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import EntityCatalogue, catalogue_fingerprint
from hnce.cluster.stores.versioned_dir import read_manifest
from hnce.documents import document_record, read_resumable
from hnce.encoders.formatting import tokenize_entities, tokenizer_fingerprint
from hnce.errors import InputError
from hnce.progress import progress_bar

logger = logging.getLogger(__name__)

TOKENS_DIR = "tokens"
MANIFEST_FILE = "manifest.json"
FORMAT = 1
ARRAYS = ("ids", "lengths", "entity_ids")
_BUILD_BATCH = 8192
_BATCHES_PER_PROGRESS = 16  # a progress record every 131,072 rows: a few seconds of one core


class TokenStoreError(InputError):
    """A token store that does not match its manifest, its tokenizer or its catalogue."""


@document_record
class TokenManifest:
    """``manifest.json``: what the store was built from, and its arrays' SHA-256; read against
    this schema (strict: no unknown key, no coercion), so a truncated or hand-edited manifest is
    named (file, line or key) before any array is mapped."""

    format: int
    tokenizer: str
    entity_length: int
    catalogue: str
    dtype: str
    pad_id: int
    rows: int
    sha256: dict[str, str]


_MANIFEST = TypeAdapter(TokenManifest)


@document_record
class TokenBuildProgress:
    """``progress.json`` of an unfinished build: what it was built from (the manifest's first
    five keys) and the rows finished."""

    format: int
    tokenizer: str
    entity_length: int
    catalogue: str
    dtype: str
    rows_done: int


_PROGRESS = TypeAdapter(TokenBuildProgress)


def store_directory(data_root: Path, fingerprint: str, entity_length: int) -> Path:
    """``<data_root>/tokens/<fingerprint[:16]>-<entity_length>``."""
    return Path(data_root) / TOKENS_DIR / f"{fingerprint[:16]}-{entity_length}"


class TokenStore:
    """Memory-mapped token ids of a whole catalogue; see the module docstring."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.entity_length: int = manifest["entity_length"]
        self.pad_id: int = manifest["pad_id"]
        self.ids = np.load(self.directory / "ids.npy", mmap_mode="r")
        self.lengths = np.load(self.directory / "lengths.npy", mmap_mode="r")
        self.entity_ids = np.load(self.directory / "entity_ids.npy", mmap_mode="r")

    def __len__(self) -> int:
        return int(self.manifest["rows"])

    @classmethod
    def open(
        cls,
        directory: Path,
        fingerprint: str | None = None,
        catalogue: str | None = None,
        verify: bool = True,
    ) -> TokenStore:
        """Open a published store, checking its manifest (and, with ``verify``, every array's
        SHA-256); ``fingerprint`` / ``catalogue`` must match the manifest when given."""
        directory = Path(directory)
        manifest_path = directory / MANIFEST_FILE
        if not manifest_path.is_file():
            raise TokenStoreError(f"{manifest_path}: missing; not a token store")
        manifest = asdict(read_manifest(manifest_path, _MANIFEST))
        if manifest["format"] != FORMAT:
            raise TokenStoreError(f"{manifest_path}: format {manifest['format']!r}, not {FORMAT}")
        expected = {"tokenizer": fingerprint, "catalogue": catalogue}
        for key, value in expected.items():
            if value is not None and manifest[key] != value:
                raise TokenStoreError(
                    f"{manifest_path}: built for {key} {manifest[key]!r}, not {value!r}; "
                    f"delete {directory} to rebuild it"
                )
        if verify:
            for name in ARRAYS:
                path = directory / f"{name}.npy"
                actual = sha256_file(path)
                if actual != manifest["sha256"][name]:
                    raise TokenStoreError(
                        f"{path}: sha256 {actual} does not match {manifest_path}; the file is corrupt"
                    )
        return cls(directory, manifest)

    @classmethod
    def ensure(
        cls,
        data_root: Path,
        tokenizer: PreTrainedTokenizerBase,
        entity_length: int,
    ) -> TokenStore:
        """The store of this catalogue for ``tokenizer`` at ``entity_length``, built on first use.

        Concurrent callers (trainer ranks, encoder actors) serialise on a file lock; the first
        builds, the others open what it published.
        """
        fingerprint = tokenizer_fingerprint(tokenizer)
        catalogue = catalogue_fingerprint(data_root)
        directory = store_directory(data_root, fingerprint, entity_length)
        directory.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory) + ".lock"):
            if not directory.is_dir():
                _build(directory, data_root, tokenizer, entity_length, fingerprint, catalogue)
        return cls.open(directory, fingerprint, catalogue)

    def rows(self, entity_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids [n, L], lengths [n]) of these entities, in the order given."""
        entity_ids = np.asarray(entity_ids, dtype=np.int64)
        if entity_ids.size and (entity_ids.min() < 0 or entity_ids.max() >= len(self)):
            raise IndexError(f"entity ids outside 0..{len(self) - 1} in a token store look-up")
        return self.ids[entity_ids], self.lengths[entity_ids]

    def batch(self, entity_ids: np.ndarray) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` (int64 [n, w]) of these entities, trimmed to the
        longest row ``w``: what the entity tower reads."""
        ids, lengths = self.rows(entity_ids)
        width = max(int(lengths.max()) if len(lengths) else 0, 1)
        input_ids = torch.from_numpy(ids[:, :width].astype(np.int64))
        positions = torch.arange(width)[None, :]
        attention_mask = (positions < torch.from_numpy(lengths.astype(np.int64))[:, None]).long()
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def _build(
    directory: Path,
    data_root: Path,
    tokenizer: PreTrainedTokenizerBase,
    entity_length: int,
    fingerprint: str,
    catalogue_digest: str,
) -> None:
    """Tokenize the catalogue into the staging sibling of ``directory`` (resuming a build of the
    same inputs left there), then publish it. The caller holds the store's file lock."""
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.int32
    remove_leftovers(directory)  # per-process staging of builds before they were resumable
    building = directory.parent / f"{STAGING_PREFIX}{directory.name}"
    inputs = {
        "format": FORMAT,
        "tokenizer": fingerprint,
        "entity_length": entity_length,
        "catalogue": catalogue_digest,
        "dtype": np.dtype(dtype).name,
    }
    done = _rows_done(building, inputs)

    def record(rows_done: int) -> None:
        progress = TokenBuildProgress(**inputs, rows_done=rows_done)
        atomic_write_json(building / PROGRESS_FILE, asdict(progress))

    rows = _tokenize_into(building, data_root, tokenizer, entity_length, dtype, done, record)
    manifest = {
        **inputs,
        "pad_id": int(tokenizer.pad_token_id),
        "rows": rows,
        "sha256": {name: sha256_file(building / f"{name}.npy") for name in ARRAYS},
    }
    (building / PROGRESS_FILE).unlink(missing_ok=True)
    atomic_write_json(building / MANIFEST_FILE, manifest)
    publish_directory(building, directory)


def _rows_done(building: Path, inputs: dict[str, Any]) -> int:
    """Rows an unfinished build in ``building`` finished for these ``inputs`` (0, with the
    directory emptied, when there is none, it was of other inputs or its progress record is
    unreadable)."""
    progress = read_resumable(building / PROGRESS_FILE, _PROGRESS, "token store progress record")
    if progress is not None and {key: getattr(progress, key) for key in inputs} == inputs:
        logger.info("resuming the token store build in %s at row %d", building, progress.rows_done)
        return progress.rows_done
    if building.exists():
        logger.info("removing %s: an unfinished token store build of other inputs", building)
        remove_owned(building, building.parent)
    building.mkdir()
    return 0


def _tokenize_into(
    building: Path,
    data_root: Path,
    tokenizer: PreTrainedTokenizerBase,
    entity_length: int,
    dtype: type,
    done: int,
    record: Callable[[int], None],
) -> int:
    """The catalogue's token arrays, written into ``building`` from row ``done`` on (the rows
    before it are already there), calling ``record`` with the rows finished every
    ``_BATCHES_PER_PROGRESS`` batches once they are flushed; returns the row count."""
    catalogue = EntityCatalogue.open(data_root)
    rows = len(catalogue)
    mode = "r+" if done else "w+"
    ids = np.lib.format.open_memmap(building / "ids.npy", mode, dtype, (rows, entity_length))
    lengths = np.lib.format.open_memmap(building / "lengths.npy", mode, np.uint16, (rows,))
    entity_ids = np.lib.format.open_memmap(building / "entity_ids.npy", mode, np.int64, (rows,))
    arrays = (ids, lengths, entity_ids)
    logger.info("tokenizing %d entities into %s", rows - done, building.parent)
    stop, batches = 0, 0
    with progress_bar(total=rows, initial=done, desc="token store", unit="entities") as bar:
        for record_batch in catalogue.iter_batches(_BUILD_BATCH, ["entity_id", "title", "text"]):
            start, stop = stop, stop + record_batch.num_rows
            if stop <= done:
                continue
            if start < done:
                record_batch, start = record_batch.slice(done - start), done
            tokens = tokenize_entities(
                tokenizer,
                record_batch.column("title").to_pylist(),
                record_batch.column("text").to_pylist(),
                entity_length,
                pad_to_max_length=True,
            )
            ids[start:stop] = tokens["input_ids"].numpy().astype(dtype)
            lengths[start:stop] = tokens["attention_mask"].sum(dim=1).numpy()
            entity_ids[start:stop] = record_batch.column("entity_id").to_numpy()
            bar.update(stop - start)
            batches += 1
            if batches % _BATCHES_PER_PROGRESS == 0:
                for array in arrays:
                    array.flush()
                record(stop)
    if not np.array_equal(entity_ids, np.arange(rows)):
        raise TokenStoreError(f"{data_root}: entity ids are not dense 0..{rows - 1} in file order")
    for array in arrays:
        array.flush()
    return rows


class MentionTokenizer(Protocol):
    """What tokenizes mentions in a model's own layout (bi-encoder and reranker alike)."""

    def tokenize_mentions(
        self, context_left: Sequence[str], mention: Sequence[str], context_right: Sequence[str]
    ) -> dict[str, Tensor]: ...


@dataclass
class MentionTokens:
    """The training mentions tokenized once per run: ``input_ids`` [M, L] and real ``lengths`` [M]."""

    input_ids: Tensor
    lengths: Tensor

    @classmethod
    def tokenize(cls, model: MentionTokenizer, mentions: Sequence[Mention]) -> MentionTokens:
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        return cls(tokens["input_ids"], tokens["attention_mask"].sum(dim=1))

    def batch(self, rows: np.ndarray) -> dict[str, Tensor]:
        """``input_ids`` and ``attention_mask`` of these rows, trimmed to their longest."""
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        lengths = self.lengths[index]
        width = max(int(lengths.max()) if len(lengths) else 0, 1)
        positions = torch.arange(width)[None, :]
        return {
            "input_ids": self.input_ids[index, :width],
            "attention_mask": (positions < lengths[:, None]).long(),
        }
