"""False-negative filter: a hash set of known (mention, entity) positive pairs.

Entity linking data has aliases and multi-gold mentions (``Mention.golds``): an entity that is
correct for a mention must never be trained on as its negative. The filter remembers every known
positive pair and answers membership for single pairs or whole candidate matrices; every sampler
in :mod:`hnce.mining.samplers` additionally excludes the per-mention ``positives`` sets of its
:class:`~hnce.mining.samplers.SamplingRequest` (ACE, Bose et al. 2018 §2.5, uses the same hash map to
zero false negatives for the discriminator and penalise them for the generator).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


class FalseNegativeFilter:
    """Hash set of (mention key, entity id) gold pairs and aliases.

    Example::

        fn = FalseNegativeFilter()
        fn.add("m1", 3); fn.add("m1", 7)        # gold 3, alias 7
        fn.is_positive("m1", 7)                 # True
        fn.mask(["m1"], torch.tensor([[7, 5]]))  # tensor([[True, False]])
    """

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()) -> None:
        self._positives: dict[str, set[int]] = {}
        for mention_key, entity_id in pairs:
            self.add(mention_key, entity_id)

    def add(self, mention_key: str, entity_id: int) -> None:
        """Record that ``entity_id`` is a correct entity for the mention ``mention_key``."""
        self._positives.setdefault(str(mention_key), set()).add(int(entity_id))

    def is_positive(self, mention_key: str, entity_id: int) -> bool:
        """True when (mention_key, entity_id) is a known positive pair."""
        return int(entity_id) in self._positives.get(str(mention_key), ())

    def positives(self, mention_key: str) -> set[int]:
        """All known positive entity ids of one mention (a copy; empty when unknown)."""
        return set(self._positives.get(str(mention_key), ()))

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._positives.values())

    def mask(self, mention_keys: Sequence[str], candidate_ids: Tensor) -> Tensor:
        """Bool [B, N]: True where ``candidate_ids[b, n]`` is a known positive of mention b."""
        if candidate_ids.dim() != 2 or candidate_ids.shape[0] != len(mention_keys):
            raise ValueError(
                f"{__file__}: candidate_ids must be [B, N] with B = len(mention_keys) = "
                f"{len(mention_keys)}, got shape {tuple(candidate_ids.shape)}"
            )
        sets = [self._positives.get(str(key), set()) for key in mention_keys]
        return positives_mask(candidate_ids, sets)


def positives_mask(ids: Tensor, positives: Sequence[set[int]]) -> Tensor:
    """Bool like ``ids`` [B, M]: True where ``ids[b, m]`` is in ``positives[b]`` (vectorised)."""
    width = max((len(p) for p in positives), default=0)
    if width == 0:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    padded = torch.full((len(positives), width), -2, dtype=torch.long)
    for row, ids_of_row in enumerate(positives):
        if ids_of_row:
            padded[row, : len(ids_of_row)] = torch.tensor(sorted(ids_of_row), dtype=torch.long)
    padded = padded.to(ids.device)
    return (ids.long().unsqueeze(-1) == padded.unsqueeze(1)).any(-1)
