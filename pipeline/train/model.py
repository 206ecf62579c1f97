"""The bi-encoder a run starts from (``model`` section of the config)."""

from __future__ import annotations

from encoders.biencoder import SCORER_FILE, BiEncoder, build_biencoder, load_biencoder
from pipeline.config import Config
from pipeline.preflight import model_directory


def build_model(config: Config) -> BiEncoder:
    """A fresh bi-encoder for the config (both towers from ``model.path``), or, when
    ``model.path`` is a bi-encoder export directory (``scorer.json``: e.g. BLINK imported by
    ``hnce finetune-blink``), that model with its own towers, scorer and lengths."""
    path = model_directory(config, "model.path", config.model.path)
    if (path / SCORER_FILE).is_file():
        return load_biencoder(path)
    return build_biencoder(
        path,
        config.model.scorer,
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )
