"""BLINK input layout for mentions and entities, tokenized in batches with a fast tokenizer.

Mention: ``[CLS] left [unused0] mention [unused1] right [SEP]``; the context budget is split
around the mention and budget one side cannot use flows to the other, exactly as BLINK's
``get_context_representation``. Entity: ``[CLS] title [unused2] text [SEP]`` truncated to the
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


def blink_mention_ids(
    left: Sequence[int],
    mention: Sequence[int],
    right: Sequence[int],
    max_length: int,
    *,
    cls_id: int,
    sep_id: int,
    start_id: int,
    end_id: int,
) -> list[int]:
    """One mention's ids in BLINK's layout, without padding.

    The mention (with its markers) is kept whole up to ``max_length - 4`` pieces. The left context
    gets ``(max_length - len(mention) - 2) // 2`` pieces (its rightmost ones), the right context the
    rest; when one side is shorter than its quota the unused budget flows to the other side.
    An empty mention gets no markers (BLINK does the same).
    """
    if max_length < 4:
        raise ValueError(
            f"max_length must be at least 4 for [CLS] m_start m_end [SEP], got {max_length}"
        )
    mention_part: list[int] = []
    if len(mention) > 0:
        mention_part = [start_id, *list(mention)[: max_length - 4], end_id]
    left_quota = (max_length - len(mention_part)) // 2 - 1
    right_quota = max_length - len(mention_part) - left_quota - 2
    if len(left) <= left_quota:
        if len(right) > right_quota:
            right_quota += left_quota - len(left)
    elif len(right) <= right_quota:
        left_quota += right_quota - len(right)
    left_part = list(left[max(0, len(left) - left_quota) :]) if left_quota > 0 else []
    right_part = list(right[:right_quota]) if right_quota > 0 else []
    return [cls_id, *left_part, *mention_part, *right_part, sep_id]


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


def pad_sequences(
    sequences: Sequence[Sequence[int]], pad_id: int, length: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad id lists to ``length`` (default: the longest) -> ``input_ids``, ``attention_mask``."""
    width = max((len(s) for s in sequences), default=0) if length is None else length
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if len(sequence) > width:
            raise ValueError(f"sequence {row} has {len(sequence)} ids, more than the width {width}")
        input_ids[row, : len(sequence)] = torch.as_tensor(list(sequence), dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _piece_ids(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], limit: int, keep: str
) -> list[list[int]]:
    """Word-piece ids of each text without special tokens, keeping at most ``limit`` from ``keep``.

    Cutting the encoding is the same as cutting BLINK's ``tokenizer.tokenize`` output: WordPiece
    splits words independently, so the kept pieces do not depend on the cut ones.
    """
    if not texts:
        return []
    previous_side = tokenizer.truncation_side
    tokenizer.truncation_side = keep
    try:
        encoded = tokenizer(
            list(texts),
            add_special_tokens=False,
            truncation=True,
            max_length=limit,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
    finally:
        tokenizer.truncation_side = previous_side
    return [list(ids) for ids in encoded["input_ids"]]


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
    reranker needs BLINK's fixed-width mention block). See :func:`blink_mention_ids`.
    """
    _check_lengths(context_left=context_left, mention=mention, context_right=context_right)
    start_id, end_id, _ = marker_ids(tokenizer)
    # A side never uses more than max_length pieces, so longer contexts are cut while tokenizing.
    lefts = _piece_ids(tokenizer, context_left, max_length, keep="left")
    mentions = _piece_ids(tokenizer, mention, max_length, keep="right")
    rights = _piece_ids(tokenizer, context_right, max_length, keep="right")
    sequences = [
        blink_mention_ids(
            left,
            middle,
            right,
            max_length,
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            start_id=start_id,
            end_id=end_id,
        )
        for left, middle, right in zip(lefts, mentions, rights, strict=True)
    ]
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
    title_pieces = _piece_ids(tokenizer, [titles[i] for i in present], max_length, keep="right")
    title_by_row: dict[int, list[int]] = dict(zip(present, title_pieces, strict=True))
    text_pieces = _piece_ids(tokenizer, texts, max_length, keep="right")
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
