"""ACE: the entropy regulariser prevents generator collapse; planted false negatives never
reach the discriminator and are penalised for the generator."""

from __future__ import annotations

import math

import torch

from hnce.mining.losses import NCELoss
from hnce.mining.samplers import SamplingRequest, build_sampler
from hnce.mining.samplers.adversarial import AdversarialSampler, pairwise_reward


def _request(
    generator: torch.Generator, positives: list[set[int]] | None = None
) -> SamplingRequest:
    batch = 8
    return SamplingRequest(
        gold=torch.zeros(batch, dtype=torch.long),
        positives=positives or [{0}] * batch,
        num_entities=20,
        num_negatives=2,
        candidate_ids=torch.arange(1, 11).expand(batch, -1),
        candidate_scores=torch.zeros(batch, 10),
        generator=generator,
    )


def _train(entropy_weight: float, steps: int = 150) -> float:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    ace = AdversarialSampler(20, mix=0.5, entropy_k=4, entropy_weight=entropy_weight)
    optimiser = torch.optim.Adam(ace.parameters(), lr=0.2)
    request = _request(generator)
    reward_of = torch.zeros(21)
    reward_of[1] = 5.0  # entity 1 is by far the hardest negative
    for _ in range(steps):
        draw = ace.sample(request)
        rewards = reward_of[draw.ids.clamp_min(0)]
        baseline = reward_of[draw.greedy_ids.clamp_min(0)]
        optimiser.zero_grad()
        ace.generator_loss(request, draw, rewards, baseline).backward()
        optimiser.step()
    return float(ace.entropy(request).detach().mean())


def test_entropy_regulariser_prevents_collapse() -> None:
    collapsed = _train(entropy_weight=0.0)
    regularised = _train(entropy_weight=20.0)
    assert collapsed < 0.5 * math.log(4)
    assert regularised > math.log(4) - 0.15


def test_false_negative_never_used_by_discriminator_and_penalised() -> None:
    generator = torch.Generator().manual_seed(1)
    # Entity 3 is an alias (known positive) sitting in every candidate list.
    request = _request(generator, positives=[{0, 3}] * 8)
    ace = AdversarialSampler(20, mix=0.5, false_negative_penalty=10.0, self_critical=False)
    optimiser = torch.optim.Adam(ace.parameters(), lr=0.1)
    seen_false_negative = False
    for _ in range(60):
        draw = ace.sample(request)
        assert not (draw.ids[draw.valid] == 3).any()
        assert (draw.ids[~draw.valid] == -1).all()
        seen_false_negative |= bool(draw.false_negative.any())
        # Discriminator loss ignores it: scores of invalid entries do not matter.
        negative_scores = torch.randn(8, 2)
        poisoned = negative_scores.masked_fill(draw.false_negative, 1e4)
        positive = torch.zeros(8)
        loss = NCELoss()
        assert torch.allclose(
            loss(positive, negative_scores, draw.valid), loss(positive, poisoned, draw.valid)
        )
        optimiser.zero_grad()
        ace.generator_loss(request, draw, pairwise_reward(positive, negative_scores)).backward()
        optimiser.step()
    assert seen_false_negative
    _, log_g, _ = ace.generator_log_probs(request)
    assert log_g[0, 2].exp() < 0.02  # column of entity 3: the generator learned to avoid it


def test_build_sampler_adversarial() -> None:
    ace = build_sampler("adversarial", num_entities=20, mix=0.25)
    draw = ace.sample(_request(torch.Generator().manual_seed(0)))
    assert draw.adversarial.sum(dim=1).tolist() == [1] * 8  # K=2, λ=0.25: one fixed slot
