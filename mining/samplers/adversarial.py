"""Adversarial Contrastive Estimation (ACE, Bose et al. 2018 §2): a learned generator of negatives.

Negatives come from the mixture λ·p_nce + (1 − λ)·g_θ(y|x) (eq. 4): round(λ·K) slots from a
fixed sampler (uniform by default) and the rest from the generator g_θ, a softmax over the
current index version's top-N candidates (not over millions of entities). The generator is
trained by REINFORCE (eq. 6) with the discriminator's loss as reward, a self-critical baseline
(§2.6), an entropy regulariser (eq. 8, §2.4), a penalty for false negatives (§2.5) and optional
off-policy importance weights on the fixed sampler's draws (§2.7).

In the trainer (:class:`AdversarialTraining`) the generator learns from the model being trained:
right after each draw the discriminator (the current bi-encoder's scores, no gradient) scores the
gold, the drawn negatives and the generator's greedy choice y*; the generator then takes one
optimiser step on the REINFORCE loss of eq. 6 with the pairwise reward softplus(s(x, y⁻) −
s(x, y⁺)), the self-critical baseline, the entropy floor log k and the false-negative penalty
(docs/math.md, eqs. (40)–(46)). The generator (a sharpness and one bias per entity of the
sampler's space) and its optimiser live on the worker's CPU and are not checkpointed: a resumed
run restarts the generator from its initial state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hnce.mining.samplers.base import (
    NegativeSampler,
    SampledNegatives,
    SamplingRequest,
    candidates_of,
    draw_ids,
    excluded,
    later_duplicates,
    take_first,
)
from hnce.mining.samplers.random import RandomSampler
from hnce.mining.samplers.spec import LocalScores, SamplerSpec


class CandidateGenerator(nn.Module):
    """g_θ(y|x) ∝ exp(α·s_index(x, y) + b_y) over a mention's index candidates: a learned
    sharpness α on the (stale) index score plus a learned per-entity bias. Subclass and
    override ``forward`` for richer generators (e.g. a small network on the embeddings)."""

    def __init__(self, num_entities: int, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.entity_bias = nn.Embedding(num_entities, 1)
        nn.init.zeros_(self.entity_bias.weight)

    def forward(self, candidate_ids: Tensor, candidate_scores: Tensor) -> Tensor:
        """Logits [B, N] (finite everywhere; masking empty slots and ids outside the catalogue
        is the sampler's job, so they only need an in-range row of the bias here)."""
        scores = candidate_scores.nan_to_num(neginf=0.0, posinf=0.0).float()
        rows = candidate_ids.clamp(0, self.entity_bias.num_embeddings - 1)
        return self.scale * scores + self.entity_bias(rows).squeeze(-1)


@dataclass
class AdversarialNegatives(SampledNegatives):
    """ACE draw. ``adversarial`` marks generator slots; ``false_negative`` marks generator
    draws that are known positives (``valid=False``: zero weight for the discriminator, a
    penalty for the generator); ``log_g`` is log g_θ of every slot (differentiable; -inf for
    fixed-sampler draws outside the candidates); ``step_log_prob`` is the Plackett-Luce
    log-probability of each generator slot given the earlier ones (the REINFORCE score)."""

    adversarial: Tensor | None = None
    false_negative: Tensor | None = None
    log_g: Tensor | None = None
    step_log_prob: Tensor | None = None
    greedy_ids: Tensor | None = None


class AdversarialSampler(nn.Module):
    """ACE mixture sampler with a REINFORCE-trained generator over index candidates.

    Args:
        num_entities: catalogue size (for the default generator's per-entity bias).
        mix: λ, the fixed sampler's share: round(λ·K) slots (halves up) come from ``fixed``.
        fixed: the fixed sampler p_nce (default uniform :class:`RandomSampler`).
        generator_module: maps (candidate ids, candidate scores) to logits [B, N].
        entropy_k: k of the entropy floor c = log k (eq. 8).
        entropy_weight: weight of the entropy penalty.
        false_negative_penalty: reward given to a generator draw that is a known positive.
        self_critical: subtract the reward of y* = argmax g_θ (Rennie et al.) as baseline.
        off_policy: add the importance-weighted REINFORCE term on the fixed draws (§2.7).

    Typical step (``score_fn`` scores (gold, ids) with the discriminator)::

        draw = ace.sample(request)
        d_loss = nce(pos, score_fn(gold, draw.ids), draw.valid)     # FNs already invalid
        rewards = pairwise_reward(pos, neg)                          # detached
        g_loss = ace.generator_loss(draw, rewards, baseline_reward)
    """

    def __init__(
        self,
        num_entities: int,
        mix: float = 0.5,
        fixed: NegativeSampler | None = None,
        generator_module: nn.Module | None = None,
        entropy_k: int = 4,
        entropy_weight: float = 1.0,
        false_negative_penalty: float = 10.0,
        self_critical: bool = True,
        off_policy: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"{__file__}: mix (λ) must be within [0, 1], got {mix}")
        self.mix = mix
        self.fixed = fixed if fixed is not None else RandomSampler()
        self.generator_module = generator_module or CandidateGenerator(num_entities)
        self.entropy_k = entropy_k
        self.entropy_weight = entropy_weight
        self.false_negative_penalty = false_negative_penalty
        self.self_critical = self_critical
        self.off_policy = off_policy

    def generator_log_probs(self, request: SamplingRequest) -> tuple[Tensor, Tensor, Tensor]:
        """(candidate ids [B, N], log g_θ(y|x) [B, N] with -inf off the support, support).

        The support excludes empty slots, -inf scores, the gold and repeats, but keeps other
        known positives: drawing one is what the false-negative penalty teaches away from."""
        ids, scores = candidates_of(request, "adversarial")
        gold_only = replace(request, positives=[set() for _ in request.positives])
        support = ~excluded(gold_only, ids) & torch.isfinite(scores)
        support &= ~later_duplicates(ids, support)
        logits = self.generator_module(ids, scores).masked_fill(~support, float("-inf"))
        return ids, torch.log_softmax(logits, dim=1), support

    def sample(self, request: SamplingRequest) -> AdversarialNegatives:
        k = request.num_negatives
        k_fixed = min(k, math.floor(self.mix * k + 0.5))
        ids, log_g, support = self.generator_log_probs(request)
        adv_ids, drawn, columns = draw_ids(ids, log_g.detach(), k - k_fixed, request.generator)
        # Plackett-Luce step probabilities: each draw given the earlier draws removed.
        step_log_prob = []
        remaining = log_g
        for slot in range(k - k_fixed):
            column = columns[:, slot : slot + 1]
            step = remaining.gather(1, column).squeeze(1) - torch.logsumexp(remaining, dim=1)
            step_log_prob.append(step.masked_fill(~drawn[:, slot], 0.0))
            remaining = remaining.scatter(1, column, float("-inf"))
        steps = torch.stack(step_log_prob, 1) if step_log_prob else log_g.new_zeros(len(ids), 0)
        false_negative = drawn & _is_positive(request, adv_ids)
        exclusions = request.exclusions()
        for row in range(request.batch_size):
            exclusions[row] |= set(adv_ids[row][drawn[row]].tolist())
        fixed = self.fixed.sample(
            replace(request, num_negatives=k_fixed, positives=[e - {-1} for e in exclusions])
        )
        fixed_ids, fixed_valid, _ = take_first(fixed.ids, fixed.valid, k_fixed)
        out_ids = torch.cat([adv_ids.cpu(), fixed_ids.cpu()], dim=1)
        valid = torch.cat([(drawn & ~false_negative).cpu(), fixed_valid.cpu()], dim=1)
        adversarial = torch.zeros_like(valid)
        adversarial[:, : k - k_fixed] = drawn.cpu()
        fn_all = torch.zeros_like(valid)
        fn_all[:, : k - k_fixed] = false_negative.cpu()
        slot_log_g = _lookup(out_ids, ids.cpu(), log_g.cpu())
        greedy = ids.gather(1, log_g.argmax(dim=1, keepdim=True)).squeeze(1)
        fixed_log_q = fixed.log_q if fixed.log_q is not None else None
        log_q = None
        if fixed_log_q is not None:
            log_q = torch.cat(
                [torch.zeros_like(adv_ids, dtype=torch.float32), fixed_log_q.cpu()], 1
            )
        return AdversarialNegatives(
            ids=out_ids.masked_fill(~valid, -1),
            valid=valid,
            log_q=log_q,
            adversarial=adversarial,
            false_negative=fn_all,
            log_g=slot_log_g,
            step_log_prob=steps,
            greedy_ids=greedy.masked_fill(~support.any(dim=1), -1),
        )

    def entropy(self, request: SamplingRequest) -> Tensor:
        """H(g_θ(·|x)) per mention [B] over the candidate support."""
        _, log_g, support = self.generator_log_probs(request)
        return -(log_g.exp() * log_g.masked_fill(~support, 0.0)).sum(dim=1)

    def generator_loss(
        self,
        request: SamplingRequest,
        draw: AdversarialNegatives,
        rewards: Tensor,
        baseline: Tensor | None = None,
    ) -> Tensor:
        """REINFORCE loss for θ (minimise it): −(1−λ)·E[(r − b)·log g_θ] + entropy penalty.

        Args:
            rewards: [B, K] discriminator loss of each negative (detached), e.g.
                :func:`pairwise_reward`; false negatives get −``false_negative_penalty``.
            baseline: [B] self-critical baseline, the reward of ``draw.greedy_ids``
                (required when ``self_critical``).

        The entropy term is ``entropy_weight · max(0, log k − H(g))``: the regulariser of
        eq. 8, R_ent = min(0, c − H), read as the paper intends (zero once the generator spreads
        its mass over more than k candidates, a penalty below that).
        """
        rewards = rewards.detach().float().cpu()
        rewards = torch.where(draw.false_negative, -self.false_negative_penalty, rewards)
        if self.self_critical:
            if baseline is None:
                raise ValueError(f"{__file__}: self_critical needs the baseline reward of y*")
            rewards = rewards - baseline.detach().float().cpu().unsqueeze(1)
        k_adv = draw.step_log_prob.shape[1]
        adv = draw.adversarial[:, :k_adv]
        policy = -(rewards[:, :k_adv] * draw.step_log_prob.cpu() * adv).sum(dim=1)
        if self.off_policy and draw.log_q is not None:
            fixed = slice(k_adv, None)
            log_g = draw.log_g[:, fixed]
            usable = draw.valid[:, fixed] & torch.isfinite(log_g)
            weight = (log_g.detach() - draw.log_q[:, fixed]).exp().masked_fill(~usable, 0.0)
            safe_log_g = log_g.masked_fill(~usable, 0.0)
            policy = policy - (weight * rewards[:, fixed] * safe_log_g).sum(dim=1)
        penalty = (math.log(self.entropy_k) - self.entropy(request).cpu()).clamp_min(0.0)
        return (1.0 - self.mix) * policy.mean() + self.entropy_weight * penalty.mean()


def pairwise_reward(positive_scores: Tensor, negative_scores: Tensor) -> Tensor:
    """Discriminator loss of each negative alone, softplus(s(x,y⁻) − s(x,y⁺)) [B, K]: the
    reward l_ω(x, y⁺, y⁻) of eq. 6 (higher = harder negative), detached."""
    return F.softplus(negative_scores - positive_scores.unsqueeze(1)).detach()


def _is_positive(request: SamplingRequest, ids: Tensor) -> Tensor:
    return excluded(request, ids) & (ids >= 0)


def _lookup(ids: Tensor, candidate_ids: Tensor, values: Tensor) -> Tensor:
    """values[b, n] where candidate_ids[b, n] == ids[b, k]; -inf where absent."""
    match = ids.unsqueeze(2) == candidate_ids.unsqueeze(1)
    picked = torch.where(
        match, values.unsqueeze(1), torch.full_like(values.unsqueeze(1), float("-inf"))
    )
    return picked.amax(dim=2)


#: Adam's step size for the generator: one step after each draw on a model of a sharpness and a
#: bias per entity moves it within tens of steps (tests/test_pipeline_samplers.py).
GENERATOR_LEARNING_RATE = 1e-2


class AdversarialTraining:
    """ACE's sampler and the optimiser of its generator, as the trainer runs them (module
    docstring). A recipe trains it at ACE's settings (λ = ``mix`` 0.5, the entropy floor log 4,
    the false-negative penalty 10, the self-critical baseline, no off-policy term; the
    :class:`AdversarialSampler` defaults), the only ones measured here (BENCHMARKS.md, the
    WordNet comparison); code may give others."""

    def __init__(
        self,
        num_entities: int,
        mix: float = 0.5,
        learning_rate: float = GENERATOR_LEARNING_RATE,
    ) -> None:
        self.sampler = AdversarialSampler(num_entities, mix=mix)
        self.optimizer = torch.optim.Adam(self.sampler.parameters(), lr=learning_rate)

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


SPEC = SamplerSpec(
    name="adversarial",
    sampler=AdversarialSampler,
    candidates="index",
    scores_online=True,
    resumes_exactly=False,
    build=lambda negatives, num_entities: AdversarialTraining(num_entities),
)
