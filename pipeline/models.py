"""The models a recipe names, built in whichever process needs them: the retriever of the
``model`` section, the joint reranker of the ``rerank`` section, and the untrained retriever
exported for the encoder actors.

The trainer builds them to train (``hnce.pipeline.train.model``); ``hnce eval``, the demo and
version 0 load the untrained export (:func:`untrained_export`) to search with the model a run
starts from. Living below the trainer, they import neither DeepSpeed nor Ray Train.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hnce.cluster.compute.index_build import model_fingerprint
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR
from hnce.cluster.stores.files import publish_directory, staging
from hnce.encoders.biencoder import (
    SCORER_FILE,
    BiEncoder,
    build_biencoder,
    export_biencoder,
    load_biencoder,
)
from hnce.encoders.reranker import JointReranker, build_reranker
from hnce.pipeline.config import Config
from hnce.pipeline.preflight import model_directory


def build_model(config: Config) -> BiEncoder:
    """A fresh bi-encoder for the config (both towers from ``model.path``, pooled as
    ``model.pooling`` says: auto reads the directory's declaration), or, when ``model.path`` is a
    bi-encoder export directory (``scorer.json``: e.g. BLINK imported by ``hnce finetune-blink``),
    that model with its own towers, scorer, lengths, pooling, normalisation and projection.
    ``model.projection_size`` adds a learned projection after each fresh tower;
    ``model.shared_towers`` makes the two towers one."""
    path = model_directory(config, "model.path", config.model.path)
    pooling, normalize = config.model.pooling, config.model.normalize
    projection_size, shared = config.model.projection_size, config.model.shared_towers
    if (path / SCORER_FILE).is_file():
        model = load_biencoder(path)
        if pooling not in ("auto", model.pooling):
            raise config.error(
                "model.pooling",
                f"is {pooling!r} but {path / SCORER_FILE} pools {model.pooling!r}; set it to "
                f"auto (or {model.pooling!r}) to continue that model",
            )
        if normalize not in (None, model.normalize):
            raise config.error(
                "model.normalize",
                f"is {normalize} but {path / SCORER_FILE} has normalize {model.normalize}; "
                f"leave it unset (or {model.normalize}) to continue that model",
            )
        if projection_size not in (None, model.projection_size):
            raise config.error(
                "model.projection_size",
                f"is {projection_size} but {path / SCORER_FILE} has projection_size "
                f"{model.projection_size}; leave it unset to continue that model",
            )
        if shared not in (None, model.shared_towers):
            raise config.error(
                "model.shared_towers",
                f"is {shared} but {path / SCORER_FILE} has shared_towers {model.shared_towers}; "
                f"leave it unset to continue that model",
            )
        return model
    return build_biencoder(
        path,
        config.model.scorer,
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
        projection_size=projection_size,
        pooling=pooling,
        normalize=True if normalize is None else normalize,
        shared_towers=bool(shared),
    )


def build_reranker_model(config: Config) -> JointReranker:
    """The joint reranker of the ``rerank`` section (encoder from ``rerank.model``, head random)."""
    settings = config.rerank
    return build_reranker(
        model_directory(config, "rerank.model", settings.model),
        mention_length=settings.mention_length,
        entity_length=settings.entity_length,
    )


def untrained_export(config: Config) -> Path:
    """``model.path`` with the recipe's scorer, exported once under
    ``<run>/eval-index/models/<fingerprint>/`` so the encoder actors can load it and an index
    built for it is found again (the fingerprint is of the exported files). Weights the
    model directory does not give (e.g. poly codes) are drawn from ``run.seed``, as the training
    workers draw them, so this is the model a run starts from."""
    with torch.random.fork_rng():
        torch.manual_seed(config.run.seed)
        model = build_model(config)
    root = config.run_dir / EVAL_INDEX_DIR / "models"
    root.mkdir(parents=True, exist_ok=True)
    with staging(root / "model") as building:
        export_biencoder(model, building)
        target = root / model_fingerprint(building)[:16]
        if not target.exists():
            publish_directory(building, target)
    return target
