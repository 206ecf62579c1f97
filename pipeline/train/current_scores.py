"""The current model's scores of chosen (mention, entity) pairs, for the samplers that rank by
the model being trained instead of the index's stale scores (OHEM, the ACE discriminator).

Scores are s(x, y) of eq. 9 from the model's own ``score_matrix``, computed without gradient and
in eval mode (no dropout) on the worker's device, from the run's token stores: each distinct
entity of the request is encoded once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor, nn

from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.encoders.biencoder import BiEncoder

EntityScores = Callable[[Tensor], Tensor]
"""Catalogue ids [B, P] (≥ 0) of B mentions -> the current model's scores [B, P]."""


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no dropout) for the block, then back in the mode it was in: the
    current weights read outside the engine's forward (these scores, the negative cache's)."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


class CurrentModelScores:
    """Scores of the model being trained (the engine's module, ZeRO stage < 3)."""

    def __init__(
        self, model: BiEncoder, mentions: MentionTokens, store: TokenStore, device: torch.device
    ) -> None:
        self.model = model
        self.mentions = mentions
        self.store = store
        self.device = device

    def for_rows(self, rows: np.ndarray) -> EntityScores:
        """The scoring function of the mentions at ``rows`` of the run's mention tokens."""

        def score(entity_ids: Tensor) -> Tensor:
            return self.score(rows, entity_ids)

        return score

    @torch.no_grad()
    def score(self, rows: np.ndarray, entity_ids: Tensor) -> Tensor:
        """s(x_b, y_bp) float32 [B, P] for the mentions at ``rows`` and catalogue ids [B, P]."""
        unique, columns = torch.unique(entity_ids.long().cpu(), return_inverse=True)
        mentions = {k: v.to(self.device) for k, v in self.mentions.batch(rows).items()}
        entities = {k: v.to(self.device) for k, v in self.store.batch(unique.numpy()).items()}
        with eval_mode(self.model):
            scores = self.model.score_matrix(mentions, entities).float().cpu()
        return scores.gather(1, columns)
