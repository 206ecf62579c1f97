"""Versioned, checksummed store of mined negatives: `<run>/negatives/` (docs/stores.md, docs/refresh.md).

Layout::

    negatives/CURRENT                   "v7" — replaced atomically
    negatives/v7/manifest.json          {format, version, checkpoint, top_n, num_entities,
                                         splits: {train: {file, sha256, rows}}, created_at}
    negatives/v7/train.parquet          mention_id string, cands list<int64>, scores list<float32>,
                                        gold_rank int32 (rank of the gold in cands, -1 if absent;
                                        diagnostics only); file metadata: hnce.version,
                                        hnce.checkpoint, hnce.top_n

Candidates are the raw top-N of the index version with the same number, gold included: filtering
the gold and known positives is the sampler's job (mining/), which sees the multi-positive sets.
A version is written under `.building-v<N>/` and renamed when complete, so the trainer can call
`latest()` every few steps and switch without waiting for a refresh.

Nothing is trusted on reading: the manifest's schema and version, the file's SHA-256, the table's
schema and metadata against the manifest, and its rows (mention ids unique, candidate ids in
0..num_entities-1, as many scores as candidates and at most top_n of each, gold ranks inside
the list) are checked, and the same checks run before a version is written. Every failure is a
`StoreError` (an `InputError`) naming the file.

Example::

    negatives = NegativesStore(run_dir / "negatives").latest()
    if negatives is not None:
        cand_ids, cand_scores = negatives.lookup(batch_mention_ids)   # [B, N] each
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from pydantic import Field

from hnce.cluster.stores.files import AtomicPath, sha256_file
from hnce.cluster.stores.tables import parquet_read
from hnce.cluster.stores.versioned_dir import (
    MANIFEST_FILE,
    Count,
    ManifestFile,
    Positive,
    Sha256,
    StoreError,
    VersionedStore,
    created_at,
    verify_sha256,
)
from hnce.documents import document_record

logger = logging.getLogger(__name__)

FORMAT = 1
#: the negatives store's directory in a run (``<run>/negatives``)
NEGATIVES_DIR = "negatives"
NEGATIVES_SCHEMA = pa.schema(
    [
        pa.field("mention_id", pa.string(), nullable=False),
        pa.field("cands", pa.list_(pa.int64()), nullable=False),
        pa.field("scores", pa.list_(pa.float32()), nullable=False),
        pa.field("gold_rank", pa.int32(), nullable=False),
    ]
)


@document_record
class SplitRecord:
    """One split's file in a negatives version."""

    file: str
    sha256: Sha256
    rows: Count


@document_record
class NegativesManifest:
    """`manifest.json` of a negatives version."""

    format: Literal[1]
    version: Count
    checkpoint: int
    top_n: Positive
    num_entities: Positive
    splits: Annotated[dict[str, SplitRecord], Field(min_length=1)]
    created_at: str
    catalogue: Sha256 | None = None  # the dataset's catalogue fingerprint (none: not recorded)

    def metadata(self) -> dict[bytes, bytes]:
        """The Parquet file metadata every split of this version carries."""
        return file_metadata(self.version, self.checkpoint, self.top_n)


_MANIFEST = ManifestFile(NegativesManifest)


def file_metadata(version: int, checkpoint: int, top_n: int) -> dict[bytes, bytes]:
    """What each split file's Parquet metadata records (and a reader checks)."""
    return {
        b"hnce.version": str(version).encode(),
        b"hnce.checkpoint": str(checkpoint).encode(),
        b"hnce.top_n": str(top_n).encode(),
    }


def gold_ranks(cands: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Position of each row's gold in its candidate list, -1 when absent (int32 [M]); padding
    (-1) never matches a missing gold."""
    hits = (cands == gold[:, None]) & (cands >= 0)
    return np.where(hits.any(axis=1), hits.argmax(axis=1), -1).astype(np.int32)


@dataclass(frozen=True)
class MinedSplit:
    """Top-N candidates of one mention split, in mention order."""

    mention_ids: list[str]
    cands: np.ndarray  # int64 [M, N], -1 where fewer than N entities exist
    scores: np.ndarray  # float32 [M, N], best first, -inf where cands is -1
    gold_ranks: np.ndarray  # int32 [M], -1 when the gold is not in the top-N

    def __post_init__(self) -> None:
        rows = len(self.mention_ids)
        if self.cands.shape[0] != rows or self.scores.shape != self.cands.shape:
            raise ValueError(
                f"{rows} mentions but cands {self.cands.shape} and scores {self.scores.shape}"
            )
        if self.gold_ranks.shape != (rows,):
            raise ValueError(f"{rows} mentions but gold_ranks {self.gold_ranks.shape}")

    def table(self) -> pa.Table:
        """The split as a table of NEGATIVES_SCHEMA (padding dropped from each row's lists)."""
        return pa.table(
            {
                "mention_id": pa.array(self.mention_ids, pa.string()),
                "cands": _list_column(self.cands, self.cands >= 0, pa.int64()),
                "scores": _list_column(self.scores, self.cands >= 0, pa.float32()),
                "gold_rank": pa.array(self.gold_ranks.astype(np.int32), pa.int32()),
            },
            schema=NEGATIVES_SCHEMA,
        )


def check_table(
    table: pa.Table, metadata: Mapping[bytes, bytes], top_n: int, num_entities: int, path: Path
) -> None:
    """Schema, `metadata` and rows of one split (module docstring); StoreError naming `path`."""
    found = pa.schema([pa.field(f.name, f.type) for f in table.schema])
    wanted = pa.schema([pa.field(f.name, f.type) for f in NEGATIVES_SCHEMA])
    if not found.equals(wanted):
        raise StoreError(f"{path}: columns {found} do not match the negatives schema {wanted}")
    recorded = table.schema.metadata or {}
    for key, value in metadata.items():
        if recorded.get(key) != value:
            raise StoreError(
                f"{path}: metadata {key.decode()} is {recorded.get(key)!r}, the manifest says "
                f"{value.decode()!r}"
            )
    if any(table.column(name).null_count for name in table.column_names):
        raise StoreError(f"{path}: holds null values")
    if pc.count_distinct(table.column("mention_id")).as_py() != table.num_rows:
        raise StoreError(f"{path}: a mention id is listed more than once")
    cand_lengths = pc.list_value_length(table.column("cands")).to_numpy()
    score_lengths = pc.list_value_length(table.column("scores")).to_numpy()
    if not np.array_equal(cand_lengths, score_lengths):
        row = int(np.flatnonzero(cand_lengths != score_lengths)[0])
        raise StoreError(
            f"{path}: row {row} has {cand_lengths[row]} candidates but {score_lengths[row]} scores"
        )
    scores = pc.list_flatten(table.column("scores")).to_numpy()
    if len(scores) and not np.isfinite(scores).all():
        raise StoreError(
            f"{path}: {int((~np.isfinite(scores)).sum())} of {len(scores)} candidate scores are "
            f"not finite: the model that mined them diverged"
        )
    if len(cand_lengths) and cand_lengths.max() > top_n:
        raise StoreError(f"{path}: a row holds more than top_n = {top_n} candidates")
    cands = pc.list_flatten(table.column("cands")).to_numpy()
    if len(cands) and (cands.min() < 0 or cands.max() >= num_entities):
        raise StoreError(
            f"{path}: candidate ids {cands.min()}..{cands.max()} outside the catalogue's "
            f"0..{num_entities - 1}"
        )
    ranks = table.column("gold_rank").to_numpy()
    if ((ranks < -1) | (ranks >= cand_lengths)).any():
        raise StoreError(f"{path}: a gold_rank lies outside its row's candidates")


def check_catalogue(version: NegativesVersion, catalogue: str, data_root: Path) -> None:
    """StoreError unless ``version`` was mined over the catalogue with fingerprint
    ``catalogue`` (that of ``data_root``); a version that recorded none is taken as is."""
    if version.catalogue is not None and version.catalogue != catalogue:
        raise StoreError(
            f"{version.path}: mined over catalogue {version.catalogue[:16]}…, but {data_root} "
            f"now holds catalogue {catalogue[:16]}… (converted again?); its candidate ids would "
            f"name other entities. Start a new run directory, or convert the old data back"
        )


class NegativesVersion:
    """One published negatives version of one split, verified, indexed by mention id.

    Args:
        path: `<negatives>/v<N>/<split>.parquet`; the version's manifest lies beside it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        directory = self.path.parent
        manifest_path = directory / MANIFEST_FILE
        manifest = _MANIFEST.read(directory)
        split = manifest.splits.get(self.path.stem)
        if split is None or split.file != self.path.name:
            raise StoreError(f"{manifest_path}: lists no split file {self.path.name}")
        verify_sha256(self.path, split.sha256, manifest_path)
        with parquet_read(self.path):
            table = pq.read_table(self.path)
        if table.num_rows != split.rows:
            raise StoreError(f"{self.path}: {table.num_rows} rows, the manifest says {split.rows}")
        check_table(table, manifest.metadata(), manifest.top_n, manifest.num_entities, self.path)
        self.manifest = manifest
        self.version = manifest.version
        self.checkpoint_step = manifest.checkpoint
        self.top_n = manifest.top_n
        self.catalogue = manifest.catalogue
        self.mention_ids: list[str] = table.column("mention_id").to_pylist()
        self._row = {mention_id: row for row, mention_id in enumerate(self.mention_ids)}
        self.cands = _fixed_width(table.column("cands"), self.top_n, np.int64, -1)
        self.scores = _fixed_width(table.column("scores"), self.top_n, np.float32, -np.inf)
        self.gold_ranks = table.column("gold_rank").to_numpy()

    def __len__(self) -> int:
        return len(self.mention_ids)

    def lookup(self, mention_ids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(cand ids LongTensor [B, N], scores FloatTensor [B, N]) for these mentions.

        Raises KeyError naming the first mention missing from this version's file.
        """
        try:
            rows = np.fromiter((self._row[mention_id] for mention_id in mention_ids), np.int64)
        except KeyError as error:
            raise KeyError(f"{self.path}: no negatives for mention {error.args[0]!r}") from None
        return torch.from_numpy(self.cands[rows]), torch.from_numpy(self.scores[rows])

    def recall_at(self, k: int) -> float:
        """Share of mentions whose gold is among the first k candidates (diagnostics)."""
        ranks = self.gold_ranks
        return float(((ranks >= 0) & (ranks < k)).mean()) if len(ranks) else 0.0


class NegativesStore(VersionedStore):
    """Negatives versions under `root` (normally `<run>/negatives`)."""

    def publish(
        self,
        version: int,
        splits: Mapping[str, MinedSplit],
        checkpoint_step: int,
        top_n: int,
        num_entities: int,
        catalogue: str | None = None,
    ) -> Path:
        """Write every split of version `version` (checked as a reader checks it), then its
        manifest, and make it the live one atomically. ``catalogue``: the fingerprint of the
        catalogue the candidates index (``catalogue_fingerprint``), refused by a reader of
        another catalogue.

        The unfinished directory of another version (a publication killed midway, whose refresh
        a later one superseded) is removed first: callers hold the refresh lock, so nothing else
        writes it, and nothing would ever finish it."""
        for stale in self.unfinished_versions():
            if stale != version:
                logger.info("removing unfinished negatives v%d of a stopped publication", stale)
                self.remove_building(stale)
        building = self.building_dir(version)
        building.mkdir(parents=True, exist_ok=True)
        metadata = file_metadata(version, checkpoint_step, top_n)
        records = {}
        for name, mined in splits.items():
            path = building / f"{name}.parquet"
            table = mined.table().replace_schema_metadata(
                {**metadata, b"hnce.splits": json.dumps(sorted(splits)).encode()}
            )
            check_table(table, metadata, top_n, num_entities, path)
            with AtomicPath(path) as temporary:
                pq.write_table(table, temporary)
            records[name] = SplitRecord(path.name, sha256_file(path), table.num_rows)
        manifest = NegativesManifest(
            format=FORMAT,
            version=version,
            checkpoint=checkpoint_step,
            top_n=top_n,
            num_entities=num_entities,
            splits=records,
            created_at=created_at(),
            catalogue=catalogue,
        )
        _MANIFEST.write(building, manifest)
        self.publish_build(version)
        logger.info("published negatives v%d (%s)", version, ", ".join(sorted(splits)))
        return self.version_dir(version)

    def latest(self, split: str = "train") -> NegativesVersion | None:
        """The newest published version of `split`, or None before the first refresh.

        Cheap to call every C trainer steps: compare `current_version()` with the version held
        and call this only when it changed.
        """
        return self.follow_current(
            lambda version: NegativesVersion(self.version_dir(version) / f"{split}.parquet"),
            FileNotFoundError,
        )


def _list_column(matrix: np.ndarray, valid: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """A list<value_type> column of the rows of `matrix`, keeping the `valid` entries."""
    lengths = valid.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(matrix[valid], value_type)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _fixed_width(column: pa.ChunkedArray, width: int, dtype: type, fill: float) -> np.ndarray:
    """A [rows, width] array from a list column, padded with `fill` (vectorised)."""
    lengths = pc.list_value_length(column).to_numpy()
    values = pc.list_flatten(column).to_numpy()
    rows = np.repeat(np.arange(len(lengths)), lengths)
    columns = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = np.full((len(lengths), width), fill, dtype=dtype)
    out[rows, columns] = values
    return out
