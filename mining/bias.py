"""Gradient-bias diagnostics of NCE negatives (Zhang & Stratos (2021) Theorem 3.1, §6.4, Appendix C).

For a model whose label space fits a full softmax, the cross-entropy gradient ∇J_CE (eq. 2) is
exact and the expected NCE gradient E[∇J_NCE] (eq. 5) is estimated by averaging many negative
draws; Theorem 3.1 says their difference vanishes when the negative distribution matches the
model, which hard negatives (eq. 8) approach as the model improves. Both gradients are linear in
the logits' gradients, so each draw only costs a softmax over 1 + K candidates: the per-draw
logit gradients are averaged first and back-propagated once.

:func:`run_synthetic_experiment` is §6.4's experiment (Figure 1), used by ``hnce bias``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from hnce.mining.samplers.base import NegativeSampler, SamplingRequest
from hnce.mining.samplers.hard import HardSampler
from hnce.mining.samplers.mixed import MixedSampler
from hnce.mining.samplers.random import RandomSampler
from hnce.progress import progress_bar


def default_samplers(hard_fraction: float = 0.5) -> dict[str, NegativeSampler]:
    """random (uniform), hard (eq. 8 over the whole label space) and mixed-p."""
    return {
        "random": RandomSampler(),
        "hard": HardSampler(),
        "mixed": MixedSampler(hard_fraction=hard_fraction),
    }


@dataclass
class BiasEstimate:
    """One measurement: exact CE loss, Monte Carlo NCE losses and gradient-bias norms."""

    ce_loss: float
    nce_loss: dict[str, float]
    bias_norm: dict[str, float]
    ce_gradient_norm: float


def expected_nce_logit_gradient(
    logits: Tensor,
    labels: Tensor,
    sampler: NegativeSampler,
    num_negatives: int,
    draws: int,
    generator: torch.Generator | None = None,
    positives: list[set[int]] | None = None,
) -> tuple[Tensor, float]:
    """E over ``draws`` negative draws of ∂J_NCE/∂logits [n, L] (batch mean), and mean J_NCE.

    The sampler sees the full-softmax logits as whole-catalogue ``candidate_scores`` (so hard
    negatives are drawn exactly from the model, eq. 8). Invalid negatives leave the softmax.
    """
    n, num_labels = logits.shape
    scores = logits.detach().repeat(draws, 1)
    gold = labels.repeat(draws)
    positive_sets = positives if positives is not None else [{int(y)} for y in labels.tolist()]
    sampled = sampler.sample(
        SamplingRequest(
            gold=gold,
            positives=positive_sets * draws,
            num_entities=num_labels,
            num_negatives=num_negatives,
            candidate_scores=scores,
            generator=generator,
        )
    )
    candidates = torch.cat([gold.unsqueeze(1), sampled.ids.clamp_min(0)], dim=1)
    valid = torch.cat([torch.ones_like(gold, dtype=torch.bool).unsqueeze(1), sampled.valid], 1)
    candidate_logits = scores.gather(1, candidates).masked_fill(~valid, float("-inf"))
    probs = torch.softmax(candidate_logits, dim=1)
    loss = -torch.log_softmax(candidate_logits, dim=1)[:, 0].mean().item()
    grad_candidates = probs.clone()
    grad_candidates[:, 0] -= 1.0
    grad = torch.zeros_like(scores).scatter_add_(1, candidates, grad_candidates * valid)
    return grad.view(draws, n, num_labels).mean(dim=0) / n, loss


def gradient_bias(
    model: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    samplers: Mapping[str, NegativeSampler] | None = None,
    num_negatives: int = 4,
    draws: int = 10,
    generator: torch.Generator | None = None,
) -> BiasEstimate:
    """‖E[∇_θ J_NCE] − ∇_θ J_CE‖ per sampler on one batch (Theorem 3.1).

    Args:
        model: maps ``inputs`` to logits over the whole label space [n, L].
        inputs: a batch the model accepts; labels: LongTensor [n] of gold labels.
        samplers: name → sampler (default random / hard / mixed-50).
        num_negatives: K; draws: Monte Carlo draws averaged for E[∇J_NCE].
    """
    samplers = default_samplers() if samplers is None else samplers
    params = [p for p in model.parameters() if p.requires_grad]
    logits = model(inputs)
    n = logits.shape[0]
    ce_grad = torch.softmax(logits.detach(), dim=1)
    ce_grad[torch.arange(n), labels] -= 1.0
    ce_grad /= n
    ce_loss = nn.functional.cross_entropy(logits.detach(), labels).item()
    nce_loss: dict[str, float] = {}
    bias: dict[str, float] = {}
    for name, sampler in samplers.items():
        nce_grad, nce_loss[name] = expected_nce_logit_gradient(
            logits, labels, sampler, num_negatives, draws, generator
        )
        difference = torch.autograd.grad(
            (logits * (nce_grad - ce_grad)).sum(), params, retain_graph=True, allow_unused=True
        )
        bias[name] = _norm(difference)
    ce_norm = _norm(torch.autograd.grad((logits * ce_grad).sum(), params, allow_unused=True))
    return BiasEstimate(ce_loss, nce_loss, bias, ce_norm)


def _norm(gradients: Sequence[Tensor | None]) -> float:
    """Euclidean norm over every parameter's gradient; a parameter the logits do not use (e.g.
    BERT's pooler under mean pooling) contributes 0."""
    return math.sqrt(sum(float(g.pow(2).sum()) for g in gradients if g is not None))


@dataclass
class SyntheticBiasConfig:
    """§6.4: a low-entropy population over ``num_labels`` labels, a one-ReLU-layer network
    trained by cross entropy on ``batch_size`` iid samples per update, NCE with
    ``num_negatives`` negatives estimated from ``draws`` Monte Carlo simulations."""

    num_labels: int = 1000
    input_dim: int = 16
    num_contexts: int = 100
    hidden_dim: int = 128
    population_scale: float = 20.0  # larger = peakier p(y|x), lower entropy
    updates: int = 500
    batch_size: int = 128
    num_negatives: int = 4
    draws: int = 10
    hard_fraction: float = 0.5
    learning_rate: float = 1e-2
    measure_every: int = 5
    seed: int = 0


@dataclass
class SyntheticBiasResult:
    """Per-measured-update series (Figure 1): losses (``ce`` and each sampler's NCE) and bias
    norms per sampler, plus the population's mean conditional entropy."""

    config: SyntheticBiasConfig
    population_entropy: float
    updates: list[int] = field(default_factory=list)
    loss: dict[str, list[float]] = field(default_factory=dict)
    bias_norm: dict[str, list[float]] = field(default_factory=dict)
    ce_gradient_norm: list[float] = field(default_factory=list)
    divergence: list[float] = field(default_factory=list)

    def summary(self, window: int = 10) -> dict[str, dict[str, float]]:
        """Mean of the first and last ``window`` measurements of every series."""
        out: dict[str, dict[str, float]] = {}
        for kind, series in (("loss", self.loss), ("bias_norm", self.bias_norm)):
            for name, values in series.items():
                out[f"{kind}/{name}"] = {
                    "first": sum(values[:window]) / len(values[:window]),
                    "last": sum(values[-window:]) / len(values[-window:]),
                }
        return out

    def to_json(self, path: Path) -> None:
        payload = asdict(self)
        payload["summary"] = self.summary()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1) + "\n")


class SyntheticPopulation:
    """``num_contexts`` inputs x_c ~ N(0, I_d) drawn once, uniform over them; p(y|x) =
    softmax(scale · A x) with unit-norm random rows of A: a peaky (low-entropy) conditional over
    the labels, as §6.4 asks for, that the small network can fit (so hard-NCE's bias can be
    watched vanishing as the model approaches the population, Theorem 3.2)."""

    def __init__(self, config: SyntheticBiasConfig, generator: torch.Generator) -> None:
        weights = torch.randn(config.num_labels, config.input_dim, generator=generator)
        self.weights = config.population_scale * weights / weights.norm(dim=1, keepdim=True)
        self.contexts = torch.randn(config.num_contexts, config.input_dim, generator=generator)
        self.probs = torch.softmax(self.logits(self.contexts), dim=1)

    def logits(self, inputs: Tensor) -> Tensor:
        return inputs @ self.weights.T

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        context = torch.randint(self.contexts.shape[0], (n,), generator=generator)
        labels = torch.multinomial(self.probs[context], 1, generator=generator).squeeze(1)
        return self.contexts[context], labels

    def entropy(self) -> float:
        """Mean conditional entropy H(p(·|x)) in nats."""
        return float(-(self.probs * self.probs.clamp_min(1e-30).log()).sum(dim=1).mean())

    def divergence(self, model: nn.Module) -> float:
        """Mean KL(p(·|x) ‖ p_θ(·|x)) over the contexts."""
        with torch.no_grad():
            log_model = torch.log_softmax(model(self.contexts), dim=1)
        log_pop = self.probs.clamp_min(1e-30).log()
        return float((self.probs * (log_pop - log_model)).sum(dim=1).mean())


def feed_forward(config: SyntheticBiasConfig) -> nn.Module:
    """The §6.4 model: one ReLU hidden layer, logits over all labels."""
    return nn.Sequential(
        nn.Linear(config.input_dim, config.hidden_dim),
        nn.ReLU(),
        nn.Linear(config.hidden_dim, config.num_labels),
    )


def run_synthetic_experiment(config: SyntheticBiasConfig | None = None) -> SyntheticBiasResult:
    """Train the feed-forward model by exact cross entropy and, every ``measure_every``
    updates, record CE, the Monte Carlo NCE loss and the gradient-bias norm of random, hard
    and mixed negatives on that update's batch (Zhang & Stratos (2021) §6.4, Figure 1)."""
    config = config or SyntheticBiasConfig()
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    population = SyntheticPopulation(config, generator)
    model = feed_forward(config)
    optimiser = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    samplers = default_samplers(config.hard_fraction)
    result = SyntheticBiasResult(config, population.entropy())
    result.loss = {"ce": [], **{name: [] for name in samplers}}
    result.bias_norm = {name: [] for name in samplers}
    for update in progress_bar(range(config.updates), desc="bias (§6.4)"):
        inputs, labels = population.sample(config.batch_size, generator)
        if update % config.measure_every == 0 or update == config.updates - 1:
            estimate = gradient_bias(
                model, inputs, labels, samplers, config.num_negatives, config.draws, generator
            )
            result.updates.append(update)
            result.loss["ce"].append(estimate.ce_loss)
            for name in samplers:
                result.loss[name].append(estimate.nce_loss[name])
                result.bias_norm[name].append(estimate.bias_norm[name])
            result.ce_gradient_norm.append(estimate.ce_gradient_norm)
            result.divergence.append(population.divergence(model))
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimiser.step()
    return result


def plot_figure1(result: SyntheticBiasResult, path: Path) -> None:
    """Figure 1's two panels: loss per update (CE and each NCE) and bias norm per update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"ce": "CE", "random": "random-NCE", "hard": "hard-NCE", "mixed": "mixed-NCE"}
    colours = {"ce": "C0", "random": "C1", "hard": "C2", "mixed": "C3"}
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, values in result.loss.items():
        left.plot(
            result.updates, values, label=labels.get(name, name), color=colours.get(name), lw=1
        )
    left.set(xlabel="update", ylabel="loss", title="Loss")
    left.legend()
    for name, values in result.bias_norm.items():
        right.plot(
            result.updates, values, label=labels.get(name, name), color=colours.get(name), lw=1
        )
    right.set(xlabel="update", ylabel="‖E[∇J_NCE] − ∇J_CE‖", title="Gradient bias norm")
    right.set_yscale("log")
    right.legend()
    config = result.config
    figure.suptitle(
        f"{config.num_labels} labels (entropy {result.population_entropy:.2f} nats), "
        f"{config.batch_size} samples/update, {config.num_negatives} negatives, "
        f"{config.draws} draws"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
