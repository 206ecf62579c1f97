"""The one way an index version is made (docs/stores.md, docs/refresh.md): a model's export and a catalogue in,
shards indexed by the encoder actors, a verified version published into a store.

Every index in hnce is built here, whatever asks for it: the refresh (`hnce.cluster.compute.refresh`, into
the run's `index/` store), evaluation and prediction (`hnce.cluster.compute.retrieval`, into the run's
`eval-index/` store when no published version holds the model), and index version 0 of a BLINK
fine-tuning run (from BLINK's precomputed encodings or from the imported model); and for every
scorer: vectors of an inner-product index for dual, multi-m and som, each entity's reduced
vectors for the scorers mined exactly (poly-m, genpoly-m, general; `hnce.cluster.stores.exact_search`). The shards are
contiguous entity ranges of ``refresh.shard_size``; each is encoded from the catalogue's token
store (or read from precomputed vectors) and written by an encoder actor
(`EntityEncoderActor.index_shard`), recorded in the build's `progress.json` so an interrupted
build resumes, and the version is published when every shard is in.

A version records the fingerprint of the model it was encoded with (:func:`model_fingerprint`:
the SHA-256 of the export's files) and of the catalogue, so it can be found again
(`IndexStore.find`) for the same model, catalogue and index parameters.

Example::

    model = IndexedModel.from_checkpoint(checkpoint_dir, step)
    builder = store.begin(build_parameters(model, catalogue, len(tokens), spec, shard_size))
    report = index_entities(pool, builder, spec, shard_size)
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from hnce.cluster.compute.encoder_actor import QuantiserTask, ShardEncoded, ShardTask
from hnce.cluster.compute.encoder_pool import EncoderPool, EncoderPoolSettings, KeptPool
from hnce.cluster.stores.checkpoints import EXPORT_DIR, verify_checkpoint
from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import BuildParameters, IndexBuilder, IndexStore, IndexVersion
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import (
    SCORER_FILE,
    ExportDescription,
    check_finite_weights,
    read_description,
)
from hnce.encoders.formatting import register_markers
from hnce.encoders.local import load_local
from hnce.errors import InputError
from hnce.progress import progress_bar

logger = logging.getLogger(__name__)


def model_fingerprint(export_dir: Path, files: Mapping[str, str] | None = None) -> str:
    """SHA-256 identifying an exported model: of its files' relative paths and SHA-256s.

    `files` (relative path → SHA-256), when the caller has them from a verified checkpoint
    manifest, saves hashing the export again; otherwise every file is hashed (streamed).
    """
    export_dir = Path(export_dir)
    if files is None:
        files = {
            str(path.relative_to(export_dir)): sha256_file(path)
            for path in sorted(export_dir.rglob("*"))
            if path.is_file()
        }
    return hashlib.sha256(json.dumps(dict(sorted(files.items()))).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class IndexedModel:
    """A model an index version is built from or found for: its export directory, the run's
    checkpoint step (None for another model, e.g. the untrained one), its fingerprint and its
    ``scorer.json`` description."""

    export_dir: Path
    checkpoint: int | None
    fingerprint: str
    description: ExportDescription

    @classmethod
    def from_export(cls, export_dir: Path, checkpoint: int | None = None) -> IndexedModel:
        """A model from an export directory (its files hashed)."""
        return cls._described(Path(export_dir), checkpoint, model_fingerprint(export_dir))

    @classmethod
    def from_checkpoint(cls, directory: Path, step: int | None) -> IndexedModel:
        """Checkpoint `directory` (`step-<S>/`, step `step`), verified against its manifest (whose
        SHA-256s give the fingerprint without hashing the export again)."""
        prefix = EXPORT_DIR + "/"
        files = {
            name[len(prefix) :]: digest
            for name, digest in verify_checkpoint(directory).files.items()
            if name.startswith(prefix)
        }
        export_dir = Path(directory) / EXPORT_DIR
        return cls._described(export_dir, step, model_fingerprint(export_dir, files))

    @classmethod
    def _described(cls, export_dir: Path, checkpoint: int | None, fingerprint: str) -> IndexedModel:
        description = read_description(export_dir)
        check_finite_weights(export_dir)  # here, before any actor loads it (docs/failures.md)
        return cls(export_dir, checkpoint, fingerprint, description)

    @property
    def vectors_per_entity(self) -> int | None:
        return self.description.vectors_per_entity


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the wall time of the block to ``seconds[stage]`` (per-stage timing of summaries)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started


def ensure_token_store(data_dir: Path, model: IndexedModel) -> TokenStore:
    """The catalogue's token store for `model`'s tokenizer and entity length, built the first
    time any refresh, evaluation or trainer asks (`TokenStore.ensure`). Only the tokenizer is
    loaded here, exactly as `load_biencoder` loads it (the actors check its fingerprint)."""
    tokenizer = load_local(AutoTokenizer, model.export_dir / "mention")
    register_markers(tokenizer)
    return TokenStore.ensure(data_dir, tokenizer, model.description.entity_length)


def start_pool(
    model: IndexedModel,
    settings: EncoderPoolSettings,
    encode_catalogue: Path | None,
    seconds: dict[str, float],
    kept: KeptPool | None = None,
) -> tuple[EncoderPool, TokenStore | None]:
    """The encoder pool of `model`: started (stage ``start``), or `kept`'s pool reloaded with
    it (stage ``reload``); when it is to encode the catalogue of dataset `encode_catalogue`,
    that catalogue's token store first (stage ``tokens``)."""
    tokens = None
    if encode_catalogue is not None:
        with timed(seconds, "tokens"):
            tokens = ensure_token_store(encode_catalogue, model)
    directory = None if tokens is None else tokens.directory
    if kept is None:
        with timed(seconds, "start"):
            return EncoderPool(model.export_dir, settings, directory), tokens
    with timed(seconds, "reload" if kept.reuses(settings) else "start"):
        return kept.pool_for(model.export_dir, settings, directory), tokens


def index_parameters(spec: IndexSpec, shard_size: int) -> dict[str, Any]:
    """The index parameters a version records (and `IndexStore.find` matches)."""
    return {**spec.to_json(), "shard_size": shard_size}


def build_parameters(
    model: IndexedModel,
    catalogue: str,
    num_entities: int,
    spec: IndexSpec,
    shard_size: int,
    encodings: Path | None = None,
) -> BuildParameters:
    """What a version of `model` over the catalogue (fingerprint `catalogue`) is built from.

    A scorer mined exactly stores its reduced entity vectors, which only a flat index keeps
    exactly (`hnce.cluster.stores.exact_search`)."""
    scorer = model.description.scorer
    if scorer.mining == "exact" and spec.kind != "flat":
        raise InputError(
            f"{model.export_dir / SCORER_FILE}: scorer {scorer.name!r} is mined exactly, which "
            f"needs index.kind flat (got {spec.kind!r})"
        )
    return BuildParameters(
        checkpoint=model.checkpoint,
        checkpoint_path=str(model.export_dir),
        model=model.fingerprint,
        catalogue=catalogue,
        source="encoded" if encodings is None else f"encodings {encodings}",
        scorer=scorer.to_dict(),
        dim=model.description.output_size,
        vectors_per_entity=model.vectors_per_entity,
        num_entities=num_entities,
        index=index_parameters(spec, shard_size),
    )


@dataclass(frozen=True)
class BuildReport:
    """What a build did: the published version, its shards (those resumed from an interrupted
    build among them) and how long indexing took."""

    version: IndexVersion
    num_shards: int
    resumed_shards: int
    seconds: float


def index_entities(
    pool: EncoderPool,
    builder: IndexBuilder,
    spec: IndexSpec,
    shard_size: int,
    encodings: Path | None = None,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> BuildReport:
    """Index every unfinished shard of `builder`'s version through `pool`, then publish it; an
    ``ivfpq`` version first has its one quantiser trained (unless an interrupted build already
    wrote it), which every shard then shares.

    Vectors are encoded from the token store the pool was started with, or read from
    `encodings` (row i = entity i). `on_shard` is called in this process after each shard is
    recorded (monitoring, fault tests). Once `stopping()` is true the build stops within a batch
    (StopRequested), its finished shards recorded for the next build to resume.
    """
    parameters = builder.parameters
    num_entities = parameters.num_entities
    bounds = [
        (start, min(start + shard_size, num_entities))
        for start in range(0, num_entities, shard_size)
    ]
    finished = builder.finished_shards
    started = time.perf_counter()
    if spec.quantised and len(finished) < len(bounds) and not builder.quantiser_path.exists():
        trained = pool.train_quantiser(
            QuantiserTask(
                str(builder.directory),
                spec,
                parameters.vectors_per_entity,
                num_entities,
                None if encodings is None else str(encodings),
            ),
            stopping,
        )
        source = (
            "read" if encodings is not None else f"encoded by {trained.encoders} encoder actor(s)"
        )
        logger.info(
            "index v%d: %s quantiser trained on %d vectors sampled from the catalogue "
            "(%s) in %.1f s (every shard shares it)",
            builder.version,
            spec.kind,
            trained.sample_vectors,
            source,
            trained.seconds,
        )
    bar = progress_bar(
        total=num_entities,
        desc=f"indexing v{builder.version}",
        unit="entities",
        unit_scale=True,
    )
    bar.update(
        sum(finished[number].entities[1] - finished[number].entities[0] for number in finished)
    )
    tasks = (
        ShardTask(
            number,
            entities,
            str(builder.directory),
            spec,
            parameters.vectors_per_entity,
            None if encodings is None else str(encodings),
        )
        for number, entities in enumerate(bounds)
        if number not in finished
    )

    def record(encoded: ShardEncoded) -> None:
        builder.record_shard(encoded.shard_no, encoded.record)
        bar.update(encoded.num_entities)
        if on_shard is not None:
            on_shard(encoded, pool)

    with bar:
        pool.index_shards(tasks, record, stopping=stopping)
    seconds = time.perf_counter() - started
    version = builder.publish(len(bounds))
    return BuildReport(version, len(bounds), len(finished), seconds)


def build_version(
    pool: EncoderPool,
    store: IndexStore,
    model: IndexedModel,
    tokens: TokenStore,
    spec: IndexSpec,
    shard_size: int,
    on_shard: Callable[[ShardEncoded, EncoderPool], None] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> BuildReport:
    """A new version of `store`: the whole catalogue of `tokens` encoded with `model` (resuming
    an unfinished build of the same parameters; `stopping` as in :func:`index_entities`)."""
    catalogue = tokens.manifest["catalogue"]
    parameters = build_parameters(model, catalogue, len(tokens), spec, shard_size)
    builder = store.begin(parameters)
    return index_entities(pool, builder, spec, shard_size, on_shard=on_shard, stopping=stopping)
