"""BLINK input layout: budget split, markers, batching (encoders/formatting.py and
encoders/mention_window.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_WORDS
from transformers import AutoTokenizer, BertTokenizerFast

from hnce.encoders.biencoder import minilm_path
from hnce.encoders.formatting import (
    length_sorted_batches,
    register_markers,
    tokenize_entities,
    tokenize_mentions,
)
from hnce.encoders.mention_window import blink_mention_ids


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


def test_mention_ids_match_hand_checked_minilm_ids(minilm_tokenizer) -> None:
    # max 10, mention "[unused0] france [unused1]" = 3: left quota (10-3)//2-1 = 2, right quota 3;
    # the right side needs exactly 3, so nothing flows and the left keeps "capital of".
    batch = tokenize_mentions(minilm_tokenizer, ["The capital of"], ["France"], ["is Paris."], 10)
    # [CLS] capital of [unused0] france [unused1] is paris . [SEP]
    assert batch["input_ids"].tolist() == [[101, 3007, 1997, 1, 2605, 2, 2003, 3000, 1012, 102]]
    assert batch["attention_mask"].tolist() == [[1] * 10]


def test_entity_ids_match_hand_checked_minilm_ids(minilm_tokenizer) -> None:
    batch = tokenize_entities(minilm_tokenizer, ["Paris"], ["capital of France"], 6)
    # [CLS] paris [unused2] capital of [SEP]
    assert batch["input_ids"].tolist() == [[101, 3000, 3, 3007, 1997, 102]]
    untitled = tokenize_entities(minilm_tokenizer, [None], ["capital of France"], 6)
    assert untitled["input_ids"].tolist() == [[101, 3007, 1997, 2605, 102]]


def test_budget_left_over_flows_to_the_other_side() -> None:
    special = {"cls_id": 100, "sep_id": 101, "start_id": 1, "end_id": 2}
    right = list(range(50, 60))
    # left needs 1 of its 2: right quota 3 grows to 4.
    assert blink_mention_ids([10], [7], right, 10, **special) == [
        100,
        10,
        1,
        7,
        2,
        50,
        51,
        52,
        53,
        101,
    ]
    left = list(range(20, 30))
    # right needs 0 of its 3: the left keeps its 5 rightmost pieces.
    assert blink_mention_ids(left, [7], [], 10, **special) == [
        100,
        25,
        26,
        27,
        28,
        29,
        1,
        7,
        2,
        101,
    ]
    # both long: left 2 (rightmost), right 3 (leftmost).
    assert blink_mention_ids(left, [7], right, 10, **special) == [
        100,
        28,
        29,
        1,
        7,
        2,
        50,
        51,
        52,
        101,
    ]
    # a mention longer than the budget is cut to max_length - 4 pieces; no context fits.
    long_mention = blink_mention_ids(left, list(range(40)), right, 10, **special)
    assert long_mention == [100, 1, 0, 1, 2, 3, 4, 5, 2, 101]
    # an empty mention gets no markers, as in BLINK.
    assert blink_mention_ids([10], [], [50], 10, **special) == [100, 10, 50, 101]


def test_batched_tokenization_pads_to_the_batch_maximum(tiny_tokenizer) -> None:
    batch = tokenize_mentions(
        tiny_tokenizer,
        ["the capital of", ""],
        ["france", "paris"],
        ["is paris", ""],
        max_length=32,
    )
    ids = batch["input_ids"]
    assert ids.shape == (2, 10)
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids[1].tolist())
    assert tokens == ["[CLS]", "[unused0]", "paris", "[unused1]", "[SEP]"] + ["[PAD]"] * 5
    assert batch["attention_mask"].sum(1).tolist() == [10, 5]
    fixed = tokenize_mentions(tiny_tokenizer, [""], ["paris"], [""], 16, pad_to_max_length=True)
    assert fixed["input_ids"].shape == (1, 16)


def test_long_contexts_are_cut_like_full_tokenization(tiny_tokenizer) -> None:
    left = " ".join(list(TINY_WORDS) * 30)
    right = " ".join(reversed(list(TINY_WORDS) * 30))
    batch = tokenize_mentions(tiny_tokenizer, [left], ["seine"], [right], 32)
    full_left = tiny_tokenizer(left, add_special_tokens=False)["input_ids"]
    full_right = tiny_tokenizer(right, add_special_tokens=False)["input_ids"]
    start, mention, end = tiny_tokenizer.convert_tokens_to_ids(["[unused0]", "seine", "[unused1]"])
    expected = blink_mention_ids(
        full_left,
        [mention],
        full_right,
        32,
        cls_id=tiny_tokenizer.cls_token_id,
        sep_id=tiny_tokenizer.sep_token_id,
        start_id=start,
        end_id=end,
    )
    assert batch["input_ids"][0].tolist() == expected
    assert tiny_tokenizer.truncation_side == "right"


def test_minilm_markers_survive_as_single_tokens(minilm_tokenizer) -> None:
    register_markers(minilm_tokenizer)
    ids = minilm_tokenizer("[unused0] paris [unused1] [unused2]", add_special_tokens=False)[
        "input_ids"
    ]
    assert ids == [1, 3000, 2, 3]
    batch = tokenize_entities(minilm_tokenizer, ["[unused0] odd title"], ["text"], 16)
    assert batch["input_ids"][0].tolist().count(3) == 1


def test_missing_markers_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "paris"]) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path))
    with pytest.raises(ValueError, match=r"unused0"):
        tokenize_entities(tokenizer, ["paris"], ["paris"])


def test_mismatched_columns_are_an_error(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="same length"):
        tokenize_mentions(tiny_tokenizer, ["a", "b"], ["paris"], ["c", "d"])


def test_length_sorted_batches_cover_every_row_once() -> None:
    lengths = np.array([5, 100, 7, 100, 3, 50, 8])
    batches = length_sorted_batches(lengths, 3)
    order = np.concatenate(batches)
    assert sorted(order.tolist()) == list(range(7))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert batches[0].tolist() == [1, 3, 5]  # longest first, stable among equal lengths
    assert torch.all(torch.as_tensor(lengths[order][:-1] >= lengths[order][1:]))
    with pytest.raises(ValueError):
        length_sorted_batches(lengths, 0)
