"""Score functions against their direct formulas and the general form (eq. 9), on random tensors."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from hnce.encoders.scorers import (
    GeneralForm,
    GeneralScorer,
    PolyScorer,
    Scorer,
    ScorerConfig,
    build_scorer,
    exact_index_scores,
    index_scores,
)

D = 8


def _masks(lengths: list[int], width: int) -> Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


@pytest.fixture
def tensors() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    mention_hidden = torch.randn(3, 5, D, generator=generator, dtype=torch.float64)
    entity_hidden = torch.randn(4, 6, D, generator=generator, dtype=torch.float64)
    return mention_hidden, _masks([5, 3, 2], 5), entity_hidden, _masks([6, 2, 4, 1], 6)


def _random_batch(
    seed: int, mention_lengths: list[int], num_entities: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random float32 token states of mentions (5 positions, ``mention_lengths`` real) and of
    ``num_entities`` entities (7 positions, 1 to 7 real, drawn), with their masks."""
    generator = torch.Generator().manual_seed(seed)
    mention_hidden = torch.randn(len(mention_lengths), 5, D, generator=generator)
    mention_mask = _masks(mention_lengths, 5)
    entity_hidden = torch.randn(num_entities, 7, D, generator=generator)
    entity_mask = _masks(torch.randint(1, 8, (num_entities,), generator=generator).tolist(), 7)
    return mention_hidden, mention_mask, entity_hidden, entity_mask


def _real(hidden: Tensor, mask: Tensor, row: int) -> Tensor:
    return hidden[row, : int(mask[row].sum())]


def direct_dual(x: Tensor, y: Tensor) -> Tensor:
    return x[0] @ y[0]


def direct_multi(x: Tensor, y: Tensor, m: int) -> Tensor:
    return max(x[0] @ y[t] for t in range(min(m, len(y))))


def direct_som(x: Tensor, y: Tensor) -> Tensor:
    return sum(max(x[i] @ y[j] for j in range(len(y))) for i in range(len(x)))


def code_vectors(x: Tensor, codes: Tensor) -> Tensor:
    return torch.stack([torch.softmax(x @ c, 0) @ x for c in codes])


def direct_genpoly(x: Tensor, y: Tensor, codes: Tensor, entity_queries: int) -> Tensor:
    z = code_vectors(x, codes)
    return sum(y[s] @ (torch.softmax(z @ y[s], 0) @ z) for s in range(min(entity_queries, len(y))))


def eq9(queries: Tensor, keys: Tensor, attention: str) -> Tensor:
    """s = Σ_t q_t · attn(q_t, K): soft K softmax(Kᵀq_t), hard k_argmax (Zhang & Stratos (2021) eq. 9)."""
    total = torch.zeros((), dtype=queries.dtype)
    for q in queries:
        logits = keys @ q
        value = (
            torch.softmax(logits, 0) @ keys if attention == "soft" else keys[int(logits.argmax())]
        )
        total = total + q @ value
    return total


def pairwise_reference(tensors, formula) -> Tensor:
    mention_hidden, mention_mask, entity_hidden, entity_mask = tensors
    return torch.tensor(
        [
            [
                float(
                    formula(
                        _real(mention_hidden, mention_mask, b), _real(entity_hidden, entity_mask, e)
                    )
                )
                for e in range(entity_hidden.shape[0])
            ]
            for b in range(mention_hidden.shape[0])
        ],
        dtype=torch.float64,
    )


def _general_twin(scorer: Scorer) -> GeneralScorer:
    general = build_scorer(scorer.config.general_equivalent(), D).double()
    assert isinstance(general, GeneralScorer)
    if isinstance(scorer, PolyScorer):
        general.key_codes.data.copy_(scorer.codes.data)
    return general


def _candidate_view(tensors) -> tuple[Tensor, Tensor, Tensor]:
    """Per-mention candidate lists drawn from the entities, and which entity each one is."""
    _, _, entity_hidden, entity_mask = tensors
    chosen = torch.tensor([[2, 0], [1, 3], [3, 3]])
    return entity_hidden[chosen], entity_mask[chosen], chosen


CASES = {
    "dual": direct_dual,
    "multi-3": lambda x, y: direct_multi(x, y, 3),
    "som": direct_som,
}


@pytest.mark.parametrize("spec", [*CASES, "poly-4", "genpoly-4-3"])
def test_special_case_equals_direct_formula_and_general_form(spec: str, tensors) -> None:
    torch.manual_seed(1)
    scorer = build_scorer(spec, D).double()
    if isinstance(scorer, PolyScorer):
        codes = scorer.codes.detach()
        queries = scorer.entity_queries

        def formula(x: Tensor, y: Tensor) -> Tensor:
            return direct_genpoly(x, y, codes, queries)

    else:
        formula = CASES[spec]
    expected = pairwise_reference(tensors, formula)
    scores = scorer.score(*tensors)
    torch.testing.assert_close(scores, expected)
    torch.testing.assert_close(_general_twin(scorer).score(*tensors), expected)

    cand_hidden, cand_mask, chosen = _candidate_view(tensors)
    per_mention = scorer.score_candidates(tensors[0], tensors[1], cand_hidden, cand_mask)
    torch.testing.assert_close(per_mention, expected.gather(1, chosen))
    general_per_mention = _general_twin(scorer).score_candidates(
        tensors[0], tensors[1], cand_hidden, cand_mask
    )
    torch.testing.assert_close(general_per_mention, expected.gather(1, chosen))


@pytest.mark.parametrize(
    "config",
    [
        GeneralForm(2, 3, "mention", "leftmost", "leftmost", "soft"),
        GeneralForm(2, 3, "entity", "leftmost", "all", "hard"),
        GeneralForm(2, 3, "mention", "codes", "codes", "soft"),
        GeneralForm(1, 1, "entity", "all", "leftmost", "soft"),
    ],
)
def test_general_form_matches_equation_9(config: GeneralForm, tensors) -> None:
    torch.manual_seed(2)
    scorer = build_scorer(config, D).double()
    assert isinstance(scorer, GeneralScorer)

    def reduce(hidden: Tensor, how: str, count: int, codes: Tensor | None) -> Tensor:
        if how == "all":
            return hidden
        if how == "leftmost":
            return hidden[:count]
        return code_vectors(hidden, codes.detach())

    def formula(x: Tensor, y: Tensor) -> Tensor:
        query_source, key_source = (x, y) if config.query_side == "mention" else (y, x)
        queries = reduce(query_source, config.query_reduction, config.m, scorer.query_codes)
        keys = reduce(key_source, config.key_reduction, config.m_prime, scorer.key_codes)
        return eq9(queries, keys, config.attention)

    torch.testing.assert_close(scorer.score(*tensors), pairwise_reference(tensors, formula))


def test_dual_and_multi_hard_and_soft_agree_when_one_key() -> None:
    # with one key the choice of attention has no effect (Zhang & Stratos (2021) §4.2, dual encoder)
    hidden = torch.randn(2, 4, D, dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.long)
    soft = build_scorer(GeneralForm(1, 1, attention="soft"), D)
    hard = build_scorer(GeneralForm(1, 1, attention="hard"), D)
    torch.testing.assert_close(
        soft.score(hidden, mask, hidden, mask), hard.score(hidden, mask, hidden, mask)
    )


@pytest.mark.parametrize("spec", ["dual", "multi-3", "som"])
def test_index_search_ranks_entities_as_the_pairwise_scorer(spec: str) -> None:
    mention_hidden, mention_mask, entity_hidden, entity_mask = _random_batch(
        3, [5, 4, 3, 2, 5, 1], 40
    )
    scorer = build_scorer(spec, D)
    pairwise = scorer.score(mention_hidden, mention_mask, entity_hidden, entity_mask)
    vectors, owners = scorer.entity_index_vectors(entity_hidden, entity_mask)
    queries = scorer.mention_query_vectors(mention_hidden, mention_mask)
    assert vectors.dtype == torch.float32 and owners.shape == (vectors.shape[0],)
    if scorer.vectors_per_entity is not None:
        assert vectors.shape[0] == 40 * scorer.vectors_per_entity
    else:
        assert vectors.shape[0] == int(entity_mask.sum())
    searched = index_scores(queries, vectors, owners, 40)
    torch.testing.assert_close(searched, pairwise, rtol=1e-5, atol=1e-5)
    assert torch.equal(searched.argsort(1, descending=True), pairwise.argsort(1, descending=True))
    if spec != "som":
        # plain inner-product top-1 over the index vectors is an owner of the best entity
        best_vector = (queries[:, 0] @ vectors.T).argmax(1)
        assert torch.equal(owners[best_vector], pairwise.argmax(1))


@pytest.mark.parametrize(
    "spec",
    [
        "poly-2",
        "genpoly-2-3",
        GeneralForm(2, 3, "mention", "leftmost", "all", "soft"),
        GeneralForm(2, 3, "entity", "leftmost", "codes", "hard"),
        GeneralForm(3, 2, "mention", "leftmost", "leftmost", "hard"),
    ],
)
def test_exact_scoring_of_stored_entity_vectors_equals_the_pairwise_scorer(spec) -> None:
    """Scorers mined exactly: the stored reduced vectors, grouped back per entity and scored
    against the mention's zero-padded reduced vectors, give ``score`` (padding on both sides)."""
    mention_hidden, mention_mask, entity_hidden, entity_mask = _random_batch(
        4, [5, 4, 3, 1, 5, 2], 30
    )
    scorer = build_scorer(spec, D)
    assert not scorer.indexable and scorer.config.mining == "exact"
    pairwise = scorer.score(mention_hidden, mention_mask, entity_hidden, entity_mask)
    vectors, owners = scorer.entity_index_vectors(entity_hidden, entity_mask)
    if scorer.vectors_per_entity is not None:
        assert vectors.shape[0] == 30 * scorer.vectors_per_entity
    queries = scorer.mention_query_vectors(mention_hidden, mention_mask)
    entities, scores = exact_index_scores(scorer, queries, vectors, owners)
    assert torch.equal(entities, torch.arange(30))
    torch.testing.assert_close(scores, pairwise, rtol=1e-5, atol=1e-5)


def test_scorer_specs_parse_and_reject_bad_values() -> None:
    assert ScorerConfig.parse("multi-8") == ScorerConfig("multi", 8)
    assert ScorerConfig.parse("genpoly-16-4") == ScorerConfig("genpoly", 16, 4)
    with pytest.raises(ValueError, match="name"):
        ScorerConfig.parse("triple-2")
    with pytest.raises(ValueError, match="'dual', 'multi', 'som', 'poly' or 'genpoly'"):
        ScorerConfig("general")  # a recipe names a case; the general form is built in code
    with pytest.raises(ValueError, match="unknown ScorerConfig fields"):
        ScorerConfig.from_dict({"name": "dual", "colour": 1})


def test_all_pairs_scoring_in_blocks_equals_one_block(
    monkeypatch: pytest.MonkeyPatch, tensors
) -> None:
    import hnce.encoders.scorers as scorers

    scorer = build_scorer("som", D)
    whole = scorer.score(*tensors)
    monkeypatch.setattr(scorers, "_BLOCK_ELEMENTS", 1)
    torch.testing.assert_close(scorer.score(*tensors), whole)
