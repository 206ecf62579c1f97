"""Samplers: exact hard-negative inclusion frequencies, mixed-p counts, and the invariant that
no sampler returns the gold, a known positive or a duplicate among its valid entries."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hnce.mining.false_negatives import FalseNegativeFilter
from hnce.mining.samplers import SAMPLER_SPECS, SamplingRequest, build_sampler
from hnce.mining.samplers.ance import AnceSampler
from hnce.mining.samplers.greedy import GreedySampler
from hnce.mining.samplers.hard import HardSampler
from hnce.mining.samplers.in_batch import InBatchSampler
from hnce.mining.samplers.lexical import Bm25Index
from hnce.mining.samplers.mixed import MixedSampler, hard_count
from hnce.mining.samplers.momentum_queue import MomentumQueue
from hnce.mining.samplers.ohem import OhemSampler
from hnce.mining.samplers.random import RandomSampler


def exact_inclusion(scores: list[float], k: int) -> list[float]:
    """P(i among k draws without replacement ∝ exp(score)), by enumerating ordered draws."""
    weights = [math.exp(s) for s in scores]
    inclusion = [0.0] * len(scores)
    for sequence in itertools.permutations(range(len(scores)), k):
        probability, left = 1.0, sum(weights)
        for item in sequence:
            probability *= weights[item] / left
            left -= weights[item]
        for item in sequence:
            inclusion[item] += probability
    return inclusion


def test_hard_inclusion_frequencies_match_exact_without_replacement() -> None:
    scores = [2.0, 1.0, 0.5, 0.0, -1.0, 1.5]
    ids = [10, 11, 12, 13, 14, 15]
    k, n = 3, 20_000
    request = SamplingRequest(
        gold=torch.full((n,), 99),
        positives=[{99}] * n,
        num_entities=100,
        num_negatives=k,
        candidate_ids=torch.tensor(ids).expand(n, -1),
        candidate_scores=torch.tensor(scores).expand(n, -1),
        generator=torch.Generator().manual_seed(1234),
    )
    out = HardSampler().sample(request)
    assert out.valid.all()
    expected = exact_inclusion(scores, k)
    for entity, p in zip(ids, expected, strict=True):
        frequency = (out.ids == entity).any(dim=1).double().mean().item()
        tolerance = 5 * math.sqrt(p * (1 - p) / n)
        assert abs(frequency - p) <= tolerance, (entity, frequency, p, tolerance)


def test_hard_over_whole_catalogue_excludes_positives_exactly() -> None:
    # Scores for every entity (candidate_ids=None): positives 0 and 2 must never appear and
    # the rest follow the without-replacement distribution over the remaining entities.
    scores = [3.0, 0.0, 3.0, 1.0, -0.5]
    n, k = 20_000, 2
    request = SamplingRequest(
        gold=torch.zeros(n, dtype=torch.long),
        positives=[{0, 2}] * n,
        num_entities=5,
        num_negatives=k,
        candidate_scores=torch.tensor(scores).expand(n, -1),
        generator=torch.Generator().manual_seed(7),
    )
    out = HardSampler().sample(request)
    expected = exact_inclusion([scores[1], scores[3], scores[4]], k)
    for entity, p in zip([1, 3, 4], expected, strict=True):
        frequency = (out.ids == entity).any(dim=1).double().mean().item()
        assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12
    assert not torch.isin(out.ids, torch.tensor([0, 2])).any()


def test_temperature_sharpens_towards_greedy() -> None:
    request = SamplingRequest(
        gold=torch.zeros(200, dtype=torch.long),
        positives=[{0}] * 200,
        num_entities=10,
        num_negatives=2,
        candidate_scores=torch.arange(10.0).expand(200, -1),
        generator=torch.Generator().manual_seed(0),
    )
    cold = HardSampler(temperature=1e-3).sample(request)
    greedy = GreedySampler().sample(request)
    assert torch.equal(cold.ids.sort(dim=1).values, greedy.ids.sort(dim=1).values)
    assert greedy.ids[0].tolist() == [9, 8]


def test_mixed_draws_exact_hard_and_random_counts() -> None:
    assert [hard_count(0.5, k) for k in (1, 2, 3, 7, 8)] == [1, 1, 2, 4, 4]
    assert hard_count(0.0, 5) == 0 and hard_count(1.0, 5) == 5 and hard_count(0.3, 4) == 1
    generator = torch.Generator().manual_seed(3)
    for p, k in [(0.5, 8), (0.25, 8), (0.5, 7), (1.0, 4), (0.0, 4)]:
        request = SamplingRequest(
            gold=torch.tensor([0, 1]),
            positives=[{0, 5}, {1}],
            num_entities=1000,
            num_negatives=k,
            candidate_ids=torch.arange(40).expand(2, -1),
            candidate_scores=torch.randn(2, 40, generator=generator),
            generator=generator,
        )
        out = MixedSampler(hard_fraction=p).sample(request)
        assert out.valid.all()
        assert out.hard.sum(dim=1).tolist() == [hard_count(p, k)] * 2
        # Hard ones come from the candidates, first.
        assert (out.ids[:, : hard_count(p, k)] < 40).all()


def test_mixed_fills_missing_hard_slots_with_random() -> None:
    request = SamplingRequest(
        gold=torch.tensor([0]),
        positives=[{0}],
        num_entities=50,
        num_negatives=4,
        candidate_ids=torch.tensor([[0, 3, -1]]),
        candidate_scores=torch.tensor([[1.0, 1.0, 1.0]]),
        generator=torch.Generator().manual_seed(0),
    )
    out = MixedSampler(hard_fraction=0.5).sample(request)
    assert out.valid.all() and out.hard.sum().item() == 1 and out.ids[0, 0].item() == 3
    strict = MixedSampler(hard_fraction=0.5, fill_with_random=False).sample(request)
    assert strict.valid.sum().item() == 3 and not strict.valid[0, 1]


def test_random_is_uniform_and_batch_shared_option() -> None:
    n = 20_000
    request = SamplingRequest(
        gold=torch.zeros(n, dtype=torch.long),
        positives=[{0, 1}] * n,
        num_entities=6,
        num_negatives=2,
        generator=torch.Generator().manual_seed(5),
    )
    out = RandomSampler().sample(request)
    for entity in (2, 3, 4, 5):  # C(3,1)/C(4,2) = 1/2 inclusion each
        frequency = (out.ids == entity).any(dim=1).double().mean().item()
        assert abs(frequency - 0.5) <= 5 * math.sqrt(0.25 / n)
    shared = RandomSampler(shared=True).sample(
        SamplingRequest(
            gold=torch.tensor([1, 2, 3]),
            positives=[{1}, {2}, {3}],
            num_entities=10**6,
            num_negatives=8,
            generator=torch.Generator().manual_seed(0),
        )
    )
    assert shared.valid.all()
    common = set(shared.ids[0].tolist()) & set(shared.ids[1].tolist()) & set(shared.ids[2].tolist())
    assert len(common) >= 7
    assert torch.allclose(shared.log_q, torch.full((3, 8), -math.log(10**6 - 1)))


def test_too_few_admissible_entities_are_marked_invalid() -> None:
    request = SamplingRequest(
        gold=torch.tensor([0]),
        positives=[{0, 1}],
        num_entities=4,
        num_negatives=5,
        generator=torch.Generator().manual_seed(0),
    )
    out = RandomSampler().sample(request)
    assert out.valid.tolist() == [[True, True, False, False, False]]
    assert sorted(out.ids[0, :2].tolist()) == [2, 3] and out.ids[0, 2:].tolist() == [-1] * 3


def test_lexical_negatives_are_the_best_bm25_candidates_that_are_not_positives() -> None:
    index = Bm25Index(
        ["paris capital of france", "paris texas city", "paris hilton", "london city", "rome"]
    )
    found, found_scores = index.search(["paris", "london city"], k=4)
    ids, scores = torch.from_numpy(found), torch.from_numpy(found_scores)
    assert set(ids[0].tolist()) == {0, 1, 2, -1} and set(ids[1].tolist()) == {3, 1, -1}
    assert torch.isinf(scores[ids < 0]).all() and torch.isfinite(scores[ids >= 0]).all()
    lexical = SAMPLER_SPECS["lexical"]
    assert lexical.candidates == "lexical"
    out = lexical.sampler().sample(
        SamplingRequest(
            gold=torch.tensor([0, 3]),
            positives=[{0, 2}, {3}],
            num_entities=5,
            num_negatives=2,
            candidate_ids=ids,
            candidate_scores=scores,
        )
    )
    assert out.ids[0].tolist() == [1, -1] and out.valid[0].tolist() == [True, False]
    assert out.ids[1].tolist() == [1, -1]


def test_ohem_keeps_highest_scoring_of_the_pool() -> None:
    def score_fn(gold: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return ids.double()  # the model "prefers" high ids

    request = SamplingRequest(
        gold=torch.tensor([50]),
        positives=[{50, 49}],
        num_entities=51,
        num_negatives=3,
        generator=torch.Generator().manual_seed(0),
    )
    out = OhemSampler(pool_size=51, base=RandomSampler(), score_fn=score_fn).sample(request)
    assert out.ids.tolist() == [[48, 47, 46]]


def test_momentum_queue_negatives_and_update() -> None:
    queue = MomentumQueue(dim=2, size=4)
    queue.enqueue(torch.tensor([1, 2, 3, 2, 5]), torch.arange(10.0).view(5, 2))
    keys, ids, valid = queue.negatives(
        SamplingRequest(
            gold=torch.tensor([5]), positives=[{5, 3}], num_entities=10, num_negatives=2
        )
    )
    assert ids.tolist() == [5, 2, 3, 2]  # newest first
    assert valid.tolist() == [[False, True, False, False]]  # gold 5, positive 3, older copy of 2
    assert keys[1].tolist() == [6.0, 7.0]
    target, source = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    with torch.no_grad():
        target.weight.fill_(1.0)
        source.weight.fill_(0.0)
    from hnce.mining.samplers.momentum_queue import momentum_update

    momentum_update(target, source, momentum=0.9)
    assert torch.allclose(target.weight, torch.tensor([[0.9]]))


def test_false_negative_filter_mask() -> None:
    fn = FalseNegativeFilter([("m1", 3)])
    fn.add("m1", 7)
    fn.add("m2", 3)
    assert fn.is_positive("m1", 7) and not fn.is_positive("m2", 7)
    mask = fn.mask(["m1", "m2", "m3"], torch.tensor([[7, 3, 1], [7, 3, 1], [3, 7, 1]]))
    assert mask.tolist() == [[True, True, False], [False, True, False], [False, False, False]]


def test_build_sampler_rejects_unknown_names() -> None:
    try:
        build_sampler("nope")
    except ValueError as error:
        assert "unknown sampler 'nope'" in str(error) and "random" in str(error)
    else:
        raise AssertionError("expected ValueError")


@st.composite
def requests(draw: st.DrawFn) -> SamplingRequest:
    num_entities = draw(st.integers(1, 25))
    batch = draw(st.integers(1, 4))
    width = draw(st.integers(1, 12))
    entity = st.integers(-1, num_entities + 1)
    golds = draw(st.lists(st.integers(0, num_entities - 1), min_size=batch, max_size=batch))
    positives = [
        draw(st.sets(st.integers(0, num_entities - 1), max_size=4))
        | ({g} if draw(st.booleans()) else set())
        for g in golds
    ]
    ids = draw(
        st.lists(st.lists(entity, min_size=width, max_size=width), min_size=batch, max_size=batch)
    )
    score = st.one_of(st.floats(-5, 5), st.just(float("-inf")))
    scores = draw(
        st.lists(st.lists(score, min_size=width, max_size=width), min_size=batch, max_size=batch)
    )
    return SamplingRequest(
        gold=torch.tensor(golds),
        positives=positives,
        num_entities=num_entities,
        num_negatives=draw(st.integers(0, 8)),
        candidate_ids=torch.tensor(ids),
        candidate_scores=torch.tensor(scores),
        generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31))),
    )


SAMPLERS = {
    "random": RandomSampler(),
    "random-shared": RandomSampler(shared=True),
    "hard": HardSampler(),
    "greedy": GreedySampler(),
    "mixed": MixedSampler(hard_fraction=0.5),
    "in-batch": InBatchSampler(),
    "ance": AnceSampler(top_n=4),
    "ohem": OhemSampler(pool_size=6),
}


def expected_valid(name: str, request: SamplingRequest, queue: MomentumQueue, row: int) -> int:
    """How many valid negatives sampler ``name`` must return for ``row``: K, or every admissible
    entity of what it draws from when fewer exist."""
    k, entities = request.num_negatives, request.num_entities
    excluded = request.positives[row] | {int(request.gold[row])}
    in_catalogue = entities - len({e for e in excluded if 0 <= e < entities})
    ids, scores = request.candidate_ids[row].tolist(), request.candidate_scores[row].tolist()
    candidates = {
        e for e, s in zip(ids, scores, strict=True) if 0 <= e < entities and math.isfinite(s)
    } - excluded
    golds = set(request.gold.tolist()) - excluded
    queued = {e for e in queue.ids.tolist() if e >= 0} - excluded
    admissible = {
        "random": in_catalogue,
        "random-shared": in_catalogue,
        "mixed": in_catalogue,  # missing hard slots are filled with random ones
        "hard": len(candidates),
        "greedy": len(candidates),
        "ohem": len(candidates),
        "ance": min(4, len(candidates)),  # uniform over the top 4
        "in-batch": len(golds),
        "momentum-queue": len(queued),
    }
    return min(k, admissible[name])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests())
def test_no_sampler_returns_gold_positive_or_duplicate(request: SamplingRequest) -> None:
    """Every sampler returns K distinct admissible negatives per mention, or all it has."""
    queue = MomentumQueue(dim=1, size=6)
    queue.enqueue(
        request.candidate_ids[0].clamp(0, request.num_entities - 1),
        torch.zeros(request.candidate_ids.shape[1], 1),
    )
    for name, sampler in {**SAMPLERS, "momentum-queue": queue}.items():
        out = sampler.sample(request)
        for row, chosen in enumerate(_keeps_the_contract(name, request, out)):
            assert len(chosen) == expected_valid(name, request, queue, row), (name, row, chosen)


def _keeps_the_contract(name: str, request: SamplingRequest, out) -> list[list[int]]:
    """Asserts that ``out`` is [B, K] ids holding, among its valid entries, no gold, known
    positive, repeat or id outside the catalogue, and -1 where invalid; returns each row's valid
    ids."""
    k = request.num_negatives
    assert out.ids.shape == (request.batch_size, k) == out.valid.shape, name
    rows = []
    for row in range(request.batch_size):
        chosen = out.ids[row][out.valid[row]].tolist()
        forbidden = request.positives[row] | {int(request.gold[row])}
        assert not forbidden & set(chosen), (name, chosen, forbidden)
        assert len(chosen) == len(set(chosen)), (name, chosen)
        assert all(0 <= e < request.num_entities for e in chosen), (name, chosen)
        assert (out.ids[row][~out.valid[row]] == -1).all(), name
        rows.append(chosen)
    return rows


def test_in_batch_negatives_are_the_other_mentions_golds_in_random_order() -> None:
    request = SamplingRequest(
        gold=torch.tensor([10, 11, 12, 11, 13]),
        positives=[{10, 12}, {11}, {12}, {11}, {13}],
        num_entities=100,
        num_negatives=4,
    )
    firsts = set()
    for seed in range(20):
        out = InBatchSampler().sample(
            replace(request, generator=torch.Generator().manual_seed(seed))
        )
        rows = [set(ids[valid].tolist()) for ids, valid in zip(out.ids, out.valid, strict=True)]
        assert rows == [{11, 13}, {10, 12, 13}, {10, 11, 13}, {10, 12, 13}, {10, 11, 12}]
        assert out.log_q is None
        firsts.add(int(out.ids[1, 0]))
    assert firsts == {10, 12, 13}  # shuffled: any of the others can come first


def test_ance_draws_uniformly_from_the_top_n_admissible_candidates() -> None:
    n, k = 30_000, 2
    request = SamplingRequest(
        gold=torch.full((n,), 21),
        positives=[{21}] * n,
        num_entities=100,
        num_negatives=k,
        candidate_ids=torch.tensor([20, 21, 22, 23, 24, 25]).expand(n, -1),
        candidate_scores=torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0]).expand(n, -1),
        generator=torch.Generator().manual_seed(11),
    )
    out = AnceSampler(top_n=3).sample(request)
    assert out.valid.all()
    assert set(out.ids.unique().tolist()) == {20, 22, 23}  # the gold 21 is not one of the top 3
    for entity in (20, 22, 23):
        frequency = (out.ids == entity).any(dim=1).double().mean().item()
        assert abs(frequency - k / 3) <= 5 * math.sqrt((2 / 9) / n), (entity, frequency)
    assert torch.allclose(out.log_q, torch.full((n, k), -math.log(3)))


def _as_the_trainer_draws(name: str, request: SamplingRequest):
    """The trainer's sampler of ``name`` (its spec's ``build`` over the recipe's defaults) drawing
    for ``request``; samplers that read the current model get scores that prefer high ids."""
    from hnce.pipeline.config import NegativesSettings

    sampler = SAMPLER_SPECS[name].build(NegativesSettings(), request.num_entities)
    if hasattr(sampler, "sample_scored"):
        return sampler.sample_scored(request, lambda ids: ids.double())
    return sampler.sample(request)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests())
def test_every_declared_sampler_as_the_trainer_builds_it_keeps_the_contract(
    request: SamplingRequest,
) -> None:
    """Whatever a sampler module declares in its SPEC, the sampler the trainer builds from it
    returns [B, K] ids, never the gold, a known positive, a repeat or an id outside the
    catalogue among its valid entries, and -1 where invalid."""
    for name in SAMPLER_SPECS:
        _keeps_the_contract(name, request, _as_the_trainer_draws(name, request))


def test_a_sampler_module_without_a_spec_is_refused_at_import(tmp_path, monkeypatch) -> None:
    """The registry is the package's modules: one that forgets its SPEC fails loudly."""
    import shutil

    import hnce.mining.samplers as samplers

    copy = tmp_path / "samplers_copy"
    shutil.copytree(Path(samplers.__file__).parent, copy)
    (copy / "forgotten.py").write_text('"""A sampler whose author forgot SPEC."""\n')
    spec = importlib.util.spec_from_file_location(
        "hnce.mining.samplers_copy", copy / "__init__.py", submodule_search_locations=[str(copy)]
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "hnce.mining.samplers_copy", module)
    with pytest.raises(TypeError, match=r"forgotten\.py: a sampler module must end with SPEC"):
        spec.loader.exec_module(module)
