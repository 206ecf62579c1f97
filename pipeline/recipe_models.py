"""The models a recipe names, built in whichever process needs them: the retriever of the
``model`` section, the joint reranker of the ``rerank`` section, and the untrained retriever
exported for the encoder actors.

The training workers build the model their task trains (:func:`build_trainable`) and export it
into every checkpoint's ``export/`` directory in Hugging Face format (:func:`export_trainable`);
``hnce eval``, the demo and the initial negatives load the untrained export (:func:`untrained_export`) to
search with the model a run starts from. Living below the trainer, they import neither DeepSpeed
nor Ray Train.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

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
from hnce.encoders.reranker import JointReranker, build_reranker, export_reranker
from hnce.pipeline.config import Config
from hnce.pipeline.preflight import model_directory
from hnce.pipeline.run import TaskKind


def build_model(config: Config) -> BiEncoder:
    """A fresh bi-encoder for the config (both towers from ``model.path``, pooled as
    ``model.pooling`` says: auto reads the directory's declaration), or, when ``model.path`` is a
    bi-encoder export directory (``scorer.json``: e.g. BLINK imported by ``hnce finetune-blink``),
    that model with its own towers, scorer, lengths, pooling, normalisation and projection.
    ``model.projection_size`` adds a learned projection after each fresh tower;
    ``model.shared_towers`` makes the two towers one."""
    path = model_directory(config, "model.path", config.model.path)
    if (path / SCORER_FILE).is_file():
        return _continued_export(config, path)
    settings = config.model
    return build_biencoder(
        path,
        settings.scorer,
        mention_length=settings.mention_length,
        entity_length=settings.entity_length,
        projection_size=settings.projection_size,
        pooling=settings.pooling,
        normalize=True if settings.normalize is None else settings.normalize,
        shared_towers=bool(settings.shared_towers),
    )


def _continued_export(config: Config, path: Path) -> BiEncoder:
    """The bi-encoder exported at ``path``; a ``model`` setting that contradicts what the export
    says (its pooling, normalisation, projection or shared towers) is an error."""
    model = load_biencoder(path)
    settings = config.model
    kept = {  # setting: (the recipe's value, the value that defers to the export, the export's)
        "pooling": (settings.pooling, "auto", model.pooling),
        "normalize": (settings.normalize, None, model.normalize),
        "projection_size": (settings.projection_size, None, model.projection_size),
        "shared_towers": (settings.shared_towers, None, model.shared_towers),
    }
    for name, (wanted, deferring, exported) in kept.items():
        if wanted not in (deferring, exported):
            leave = "set it to auto" if deferring == "auto" else "leave it unset"
            raise config.error(
                f"model.{name}",
                f"is {wanted} but {path / SCORER_FILE} has {name} {exported}; {leave} "
                f"(or {exported}) to continue that model",
            )
    return model


def build_reranker_model(config: Config) -> JointReranker:
    """The joint reranker of the ``rerank`` section (encoder from ``rerank.model``, head random),
    reading mentions and entities at the retriever's lengths."""
    return build_reranker(
        model_directory(config, "rerank.model", config.rerank.model),
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )


def build_trainable(config: Config, kind: TaskKind) -> BiEncoder | JointReranker:
    """The model a task trains, with activation checkpointing when the recipe asks for it
    (``model.activation_checkpointing``, for the retriever's towers and the reranker's encoder)."""
    model: BiEncoder | JointReranker = (
        build_model(config) if kind == "retriever" else build_reranker_model(config)
    )
    if config.model.activation_checkpointing:
        model.enable_activation_checkpointing()
    return model


def export_trainable(model: nn.Module, directory: Path) -> None:
    """Write ``model`` in its Hugging Face export format into ``directory``."""
    if isinstance(model, BiEncoder):
        export_biencoder(model, directory)
    elif isinstance(model, JointReranker):
        export_reranker(model, directory)
    else:
        raise TypeError(f"cannot export a {type(model).__name__}")


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
