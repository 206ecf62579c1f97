"""False-negative control of mined negatives, exact on hand-made scores: the margin below the gold
(sentence-transformers' ``mine_hard_negatives``) and the rank window (ANCE) are never crossed by
any index sampler over many draws; schedules give the configured share at each step; the joint
reranker's denoising (RocketQA) flags a planted false negative, which the drawer then never draws;
bad settings are config errors naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config
from transformers import BertModel

from hnce.cluster.stores.denoised import read_denoised, write_denoised
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.versioned_dir import StoreError
from hnce.encoders.reranker import JointReranker
from hnce.mining.false_negatives import (
    CandidateRules,
    gold_scores,
    ranks_among,
    within_margin,
)
from hnce.mining.samplers import SamplingRequest, build_sampler
from hnce.mining.samplers.base import restricted
from hnce.mining.samplers.mixed import MixedSampler
from hnce.mining.schedule import SamplerSchedule, piecewise_linear
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.rerank import SplitCandidates, denoise, reranker_scores
from hnce.pipeline.train.negatives import NegativeDrawer

GOLD = 99
DRAWS = 400


def request_of(
    ids: list[int],
    scores: list[float],
    k: int,
    positives: frozenset[int] = frozenset(),
    rows: int = DRAWS,
) -> SamplingRequest:
    """``rows`` identical mentions with gold ``GOLD`` and these index candidates."""
    return SamplingRequest(
        gold=torch.full((rows,), GOLD),
        positives=[{GOLD, *positives}] * rows,
        num_entities=100,
        num_negatives=k,
        candidate_ids=torch.tensor(ids).expand(rows, -1),
        candidate_scores=torch.tensor(scores).expand(rows, -1),
        generator=torch.Generator().manual_seed(3),
    )


def drawn(ids: torch.Tensor, valid: torch.Tensor) -> set[int]:
    return set(ids[valid].tolist())


def test_within_margin_is_sentence_transformers_rule() -> None:
    scores = torch.tensor([[2.5, 1.9, 1.5, 1.4], [-2.4, -2.6, -3.0, -1.0]])
    gold = torch.tensor([2.0, -2.0])
    # absolute: s > s⁺ − 0.5; relative: s > s⁺ − |s⁺|·0.25 (the sign-safe form)
    assert within_margin(scores, gold, absolute_margin=0.5).tolist() == [
        [True, True, False, False],
        [True, False, False, True],
    ]
    assert within_margin(scores, gold, relative_margin=0.25).tolist() == [
        [True, True, False, False],
        [True, False, False, True],
    ]
    assert within_margin(scores, gold, 0.0, None)[0].tolist() == [True, False, False, False]
    assert not within_margin(scores, gold).any()
    unknown = torch.tensor([float("nan"), -2.0])
    assert within_margin(scores, unknown, absolute_margin=0.0)[0].all()


def test_gold_score_is_read_from_the_candidates() -> None:
    ids = torch.tensor([[5, GOLD, 7], [5, 6, 7]])
    scores = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    found = gold_scores(ids, scores, torch.tensor([GOLD, GOLD]))
    assert found[0].item() == 2.0 and torch.isnan(found[1])


INDEX_SAMPLERS = [
    build_sampler("hard"),
    build_sampler("greedy"),
    build_sampler("ance"),
    build_sampler("ohem", pool_size=3),
    MixedSampler(hard_fraction=1.0, fill_with_random=False),
]


@pytest.mark.parametrize("sampler", INDEX_SAMPLERS, ids=lambda s: type(s).__name__)
def test_a_candidate_within_the_margin_is_never_drawn(sampler) -> None:
    #         gold  above  close  ok    ok    ok    ok
    ids = [GOLD, 10, 11, 12, 13, 14, 15]
    scores = [2.0, 3.0, 1.6, 1.5, 1.0, 0.5, 0.0]
    rules = CandidateRules(absolute_margin=0.5)
    out = sampler.sample(restricted(request_of(ids, scores, k=3), rules))
    seen = drawn(out.ids, out.valid)
    assert not seen & {10, 11}
    assert out.valid.all()
    if type(sampler).__name__ in ("HardSampler", "AnceSampler", "MixedSampler"):
        assert seen == {12, 13, 14, 15}  # the rest is still drawn


def test_margin_and_relative_margin_combine_and_a_missing_gold_rules_out_every_candidate() -> None:
    rules = CandidateRules(absolute_margin=0.1, relative_margin=0.3)  # 2.0 − 0.6 = 1.4 wins
    listed = request_of([GOLD, 10, 11, 12], [2.0, 1.5, 1.4, 1.0], k=2)
    out = build_sampler("hard").sample(restricted(listed, rules))
    assert drawn(out.ids, out.valid) == {11, 12} and out.valid.all()
    # The gold is not among its top-N: it scores no higher than any of them.
    missing = request_of([10, 11, 12], [1.5, 1.4, 1.0], k=2)
    out = build_sampler("hard").sample(restricted(missing, rules))
    assert not out.valid.any()


def test_ranks_count_admissible_candidates_by_score() -> None:
    scores = torch.tensor([[1.0, 3.0, 2.0, 5.0, 2.0]])
    keep = torch.tensor([[True, True, True, False, True]])
    assert ranks_among(scores, keep).tolist() == [[3, 0, 1, -1, 2]]


@pytest.mark.parametrize("sampler", INDEX_SAMPLERS, ids=lambda s: type(s).__name__)
def test_ranks_outside_the_window_are_never_drawn(sampler) -> None:
    # Admissible ranks: 10 → 0, 12 → 1, 13 → 2, 14 → 3 (the gold and alias 11 do not count).
    ids = [GOLD, 10, 11, 12, 13, 14]
    scores = [5.0, 4.0, 3.5, 3.0, 2.0, 1.0]
    rules = CandidateRules(rank_window=[1, 3])
    out = sampler.sample(restricted(request_of(ids, scores, k=3, positives=frozenset({11})), rules))
    assert drawn(out.ids, out.valid) == {12, 13}
    assert out.valid[:, :2].all() and not out.valid[:, 2].any()


def test_rank_window_over_the_whole_catalogue() -> None:
    scores = torch.tensor([[0.0, 4.0, 3.0, 2.0, 1.0]]).expand(DRAWS, -1)
    request = SamplingRequest(
        gold=torch.zeros(DRAWS, dtype=torch.long),
        positives=[set()] * DRAWS,
        num_entities=5,
        num_negatives=2,
        candidate_scores=scores,
        generator=torch.Generator().manual_seed(0),
    )
    out = build_sampler("hard").sample(restricted(request, CandidateRules(rank_window=[2, 4])))
    assert drawn(out.ids, out.valid) == {3, 4} and out.valid.all()


def test_piecewise_linear_schedule() -> None:
    points = [(100, 0.0), (300, 0.5), (400, 1.0)]
    values = [piecewise_linear(points, step) for step in (0, 100, 200, 300, 350, 400, 10**6)]
    assert values == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert piecewise_linear([(5, 2.0)], 0) == piecewise_linear([(5, 2.0)], 9) == 2.0
    step_change = [(0, 1.0), (50, 1.0), (51, 0.2)]
    assert [piecewise_linear(step_change, s) for s in (50, 51, 60)] == [1.0, 0.2, 0.2]


def test_schedule_gives_the_configured_hard_share_at_each_step() -> None:
    schedule = SamplerSchedule(
        hard_fraction_by_step=[(0, 0.0), (200, 0.5)], sampling_temperature_by_step=[(0, 4.0)]
    )
    request = request_of([GOLD, *range(10, 30)], [float(-i) for i in range(21)], k=8, rows=8)
    for step, hard in [(0, 0), (100, 2), (200, 4), (5000, 4)]:
        sampler = schedule.apply(MixedSampler(), step)
        assert sampler.temperature == 4.0
        assert sampler.sample(request).hard.sum(dim=1).eq(hard).all(), step


@dataclass
class _Version:
    """A negatives version holding the same candidates for every mention."""

    ids: list[int]
    scores: list[float]
    version: int = 1

    def lookup(self, mention_ids: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(mention_ids)
        return torch.tensor([self.ids] * rows), torch.tensor([self.scores] * rows)


@dataclass
class _Source:
    current: _Version


def _drawer(**options) -> tuple[NegativeDrawer, list[Mention], _Source]:
    mentions = [Mention(f"m{i}", "", "paris", "", GOLD) for i in range(64)]
    drawer = NegativeDrawer(
        MixedSampler(),
        8,
        torch.arange(100).numpy(),
        100,
        mentions,
        filter_false_negatives=True,
        draws_candidates=True,
        **options,
    )
    source = _Source(_Version([GOLD, *range(10, 40)], [10.0 - i for i in range(31)]))
    return drawer, mentions, source


def test_the_drawer_follows_the_schedule_per_step_and_repeats_a_step_exactly() -> None:
    schedule = SamplerSchedule(hard_fraction_by_step=[(0, 0.0), (100, 1.0)])
    drawer, mentions, source = _drawer(schedule=schedule)

    def draw(step: int):
        return drawer.draw(mentions, source, torch.Generator().manual_seed(step), step=step)

    assert draw(0).hard.sum().item() == 0
    assert draw(50).hard.sum(dim=1).eq(4).all()
    first, again = draw(75), draw(75)
    assert torch.equal(first.ids, again.ids) and torch.equal(first.hard, again.hard)


def test_the_drawer_applies_the_rules_and_never_draws_a_flagged_pair() -> None:
    rules = CandidateRules(rank_window=[3, 10])
    drawer, mentions, source = _drawer(rules=rules, flagged=[("m0", 14), ("m1", 30)])
    out = drawer.draw(mentions, source, torch.Generator().manual_seed(1))
    hard = out.ids[out.hard]
    assert hard.ge(13).all() and hard.lt(20).all()  # ranks 3..9 (ids 13..19) only
    assert 14 not in out.ids[0].tolist() and 30 not in out.ids[1].tolist()
    assert 14 in out.ids[2:][out.hard[2:]].tolist()  # other mentions still draw it


class _EntityTokens:
    """A token store over a few entity texts (what ``TokenStore.batch`` gives)."""

    def __init__(self, reranker: JointReranker, texts: list[str]) -> None:
        self.tokens = reranker.tokenize_entities([None] * len(texts), texts)

    def batch(self, ids) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(ids, dtype=torch.long)
        return {key: value[index] for key, value in self.tokens.items()}


def test_the_reranker_flags_a_planted_false_negative(tiny_tokenizer, tmp_path: Path) -> None:
    torch.manual_seed(0)
    encoder = BertModel(tiny_bert_config(len(tiny_tokenizer)))
    reranker = JointReranker(encoder, tiny_tokenizer, mention_length=16, entity_length=16)
    texts = [
        "paris is the capital of france",  # 0: gold
        "a big river",
        "the seine",
        "paris is the capital of france",  # 3: planted, the gold's text under another id
        "a city on the river",
        "big city",
    ]
    store = _EntityTokens(reranker, texts)
    mention = Mention("m0", "the capital of france is", "paris", ".", 0)
    split = SplitCandidates([mention], torch.tensor([[1, 0, 2, 3, 4, 5]]).numpy())
    margin = 1e-4
    flagged = denoise(reranker, store, split, margin, num_candidates=6)
    assert 3 in flagged["m0"] and 0 not in flagged["m0"]
    # Exactly the candidates the reranker scores within the margin of the gold.
    scores = reranker_scores(reranker, store, [mention], torch.tensor([[0, 1, 2, 3, 4, 5]]).numpy())
    expected = {c for c in range(1, 6) if scores[0, c] > scores[0, 0] - margin}
    assert set(flagged["m0"]) == expected and len(expected) < 5

    path = tmp_path / "false_negatives.json"
    write_denoised(path, flagged, margin, 1, 30, num_entities=6, catalogue=None)
    assert ("m0", 3) in read_denoised(path, 6, None).flagged()
    with pytest.raises(StoreError, match="catalogue of 6 entities"):
        read_denoised(path, 4, None)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["negatives.candidates.rank_window=[5, 5]"], "negatives.candidates.rank_window"),
        (["negatives.candidates.rank_window=[80, 90]"], "negatives.candidates.rank_window"),
        (["negatives.candidates.absolute_margin=-0.1"], "negatives.candidates.absolute_margin"),
        (["negatives.candidates.relative_margin=-1"], "negatives.candidates.relative_margin"),
        (
            ["negatives.sampler=random", "negatives.candidates.absolute_margin=0.1"],
            "negatives.candidates.absolute_margin",
        ),
        (
            ["negatives.sampler=in-batch", "negatives.candidates.denoised=true"],
            "negatives.candidates.denoised",
        ),
        (
            ["negatives.schedule.hard_fraction_by_step=[[10, 0.5], [10, 0.6]]"],
            "negatives.schedule.hard_fraction_by_step",
        ),
        (
            ["negatives.schedule.hard_fraction_by_step=[[0, 0.5], [10, 1.5]]"],
            "negatives.schedule.hard_fraction_by_step",
        ),
        (
            ["negatives.schedule.sampling_temperature_by_step=[[0, 0.0]]"],
            "negatives.schedule.sampling_temperature_by_step",
        ),
        (
            ["negatives.sampler=hard", "negatives.schedule.hard_fraction_by_step=[[0, 0.5]]"],
            "negatives.schedule.hard_fraction_by_step",
        ),
        (["rerank.denoise_margin=-1"], "rerank.denoise_margin"),
    ],
)
def test_bad_controls_are_config_errors_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert f"'{key}'" in str(error.value)


def test_controls_load_from_a_recipe() -> None:
    config = load_config(
        None,
        [
            "negatives.candidates.rank_window=[2, 50]",
            "negatives.candidates.relative_margin=0.05",
            "negatives.schedule.hard_fraction_by_step=[[0, 0.0], [200, 0.5]]",
        ],
    )
    assert config.negatives.candidates.rank_window == [2, 50]
    assert config.negatives.schedule.options_at(100) == {"hard_fraction": 0.25}
