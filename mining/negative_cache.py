"""The negative cache (Lindgren et al. 2021, *Efficient Training of Retrieval Models Using Negative
Cache*): the entity vectors hard negatives are mined from, kept fresh by the training steps.

Hard negatives of eq. 8 are drawn ∝ exp(s(x, y)/τ) from a mention's top candidates under the
model. Without a cache those candidates come from the newest negatives version, mined through an
index that a refresh encodes from a checkpoint: every version costs a pass over the catalogue and
is tens to hundreds of steps old when it is used. The cache holds one row of reduced entity
vectors (the scorer's entity side, [b, d]) per entity of the trainer's space. It is

- *filled* from an index version (:meth:`NegativeCache.fill`): every row older than the version's
  checkpoint takes the version's vector (the paper's initialisation from a full encoding);
- *written* by every training step (:meth:`NegativeCache.write`): the vectors the entity tower has
  just computed for the step's candidates (positives and negatives, detached) replace their rows,
  stamped with the step: the paper's cache update, at no encoding cost;
- *refreshed* optionally, a few of its oldest rows re-encoded each step (:meth:`oldest`, the
  paper's cache refresh rate);
- *searched* by the current model's mention vectors (:meth:`top_candidates`): the top N rows by the
  scorer's own ``score_reduced`` (eq. 9 from reduced vectors), a matrix product and a top-k, so a
  step's candidates have no refresh lag;
- optionally *scored whole* (``whole_catalogue``, :meth:`catalogue_columns`): every written row
  joins each mention's softmax as a negative (the paper's cache loss, and the limit of eq. 5 as
  K grows to the whole catalogue, where Zhang & Stratos' bias vanishes). The rows are constants:
  through them the gradient reaches the mention tower only; the step's own candidates, fresh,
  carry it to the entity tower and leave the constant columns (docs/math.md, eq. (61)).

Each row records the optimizer step whose weights computed it (``written_at``; -1: never written),
and whether a step wrote it, so that a checkpoint keeps only what steps wrote since the version it
was filled from (:meth:`written_rows`, :meth:`restore`) and a resumed run draws what an
uninterrupted one would.

Example::

    cache = NegativeCache(num_rows=8000, vectors_per_entity=1, dim=384)
    cache.fill(rows, version_vectors, step=0)           # from index version 0
    cache.write(batch_rows, batch_entity_vectors, step=12)
    ids, scores = cache.top_candidates(mention_vectors, mention_kept, scorer.score_reduced, 32)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hnce.settings import Flag, NonNegativeInt, settings

ReducedScores = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""(mention vectors [B, a, d], kept [B, a], entity vectors [E, b, d], kept [E, b]) -> s [B, E]."""

NEVER_WRITTEN = -1

#: rows scored per block in :meth:`NegativeCache.top_candidates` (bounds the [B, rows] scores)
_SEARCH_BLOCK = 65536


@dataclass
class CachedRows:
    """Rows of a cache as a checkpoint keeps them: row numbers [R], vectors [R, b, d], steps [R]."""

    rows: Tensor
    vectors: Tensor
    written_at: Tensor


class NegativeCache:
    """Reduced entity vectors [num_rows, b, d] of one entity space (module docs), with the step
    that wrote each row. ``dtype``: of the stored vectors (float16 halves the memory of a
    Wikipedia-size cache); ``device``: where they are kept and searched."""

    def __init__(
        self,
        num_rows: int,
        vectors_per_entity: int,
        dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_rows <= 0 or vectors_per_entity <= 0 or dim <= 0:
            raise ValueError(
                f"{__file__}: a cache needs rows, vectors and a dimension, got "
                f"{num_rows} x {vectors_per_entity} x {dim}"
            )
        self.vectors = torch.zeros(num_rows, vectors_per_entity, dim, dtype=dtype, device=device)
        self.written_at = torch.full((num_rows,), NEVER_WRITTEN, dtype=torch.long)
        self.by_step = torch.zeros(num_rows, dtype=torch.bool)

    @property
    def num_rows(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def memory_bytes(self) -> int:
        """Bytes of the vectors, the steps and the flags."""
        rows = self.num_rows
        return self.vectors.numel() * self.vectors.element_size() + rows * 9

    @property
    def empty(self) -> bool:
        """No row has been filled or written yet."""
        return bool((self.written_at == NEVER_WRITTEN).all())

    def _check(self, rows: Tensor, vectors: Tensor) -> None:
        if vectors.shape != (rows.shape[0], *self.vectors.shape[1:]):
            raise ValueError(
                f"{__file__}: {rows.shape[0]} rows need vectors "
                f"[{rows.shape[0]}, {', '.join(map(str, self.vectors.shape[1:]))}], got "
                f"{list(vectors.shape)}"
            )

    def fill(self, rows: Tensor, vectors: Tensor, step: int) -> int:
        """Rows ``rows`` [R] take ``vectors`` [R, b, d] of an index version encoded with the weights
        of checkpoint ``step``, where they are older than it (a row a later step wrote is fresher
        and stays); the number of rows replaced."""
        self._check(rows, vectors)
        rows = rows.long().cpu()
        older = self.written_at[rows] < step
        replaced = rows[older]
        self.vectors[replaced.to(self.vectors.device)] = vectors[older.to(vectors.device)].to(
            self.vectors
        )
        self.written_at[replaced] = step
        self.by_step[replaced] = False
        return int(replaced.numel())

    def catalogue_columns(
        self, own_rows: Tensor, positive_rows: list[Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Every row as a loss column (``whole_catalogue``): the vectors [rows, b, d] (constants:
        the step scores them through ``with_extra_entities``, which detaches them),
        and valid [B, rows], False where a row was never written, is one of the step's own
        candidates ``own_rows`` (their fresh vectors are scored instead; -1: none) or is one of
        mention b's ``positive_rows[b]``."""
        valid = (self.written_at != NEVER_WRITTEN).clone()
        own = own_rows.long().cpu()
        valid[own[own >= 0]] = False
        valid = valid.expand(len(positive_rows), -1).clone()
        for mention, rows in enumerate(positive_rows):
            rows = rows.long().cpu()
            valid[mention, rows[rows >= 0]] = False
        return self.vectors, valid

    def write(self, rows: Tensor, vectors: Tensor, step: int) -> None:
        """Rows ``rows`` [R] (-1: none, skipped) take ``vectors`` [R, b, d] that the weights of
        optimizer step ``step`` computed (detached). A row named twice keeps its last vector."""
        self._check(rows, vectors)
        rows = rows.long().cpu()
        kept = rows >= 0
        rows, vectors = rows[kept], vectors.detach()[kept.to(vectors.device)]
        self.vectors[rows.to(self.vectors.device)] = vectors.to(self.vectors)
        self.written_at[rows] = step
        self.by_step[rows] = True

    def oldest(self, count: int) -> Tensor:
        """The ``count`` rows written longest ago (never-written first, then by step, then by row
        number): the rows a cache refresh re-encodes."""
        order = torch.argsort(self.written_at, stable=True)
        return order[: max(0, count)]

    def ages(self, rows: Tensor, step: int) -> Tensor:
        """Steps since each of ``rows`` [...] (≥ 0) was written, at optimizer step ``step``; -1
        for a row never written."""
        written = self.written_at[rows.long().clamp(min=0).cpu()]
        return torch.where(written == NEVER_WRITTEN, NEVER_WRITTEN, step - written)

    @torch.no_grad()
    def top_candidates(
        self,
        mention_vectors: Tensor,
        mention_kept: Tensor,
        score: ReducedScores,
        count: int,
    ) -> tuple[Tensor, Tensor]:
        """The ``count`` rows scored highest for each mention (reduced mention side [B, a, d], kept
        [B, a]) under ``score`` (the scorer's ``score_reduced``), best first: rows [B, count]
        (-1 past the rows ever written) and float32 scores [B, count] (-inf there). Rows are
        scored in blocks, so memory stays [B, block] whatever the cache's size."""
        batch = mention_vectors.shape[0]
        count = min(count, self.num_rows)
        device = self.vectors.device
        best_scores = torch.full((batch, 0), float("-inf"), device=device)
        best_rows = torch.full((batch, 0), -1, dtype=torch.long, device=device)
        mention_vectors = mention_vectors.to(device, self.vectors.dtype)
        mention_kept = mention_kept.to(device)
        kept_row = torch.ones(1, self.vectors.shape[1], dtype=torch.bool, device=device)
        for start in range(0, self.num_rows, _SEARCH_BLOCK):
            block = self.vectors[start : start + _SEARCH_BLOCK]
            scores = score(mention_vectors, mention_kept, block, kept_row.expand(len(block), -1))
            unwritten = self.written_at[start : start + len(block)] == NEVER_WRITTEN
            scores = scores.float().masked_fill(unwritten.to(device), float("-inf"))
            rows = torch.arange(start, start + len(block), device=device).expand(batch, -1)
            merged_scores = torch.cat([best_scores, scores], dim=1)
            merged_rows = torch.cat([best_rows, rows], dim=1)
            best_scores, order = merged_scores.topk(min(count, merged_scores.shape[1]), dim=1)
            best_rows = merged_rows.gather(1, order)
        best_scores, best_rows = best_scores.cpu(), best_rows.cpu()
        return best_rows.masked_fill(best_scores == float("-inf"), -1), best_scores

    def written_rows(self) -> CachedRows:
        """The rows training steps wrote since the cache was last filled: what a checkpoint keeps
        (the rest is the index version the cache was filled from)."""
        rows = self.by_step.nonzero().flatten()
        vectors = self.vectors[rows.to(self.vectors.device)].cpu()
        return CachedRows(rows, vectors, self.written_at[rows].clone())

    def restore(self, kept: CachedRows) -> int:
        """Put back rows a checkpoint kept (:meth:`written_rows`) where they are fresher than the
        cache's (it was filled from the checkpoint's version, or a newer one since); the number of
        rows put back."""
        rows = kept.rows.long()
        fresher = kept.written_at >= self.written_at[rows]
        rows = rows[fresher]
        self.vectors[rows.to(self.vectors.device)] = kept.vectors[fresher].to(self.vectors)
        self.written_at[rows] = kept.written_at[fresher]
        self.by_step[rows] = True
        return int(rows.numel())


@settings
class NegativeCacheOptions:
    """``negatives.cache``: the trainer's negative cache (module docs; docs/negatives.md,
    "Negative cache"). Its rows keep the precision the towers computed them in: bfloat16 where
    training runs in bf16, else float32.

    Attributes:
        enabled: the samplers that draw from index candidates draw from the cache instead: each
            step's candidates are the top ``refresh.top_n`` rows under the current model. Unset,
            it is on wherever it can be (a sampler of index candidates, a scorer of fixed rows,
            ZeRO below 3: the recipe's validation decides), the measured default.
        refresh_rows: the oldest rows re-encoded by the entity tower each step (the paper's
            cache refresh; 0: none).
        whole_catalogue: every cached row is also a negative of every mention in the loss
            (module docs; B x rows scores a step).
    """

    enabled: Flag | None = None
    refresh_rows: NonNegativeInt = 0
    whole_catalogue: Flag = False
