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
is asked for (under a file lock, into a temporary directory published by rename) and reuses it
afterwards; a different tokenizer or entity length gets its own store, and a store whose
catalogue changed is refused (rebuild it by deleting its directory).

Example::

    store = TokenStore.ensure(data_root, model.tokenizer, model.entity_length)
    batch = store.batch(np.array([3, 17, 42]))   # {"input_ids", "attention_mask"} trimmed
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from transformers import PreTrainedTokenizerBase

from hnce.cluster.stores.files import (
    atomic_write_json,
    publish_directory,
    sha256_file,
    staging,
)
from hnce.cluster.stores.tables_read import EntityCatalogue, catalogue_fingerprint
from hnce.encoders.errors import InputError
from hnce.encoders.formatting import tokenize_entities, tokenizer_fingerprint
from hnce.encoders.progress import progress_bar

logger = logging.getLogger(__name__)

TOKENS_DIR = "tokens"
MANIFEST_FILE = "manifest.json"
FORMAT = 1
ARRAYS = ("ids", "lengths", "entity_ids")
_BUILD_BATCH = 8192


class TokenStoreError(InputError):
    """A token store that does not match its manifest, its tokenizer or its catalogue."""


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
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TokenStoreError(f"{manifest_path}: missing; not a token store") from None
        if manifest.get("format") != FORMAT:
            raise TokenStoreError(
                f"{manifest_path}: format {manifest.get('format')!r}, not {FORMAT}"
            )
        expected = {"tokenizer": fingerprint, "catalogue": catalogue}
        for key, value in expected.items():
            if value is not None and manifest.get(key) != value:
                raise TokenStoreError(
                    f"{manifest_path}: built for {key} {manifest.get(key)!r}, not {value!r}; "
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
    """Tokenize the catalogue into a staging sibling of ``directory``, then publish it."""
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.int32
    with staging(directory) as building:
        rows = _tokenize_into(building, data_root, tokenizer, entity_length, dtype)
        manifest = {
            "format": FORMAT,
            "tokenizer": fingerprint,
            "entity_length": entity_length,
            "catalogue": catalogue_digest,
            "pad_id": int(tokenizer.pad_token_id),
            "rows": rows,
            "dtype": np.dtype(dtype).name,
            "sha256": {name: sha256_file(building / f"{name}.npy") for name in ARRAYS},
        }
        atomic_write_json(building / MANIFEST_FILE, manifest)
        publish_directory(building, directory)


def _tokenize_into(
    building: Path,
    data_root: Path,
    tokenizer: PreTrainedTokenizerBase,
    entity_length: int,
    dtype: type,
) -> int:
    """The catalogue's token arrays, written into ``building``; returns the row count."""
    catalogue = EntityCatalogue.open(data_root)
    rows = len(catalogue)
    ids = np.lib.format.open_memmap(building / "ids.npy", "w+", dtype, (rows, entity_length))
    lengths = np.lib.format.open_memmap(building / "lengths.npy", "w+", np.uint16, (rows,))
    entity_ids = np.lib.format.open_memmap(building / "entity_ids.npy", "w+", np.int64, (rows,))
    logger.info("tokenizing %d entities into %s", rows, building.parent)
    start = 0
    with progress_bar(total=rows, desc="token store", unit="entities") as bar:
        for record_batch in catalogue.iter_batches(_BUILD_BATCH, ["entity_id", "title", "text"]):
            tokens = tokenize_entities(
                tokenizer,
                record_batch.column("title").to_pylist(),
                record_batch.column("text").to_pylist(),
                entity_length,
                pad_to_max_length=True,
            )
            stop = start + record_batch.num_rows
            ids[start:stop] = tokens["input_ids"].numpy().astype(dtype)
            lengths[start:stop] = tokens["attention_mask"].sum(dim=1).numpy()
            entity_ids[start:stop] = record_batch.column("entity_id").to_numpy()
            start = stop
            bar.update(record_batch.num_rows)
    if not np.array_equal(entity_ids, np.arange(rows)):
        raise TokenStoreError(f"{data_root}: entity ids are not dense 0..{rows - 1} in file order")
    for array in (ids, lengths, entity_ids):
        array.flush()
    return rows
