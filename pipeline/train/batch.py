"""What one micro-batch of the contrastive step holds, built from token rows in O(batch).

A micro-batch is B mentions and the C *unique* candidate entities of the batch: every mention's
gold and sampled negatives, de-duplicated by entity id, each encoded once. The step scores every
mention against every candidate ([B, C]); what each mention's loss sees is said by masks:

- ``gold`` [B]: the column of each mention's gold;
- ``valid`` [B, C]: the columns that are negatives of that mention, by ``negatives.share``:

  - ``none``: the mention's own sampled negatives (block-diagonal up to shared ids), exactly the
    classic step "each mention against its own 1 + K";
  - ``batch`` (and ``global``, whose other workers' columns the step adds with
    :meth:`ContrastiveBatch.across_workers`): every candidate of the micro-batch, as BLINK, DPR
    and Tevatron score in-batch negatives; the loss stays the NCE of eq. 5/11 over the enlarged
    candidate set.

  A known positive of a mention (``positive_ids``: its gold, and its ``golds`` aliases under
  ``negatives.filter_false_negatives``) is never valid for it, whichever mention's candidate the
  column is; another mention's identical gold is the same column as the mention's own gold;
- ``log_q`` [B, C] (optional): the sampler's log-proposal q of each of the mention's *own* drawn
  negatives (eq. 10). A candidate borrowed from another mention or worker was not drawn from
  this mention's proposal, so it has no q: it carries 0 (no correction), i.e. it is a plain
  NCE negative (eq. 5/11). With the default ``nce`` loss log q is never read.

Token ids come from the run's stores, never from Parquet or a tokenizer inside the step: the
candidates' rows from the catalogue's :class:`~hnce.cluster.stores.tokens.TokenStore`, the mentions' from
:class:`~hnce.cluster.stores.tokens.MentionTokens`, tokenized once per run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.mining.samplers import SampledNegatives

ShareMode = Literal["none", "batch", "global"]


@dataclass
class ContrastiveBatch:
    """One micro-batch for the contrastive step (see the module docstring)."""

    mention_ids: list[str]
    mentions: dict[str, Tensor]  # input_ids, attention_mask [B, L]
    entity_ids: Tensor  # int64 [C], unique catalogue ids of the candidates
    candidates: dict[str, Tensor]  # input_ids, attention_mask [C, L']
    gold: Tensor  # int64 [B], column of each mention's gold
    valid: Tensor  # bool [B, C], negatives of each mention
    positive_ids: Tensor  # int64 [B, P], each mention's known positives (gold first), -1 padding
    log_q: Tensor | None = None  # float [B, C], 0 where not valid or not the mention's own draw
    # Extra negative columns scored after the C candidates (negatives.sampler: momentum-queue):
    queue_vectors: Tensor | None = None  # float [Q, 1, d], no gradient
    queue_valid: Tensor | None = None  # bool [B, Q], the queued entities that are negatives

    @property
    def scored_pairs(self) -> Tensor:
        """Bool [B, C]: the entries the loss reads (each mention's gold and valid negatives)."""
        gold = torch.zeros_like(self.valid).scatter(1, self.gold[:, None], True)
        return self.valid | gold

    def across_workers(self, column_ids: Tensor, offset: int) -> ContrastiveBatch:
        """This batch over every worker's candidate columns (``share: global``, RocketQA's
        cross-batch negatives): ``column_ids`` [C_all] are the gathered entity ids in rank order,
        this worker's C columns starting at ``offset``; ``candidates`` stay this worker's tokens.

        Another worker's column is a negative of every mention unless it is one of the mention's
        known positives or repeats an entity already among the columns (a local one first, else
        the earliest), so each entity enters the normaliser once. It carries no log q (0).
        """
        local = torch.zeros(len(column_ids), dtype=torch.bool, device=column_ids.device)
        local[offset : offset + len(self.entity_ids)] = True
        kept = _first_of_each_entity(column_ids, local)
        valid = (kept & ~local)[None, :] & ~_known_positive(self.positive_ids, column_ids)
        valid[:, local] = self.valid
        log_q = None
        if self.log_q is not None:
            log_q = self.log_q.new_zeros(valid.shape)
            log_q[:, local] = self.log_q
        return dataclasses.replace(
            self, entity_ids=column_ids, gold=self.gold + offset, valid=valid, log_q=log_q
        )

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


def _known_positive(positive_ids: Tensor, column_ids: Tensor) -> Tensor:
    """Bool [B, C]: column c holds one of mention b's known positives."""
    return (positive_ids[:, :, None] == column_ids[None, None, :]).any(dim=1)


def _first_of_each_entity(column_ids: Tensor, preferred: Tensor) -> Tensor:
    """Bool [C]: the one column kept per entity id, a ``preferred`` one if any, else the first."""
    _, entity = torch.unique(column_ids, return_inverse=True)
    position = torch.arange(len(column_ids), device=column_ids.device)
    rank = torch.where(preferred, position - len(column_ids), position)
    best = torch.full_like(rank, len(column_ids)).scatter_reduce(0, entity, rank, "amin")
    return rank == best[entity]


def _padded_positives(mentions: Sequence[Mention], positives: Sequence[set[int]] | None) -> Tensor:
    """Int64 [B, P]: each mention's gold then its other known positives, -1 padding."""
    rows = [
        [m.gold, *sorted(set(p) - {m.gold})]
        for m, p in zip(mentions, positives or [set()] * len(mentions), strict=True)
    ]
    width = max(len(row) for row in rows) if rows else 1
    return torch.tensor([row + [-1] * (width - len(row)) for row in rows], dtype=torch.long)


def assemble_batch(
    mentions: Sequence[Mention],
    mention_rows: np.ndarray,
    mention_tokens: MentionTokens,
    negatives: SampledNegatives,
    store: TokenStore,
    positives: Sequence[set[int]] | None = None,
    share: ShareMode = "none",
) -> ContrastiveBatch:
    """The micro-batch of ``mentions`` (rows ``mention_rows`` of ``mention_tokens``) with their
    sampled ``negatives`` (catalogue ids [B, K]): golds and valid negatives de-duplicated into
    C candidate columns. ``share: none`` marks each mention's own negatives valid for it,
    ``batch`` and ``global`` every column; neither ever marks a mention's gold or one of its
    ``positives`` (the :class:`~hnce.pipeline.train.negatives.NegativeDrawer`'s known positives)."""
    batch = len(mentions)
    gold = torch.tensor([m.gold for m in mentions], dtype=torch.long)
    rows, slots = negatives.valid.nonzero(as_tuple=True)
    drawn = negatives.ids[rows, slots]
    entity_ids, columns = torch.unique(torch.cat([gold, drawn]), return_inverse=True)
    gold_columns, negative_columns = columns[:batch], columns[batch:]
    positive_ids = _padded_positives(mentions, positives)
    if share == "none":
        valid = torch.zeros((batch, len(entity_ids)), dtype=torch.bool)
        valid[rows, negative_columns] = True
    else:
        valid = torch.ones((batch, len(entity_ids)), dtype=torch.bool)
    valid &= ~_known_positive(positive_ids, entity_ids)
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
        positive_ids=positive_ids,
        log_q=log_q,
    )
