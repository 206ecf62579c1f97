"""Shared test helpers: tiny WordPiece tokenizers and BERT configs built offline in temp dirs.

Test modules import the functions (`from conftest import tiny_bert_config`); pytest puts
`tests/` on the path.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

# BERT's special tokens plus BLINK's mention / title markers (DESIGN.md §6).
SPECIAL_TOKENS = (
    "[PAD]",
    "[unused0]",
    "[unused1]",
    "[unused2]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
)

TINY_WORDS = (
    "the",
    "capital",
    "of",
    "france",
    "is",
    "paris",
    "a",
    "city",
    "on",
    "river",
    "seine",
    "big",
)


def write_wordpiece_tokenizer(directory: Path, tokens: Iterable[str]) -> BertTokenizerFast:
    """A tokenizer whose vocab is the special tokens then ``tokens`` (deduplicated, in order),
    written to ``directory/vocab.txt`` and saved there with ``save_pretrained``."""
    vocab = list(dict.fromkeys([*SPECIAL_TOKENS, *tokens]))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 ignores vocab_file=; vocab= takes the file.
    tokenizer = BertTokenizerFast(vocab=str(directory / "vocab.txt"))
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_bert_config(vocab_size: int) -> BertConfig:
    """A 2-layer, 32-wide BERT: milliseconds per batch on a CPU."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )


def write_letter_bert(directory: Path) -> Path:
    """A tiny random BERT whose WordPiece vocabulary is the letters (every lower-case word
    tokenizes), saved in ``directory`` like a Hugging Face model: a ``model.path`` for training."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    tokenizer = write_wordpiece_tokenizer(
        directory, [".", ",", *letters, *[f"##{c}" for c in letters]]
    )
    torch.manual_seed(0)
    BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    """Special tokens, '.', and a dozen words: enough to hand-check BLINK input ids."""
    return write_wordpiece_tokenizer(tmp_path_factory.mktemp("vocab"), [".", *TINY_WORDS])


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three synthetic worlds of 30 entities, 2 mentions each: train, dev, test a world apiece."""
    from training_helpers import small_synthetic_dataset

    return small_synthetic_dataset(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def syllable_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT directory whose vocabulary reads the synthetic data (training_helpers)."""
    from training_helpers import write_syllable_bert

    return write_syllable_bert(tmp_path_factory.mktemp("syllable-bert"))


@pytest.fixture(scope="session")
def real_wordnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Debian's WordNet converted once for the session: (dataset root, conversion summary)."""
    from pipeline.data.wordnet import convert_wordnet

    root = tmp_path_factory.mktemp("real-wordnet") / "wordnet"
    return root, convert_wordnet(root)


@pytest.fixture(autouse=True, scope="module")
def ray_shut_down_after_module() -> Iterator[None]:
    """Each test module gets its own Ray instance: one left running by a module (the pipeline
    reuses an initialised Ray) would hand the next module the wrong CPUs and runtime env."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
