"""The content checks behind the checksums, each where its file or value is read: an index's
``pq_m`` against the model's width (before Ray starts), a shard's vector copy, the exported mention
window's input. The store files workers and holders read are held to theirs by
tests/test_store_contents_boundary.py."""

from __future__ import annotations

import re
from pathlib import Path

import faiss
import numpy as np
import pytest
from store_helpers import random_word_dataset
from transformers import AutoTokenizer

from hnce.cluster.stores.faiss_index import train_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.shard_files import check_shard_vectors
from hnce.cluster.stores.versioned_dir import StoreError
from hnce.encoders.biencoder import minilm_path
from hnce.encoders.formatting import MENTION_END, MENTION_START
from hnce.encoders.mention_window import MentionWindow
from hnce.errors import InputError
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.preflight import (
    check_eval_inputs,
    check_index_width,
    check_refresh_inputs,
    check_training_inputs,
)

#: MiniLM's width, the default model's
WIDTH = 384


@pytest.mark.parametrize(
    ("settings", "width", "divisor"),
    [
        (["index.kind=ivfpq", "index.pq_m=7"], WIDTH, 6),
        (
            [
                "model.scorer.name=som",
                "model.projection_size=100",
                "index.kind=plaid",
                "index.pq_m=16",
            ],
            100,
            10,
        ),
    ],
    ids=["tower", "projection"],
)
def test_a_pq_m_that_does_not_divide_the_width_is_named_before_ray(
    settings: list[str], width: int, divisor: int
) -> None:
    """The width is the projection's where the recipe sets one, else the tower's (its config
    alone is read); the error names the key and where it was set, and offers a divisor."""
    config = load_config(None, settings)
    with pytest.raises(ConfigError) as refused:
        check_index_width(config)
    message = str(refused.value)
    assert f"'index.pq_m' is {config.index.pq_m}, which does not divide the width {width}" in (
        message
    )
    assert message.startswith("--set") and f"such as {divisor}" in message, message
    check_index_width(load_config(None, [*settings, f"index.pq_m={divisor}"]))
    check_index_width(load_config(None, [*settings, "index.kind=flat"]))  # no quantiser


def test_every_command_that_builds_an_index_checks_its_pq_m(tmp_path: Path) -> None:
    """``hnce train``, ``refresh`` and ``eval`` check it with their inputs; the encoder actor
    that trains the quantiser refuses it by the same rule, naming the key too."""
    data = random_word_dataset(tmp_path / "data")
    settings = [f"data.root={data}", "data.eval_split=train", "index.kind=ivfpq", "index.pq_m=7"]
    config = load_config(None, settings)
    for check in (check_training_inputs, check_refresh_inputs, check_eval_inputs):
        with pytest.raises(ConfigError, match=r"'index\.pq_m' is 7"):
            check(config)
    sample = np.random.default_rng(0).standard_normal((300, 12)).astype("float32")
    with pytest.raises(InputError, match=r"'index\.pq_m' is 5, which does not divide the width 12"):
        train_index(sample, IndexSpec(kind="ivfpq", nlist=4, pq_m=5))


def test_a_vector_copy_that_is_not_finite_is_refused_naming_the_row(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.vectors.npy"
    copy = np.ones((6, 4), dtype=np.float16)
    check_shard_vectors(copy, faiss.IndexFlatIP(4), 6, path)
    copy[4, 1] = np.inf
    with pytest.raises(StoreError, match=rf"{re.escape(str(path))}: row 4 is not finite"):
        check_shard_vectors(copy, faiss.IndexFlatIP(4), 6, path)


def test_the_exported_window_refuses_a_lone_surrogate_in_its_own_words() -> None:
    """What ``surrogateescape`` makes of a byte that is not UTF-8 reaches the window as a lone
    surrogate, which the tokenizer would refuse with a TypeError of its own."""
    window = MentionWindow(
        AutoTokenizer.from_pretrained(minilm_path()), 32, MENTION_START, MENTION_END
    )
    good = "the [START_ENT] river [END_ENT] bank"
    assert window.preprocess([good])["input_ids"].shape[0] == 1
    bad = b"the [START_ENT] caf\xe9 [END_ENT] bank".decode("utf-8", "surrogateescape")
    with pytest.raises(
        ValueError,
        match=re.escape(r"input 1: not Unicode text: a lone surrogate '\udce9' at character 19"),
    ):
        window.preprocess([good, bad])
