"""What the rest of hnce knows about a negative sampler, declared once beside it.

Each sampler module of :mod:`hnce.mining.samplers` ends with a ``SPEC = SamplerSpec(...)``; the
package collects them (:data:`hnce.mining.samplers.SAMPLER_SPECS`) and everything else reads
them: the recipe's schema (``negatives.sampler`` and one option group per sampler with options,
``hnce.pipeline.config``), its validation (what a sampler asks of the rest of the recipe) and the
trainer (where its candidates come from, what it reads of the current model, what it adds to the
loss). Adding a sampler is one module with its ``SPEC``, plus its tests.

A sampler with options declares them as a settings section beside its class and names it in
its spec (``mining/samplers/hard.py`` is the shortest example: ``HardOptions`` and ``SPEC``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from torch import Tensor

from hnce.mining.samplers.base import NegativeSampler, SampledNegatives, SamplingRequest

LocalScores = Callable[[Tensor], Tensor]
"""Sampler-space entity ids [B, P] (≥ 0) -> the current model's scores [B, P]."""


class ModelScoredSampler(Protocol):
    """A sampler that also reads the current model's scores of the entities it considers."""

    def sample_scored(self, request: SamplingRequest, scores: LocalScores) -> SampledNegatives: ...


TrainerSampler = NegativeSampler | ModelScoredSampler


class LossColumns(Protocol):
    """Negative columns a sampler adds to the loss beside each mention's drawn negatives (one
    vector per column, scored against every mention of the micro-batch, with no gradient)."""

    @property
    def memory_bytes(self) -> int: ...

    def columns(self, gold: Tensor, positives: list[set[int]]) -> tuple[Tensor, Tensor]:
        """(vectors [Q, 1, d], valid [B, Q]: the columns that are negatives of each mention)."""
        ...

    def observe(self, entity_ids: Tensor, input_ids: Tensor, attention_mask: Tensor) -> None:
        """After a micro-batch: the entities it encoded (ids [C], tokens [C, L])."""
        ...

    def after_step(self) -> None:
        """After an optimizer step."""
        ...


Candidates = Literal["index", "lexical", "none"]


@dataclass(frozen=True)
class SamplerSpec:
    """One sampler as the recipe, its validation and the trainer see it.

    Attributes:
        name: the recipe's ``negatives.sampler`` value.
        sampler: the sampler's constructor, for :func:`~hnce.mining.samplers.build_sampler`.
        build: ``(negatives, num_entities) -> sampler``: what the trainer draws with, from the
            recipe's ``negatives`` section (its option groups) and the size of the id space
            the sampler draws from.
        options: the settings class of the sampler's option group, ``negatives.<name>`` with
            ``-`` read as ``_``; None when it has none.
        candidates: where each mention's candidate list comes from: ``index`` (the newest
            refreshed negatives version), ``lexical`` (BM25 over the catalogue) or ``none``
            (the sampler draws from the whole catalogue or the batch itself).
        scores_online: reads the current model's scores of its candidates (through
            ``sample_scored``), outside the training engine's forward pass.
        loss_columns: ``(model, negatives, num_entities) -> LossColumns``: columns the sampler
            adds to the loss beside the drawn negatives (the momentum queue's vectors); they hold
            one vector per entity, so only the dual scorer reads them. None for most samplers.
        resumes_exactly: its draws depend only on the seed, the step and the candidates, so a
            run resumed from a checkpoint draws what an uninterrupted run would; False when it
            keeps state that checkpoints do not hold (a generator, a queue).
        check: ``(negatives) -> (key, problem) | None``, a rule between its options and the
            rest of the ``negatives`` section (e.g. a BM25 depth below K), checked when the
            recipe chooses this sampler (no other reads its options).
    """

    name: str
    sampler: Callable[..., TrainerSampler]
    build: Callable[[Any, int], TrainerSampler]
    options: type | None = None
    candidates: Candidates = "none"
    scores_online: bool = False
    loss_columns: Callable[[Any, Any, int], LossColumns] | None = None
    resumes_exactly: bool = True
    check: Callable[[Any], tuple[str, str] | None] | None = None

    @property
    def group(self) -> str:
        """The option group's key in the ``negatives`` section."""
        return self.name.replace("-", "_")
