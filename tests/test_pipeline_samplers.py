"""The trainer's side of the lexical, OHEM, ACE and momentum-queue samplers, without Ray: BM25
negatives share terms with the mention and are built once per dataset; OHEM ranks by the current
model, not the stale index; the ACE generator moves toward what the discriminator scores high;
queue vectors are extra loss columns and the momentum tower follows the EMA rule exactly."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from training_helpers import REFRESHED, config_for

from hnce.cluster.stores.bm25_store import bm25_directory, ensure_bm25, publish_lexical_negatives
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.encoders.biencoder import build_biencoder
from hnce.mining.losses import build_loss
from hnce.mining.samplers import SampledNegatives, SamplingRequest
from hnce.mining.samplers.adversarial import AdversarialTraining
from hnce.mining.samplers.greedy import GreedySampler
from hnce.mining.samplers.momentum_queue import MomentumEntityQueue, entity_side
from hnce.mining.samplers.ohem import OhemSampler
from hnce.pipeline.config import ConfigError
from hnce.pipeline.train.batch import ContrastiveBatch, assemble_batch
from hnce.pipeline.train.current_scores import CurrentModelScores
from hnce.pipeline.train.negatives import NegativeDrawer
from hnce.pipeline.train.step import contrastive_loss


def train_mentions(dataset: Path) -> list[Mention]:
    return MentionSplit.open(mention_split_path(dataset, "train")).read_all()


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def test_lexical_negatives_share_terms_with_the_mention(
    small_dataset: Path, syllable_bert: Path
) -> None:
    config = config_for(
        small_dataset,
        syllable_bert,
        "negatives.sampler=lexical",
        "negatives.source=none",
        "negatives.num_negatives=3",
    )
    catalogue = EntityCatalogue.open(small_dataset)
    mentions = train_mentions(small_dataset)
    drawer = NegativeDrawer.for_retriever(config, catalogue, mentions)
    drawn = drawer.draw(mentions, None, torch.Generator().manual_seed(0))  # type: ignore[arg-type]

    titles = catalogue.column("title").to_pylist()
    texts = catalogue.column("text").to_pylist()
    domains = catalogue.domain_of().to_pylist()
    assert drawn.valid.sum() >= len(mentions)  # most mentions get BM25 negatives
    for mention, ids, valid in zip(mentions, drawn.ids, drawn.valid, strict=True):
        for entity in ids[valid].tolist():
            assert words(mention.mention) & words(f"{titles[entity]} {texts[entity]}")
            assert entity not in mention.golds
            assert domains[entity] == mention.domain  # the training domains only


def test_bm25_is_built_once_per_dataset_and_k1_b(small_dataset: Path, tmp_path: Path) -> None:
    first = ensure_bm25(small_dataset, 1.5, 0.75)
    directory = bm25_directory(small_dataset, 1.5, 0.75, catalogue_fingerprint(small_dataset))
    built = (directory / "manifest.json").stat().st_mtime_ns
    again = ensure_bm25(small_dataset, 1.5, 0.75)
    assert (directory / "manifest.json").stat().st_mtime_ns == built
    assert again.num_entities == first.num_entities == len(EntityCatalogue.open(small_dataset))
    ensure_bm25(small_dataset, 1.2, 0.75)
    assert bm25_directory(small_dataset, 1.2, 0.75, catalogue_fingerprint(small_dataset)).is_dir()

    store = NegativesStore(tmp_path / "negatives")
    assert publish_lexical_negatives(store, small_dataset, "train", 8, 1.5, 0.75)
    assert not publish_lexical_negatives(store, small_dataset, "train", 8, 1.5, 0.75)
    version = store.latest("train")
    assert version is not None and version.version == 0 and version.checkpoint_step == 0
    mention = train_mentions(small_dataset)[0]
    cands, _ = version.lookup([mention.mention_id])
    ids, _ = first.search([mention.mention], 8)
    assert cands[0][cands[0] >= 0].tolist() == ids[0][ids[0] >= 0].tolist()


def test_ohem_picks_the_current_models_top_non_gold_candidates() -> None:
    # Index scores rank ids 1..9 in id order (stale); the current model ranks them otherwise.
    candidate_ids = torch.arange(10)[None]
    index_scores = -torch.arange(10, dtype=torch.float32)[None]
    current = torch.tensor([50.0, 5, 0, 40, 3, 9, 1, 8, 100, 100])  # gold 0, positive 3
    request = SamplingRequest(
        gold=torch.tensor([0]),
        positives=[{0, 3}],
        num_entities=10,
        num_negatives=3,
        candidate_ids=candidate_ids,
        candidate_scores=index_scores,
    )
    seen: list[list[int]] = []

    def scores(ids: torch.Tensor) -> torch.Tensor:
        seen.append(ids[0].tolist())
        return current[ids]

    drawn = OhemSampler(pool_size=6, base=GreedySampler()).sample_scored(request, scores)
    # The pool is the index's top 6 non-positives (1, 2, 4, 5, 6, 7): 8 and 9 score higher now
    # but lie outside the bounded pool; of the pool, the current model ranks 5, 7, 1 highest.
    assert sorted(seen[0]) == [1, 2, 4, 5, 6, 7]
    assert drawn.ids.tolist() == [[5, 7, 1]]
    assert drawn.valid.all()


def test_current_model_scores_are_the_models_score_matrix(
    small_dataset: Path, syllable_bert: Path
) -> None:
    model = build_biencoder(syllable_bert, "dual", mention_length=24, entity_length=24).train()
    store = TokenStore.ensure(small_dataset, model.tokenizer, model.entity_length)
    mentions = train_mentions(small_dataset)
    tokens = MentionTokens.tokenize(model, mentions)
    ids = torch.tensor([[3, 7, 3], [1, 0, 5]])
    got = CurrentModelScores(model, tokens, store, torch.device("cpu")).score(np.arange(2), ids)
    assert model.training  # scored in eval mode, handed back in train mode
    model.eval()
    with torch.no_grad():
        full = model.score_matrix(tokens.batch(np.arange(2)), store.batch(np.arange(8)))
    torch.testing.assert_close(got, full.gather(1, ids))


def test_ace_generator_moves_toward_high_scoring_candidates() -> None:
    """The discriminator scores candidate 6 far above the gold: after generator steps g_θ puts
    more mass on it, and less on the known positive 3 (the false-negative penalty)."""
    ace = AdversarialTraining(10, mix=0.0, learning_rate=0.1)
    request = SamplingRequest(
        gold=torch.tensor([0]),
        positives=[{0, 3}],
        num_entities=10,
        num_negatives=2,
        candidate_ids=torch.arange(1, 9)[None],
        candidate_scores=torch.zeros(1, 8),
        generator=torch.Generator().manual_seed(0),
    )
    discriminator = torch.full((10,), -4.0)
    discriminator[0], discriminator[6] = 0.0, 4.0

    def probabilities() -> torch.Tensor:
        ids, log_g, _ = ace.sampler.generator_log_probs(request)
        return torch.zeros(10).scatter(0, ids[0], log_g[0].detach().exp())

    before = probabilities()
    for _ in range(40):
        ace.sample_scored(request, lambda ids: discriminator[ids])
    after = probabilities()
    assert before[6] == pytest.approx(1 / 8)
    assert after[6] > 2 * before[6]
    assert after.argmax() == 6
    assert after[3] < before[3]


def test_queue_columns_enter_the_loss_as_negatives_exactly() -> None:
    loss = build_loss("nce")
    scores = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))  # C = 3, Q = 2
    valid = torch.tensor([[False, True, True], [True, False, False]])
    queue_valid = torch.tensor([[True, False], [True, True]])
    batch = ContrastiveBatch(
        mention_ids=["a", "b"],
        mentions={},
        entity_ids=torch.arange(3),
        candidates={},
        gold=torch.tensor([0, 1]),
        valid=valid,
        positive_ids=torch.tensor([[0], [1]]),
    )
    without = contrastive_loss(scores[:, :3], batch, loss)
    empty = contrastive_loss(
        scores,
        ContrastiveBatch(**{**vars(batch), "queue_valid": torch.zeros(2, 2, dtype=bool)}),
        loss,
    )
    with_queue = contrastive_loss(
        scores, ContrastiveBatch(**{**vars(batch), "queue_valid": queue_valid}), loss
    )
    negatives = torch.cat([valid, queue_valid], 1)
    positive = scores[torch.arange(2), torch.tensor([0, 1])]
    expected = torch.stack(
        [
            -positive[b]
            + torch.logsumexp(torch.cat([positive[b : b + 1], scores[b][negatives[b]]]), 0)
            for b in range(2)
        ]
    ).mean()
    assert torch.equal(empty, without)
    torch.testing.assert_close(with_queue, expected)
    assert not torch.isclose(with_queue, without)


def test_momentum_queue_feeds_the_step_and_follows_the_ema_rule(
    small_dataset: Path, syllable_bert: Path
) -> None:
    model = build_biencoder(syllable_bert, "dual", mention_length=24, entity_length=24)
    store = TokenStore.ensure(small_dataset, model.tokenizer, model.entity_length)
    mentions = train_mentions(small_dataset)[:2]
    tokens = MentionTokens.tokenize(model, mentions)
    queue = MomentumEntityQueue(model, size=4, momentum=0.9, num_entities=len(store))
    assert queue.memory_bytes == 4 * model.output_size * 4

    negatives = SampledNegatives(ids=torch.tensor([[5], [6]]), valid=torch.ones(2, 1, dtype=bool))
    batch = assemble_batch(mentions, np.arange(2), tokens, negatives, store)
    assert len(batch.entity_ids) == 4
    candidates = batch.candidates
    # golds and 5, 6: four vectors fill the queue
    queue.observe(batch.entity_ids, candidates["input_ids"], candidates["attention_mask"])
    gold = mentions[0].gold
    queue_vectors, queue_valid = queue.columns(
        batch.entity_ids[batch.gold], [{m.gold} for m in mentions]
    )
    queued = queue.queue.ids[queue.queue.newest_first()]
    assert queue_valid.tolist() == [
        [int(e) != gold for e in queued],
        [int(e) != mentions[1].gold for e in queued],
    ]
    # The queued vectors are the momentum tower's [CLS] vectors of those entities.
    model.eval()
    with torch.no_grad():
        hidden, _ = model.encode_entities(**store.batch(queued.numpy()))
    torch.testing.assert_close(queue_vectors[:, 0], hidden[:, 0])

    # Scores of the step: the queue's columns follow the candidates', no gradient through them.
    model.train()
    scores = model.score_matrix(batch.mentions, batch.candidates, None, 0, queue_vectors)
    assert scores.shape == (2, len(batch.entity_ids) + 4)
    model.eval()
    with torch.no_grad():
        mention_cls = model.encode_mentions(**batch.mentions)[0][:, 0]
        expected_queue = mention_cls @ queue_vectors[:, 0].T
        got = model.score_matrix(batch.mentions, batch.candidates, None, 0, queue_vectors)
    torch.testing.assert_close(got[:, -4:], expected_queue)

    old = [p.detach().clone() for p in queue.tower.parameters()]
    with torch.no_grad():
        for parameter in entity_side(model).parameters():
            parameter.add_(0.5)
    queue.after_step()
    for kept, moved, trained in zip(
        old, queue.tower.parameters(), entity_side(model).parameters(), strict=True
    ):
        assert torch.equal(moved, kept.mul(0.9).add(trained, alpha=1 - 0.9))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("negatives.sampler=momentum-queue", "model.scorer={name: multi, m: 2}"), "model.scorer"),
        (("negatives.sampler=lexical", "negatives.source=index"), "negatives.sampler"),
        (
            ("negatives.initial=lexical", "negatives.source=none", "negatives.sampler=random"),
            "negatives.initial",
        ),
        ((*REFRESHED, "negatives.sampler=ohem", "training.zero_stage=3"), "training.zero_stage"),
        (
            ("negatives.sampler=lexical", "negatives.source=none", "negatives.lexical.top_n=2"),
            "negatives.lexical.top_n",
        ),
    ],
)
def test_sampler_recipes_refused_with_the_key(
    small_dataset: Path, syllable_bert: Path, overrides: tuple[str, ...], key: str
) -> None:
    with pytest.raises(ConfigError) as error:
        config_for(small_dataset, syllable_bert, *overrides)
    assert f"'{key}" in str(error.value)


def test_index_samplers_need_a_refresh_or_bm25_initial_negatives(
    small_dataset: Path, syllable_bert: Path
) -> None:
    overrides = ("negatives.sampler=adversarial", "negatives.source=index")
    with pytest.raises(ConfigError, match=r"'negatives\.sampler'"):
        config_for(small_dataset, syllable_bert, *overrides)
    config = config_for(small_dataset, syllable_bert, *overrides, "negatives.initial=lexical")
    assert config.negatives.initial == "lexical"


def test_only_the_chosen_samplers_rule_is_checked(small_dataset: Path, syllable_bert: Path) -> None:
    """K = 100 over the index's top-128 is a valid mixed recipe: BM25's depth
    (``negatives.lexical.top_n``, 64 by default) is read by the lexical sampler only, so it is
    checked when the recipe chooses that sampler, and then refused naming the key."""
    wide = ("negatives.num_negatives=100", "refresh.top_n=128")
    config = config_for(small_dataset, syllable_bert, *REFRESHED, *wide)
    assert config.negatives.sampler == "mixed" and config.negatives.lexical.top_n < 100
    lexical = ("negatives.sampler=lexical", "negatives.source=none", *wide)
    with pytest.raises(ConfigError, match=r"'negatives\.lexical\.top_n'"):
        config_for(small_dataset, syllable_bert, *lexical)
