"""False negatives: known positive pairs, and the rules that keep likely ones out of the draws.

Entity linking data has aliases and multi-gold mentions (``Mention.golds``): an entity that is
correct for a mention must never be trained on as its negative. The filter remembers every known
positive pair and answers membership for single pairs or whole candidate matrices; every sampler
in :mod:`hnce.mining.samplers` additionally excludes the per-mention ``positives`` sets of its
:class:`~hnce.mining.samplers.SamplingRequest` (ACE, Bose et al. 2018 §2.5, uses the same hash map to
zero false negatives for the discriminator and penalise them for the generator).

Mined candidates also hold *unknown* positives: an entity the index ranks at the top may be a
correct entity nobody labelled. :class:`CandidateRules` (``negatives.candidates``) keeps them
out of every index sampler's draws in one place (``restricted`` in
:mod:`hnce.mining.samplers.base`): a score margin below the gold (sentence-transformers'
``mine_hard_negatives``), a band of ranks (ANCE), and the pairs a trained joint reranker scores
as high as the gold (RocketQA's denoising; the same :func:`within_margin` on the reranker's
scores, flagged offline and added to the :class:`FalseNegativeFilter`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

import torch
from pydantic import Field, field_validator
from torch import Tensor

from hnce.settings import Flag, NonNegativeInt, NonNegativeReal, settings


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


def gold_scores(candidate_ids: Tensor, candidate_scores: Tensor, gold: Tensor) -> Tensor:
    """Float64 [B]: each mention's gold score among its candidates, NaN where the gold is not
    listed (the miner keeps the gold in the raw top-N, so a missing gold ranks below them all)."""
    hits = candidate_ids == gold.to(candidate_ids.device).unsqueeze(1)
    listed = torch.where(hits, candidate_scores.double(), float("-inf")).amax(dim=1)
    return listed.masked_fill(~hits.any(dim=1), float("nan"))


def within_margin(
    scores: Tensor,
    gold: Tensor,
    absolute_margin: float | None = None,
    relative_margin: float | None = None,
) -> Tensor:
    """Bool [B, N]: candidates too close to the gold's score to be trusted as negatives
    (sentence-transformers' ``mine_hard_negatives``, docs/math.md eq. (56)).

    A candidate of score s is within the margin of the gold's s⁺ when s > s⁺ − m_abs or
    s > s⁺ − |s⁺|·m_rel (the sign-safe form sentence-transformers uses; s⁺·(1 − m_rel) for
    s⁺ ≥ 0). A row whose ``gold`` is NaN (its gold outside the candidate list, so scoring no
    higher than any of them) is within the margin throughout.

    Args:
        scores: [B, N] candidate scores (the index's, or a reranker's for RocketQA's denoising).
        gold: [B] the gold's score under the same model, NaN where unknown.
        absolute_margin, relative_margin: m_abs ≥ 0 and m_rel ≥ 0; None leaves that rule out.
    """
    gold = gold.double().to(scores.device).unsqueeze(1)
    close = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    if absolute_margin is not None:
        close |= scores.double() > gold - absolute_margin
    if relative_margin is not None:
        close |= scores.double() > gold - gold.abs() * relative_margin
    unknown = torch.isnan(gold).expand_as(close)
    return close | (unknown & (absolute_margin is not None or relative_margin is not None))


def ranks_among(scores: Tensor, keep: Tensor) -> Tensor:
    """Long [B, N]: each kept candidate's rank among the kept ones of its row (0 = highest
    score, ties in list order), -1 where not kept."""
    ordered = scores.double().masked_fill(~keep, float("-inf"))
    order = ordered.argsort(dim=1, descending=True, stable=True)
    positions = torch.arange(scores.shape[1], device=scores.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(1, order, positions)
    return ranks.masked_fill(~keep, -1)


def in_rank_window(scores: Tensor, keep: Tensor, window: Sequence[int]) -> Tensor:
    """Bool [B, N]: kept candidates whose rank (:func:`ranks_among`) lies in [lo, hi) — ANCE's
    (Xiong et al. 2021) negatives from a band of the index's ranking, docs/math.md eq. (57)."""
    lo, hi = window
    ranks = ranks_among(scores, keep)
    return keep & (ranks >= lo) & (ranks < hi)


@settings
class CandidateRules:
    """``negatives.candidates``: which of a mention's mined candidates may be drawn, for every
    sampler whose candidates come from an index or BM25 (docs/math.md eqs. (56)–(58)). Unset
    and false (the defaults) leave every candidate in.

    Attributes:
        absolute_margin: m_abs: never draw a candidate scored above the gold's score minus
            m_abs under the model that mined it (sentence-transformers' ``mine_hard_negatives``;
            :func:`within_margin`).
        relative_margin: m_rel: never draw a candidate scored above s⁺ − |s⁺|·m_rel, s⁺ the
            gold's score under the model that mined it (:func:`within_margin`).
        rank_window: [lo, hi): only candidates ranked lo..hi−1 among the mention's admissible
            ones (0 = the best that is neither the gold nor a known positive), as ANCE draws
            from a band of the ranking (:func:`in_rank_window`).
        denoised: also never draw the (mention, entity) pairs that the trained joint reranker
            scored within ``rerank.denoise_margin`` of the gold (RocketQA's denoised hard
            negatives; written by ``hnce rerank --denoise``, added to the
            :class:`FalseNegativeFilter`).
    """

    absolute_margin: NonNegativeReal | None = None
    relative_margin: NonNegativeReal | None = None
    rank_window: Annotated[list[NonNegativeInt], Field(min_length=2, max_length=2)] | None = None
    denoised: Flag = False

    @field_validator("rank_window")
    @classmethod
    def _lo_below_hi(cls, window: list[int] | None) -> list[int] | None:
        if window is not None and not window[0] < window[1]:
            raise ValueError("is [lo, hi), which needs lo < hi")
        return window

    @property
    def restricts_scores(self) -> bool:
        """Whether a rule reads the candidates' scores (margin or rank window)."""
        return (
            self.absolute_margin is not None
            or self.relative_margin is not None
            or self.rank_window is not None
        )

    def drawable(self, ids: Tensor, scores: Tensor, gold: Tensor, admissible: Tensor) -> Tensor:
        """Bool [B, N]: the ``admissible`` candidates (not the gold, not a known positive, finite,
        first of their id) that pass the margin and the rank window."""
        keep = admissible
        if self.absolute_margin is not None or self.relative_margin is not None:
            close = within_margin(
                scores,
                gold_scores(ids, scores, gold),
                self.absolute_margin,
                self.relative_margin,
            )
            keep = keep & ~close
        if self.rank_window is not None:
            keep = keep & in_rank_window(scores, admissible, self.rank_window)
        return keep
