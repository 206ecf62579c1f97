"""Every loss against a hand computation; masks and the uniform-Q special case."""

from __future__ import annotations

import math

import torch

from hnce.mining.losses import (
    BinaryNCELoss,
    FocalLoss,
    NCELoss,
    NegativeSamplingLoss,
    SampledSoftmaxLoss,
    TripletLoss,
    build_loss,
)

POS = torch.tensor([2.0])
NEG = torch.tensor([[1.0, 0.0]])


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_nce_hand_value_and_mask() -> None:
    assert math.isclose(
        NCELoss()(POS, NEG).item(), math.log(1 + math.e**-1 + math.e**-2), rel_tol=1e-6
    )
    masked = NCELoss()(POS, torch.tensor([[1.0, 99.0]]), torch.tensor([[True, False]]))
    assert math.isclose(masked.item(), math.log(1 + math.e**-1), rel_tol=1e-6)
    none_valid = NCELoss()(POS, NEG, torch.zeros(1, 2, dtype=torch.bool))
    assert none_valid.item() == 0.0


def test_sampled_softmax_hand_value_and_uniform_q() -> None:
    loss = SampledSoftmaxLoss()(POS, NEG, None, torch.tensor([[-1.0, -2.0]]))
    assert math.isclose(loss.item(), math.log(3.0), rel_tol=1e-6)  # corrected logits 2, 2, 2
    # Uniform Q: eq. 10 is NCE with the gold shifted by the constant log q; the gradients with
    # respect to the scores are identical.
    log_q = -math.log(1000.0)
    pos = torch.tensor([0.3, -1.0], requires_grad=True)
    neg = torch.tensor([[0.1, 2.0, -0.5], [1.0, 0.0, 0.5]], requires_grad=True)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    sampled = SampledSoftmaxLoss()(pos, neg, valid, torch.full((2, 3), log_q))
    grads = torch.autograd.grad(sampled, (pos, neg))
    pos2, neg2 = pos.detach().clone().requires_grad_(), neg.detach().clone().requires_grad_()
    nce = NCELoss()(pos2 + log_q, neg2, valid)
    assert math.isclose(sampled.item(), nce.item(), rel_tol=1e-6)
    for a, b in zip(grads, torch.autograd.grad(nce, (pos2, neg2)), strict=True):
        assert torch.allclose(a, b)


def test_binary_nce_hand_value() -> None:
    log_q = torch.tensor([[-math.log(2.0)]])
    loss = BinaryNCELoss()(torch.tensor([1.0]), torch.tensor([[0.0]]), None, log_q)
    # k = 1, k·q = 1/2 for gold and noise: logits 1 + ln 2 and 0 + ln 2.
    expected = -math.log(sigmoid(1 + math.log(2))) - math.log(1 - sigmoid(math.log(2)))
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    uniform = BinaryNCELoss(num_entities=2)(torch.tensor([1.0]), torch.tensor([[0.0]]))
    assert math.isclose(uniform.item(), expected, rel_tol=1e-6)


def test_negative_sampling_triplet_focal_hand_values() -> None:
    ns = NegativeSamplingLoss()(
        torch.tensor([1.0]), torch.tensor([[0.0, 5.0]]), torch.tensor([[True, False]])
    )
    assert math.isclose(ns.item(), -math.log(sigmoid(1.0)) - math.log(0.5), rel_tol=1e-6)
    triplet = TripletLoss(margin=1.0)(
        torch.tensor([1.0]), torch.tensor([[0.5, -1.0, 3.0]]), torch.tensor([[True, True, False]])
    )
    assert math.isclose(triplet.item(), 0.25, rel_tol=1e-6)
    p = math.e**2 / (math.e**2 + math.e + 1)
    focal = FocalLoss(gamma=2.0)(POS, NEG)
    assert math.isclose(focal.item(), -((1 - p) ** 2) * math.log(p), rel_tol=1e-6)
    assert torch.allclose(FocalLoss(gamma=0.0)(POS, NEG), NCELoss()(POS, NEG))


def test_every_loss_builds_by_name_and_a_shape_mismatch_names_the_checking_file() -> None:
    for name in ("nce", "sampled-softmax", "binary-nce", "negative-sampling", "triplet", "focal"):
        assert isinstance(build_loss(name), torch.nn.Module)
    try:
        build_loss("nce")(torch.zeros(2), torch.zeros(3, 4))
    except ValueError as error:
        assert "losses/base.py" in str(error)
    else:
        raise AssertionError("expected ValueError")
