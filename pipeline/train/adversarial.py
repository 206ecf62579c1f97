"""ACE in the worker loop (Bose et al. 2018): the generator learns from the model being trained.

Each micro-batch's negatives come from :class:`~hnce.mining.adversarial.AdversarialSampler`'s mixture
λ·p_nce + (1 − λ)·g_θ over the mention's index candidates (eq. 4). Right after the draw the
discriminator (the current bi-encoder, :class:`~hnce.pipeline.train.model_scores.CurrentModelScores`,
no gradient) scores the gold, the drawn negatives and the generator's greedy choice y*; the
generator then takes one optimiser step on the REINFORCE loss of eq. 6 with the pairwise reward
softplus(s(x, y⁻) − s(x, y⁺)), the self-critical baseline (§2.6), the entropy floor log k
(eq. 8, §2.4) and the false-negative penalty (§2.5), as ``mining/adversarial.py`` defines them.

The generator (a sharpness and one bias per entity of the sampler's space) lives on the CPU of
each worker and is not checkpointed: a resumed run restarts it from its initial state.
"""

from __future__ import annotations

import torch

from hnce.mining.adversarial import AdversarialNegatives, AdversarialSampler, pairwise_reward
from hnce.mining.samplers import SampledNegatives, SamplingRequest
from hnce.pipeline.config import AdversarialOptions
from hnce.pipeline.train.ohem import LocalScores


class AdversarialTraining:
    """ACE's sampler and the optimiser of its generator; see the module docstring."""

    def __init__(self, num_entities: int, options: AdversarialOptions) -> None:
        self.sampler = AdversarialSampler(
            num_entities,
            mix=options.mix,
            entropy_k=options.entropy_k,
            entropy_weight=options.entropy_weight,
            false_negative_penalty=options.false_negative_penalty,
            self_critical=options.self_critical,
            off_policy=options.off_policy,
        )
        self.optimizer = torch.optim.Adam(self.sampler.parameters(), lr=options.learning_rate)

    def sample_scored(self, request: SamplingRequest, scores: LocalScores) -> SampledNegatives:
        """Draw from the mixture, then update the generator on the discriminator's scores."""
        draw = self.sampler.sample(request)
        self.update(request, draw, scores)
        return SampledNegatives(ids=draw.ids, valid=draw.valid, log_q=draw.log_q)

    def update(
        self, request: SamplingRequest, draw: AdversarialNegatives, scores: LocalScores
    ) -> float:
        """One generator step (eq. 6 + eq. 8 + §2.5) on ``draw``; returns the generator loss."""
        assert draw.greedy_ids is not None
        gold = request.gold.cpu()[:, None]
        # Empty and false-negative slots (id -1) score column 0: a false negative's reward is
        # the penalty and an empty slot's is masked, whatever is scored there.
        ids = torch.cat([gold, draw.ids.cpu(), draw.greedy_ids.cpu()[:, None]], dim=1)
        scored = scores(ids.clamp_min(0)).float().cpu()
        positive, negatives, greedy = scored[:, 0], scored[:, 1:-1], scored[:, -1:]
        rewards = pairwise_reward(positive, negatives)
        baseline = None
        if self.sampler.self_critical:
            baseline = pairwise_reward(positive, greedy)[:, 0].masked_fill(
                draw.greedy_ids.cpu() < 0, 0.0
            )
        loss = self.sampler.generator_loss(request, draw, rewards, baseline)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())
