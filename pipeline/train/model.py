"""The model a training task starts from and how its checkpoints export it.

The retriever is a bi-encoder (``model`` section of the config); the reranker a joint
cross-encoder (``rerank`` section), both built as :mod:`hnce.pipeline.models` says. Both are
exported in Hugging Face format into every checkpoint's ``export/`` directory.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from hnce.encoders.biencoder import BiEncoder, export_biencoder
from hnce.encoders.reranker import JointReranker, export_reranker
from hnce.pipeline.config import Config
from hnce.pipeline.models import build_model, build_reranker_model
from hnce.pipeline.run import TaskKind


def build_trainable(config: Config, kind: TaskKind) -> BiEncoder | JointReranker:
    """The model a task trains, with activation checkpointing when its settings ask for it
    (``model.activation_checkpointing`` / ``rerank.activation_checkpointing``)."""
    if kind == "retriever":
        model: BiEncoder | JointReranker = build_model(config)
        checkpointing = config.model.activation_checkpointing
    else:
        model = build_reranker_model(config)
        checkpointing = config.rerank.activation_checkpointing
    if checkpointing:
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
