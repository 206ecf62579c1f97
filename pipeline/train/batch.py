"""What one micro-batch of the contrastive step holds, built from token rows in O(batch).

A micro-batch is B mentions and the C *unique* candidate entities of the batch: every mention's
gold and sampled negatives, de-duplicated by entity id, each encoded once. The step scores every
mention against every candidate ([B, C]); what each mention's loss sees is said by masks:

- ``gold`` [B]: the column of each mention's gold;
- ``valid`` [B, C]: the columns that are negatives of that mention. Today these are the mention's
  own sampled negatives (the mask is block-diagonal up to shared ids), which is exactly the
  classic step "each mention against its own 1 + K". A known positive of a mention is never
  valid for it. Sharing negatives across the batch (``negatives.share``) widens this mask;
- ``log_q`` [B, C] (optional): the sampler's log-proposal of each valid negative (eq. 10).

Token ids come from the run's stores, never from Parquet or a tokenizer inside the step: the
candidates' rows from the catalogue's :class:`~cluster.tokens.TokenStore`, the mentions' from
:class:`MentionTokens`, tokenized once per run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from cluster.tables import Mention
from cluster.tokens import TokenStore
from mining.samplers import SampledNegatives


class MentionTokenizer(Protocol):
    """What tokenizes mentions in a model's own layout (bi-encoder and reranker alike)."""

    def tokenize_mentions(
        self, context_left: Sequence[str], mention: Sequence[str], context_right: Sequence[str]
    ) -> dict[str, Tensor]: ...


@dataclass
class MentionTokens:
    """The training mentions tokenized once per run: ``input_ids`` [M, L] and real ``lengths`` [M]."""

    input_ids: Tensor
    lengths: Tensor

    @classmethod
    def tokenize(cls, model: MentionTokenizer, mentions: Sequence[Mention]) -> MentionTokens:
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        return cls(tokens["input_ids"], tokens["attention_mask"].sum(dim=1))

    def batch(self, rows: np.ndarray) -> dict[str, Tensor]:
        """``input_ids`` and ``attention_mask`` of these rows, trimmed to their longest."""
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        lengths = self.lengths[index]
        width = max(int(lengths.max()) if len(lengths) else 0, 1)
        positions = torch.arange(width)[None, :]
        return {
            "input_ids": self.input_ids[index, :width],
            "attention_mask": (positions < lengths[:, None]).long(),
        }


@dataclass
class ContrastiveBatch:
    """One micro-batch for the contrastive step (see the module docstring)."""

    mention_ids: list[str]
    mentions: dict[str, Tensor]  # input_ids, attention_mask [B, L]
    entity_ids: Tensor  # int64 [C], unique catalogue ids of the candidates
    candidates: dict[str, Tensor]  # input_ids, attention_mask [C, L']
    gold: Tensor  # int64 [B], column of each mention's gold
    valid: Tensor  # bool [B, C], negatives of each mention
    log_q: Tensor | None = None  # float [B, C], 0 where not valid
    # Extra negative columns scored after the C candidates (negatives.sampler: momentum-queue):
    queue_vectors: Tensor | None = None  # float [Q, 1, d], no gradient
    queue_valid: Tensor | None = None  # bool [B, Q], the queued entities that are negatives

    @property
    def scored_pairs(self) -> Tensor:
        """Bool [B, C]: the entries the loss reads (each mention's gold and valid negatives)."""
        gold = torch.zeros_like(self.valid).scatter(1, self.gold[:, None], True)
        return self.valid | gold

    def to(self, device: torch.device) -> ContrastiveBatch:
        """Every tensor of the batch on ``device`` (the worker's)."""
        moved = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tensor):
                value = value.to(device)
            elif isinstance(value, dict):
                value = {key: tensor.to(device) for key, tensor in value.items()}
            moved[field.name] = value
        return ContrastiveBatch(**moved)


def assemble_batch(
    mentions: Sequence[Mention],
    mention_rows: np.ndarray,
    mention_tokens: MentionTokens,
    negatives: SampledNegatives,
    store: TokenStore,
) -> ContrastiveBatch:
    """The micro-batch of ``mentions`` (rows ``mention_rows`` of ``mention_tokens``) with their
    sampled ``negatives`` (catalogue ids [B, K]): golds and valid negatives de-duplicated into
    C candidate columns, each mention's own negatives marked valid for it."""
    batch = len(mentions)
    gold = torch.tensor([m.gold for m in mentions], dtype=torch.long)
    rows, slots = negatives.valid.nonzero(as_tuple=True)
    drawn = negatives.ids[rows, slots]
    entity_ids, columns = torch.unique(torch.cat([gold, drawn]), return_inverse=True)
    gold_columns, negative_columns = columns[:batch], columns[batch:]
    valid = torch.zeros((batch, len(entity_ids)), dtype=torch.bool)
    valid[rows, negative_columns] = True
    valid[torch.arange(batch), gold_columns] = False  # never a mention's own gold
    log_q = None
    if negatives.log_q is not None:
        log_q = torch.zeros(valid.shape, dtype=torch.float32)
        log_q[rows, negative_columns] = negatives.log_q[rows, slots].float()
        log_q = log_q.masked_fill(~valid, 0.0)
    return ContrastiveBatch(
        mention_ids=[m.mention_id for m in mentions],
        mentions=mention_tokens.batch(mention_rows),
        entity_ids=entity_ids,
        candidates=store.batch(entity_ids.numpy()),
        gold=gold_columns,
        valid=valid,
        log_q=log_q,
    )
