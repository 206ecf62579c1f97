"""BLINK input layout for mentions and entities, tokenized in batches with a fast tokenizer.

Mention: ``[CLS] left [unused0] mention [unused1] right [SEP]``; the context budget is split
around the mention and budget one side cannot use flows to the other, exactly as BLINK's
``get_context_representation`` (the window's one home is :mod:`hnce.encoders.mention_window`,
which an export ships to sentence-transformers, so the two cannot format a mention apart). Entity: ``[CLS] title [unused2] text [SEP]`` truncated to the
entity length, as BLINK's ``get_candidate_representation`` (docs/input-formats.md, BLINK checkpoint).

Token ids are built from the tokenizer's own pieces and the marker ids are inserted directly, so the
``[unused*]`` markers always stay single tokens whatever the tokenizer does with bracketed text.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from hnce.encoders.mention_window import mention_sequences, pad_sequences, piece_ids

MENTION_START, MENTION_END, ENTITY_TITLE_SEP = "[unused0]", "[unused1]", "[unused2]"
MARKERS = (MENTION_START, MENTION_END, ENTITY_TITLE_SEP)
# Bump when the layout below changes: every token store built with the old one is then rebuilt.
LAYOUT_VERSION = 1


def marker_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, int]:
    """Vocabulary ids of ``[unused0]``, ``[unused1]``, ``[unused2]``.

    Raises ValueError when the vocabulary lacks one of them (it would map to ``[UNK]``).
    """
    ids = tuple(int(tokenizer.convert_tokens_to_ids(marker)) for marker in MARKERS)
    unknown = [m for m, i in zip(MARKERS, ids, strict=True) if i == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(
            f"tokenizer vocabulary has no {unknown}; BLINK's layout needs [unused0..2] "
            "(a standard BERT WordPiece vocabulary has them)"
        )
    return ids  # type: ignore[return-value]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hex SHA-256 identifying what this tokenizer makes of an entity in BLINK's layout: its whole
    serialized definition (vocabulary, normalizer, added tokens) and :data:`LAYOUT_VERSION`.

    Token stores are keyed by it, so a different tokenizer never reads another's token ids.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__}: a fast (Rust) tokenizer is needed")
    definition = json.loads(backend.to_str())
    # Truncation and padding are per-call state (set by every tokenize call), not the tokenizer.
    definition.pop("truncation", None)
    definition.pop("padding", None)
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode("utf-8"))
    digest.update(f"blink-layout-{LAYOUT_VERSION}".encode())
    return digest.hexdigest()


def punctuation_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Sorted ids of the tokens that are one ASCII punctuation character (ColBERT's skiplist,
    Khattab & Zaharia 2020 §3.2): each character of ``string.punctuation`` that the tokenizer
    makes a single known token of."""
    ids = set()
    for symbol in string.punctuation:
        pieces = tokenizer(symbol, add_special_tokens=False)["input_ids"]
        if len(pieces) == 1 and pieces[0] != tokenizer.unk_token_id:
            ids.add(int(pieces[0]))
    return sorted(ids)


def register_markers(tokenizer: PreTrainedTokenizerBase) -> None:
    """Declare the markers special tokens, as BLINK does, so text that contains them keeps them whole.

    The markers already exist in a BERT vocabulary, so the vocabulary size does not change.
    """
    marker_ids(tokenizer)
    tokenizer.add_tokens(list(MARKERS), special_tokens=True)


def blink_entity_ids(
    title: Sequence[int] | None,
    text: Sequence[int],
    max_length: int,
    *,
    cls_id: int,
    sep_id: int,
    title_sep_id: int,
) -> list[int]:
    """One entity's ids in BLINK's layout ``[CLS] title [unused2] text [SEP]``, truncated, unpadded.

    ``title=None`` leaves out the title and its separator (BLINK's ``candidate_title=None``).
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 for [CLS] [SEP], got {max_length}")
    body = list(text) if title is None else [*title, title_sep_id, *text]
    return [cls_id, *body[: max_length - 2], sep_id]


def _check_lengths(**columns: Sequence[object]) -> int:
    sizes = {name: len(values) for name, values in columns.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"columns must have the same length, got {sizes}")
    return next(iter(sizes.values()))


def tokenize_mentions(
    tokenizer: PreTrainedTokenizerBase,
    context_left: Sequence[str],
    mention: Sequence[str],
    context_right: Sequence[str],
    max_length: int = 32,
    pad_to_max_length: bool = False,
) -> dict[str, torch.Tensor]:
    """Mentions in BLINK's layout -> ``input_ids``, ``attention_mask`` [B, L].

    L is the batch's longest sequence, or ``max_length`` with ``pad_to_max_length`` (the joint
    reranker needs BLINK's fixed-width mention block). See
    :func:`hnce.encoders.mention_window.blink_mention_ids`.
    """
    _check_lengths(context_left=context_left, mention=mention, context_right=context_right)
    start_id, end_id, _ = marker_ids(tokenizer)
    sequences = mention_sequences(
        tokenizer,
        context_left,
        mention,
        context_right,
        max_length,
        start_id=start_id,
        end_id=end_id,
    )
    return pad_sequences(
        sequences, tokenizer.pad_token_id, max_length if pad_to_max_length else None
    )


def tokenize_entities(
    tokenizer: PreTrainedTokenizerBase,
    titles: Sequence[str | None],
    texts: Sequence[str],
    max_length: int = 128,
    pad_to_max_length: bool = False,
) -> dict[str, torch.Tensor]:
    """Entities in BLINK's layout ``[CLS] title [unused2] text [SEP]`` -> ``input_ids``, ``attention_mask``.

    A ``None`` title leaves out the title and the ``[unused2]`` separator.
    """
    _check_lengths(titles=titles, texts=texts)
    _, _, title_sep_id = marker_ids(tokenizer)
    present = [i for i, title in enumerate(titles) if title is not None]
    title_pieces = piece_ids(tokenizer, [titles[i] for i in present], max_length, keep="right")
    title_by_row: dict[int, list[int]] = dict(zip(present, title_pieces, strict=True))
    text_pieces = piece_ids(tokenizer, texts, max_length, keep="right")
    sequences = [
        blink_entity_ids(
            title_by_row.get(row),
            text,
            max_length,
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            title_sep_id=title_sep_id,
        )
        for row, text in enumerate(text_pieces)
    ]
    return pad_sequences(
        sequences, tokenizer.pad_token_id, max_length if pad_to_max_length else None
    )


def length_sorted_batches(lengths: Sequence[int] | np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Index arrays of batches of rows with similar lengths (longest first), to cut padding.

    The sort is stable, so equal lengths keep their order; every row appears in exactly one batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
