"""The bi-encoder a run starts from (``model`` section of the config)."""

from __future__ import annotations

from pathlib import Path

from encoders.biencoder import SCORER_FILE, BiEncoder, build_biencoder, load_biencoder, minilm_path
from encoders.scorers import ScorerConfig
from pipeline.config import Config


def resolve_model_path(path: str) -> Path:
    """``minilm`` is the PyPI-packaged all-MiniLM-L6-v2; anything else a local HF directory."""
    return minilm_path() if path == "minilm" else Path(path)


def build_model(config: Config) -> BiEncoder:
    """A fresh bi-encoder for the config (both towers from ``model.path``), or, when
    ``model.path`` is a bi-encoder export directory (``scorer.json``: e.g. BLINK imported by
    ``hnce finetune-blink``), that model with its own towers, scorer and lengths."""
    path = resolve_model_path(config.model.path)
    if (path / SCORER_FILE).is_file():
        return load_biencoder(path)
    return build_biencoder(
        path,
        ScorerConfig(name=config.model.scorer.name, m=config.model.scorer.m),
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )
