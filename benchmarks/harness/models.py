"""Random-weight BERT model directories for benchmarks that time the product at a model size no
hub checkpoint has here (imported where used: it pulls in torch and transformers)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel


def write_random_bert(
    directory: Path,
    tokenizer_dir: Path,
    layers: int,
    hidden: int,
    head_width: int,
    initializer_range: float = 0.02,
) -> Path:
    """A BERT of ``layers`` × ``hidden`` (heads of ``head_width``; random weights, seed 0, drawn
    with σ = ``initializer_range``) with the tokenizer of ``tokenizer_dir``, saved as a Hugging
    Face model directory; kept when ``directory`` already holds one (it is published whole by a
    rename)."""
    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // head_width),
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
        initializer_range=initializer_range,
    )
    building = directory.with_name(".building-model")
    shutil.rmtree(building, ignore_errors=True)
    BertModel(config).save_pretrained(building)
    tokenizer.save_pretrained(building)
    building.replace(directory)
    return directory
