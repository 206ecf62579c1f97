"""The sampler interface (docs/math.md): a request in, K negative entity ids per mention out.

Every sampler excludes the gold, every known positive (``SamplingRequest.positives``) and
duplicates. When fewer than K admissible entities exist for a mention the sampler returns what
it has and pads the row with id ``-1`` and ``valid=False``; it never pads with a positive or a
repeat. Losses in :mod:`hnce.mining.losses` drop entries with ``valid=False``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from hnce.mining.false_negatives import CandidateRules, positives_mask


@dataclass
class SamplingRequest:
    """What a sampler may look at for one batch of B mentions.

    Args:
        gold: LongTensor [B], the gold entity of each mention.
        positives: per mention, every known correct entity (gold included; the gold is excluded
            even when missing here).
        num_entities: catalogue size M; entity ids are 0..M-1.
        num_negatives: K, negatives per mention.
        candidate_ids: LongTensor [B, N] from the current index version (top-N per mention);
            ids < 0 are empty slots.
        candidate_scores: FloatTensor [B, N], the model's scores of those candidates (``-inf``
            marks a masked candidate). With ``candidate_ids=None`` and N = M, the scores are
            taken to cover the whole catalogue in id order (exact sampling over all entities).
        generator: the torch random generator all randomness is drawn from (seeded draws).
    """

    gold: Tensor
    positives: list[set[int]]
    num_entities: int
    num_negatives: int
    candidate_ids: Tensor | None = None
    candidate_scores: Tensor | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.gold.dim() != 1:
            raise ValueError(f"{__file__}: gold must be [B], got {tuple(self.gold.shape)}")
        if len(self.positives) != self.gold.shape[0]:
            raise ValueError(
                f"{__file__}: {len(self.positives)} positive sets for {self.gold.shape[0]} mentions"
            )
        if self.num_negatives < 0 or self.num_entities <= 0:
            raise ValueError(
                f"{__file__}: need num_negatives >= 0 and num_entities > 0, got "
                f"{self.num_negatives} and {self.num_entities}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.gold.shape[0])

    def exclusions(self) -> list[set[int]]:
        """Per mention: the gold and every known positive."""
        return [set(p) | {int(g)} for p, g in zip(self.positives, self.gold.tolist(), strict=True)]


@dataclass
class SampledNegatives:
    """K negatives per mention.

    Attributes:
        ids: LongTensor [B, K]; ``-1`` where ``valid`` is False.
        valid: BoolTensor [B, K]; False where fewer than K admissible entities existed.
        log_q: FloatTensor [B, K], log-probability of each negative under the proposal, for the
            bias-corrected losses (eq. 10); None for deterministic samplers.
        hard: BoolTensor [B, K] marking negatives drawn by the hard (model) distribution, set
            by the mixed sampler; None otherwise.
    """

    ids: Tensor
    valid: Tensor
    log_q: Tensor | None = None
    hard: Tensor | None = None


@runtime_checkable
class NegativeSampler(Protocol):
    """Anything with ``sample(request) -> SampledNegatives``."""

    def sample(self, request: SamplingRequest) -> SampledNegatives: ...


def excluded(request: SamplingRequest, ids: Tensor) -> Tensor:
    """Bool like ``ids`` [B, M]: outside 0..M-1, the gold, or a known positive."""
    gold = request.gold.to(ids.device)
    out = (ids < 0) | (ids >= request.num_entities) | (ids == gold.unsqueeze(1))
    return out | positives_mask(ids, request.positives)


def later_duplicates(ids: Tensor, keep: Tensor) -> Tensor:
    """Bool like ``ids`` [B, M]: True at every kept entry whose id appeared earlier in its row
    among kept entries (the first occurrence stays)."""
    columns = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    # Entries not kept get distinct sentinels so they never collide with anything.
    keyed = torch.where(keep, ids.long(), -2 - columns)
    sorted_ids, order = keyed.sort(dim=1, stable=True)
    dup_sorted = torch.zeros_like(keep)
    dup_sorted[:, 1:] = sorted_ids[:, 1:] == sorted_ids[:, :-1]
    return torch.zeros_like(keep).scatter(1, order, dup_sorted) & keep


def take_first(ids: Tensor, keep: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The first ``k`` kept entries of each row, in order.

    Returns (ids [B, k] padded with -1, valid [B, k], source column [B, k] or -1).
    """
    batch = ids.shape[0]
    rank = keep.long().cumsum(dim=1) - 1
    chosen = keep & (rank < k)
    rows, cols = chosen.nonzero(as_tuple=True)
    out_ids = torch.full((batch, k), -1, dtype=torch.long, device=ids.device)
    source = torch.full((batch, k), -1, dtype=torch.long, device=ids.device)
    out_ids[rows, rank[rows, cols]] = ids[rows, cols].long()
    source[rows, rank[rows, cols]] = cols
    return out_ids, source >= 0, source


def gumbel_top_k(
    logits: Tensor, k: int, generator: torch.Generator | None, noise: bool = True
) -> tuple[Tensor, Tensor]:
    """Gumbel-top-k: k distinct columns drawn without replacement with probability
    ∝ exp(logits) (the ordered draw is Plackett-Luce), or plain top-k with ``noise=False``.

    ``-inf`` logits are never drawn. Returns (column [B, k], valid [B, k]); when a row has
    fewer than k finite logits, its trailing entries are invalid (column 0, valid False).
    """
    batch, width = logits.shape
    if noise:
        uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
        uniform = uniform.clamp_min(torch.finfo(torch.float64).tiny).to(logits.device)
        perturbed = logits.double() - torch.log(-torch.log(uniform))
    else:
        perturbed = logits.double()
    take = min(k, width)
    values, columns = perturbed.topk(take, dim=1) if take else perturbed.topk(0, dim=1)
    valid = torch.isfinite(values)
    if take < k:
        pad = k - take
        columns = torch.cat([columns, columns.new_zeros(batch, pad)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(batch, pad)], dim=1)
    return columns.masked_fill(~valid, 0), valid


def candidates_of(request: SamplingRequest, sampler: str) -> tuple[Tensor, Tensor]:
    """(candidate ids [B, N], scores [B, N]), expanding whole-catalogue scores to ids."""
    scores = request.candidate_scores
    if scores is None:
        raise ValueError(
            f"{__file__}: the {sampler!r} sampler needs candidate_scores (index candidates, or "
            f"scores for all entities); use 'random' before the first refresh"
        )
    if scores.dim() != 2 or scores.shape[0] != request.batch_size:
        raise ValueError(f"{__file__}: candidate_scores must be [B, N], got {tuple(scores.shape)}")
    ids = request.candidate_ids
    if ids is None:
        if scores.shape[1] != request.num_entities:
            raise ValueError(
                f"{__file__}: candidate_scores without candidate_ids must cover the whole "
                f"catalogue ({request.num_entities} columns), got {scores.shape[1]}"
            )
        ids = torch.arange(request.num_entities, device=scores.device).expand_as(scores)
    elif ids.shape != scores.shape:
        raise ValueError(
            f"{__file__}: candidate_ids {tuple(ids.shape)} and candidate_scores "
            f"{tuple(scores.shape)} differ in shape"
        )
    return ids.long(), scores


def draw_ids(
    ids: Tensor, logits: Tensor, k: int, generator: torch.Generator | None, noise: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`gumbel_top_k` over ``logits`` [B, N], read back as the ids [B, N] in those columns.

    Returns (drawn ids [B, k] with -1 where invalid, valid [B, k], column [B, k])."""
    columns, valid = gumbel_top_k(logits, k, generator, noise)
    return ids.gather(1, columns).masked_fill(~valid, -1), valid, columns


def admissible_candidates(request: SamplingRequest, sampler: str) -> tuple[Tensor, Tensor, Tensor]:
    """(candidate ids [B, N], scores [B, N], admissible [B, N]): :func:`candidates_of`, then
    :func:`admissible` of them."""
    ids, scores = candidates_of(request, sampler)
    return ids, scores, admissible(request, ids, scores)


def admissible(request: SamplingRequest, ids: Tensor, scores: Tensor | None = None) -> Tensor:
    """Bool [B, N]: candidates that may be negatives — in range, not the gold, not a known
    positive, finite score, first occurrence of their id in the row."""
    if request.candidate_ids is None and ids.shape == (request.batch_size, request.num_entities):
        # Whole catalogue in id order: no repeats, and exclusions are a scatter.
        keep = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        rows = [row for row, excl in enumerate(request.exclusions()) for _ in excl]
        cols = [e for excl in request.exclusions() for e in excl]
        inside = [(r, c) for r, c in zip(rows, cols, strict=True) if 0 <= c < ids.shape[1]]
        if inside:
            keep[torch.tensor([r for r, _ in inside]), torch.tensor([c for _, c in inside])] = False
        return keep & torch.isfinite(scores) if scores is not None else keep
    keep = ~excluded(request, ids)
    if scores is not None:
        keep &= torch.isfinite(scores)
    return keep & ~later_duplicates(ids, keep)


def restricted(request: SamplingRequest, rules: CandidateRules) -> SamplingRequest:
    """``request`` with every candidate that ``rules`` leave out scored ``-inf``, so that no
    sampler draws it (the one place ``negatives.candidates``' margin and rank window apply:
    sentence-transformers' ``mine_hard_negatives`` margins, ANCE's rank band; docs/math.md
    eqs. (56)–(57)). A request without candidate scores is returned as is."""
    if request.candidate_scores is None or not rules.restricts_scores:
        return request
    ids, scores, keep = admissible_candidates(request, "restricted")
    gold = request.gold.to(ids.device)
    ruled_out = keep & ~rules.drawable(ids, scores, gold, keep)
    return replace(request, candidate_scores=scores.masked_fill(ruled_out, float("-inf")))
