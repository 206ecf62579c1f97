"""Versioned store of mined negatives: `<run>/negatives/` (DESIGN.md §2, §5).

Layout::

    negatives/CURRENT                   "v7" — replaced atomically
    negatives/v7/train.parquet          mention_id string, cands list<int64>, scores list<float32>,
                                        gold_rank int32 (rank of the gold in cands, -1 if absent;
                                        diagnostics only); file metadata: hnce.version,
                                        hnce.checkpoint, hnce.top_n

Candidates are the raw top-N of the index version with the same number, gold included: filtering
the gold and known positives is the sampler's job (mining/), which sees the multi-positive sets.
A version is written under `.building-v<N>/` and renamed when complete, so the trainer can call
`latest()` every few steps and switch without waiting for a refresh.

Example::

    negatives = NegativesStore(run_dir / "negatives").latest()
    if negatives is not None:
        cand_ids, cand_scores = negatives.lookup(batch_mention_ids)   # [B, N] each
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from cluster.files import AtomicPath
from cluster.versioned_dir import (
    building_dir_name,
    publish_version,
    read_current,
    version_dir_name,
)

logger = logging.getLogger(__name__)

NEGATIVES_SCHEMA = pa.schema(
    [
        pa.field("mention_id", pa.string(), nullable=False),
        pa.field("cands", pa.list_(pa.int64()), nullable=False),
        pa.field("scores", pa.list_(pa.float32()), nullable=False),
        pa.field("gold_rank", pa.int32(), nullable=False),
    ]
)


@dataclass(frozen=True)
class MinedSplit:
    """Top-N candidates of one mention split, in mention order."""

    mention_ids: list[str]
    cands: np.ndarray  # int64 [M, N], -1 where fewer than N entities exist
    scores: np.ndarray  # float32 [M, N], best first
    gold_ranks: np.ndarray  # int32 [M], -1 when the gold is not in the top-N

    def __post_init__(self) -> None:
        rows = len(self.mention_ids)
        if self.cands.shape[0] != rows or self.scores.shape != self.cands.shape:
            raise ValueError(
                f"{rows} mentions but cands {self.cands.shape} and scores {self.scores.shape}"
            )
        if self.gold_ranks.shape != (rows,):
            raise ValueError(f"{rows} mentions but gold_ranks {self.gold_ranks.shape}")


class NegativesVersion:
    """One published negatives version of one split, indexed by mention id."""

    def __init__(self, path: Path) -> None:
        table = pq.read_table(path)
        metadata = table.schema.metadata or {}
        self.path = path
        self.version = int(metadata[b"hnce.version"])
        self.checkpoint_step = int(metadata[b"hnce.checkpoint"])
        self.top_n = int(metadata[b"hnce.top_n"])
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


class NegativesStore:
    """Negatives versions under `root` (normally `<run>/negatives`)."""

    def __init__(self, root: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def publish(
        self,
        version: int,
        splits: Mapping[str, MinedSplit],
        checkpoint_step: int,
        top_n: int,
    ) -> Path:
        """Write every split of version `version` and make it the live one atomically."""
        building = self.root / building_dir_name(version)
        building.mkdir(parents=True, exist_ok=True)
        metadata = {
            b"hnce.version": str(version).encode(),
            b"hnce.checkpoint": str(checkpoint_step).encode(),
            b"hnce.top_n": str(top_n).encode(),
            b"hnce.splits": json.dumps(sorted(splits)).encode(),
        }
        for split, mined in splits.items():
            table = pa.table(
                {
                    "mention_id": pa.array(mined.mention_ids, pa.string()),
                    "cands": _list_column(mined.cands, pa.int64()),
                    "scores": _list_column(mined.scores, pa.float32()),
                    "gold_rank": pa.array(mined.gold_ranks.astype(np.int32), pa.int32()),
                },
                schema=NEGATIVES_SCHEMA.with_metadata(metadata),
            )
            with AtomicPath(building / f"{split}.parquet") as temporary:
                pq.write_table(table, temporary)
        publish_version(self.root, version, self.keep)
        logger.info("published negatives v%d (%s)", version, ", ".join(sorted(splits)))
        return self.root / version_dir_name(version)

    def current_version(self) -> int | None:
        return read_current(self.root)

    def latest(self, split: str = "train") -> NegativesVersion | None:
        """The newest published version of `split`, or None before the first refresh.

        Cheap to call every C trainer steps: compare `current_version()` with the version held
        and call this only when it changed.
        """
        for _ in range(10):
            version = read_current(self.root)
            if version is None:
                return None
            path = self.root / version_dir_name(version) / f"{split}.parquet"
            try:
                return NegativesVersion(path)
            except FileNotFoundError:
                if read_current(self.root) == version:
                    raise
        raise RuntimeError(f"{self.root}: CURRENT kept moving while opening it")


def _list_column(matrix: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """A list<value_type> column of the rows of `matrix`, dropping -1 / -inf padding."""
    valid = np.isfinite(matrix) if value_type == pa.float32() else matrix >= 0
    lengths = valid.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(matrix[valid], value_type)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _fixed_width(column: pa.ChunkedArray, width: int, dtype: type, fill: float) -> np.ndarray:
    """A [rows, width] array from a list column, padded with `fill`."""
    out = np.full((len(column), width), fill, dtype=dtype)
    row = 0
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy()
        for start, end in itertools.pairwise(offsets):
            out[row, : end - start] = values[start:end]
            row += 1
    return out
