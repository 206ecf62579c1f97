"""Index and negatives version 0 of a BLINK fine-tuning run: the starting model's view.

With BLINK's precomputed entity encodings (``all_entities_large.t7``, a [5903527, 1024] float32
tensor, 24 GB) version 0 needs no encoding at all: the file is memory-mapped
(``torch.load(mmap=True, weights_only=True)``) and copied shard by shard into FAISS, so at most
one shard is held in memory besides the page cache. Row i of the tensor is BLINK's entity i,
which is ``entity_id`` i of a catalogue converted from BLINK's ``entity.jsonl`` (DESIGN.md §6).
Without the file, version 0 is encoded from the imported checkpoint.

The train mentions are then mined against version 0 (top-N, DESIGN.md §2 negatives version), so
the trainer uses hard negatives from its first step instead of random ones (DESIGN.md §5).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from cluster.encoder_pool import encode_entity_texts
from cluster.index_store import BuildParameters, IndexBuilder, IndexStore, IndexVersion
from cluster.miner import gold_ranks, search_mentions
from cluster.negatives_store import MinedSplit, NegativesStore
from cluster.sharded_index import IndexSpec, build_shard_index
from cluster.tables import EntityCatalogue, Mention
from encoders.biencoder import BiEncoder

INITIAL_VERSION = 0
INITIAL_STEP = 0


def read_blink_encodings(path: Path) -> torch.Tensor:
    """BLINK's precomputed entity encodings [N, d], memory-mapped (no copy is read into memory)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such encodings file")
    try:
        encodings = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise ValueError(
            f"{path}: cannot memory-map as a torch tensor file (torch.save zip format needed; "
            f"re-save a legacy file once with torch.save(torch.load(path), path)): {error}"
        ) from error
    if not isinstance(encodings, torch.Tensor) or encodings.dim() != 2:
        kind = tuple(encodings.shape) if isinstance(encodings, torch.Tensor) else type(encodings)
        raise ValueError(f"{path}: expected a 2-d tensor [entities, dim], got {kind}")
    if encodings.dtype != torch.float32:
        raise ValueError(f"{path}: expected float32 encodings, got {encodings.dtype}")
    return encodings


def build_parameters(
    model: BiEncoder, export_dir: Path, num_entities: int, spec: IndexSpec, shard_size: int
) -> BuildParameters:
    """The manifest parameters of version 0 (checkpoint step 0 = the imported model)."""
    return BuildParameters(
        checkpoint=INITIAL_STEP,
        checkpoint_path=str(export_dir),
        scorer=model.scorer.config.to_dict(),
        dim=model.output_size,
        vectors_per_entity=model.scorer.vectors_per_entity,
        num_entities=num_entities,
        index={**spec.to_json(), "shard_size": shard_size},
    )


def publish_shards(
    store: IndexStore,
    parameters: BuildParameters,
    shards: Iterator[tuple[np.ndarray, np.ndarray]],
    spec: IndexSpec,
    version: int = INITIAL_VERSION,
) -> IndexVersion:
    """Index each (vectors [n, d], entity ids [n]) shard and publish ``version`` (resumable:
    shards a crashed attempt already recorded are skipped)."""
    store.root.mkdir(parents=True, exist_ok=True)
    builder = IndexBuilder(store, version, parameters)
    finished = builder.finished_shards
    count = 0
    for number, (vectors, ids) in enumerate(shards):
        count = number + 1
        if number not in finished:
            builder.add_shard(number, build_shard_index(vectors, spec), ids)
    return builder.publish(count)


def _encoding_shards(
    encodings: torch.Tensor, shard_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    total = len(encodings)
    for start in tqdm(range(0, total, shard_size), desc="index v0 from encodings", unit="shard"):
        stop = min(start + shard_size, total)
        yield encodings[start:stop].numpy(), np.arange(start, stop, dtype=np.int64)


def index_from_encodings(
    store: IndexStore,
    encodings_path: Path,
    model: BiEncoder,
    export_dir: Path,
    num_entities: int,
    spec: IndexSpec,
    shard_size: int = 1_000_000,
) -> IndexVersion:
    """Version 0 from BLINK's ``.t7`` encodings; row i must be entity_id i of the catalogue.

    Only a dual scorer can use them: they are BLINK's one [CLS] vector per entity, while multi-m
    and sum-of-max index several vectors per entity.
    """
    if model.scorer.config.name != "dual" or model.scorer.vectors_per_entity != 1:
        raise ValueError(
            f"{encodings_path}: precomputed BLINK encodings hold one vector per entity; the "
            f"{model.scorer.config.name} scorer needs its own (omit the encodings to encode them)"
        )
    encodings = read_blink_encodings(encodings_path)
    if len(encodings) != num_entities:
        raise ValueError(
            f"{encodings_path}: {len(encodings)} encodings but the catalogue has {num_entities} "
            "entities; the catalogue must be BLINK's entity.jsonl converted without rejects"
        )
    if encodings.shape[1] != model.output_size:
        raise ValueError(
            f"{encodings_path}: encodings of dim {encodings.shape[1]}, the model's entity "
            f"vectors have dim {model.output_size}"
        )
    parameters = build_parameters(model, export_dir, num_entities, spec, shard_size)
    return publish_shards(store, parameters, _encoding_shards(encodings, shard_size), spec)


def index_from_model(
    store: IndexStore,
    model: BiEncoder,
    export_dir: Path,
    catalogue: EntityCatalogue,
    spec: IndexSpec,
    shard_size: int = 100_000,
    batch_size: int = 64,
) -> IndexVersion:
    """Version 0 encoded from ``model`` (the imported checkpoint), shard by shard."""

    def shards() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        columns = ["entity_id", "title", "text"]
        for record_batch in tqdm(
            catalogue.iter_batches(shard_size, columns), desc="index v0 from model", unit="shard"
        ):
            vectors, rows, _ = encode_entity_texts(
                model,
                record_batch.column("title").to_pylist(),
                record_batch.column("text").to_pylist(),
                batch_size,
            )
            yield vectors, record_batch.column("entity_id").to_numpy()[rows]

    model.eval()
    parameters = build_parameters(model, export_dir, len(catalogue), spec, shard_size)
    return publish_shards(store, parameters, shards(), spec)


def mine_initial_negatives(
    store: NegativesStore,
    index_version: IndexVersion,
    model: BiEncoder,
    split: str,
    mentions: list[Mention],
    top_n: int,
    batch_size: int = 256,
) -> Path:
    """Top-``top_n`` of the train mentions under version 0, published as negatives version 0."""
    all_cands, all_scores = search_mentions(
        model, index_version.searcher, mentions, top_n, batch_size, description="mining v0"
    )
    mined = MinedSplit(
        mention_ids=[m.mention_id for m in mentions],
        cands=all_cands,
        scores=all_scores,
        gold_ranks=gold_ranks(all_cands, np.asarray([m.gold for m in mentions], np.int64)),
    )
    return store.publish(index_version.version, {split: mined}, INITIAL_STEP, top_n)
