"""Helpers shared by the trainer's and the refresh's tests: a tiny BERT that reads the synthetic
dataset, recipes for it, a tiny exported bi-encoder of any scorer, and exact scores to check
mining against (the one-process gloo group that runs the worker's code in a test process is the
product's own, ``hnce.pipeline.train.one_process``)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from conftest import LETTER_PIECES, tiny_bert_config, write_wordpiece_tokenizer
from safetensors.torch import load_file, save_file
from transformers import BertModel

from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.encoders.biencoder import build_biencoder, export_biencoder, load_biencoder
from hnce.pipeline.cli.main import main as hnce_main
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data import synthetic
from hnce.pipeline.data.synthetic import generate_synthetic_dataset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: the recipe's costly parts, off by default in ``configs/synthetic-test.yaml`` (one worker on
#: random negatives, no refresh actor), turned on by the tests that are about them:
#: mixed negatives mined from the index that a refresh coordinator keeps fresh beside training
REFRESHED = ("negatives.sampler=mixed", "negatives.source=index", "refresh.enabled=true")
#: two trainer workers whose optimizer state ZeRO stage 1 partitions
TWO_WORKERS = ("training.num_workers=2", "training.zero_stage=1")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def write_syllable_bert(directory: Path, dropout: float = 0.1) -> Path:
    """A 2-layer, 32-wide BERT with a WordPiece vocabulary of the synthetic generator's
    syllables, saved like a Hugging Face model directory."""
    syllables = {
        o + v + c for o in synthetic._ONSETS for v in synthetic._VOWELS for c in synthetic._CODAS
    }
    pieces = sorted(syllables | set(LETTERS))
    words = sorted(
        set(synthetic._KINDS)
        | set(synthetic._FILLER)
        | {"is", "of", "known", "for", "famed", "and"}
    )
    tokens = [".", ",", *words, *[p for p in pieces if p not in words], *[f"##{p}" for p in pieces]]
    tokenizer = write_wordpiece_tokenizer(directory, tokens)
    torch.manual_seed(0)
    config = tiny_bert_config(len(tokenizer))
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    BertModel(config).save_pretrained(directory)
    return directory


def write_letter_export(directory: Path, scorer: str) -> Path:
    """A tiny random bi-encoder with scorer ``scorer`` (a spec such as ``dual``, ``multi-3``,
    ``som``) over a letters vocabulary, exported to ``directory/export`` (returned) as a training
    checkpoint's ``export/`` holds it; ``directory`` keeps its tokenizer."""
    tokenizer = write_wordpiece_tokenizer(directory, LETTER_PIECES)
    torch.manual_seed(0)
    config = tiny_bert_config(len(tokenizer))
    model = build_biencoder(config, scorer, tokenizer=tokenizer, entity_length=24)
    export_dir = directory / "export"
    export_biencoder(model, export_dir)
    return export_dir


def poison_weight(export_dir: Path, tower: str = "entity") -> tuple[Path, str]:
    """Make one weight of ``export_dir``'s ``tower`` NaN, as a damaged or hand-made export would
    have it: (the weight file, the weight's name)."""
    weights_file = export_dir / tower / "model.safetensors"
    weights = load_file(weights_file)
    name = next(key for key, tensor in weights.items() if tensor.is_floating_point())
    weights[name][0] = float("nan")
    save_file(weights, weights_file, metadata={"format": "pt"})
    return weights_file, name


def small_synthetic_dataset(root: Path) -> Path:
    """Three worlds of 30 entities, 2 mentions each: train, dev and test one world apiece."""
    generate_synthetic_dataset(root, num_worlds=3, entities_per_world=30, mentions_per_entity=2)
    return root


def synthetic_config(run_dir: Path, dataset: Path, model_dir: Path, *overrides: str) -> Config:
    """``configs/synthetic-test.yaml`` on ``dataset`` and ``model_dir``, with ``overrides``."""
    return load_config(
        CONFIGS / "synthetic-test.yaml",
        [f"run.dir={run_dir}", f"data.root={dataset}", f"model.path={model_dir}", *overrides],
    )


def config_for(dataset: Path, model_dir: Path, *overrides: str) -> Config:
    """:func:`synthetic_config` for in-process tests, which never write a run directory."""
    return synthetic_config(Path("unused-run"), dataset, model_dir, *overrides)


def exact_scores(export_dir: Path, data_root: Path, mentions: list[Mention]) -> np.ndarray:
    """s(x, y) [M, E] of every mention against every catalogue entity, straight from the
    exported model (no index): the ground truth that mining and evaluation must match."""
    model = load_biencoder(export_dir).eval()
    catalogue = EntityCatalogue.open(data_root)
    with torch.inference_mode():
        return model(
            model.tokenize_mentions(
                [m.context_left for m in mentions],
                [m.mention for m in mentions],
                [m.context_right for m in mentions],
            ),
            model.tokenize_entities(catalogue.titles().to_pylist(), catalogue.texts().to_pylist()),
        ).numpy()


def assert_exact_top_k(cands: np.ndarray, scores: np.ndarray, atol: float = 1e-4) -> None:
    """Each row of ``cands`` [M, k] holds k distinct entities whose exact scores (``scores``
    [M, E]) are that row's k best, best first, up to ``atol``. Unlike comparing ids with an
    argsort, this holds however ties, and the near-ties that an index's float arithmetic may
    order differently, are broken."""
    k = cands.shape[1]
    assert all(len(set(row.tolist())) == k for row in cands), "a candidate repeats"
    best = -np.sort(-np.partition(scores, -k, axis=1)[:, -k:], axis=1)
    mined = np.take_along_axis(scores, cands, axis=1)
    np.testing.assert_allclose(mined, best, rtol=0, atol=atol)


class TrainedRun(NamedTuple):
    """A trained run's directory with the dataset and the model it trained from."""

    run: Path
    data: Path
    model: Path


#: the shared run's training: 30 steps of the tiny BERT, mean-pooled, on random negatives
TRAINED_RUN_STEPS = 30


def build_trained_run(root: Path) -> TrainedRun:
    """The small synthetic dataset and the syllable BERT under ``root``, trained by ``hnce train``
    for :data:`TRAINED_RUN_STEPS` steps (one worker, random negatives, no refresh while training;
    mean pooling: [CLS] pooling ranks a tenth of the golds in the top 5 after 30 steps, mean two
    thirds), then ``hnce refresh`` publishes index v<N> of the final checkpoint."""
    trained = TrainedRun(root / "run", root / "data", root / "model")
    small_synthetic_dataset(trained.data)
    write_syllable_bert(trained.model)
    settings = [
        f"run.dir={trained.run}",
        f"data.root={trained.data}",
        f"model.path={trained.model}",
        "model.pooling=mean",
        f"training.steps={TRAINED_RUN_STEPS}",
        f"training.checkpoint_every={TRAINED_RUN_STEPS}",
    ]
    train = ["train", "--config", str(CONFIGS / "synthetic-test.yaml"), "--no-progress"]
    assert hnce_main([*train, *(f"--set={setting}" for setting in settings)]) == 0
    assert hnce_main(["refresh", "--config", str(trained.run / "config.yaml")]) == 0
    return trained
