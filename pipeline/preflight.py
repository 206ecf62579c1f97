"""Checks of every path a command needs, run right after the recipe loads and before Ray starts.

A missing dataset, split, model directory or input file is reported at once, naming the setting
and where the recipe set it, instead of minutes later from inside a Ray worker (or after hours of
converting a knowledge source). Model paths must be local directories: nothing is ever fetched
from a model hub (``transformers`` is always called with ``local_files_only``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from transformers import AutoConfig

from hnce.cluster.stores.tables import ENTITIES_DIR, DatasetError, mention_split_path
from hnce.cluster.stores.tables_read import DatasetManifest
from hnce.encoders.biencoder import SCORER_FILE, minilm_path, read_description
from hnce.encoders.local import load_local
from hnce.encoders.pooling import declared_pooling
from hnce.pipeline.config import Config
from hnce.pipeline.data.kilt import aida_split_name

PACKAGED_MODEL = "minilm"


def model_directory(config: Config, key: str, value: str) -> Path:
    """The local directory of a model setting (``minilm`` is the packaged all-MiniLM-L6-v2)."""
    if value == PACKAGED_MODEL:
        return minilm_path()
    path = Path(value)
    if not (path / "config.json").is_file() and not (path / "scorer.json").is_file():
        raise config.error(
            key,
            f"is {value!r}, which is not a local model directory (no config.json or scorer.json "
            f"in it); hnce never downloads models: pass a local Hugging Face directory, a "
            f"bi-encoder export directory, or '{PACKAGED_MODEL}'",
        )
    return path


def check_dataset(config: Config, splits: Iterable[str]) -> None:
    """``data.root`` holds a published dataset (its manifest's cheap checks: a conversion that
    crashed part way has none) with a catalogue and every split in ``splits``."""
    root = Path(config.data.root)
    try:
        DatasetManifest.open(root)
    except DatasetError as error:
        raise config.error("data.root", f"is {str(root)!r}: {error}") from None
    if not (root / ENTITIES_DIR).is_dir():
        raise config.error(
            "data.root", f"is {str(root)!r}, which holds no dataset ({ENTITIES_DIR}/ missing)"
        )
    for split in dict.fromkeys(splits):
        path = mention_split_path(root, split)
        if not path.is_file():
            raise config.error("data.root", f"has no {split!r} split ({path} missing)")


def check_training_inputs(config: Config) -> None:
    """``hnce train``: the dataset with its train split, and the starting model."""
    check_dataset(config, [config.data.train_split])
    path = model_directory(config, "model.path", config.model.path)
    if config.model.pooling == "auto" and not (path / SCORER_FILE).is_file():
        declared_pooling(path)  # a bad modules.json fails here, naming its file
    check_index_width(config)


def check_refresh_inputs(config: Config) -> None:
    """``hnce refresh``: the dataset with every split the refresh mines, and an index that
    stores the model's vectors."""
    check_dataset(config, config.refresh.splits)
    check_index_width(config)


def check_eval_inputs(config: Config) -> None:
    """``hnce eval``: the dataset with its eval split, and an index that stores the model's
    vectors."""
    check_dataset(config, [config.data.eval_split])
    check_index_width(config)


def check_index_width(config: Config) -> None:
    """A quantised index's ``index.pq_m`` divides the width of the recipe's vectors
    (:meth:`hnce.cluster.stores.index_spec.IndexSpec.width_problem`): ``model.projection_size``,
    else what an export at ``model.path`` records or its tower's hidden size, read from its
    config alone. Checked here, before Ray starts; the encoder actor that trains the quantiser
    checks the model it encodes again."""
    if not config.index.quantised:
        return
    width = config.model.projection_size
    if width is None:
        path = model_directory(config, "model.path", config.model.path)
        if (path / SCORER_FILE).is_file():
            width = read_description(path).output_size
        else:
            width = int(load_local(AutoConfig, path).hidden_size)
    problem = config.index.width_problem(width)
    if problem is not None:
        raise config.error("index.pq_m", problem)


def check_rerank_inputs(config: Config) -> None:
    """``hnce rerank``: the dataset with its train and eval splits, and the reranker's model."""
    check_dataset(config, [config.data.train_split, *config.rerank.eval_splits])
    model_directory(config, "rerank.model", config.rerank.model)


def check_blink_inputs(config: Config) -> None:
    """``hnce finetune-blink``: every input file exists before anything is converted."""
    blink = config.blink
    for key in ("checkpoint", "base_model"):
        if getattr(blink, key) is None:
            raise config.error(f"blink.{key}", "is required (or its command-line flag)")
    if (blink.entities is None) == (blink.knowledge_source is None):
        raise config.error(
            "blink.entities", "or 'blink.knowledge_source': give exactly one catalogue"
        )
    if blink.encodings is not None and blink.entities is None:
        raise config.error(
            "blink.encodings", "follow entity.jsonl's rows: they need 'blink.entities'"
        )
    if not any(aida_split_name(Path(path)) == "train" for path in blink.aida):
        raise config.error(
            "blink.aida", "must list the KILT AIDA files, the train split among them"
        )
    for key in ("checkpoint", "entities", "knowledge_source", "encodings"):
        value = getattr(blink, key)
        if value is not None and not Path(value).is_file():
            raise config.error(f"blink.{key}", f"is {value!r}: no such file")
    for position, value in enumerate(blink.aida):
        if not Path(value).is_file():
            raise config.error("blink.aida", f"[{position}] is {value!r}: no such file")
    base = Path(blink.base_model or "")
    if not (base / "config.json").is_file():
        raise config.error(
            "blink.base_model",
            f"is {str(base)!r}, which is not a local Hugging Face directory (no config.json); "
            f"hnce never downloads models",
        )
