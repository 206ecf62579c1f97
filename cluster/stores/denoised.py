"""False negatives flagged by the joint reranker: `<run>/rerank/false_negatives.json` (RocketQA).

RocketQA (Qu et al. 2021) denoises a retriever's hard negatives with a trained cross-encoder: a
candidate the cross-encoder scores as high as the gold is more likely an unlabelled positive than
a negative. ``hnce rerank --denoise`` scores the train split's candidates of a negatives version
with the trained reranker and writes the (mention, entity) pairs it flags here (one JSON file,
replaced atomically); a retriever recipe with ``negatives.candidates.denoised: true`` adds them
to its known positives, so no sampler draws them and no shared batch scores them as negatives.

The file is read back untrusted: its schema, the catalogue it was flagged over and every entity
id are checked, and every failure is a `StoreError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import TypeAdapter

from hnce.cluster.stores.files import atomic_write_text
from hnce.cluster.stores.versioned_dir import (
    Count,
    Positive,
    Sha256,
    StoreError,
    created_at,
    manifest_json,
    read_manifest,
)
from hnce.documents import document_record

DENOISED_FILE = "false_negatives.json"


@document_record
class DenoisedPairs:
    """What the reranker flagged: per mention id, the candidate entity ids it scored within
    ``margin`` of the gold, over the candidates of negatives version ``negatives_version``."""

    format: Literal[1]
    margin: float
    negatives_version: Count
    reranker_step: Count
    num_entities: Positive
    pairs: dict[str, list[int]]
    created_at: str
    catalogue: Sha256 | None = None

    def flagged(self) -> list[tuple[str, int]]:
        """Every (mention id, entity id) pair, for a ``FalseNegativeFilter``."""
        return [(mention, entity) for mention, ids in self.pairs.items() for entity in ids]


_SCHEMA = TypeAdapter(DenoisedPairs)


def denoised_path(run_dir: Path) -> Path:
    """Where a run's reranker writes its flagged pairs."""
    return Path(run_dir) / "rerank" / DENOISED_FILE


def write_denoised(
    path: Path,
    pairs: dict[str, list[int]],
    margin: float,
    negatives_version: int,
    reranker_step: int,
    num_entities: int,
    catalogue: str | None,
) -> DenoisedPairs:
    """Write the flagged ``pairs`` to ``path`` atomically (replacing an earlier file)."""
    record = DenoisedPairs(
        format=1,
        margin=float(margin),
        negatives_version=negatives_version,
        reranker_step=reranker_step,
        num_entities=num_entities,
        pairs={mention: sorted(int(e) for e in ids) for mention, ids in pairs.items() if ids},
        created_at=created_at(),
        catalogue=catalogue,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, manifest_json(record, _SCHEMA))
    return record


def read_denoised(path: Path, num_entities: int, catalogue: str | None) -> DenoisedPairs:
    """The flagged pairs at ``path``, checked against the catalogue they must index (its size
    and fingerprint); StoreError naming ``path`` otherwise, or when it is missing."""
    if not path.is_file():
        raise StoreError(
            f"{path}: missing; 'negatives.candidates.denoised' reads the pairs that "
            f"'hnce rerank --denoise' writes, run it first"
        )
    record = read_manifest(path, _SCHEMA)
    if catalogue is not None and record.catalogue not in (None, catalogue):
        raise StoreError(f"{path}: flagged over another catalogue than the run's data")
    if record.num_entities != num_entities or any(
        not 0 <= entity < num_entities for ids in record.pairs.values() for entity in ids
    ):
        raise StoreError(
            f"{path}: entity ids for a catalogue of {record.num_entities} entities, the run's "
            f"holds {num_entities}"
        )
    return record
