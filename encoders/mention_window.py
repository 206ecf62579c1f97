"""BLINK's mention window: a mention's context cut on both sides so that the mention stays inside
the tower's length, for hnce and, shipped in an export, for sentence-transformers.

BLINK (``get_context_representation``) gives a mention ``[CLS] left [unused0] mention [unused1]
right [SEP]``: the length left beside the mention is split between its two contexts, and what one
side cannot use flows to the other (:func:`blink_mention_ids`). hnce formats every mention with
these functions (:func:`hnce.encoders.formatting.tokenize_mentions`). ``hnce export --format
sentence-transformers`` copies this very file beside the mention tower's ``modules.json``, whose
first module is :class:`MentionWindow`: sentence-transformers alone cuts the end of an input
longer than the tower, often the mention itself. So the file imports nothing but torch and
transformers, and the exported tower formats a mention exactly as hnce does.

Example (hnce's export ships the file; sentence-transformers imports it only when trusted)::

    tower = SentenceTransformer("models/wordnet/mention", trust_remote_code=True)
    tower.encode(["he sat on the [START_ENT] bank [END_ENT] of the river"])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

#: KILT's mention markers (AIDA's ``input``), as ``hnce link`` reads them (hnce.pipeline.data.kilt's,
#: which tests/test_pipeline_export.py feeds an exported tower: this file must stand alone)
START_ENT, END_ENT = "[START_ENT]", "[END_ENT]"


def piece_ids(
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


def mention_sequences(
    tokenizer: PreTrainedTokenizerBase,
    context_left: Sequence[str],
    mention: Sequence[str],
    context_right: Sequence[str],
    max_length: int,
    *,
    start_id: int,
    end_id: int,
) -> list[list[int]]:
    """Each mention's ids in BLINK's layout (:func:`blink_mention_ids`), unpadded."""
    # A side never uses more than max_length pieces, so longer contexts are cut while tokenizing.
    lefts = piece_ids(tokenizer, context_left, max_length, keep="left")
    mentions = piece_ids(tokenizer, mention, max_length, keep="right")
    rights = piece_ids(tokenizer, context_right, max_length, keep="right")
    return [
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


def split_marked(text: str) -> tuple[str, str, str]:
    """(left context, mention, right context) of a text marking one mention with ``[START_ENT]``
    … ``[END_ENT]``, each stripped, as ``hnce link`` reads a text's mention; a ValueError for a
    text that does not mark exactly one (BLINK's ``[unused0]`` layout included: it is not read)
    or is not Unicode text (a lone surrogate, which no tokenizer takes)."""
    if not isinstance(text, str):
        raise ValueError(f"expected a text marking one mention, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate: surrogateescape's byte not UTF-8
        raise ValueError(
            f"not Unicode text: a lone surrogate {text[error.start]!r} at character "
            f"{error.start} (a byte that is not UTF-8, decoded with surrogateescape?) in "
            f"{text[:200]!r}; decode the input as UTF-8 first"
        ) from None
    left, start, rest = text.partition(START_ENT)
    mention, end, right = rest.partition(END_ENT)
    if not (start and end) or END_ENT in left or START_ENT in rest or END_ENT in right:
        raise ValueError(
            f"expected a text marking exactly one mention with {START_ENT} ... {END_ENT}, "
            f"got {text[:200]!r}"
        )
    return left.strip(), mention.strip(), right.strip()


class MentionWindow(torch.nn.Module):
    """sentence-transformers' input module for a mention tower: marked texts (:func:`split_marked`)
    to BLINK's ids at ``max_seq_length`` (:func:`mention_sequences`); its forward passes them on
    to the Transformer module. It keeps the tokenizer and its config in the model's root."""

    config_file = "mention_window_config.json"
    save_in_root = True  # sentence-transformers saves a first module in the root, with this file

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_seq_length: int,
        mention_start: str,
        mention_end: str,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.mention_start = mention_start
        self.mention_end = mention_end

    def preprocess(
        self, inputs: Sequence[str], prompt: str | None = None, **_: Any
    ) -> dict[str, torch.Tensor]:
        """Marked texts -> ``input_ids``, ``attention_mask``, padded to the longest. A prompt is
        refused: it would become left context, which the mention's vector was not trained with."""
        if prompt:
            raise ValueError(
                "a mention tower takes no prompt: it would change the mention's vector"
            )
        parts = []
        for number, text in enumerate(inputs):
            try:
                parts.append(split_marked(text))
            except ValueError as error:  # which of the inputs it was
                raise ValueError(f"input {number}: {error}") from None
        lefts, mentions, rights = zip(*parts, strict=True)
        start_id, end_id = self.tokenizer.convert_tokens_to_ids(
            [self.mention_start, self.mention_end]
        )
        sequences = mention_sequences(
            self.tokenizer,
            lefts,
            mentions,
            rights,
            self.max_seq_length,
            start_id=start_id,
            end_id=end_id,
        )
        return pad_sequences(sequences, self.tokenizer.pad_token_id)

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        """The ids, unchanged, for the Transformer module after this one."""
        return features

    def save(self, output_path: str, *_: Any, **__: Any) -> None:
        """The tokenizer and this module's config into ``output_path`` (sentence-transformers'
        ``SentenceTransformer.save`` copies this file beside them)."""
        self.tokenizer.save_pretrained(output_path)
        config = {
            "max_seq_length": self.max_seq_length,
            "mention_start": self.mention_start,
            "mention_end": self.mention_end,
        }
        (Path(output_path) / self.config_file).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **_: Any) -> MentionWindow:
        """The module saved in the local directory ``model_name_or_path/subfolder``."""
        directory = Path(model_name_or_path) / subfolder
        config = json.loads((directory / cls.config_file).read_text())
        return cls(AutoTokenizer.from_pretrained(directory), **config)


#: :class:`MentionWindow`'s ``type`` in a ``modules.json`` beside a copy of this file
MODULE_TYPE = f"{__name__.rpartition('.')[2]}.{MentionWindow.__name__}"
