"""The whole catalogue as negatives (``negatives.cache.whole_catalogue``) and the positive-aware
mask (``negatives.positive_aware``), on hand-made vectors small enough to compute by hand."""

from __future__ import annotations

import pytest
import torch

from hnce.encoders.biencoder import with_extra_entities
from hnce.mining.losses import NCELoss, PositiveAwareMask, build_loss
from hnce.mining.losses.positive_aware import positive_aware_keep
from hnce.mining.negative_cache import NegativeCache
from hnce.pipeline.train.batch import ContrastiveBatch
from hnce.pipeline.train.step import contrastive_loss
from hnce.pipeline.train.trainer_cache import TrainerCache

TEMPERATURE = 0.5


def _trainer_cache(cache: NegativeCache, space: torch.Tensor, catalogue: int) -> TrainerCache:
    """A TrainerCache over ``space`` whose only part used here is the cache and its row map."""
    return TrainerCache(cache, space, catalogue, None, None, None, ".", None, 4, None)


def _batch(entity_ids: torch.Tensor, gold: torch.Tensor, valid: torch.Tensor) -> ContrastiveBatch:
    empty = {"input_ids": torch.zeros(0, 1), "attention_mask": torch.zeros(0, 1)}
    return ContrastiveBatch(
        mention_ids=[f"m{b}" for b in range(len(gold))],
        mentions=empty,
        entity_ids=entity_ids,
        candidates=empty,
        gold=gold,
        valid=valid,
        positive_ids=entity_ids[gold][:, None],
    )


def test_the_whole_catalogue_loss_is_the_full_softmax_and_its_cached_rows_are_constants() -> None:
    generator = torch.Generator().manual_seed(0)
    catalogue, dim = 7, 4
    # the cache holds entities 1..6 (entity 0 is outside the trainer's space); row r = entity r+1
    space = torch.arange(1, catalogue)
    cache = NegativeCache(len(space), 1, dim)
    cached = torch.randn(len(space), 1, dim, generator=generator)
    cache.fill(torch.arange(len(space)), cached, step=0)
    cached_leaf = cache.vectors.requires_grad_(True)  # to see that nothing reaches it
    trainer = _trainer_cache(cache, space, catalogue)

    # two mentions; the step's candidates are entities 2 (gold of m0) and 5 (gold of m1), shared
    entity_ids = torch.tensor([2, 5])
    gold = torch.tensor([0, 1])
    valid = torch.tensor([[False, True], [True, False]])
    # mention 1 also knows entity 4 as a positive (an alias): never its negative
    vectors, queue_valid = trainer.catalogue_columns(entity_ids, [{2}, {5, 4}])
    batch = _batch(entity_ids, gold, valid)
    batch.queue_vectors, batch.queue_valid = vectors, queue_valid

    mentions = torch.randn(2, 1, dim, generator=generator, requires_grad=True)
    fresh = torch.randn(2, 1, dim, generator=generator, requires_grad=True)
    columns, _ = with_extra_entities(fresh, torch.ones(2, 1, dtype=torch.bool), vectors)
    scores = mentions[:, 0] @ columns[:, 0].T
    loss = contrastive_loss(scores, batch, NCELoss(temperature=TEMPERATURE))
    loss.backward()

    # by hand: each mention's softmax over the catalogue it may not confuse with its gold, the
    # step's own candidates with their fresh vectors, every other cached entity with its row
    expected = []
    for b, (own_gold, negatives) in enumerate([(2, [5, 1, 3, 4, 6]), (5, [2, 1, 3, 6])]):
        vector = {
            e: (fresh[list(entity_ids).index(e), 0] if e in (2, 5) else cached[e - 1, 0])
            for e in [own_gold, *negatives]
        }
        logits = torch.stack([mentions[b, 0] @ vector[e] for e in [own_gold, *negatives]])
        expected.append(-torch.log_softmax(logits / TEMPERATURE, dim=0)[0])
    assert loss.item() == pytest.approx(torch.stack(expected).mean().item(), abs=1e-6)
    # the gold and the step's candidates are not cache columns; entity 4 is not mention 1's
    assert queue_valid.tolist() == [
        [True, False, True, True, False, True],
        [True, False, True, False, False, True],
    ]
    assert cached_leaf.grad is None
    assert mentions.grad is not None and mentions.grad.abs().sum() > 0
    assert fresh.grad is not None and fresh.grad.abs().sum() > 0


def test_rows_never_written_are_not_columns() -> None:
    cache = NegativeCache(4, 1, 2)
    cache.fill(torch.tensor([0, 2]), torch.ones(2, 1, 2), step=0)
    _, valid = _trainer_cache(cache, torch.arange(4), 4).catalogue_columns(
        torch.tensor([-1]), [set()]
    )
    assert valid.tolist() == [[True, False, True, False]]


def test_the_positive_aware_mask_drops_exactly_the_candidates_above_the_threshold() -> None:
    positive = torch.tensor([0.8, -0.5])
    negative = torch.tensor([[0.79, 0.75, 0.7, 0.9], [-0.4, -0.47, -0.48, -0.6]])
    keep = positive_aware_keep(positive, negative, 0.95)
    # the thresholds: 0.95 * 0.8 = 0.76, and 0.95 * -0.5 = -0.475 (above a negative gold score)
    assert keep.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_the_masked_loss_is_the_loss_over_the_kept_negatives_with_no_gradient_through_the_mask() -> (
    None
):
    positive = torch.tensor([0.8, 0.6], requires_grad=True)
    negative = torch.tensor([[0.79, 0.2, 0.1], [0.1, 0.7, 0.3]], requires_grad=True)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    masked = build_loss("nce", 0.95, temperature=0.1)
    assert isinstance(masked, PositiveAwareMask)
    value = masked(positive, negative, valid)
    by_hand = NCELoss(temperature=0.1)(
        positive, negative, torch.tensor([[False, True, True], [True, False, False]])
    )
    assert value.item() == pytest.approx(by_hand.item(), abs=1e-7)
    value.backward()
    assert negative.grad[0, 0] == 0 and negative.grad[1, 1] == 0 and negative.grad[1, 2] == 0
    assert negative.grad[0, 1] != 0
