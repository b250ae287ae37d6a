"""The clipped policy loss: hand-computed values, both clip sides, packing, and normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from slime_hydra.train.step.loss import clipped_policy_loss, policy_loss, token_log_probs


def _one_token(ratio: float, advantage: float) -> tuple[float, float, float]:
    """Loss, d loss / d logp and clipfrac of a single loss token with the given ratio."""
    log_probs = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    loss, num, metrics = clipped_policy_loss(
        log_probs,
        torch.zeros(1, dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1),
        normalizer=1,
    )
    loss.backward()
    assert num == 1
    return loss.item(), log_probs.grad.item(), metrics["clipfrac"].item()


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "grad", "clipfrac"),
    [
        (1.1, 2.0, -2.2, -2.2, 0.0),  # inside [0.8, 1.28]: plain -A·r
        (1.5, 1.0, -1.28, 0.0, 1.0),  # A>0, above 1+eps_high: clipped at 1.28, no gradient
        (1.5, -1.0, 1.5, 1.5, 0.0),  # A<0, above: the unclipped term is larger and stays
        (0.5, 1.0, -0.5, -0.5, 0.0),  # A>0, below 1-eps: unclipped term is larger and stays
        (0.5, -1.0, 0.8, 0.0, 1.0),  # A<0, below: clipped at 0.8, no gradient
        (1.25, 1.0, -1.25, -1.25, 0.0),  # between 1+eps and 1+eps_high: the high bound is 0.28
    ],
)
def test_single_token_clipping_both_sides(
    ratio: float, advantage: float, loss: float, grad: float, clipfrac: float
) -> None:
    got_loss, got_grad, got_clipfrac = _one_token(ratio, advantage)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)
    assert got_clipfrac == clipfrac


def test_mask_and_normalizer() -> None:
    log_probs = torch.log(torch.tensor([1.0, 1.5, 2.0, 0.9]))
    old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, -1.0, 3.0])
    mask = torch.tensor([1, 1, 0, 1])
    loss, num, metrics = clipped_policy_loss(log_probs, old, adv, mask, normalizer=10)
    # token 0: -1·1; token 1: clipped -1.28; token 2 masked; token 3: -3·0.9
    assert loss.item() == pytest.approx((-1.0 - 1.28 - 2.7) / 10)
    assert num == 3
    assert metrics["clipfrac"].item() == pytest.approx(1 / 10)
    assert metrics["ratio"].item() == pytest.approx((1.0 + 1.5 + 0.9) / 10)
    assert metrics["approx_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.9)) / 10)


def test_normalizer_must_be_positive() -> None:
    with pytest.raises(ValueError, match="normalizer"):
        clipped_policy_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), torch.ones(2), 0)


def test_token_log_probs_read_each_label_off_its_own_position() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 6, 7)
    labels = torch.randint(0, 7, (1, 6))
    expected = [torch.log_softmax(logits[0, t], -1)[labels[0, t]].item() for t in range(6)]
    assert token_log_probs(logits, labels).tolist() == pytest.approx(expected, abs=1e-6)


def _random_samples(num: int, vocab: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Per-sample leaf logits, labels, old log-probs, per-token advantage and a loss mask."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(num):
        length = int(torch.randint(2, 12, (1,), generator=gen))
        prompt = int(torch.randint(1, length, (1,), generator=gen))
        mask = torch.zeros(length)
        mask[prompt - 1 : -1] = 1  # positions whose label is a response token
        samples.append(
            {
                "logits": torch.randn(
                    length, vocab, generator=gen, dtype=torch.float64
                ).requires_grad_(),
                "labels": torch.randint(0, vocab, (length,), generator=gen),
                "old": -torch.rand(length, generator=gen, dtype=torch.float64) * 3,
                "adv": torch.randn(1, generator=gen, dtype=torch.float64).expand(length),
                "mask": mask,
            }
        )
    return samples


def _micro_batch_loss(samples: list[dict[str, torch.Tensor]], normalizer: int) -> torch.Tensor:
    """Pack the samples as one THD micro-batch and return its normalised loss."""
    loss, _, _ = policy_loss(
        torch.cat([s["logits"] for s in samples]).unsqueeze(0),
        torch.cat([s["labels"] for s in samples]),
        torch.cat([s["old"] for s in samples]),
        torch.cat([s["adv"] for s in samples]),
        torch.cat([s["mask"] for s in samples]),
        normalizer,
    )
    return loss


@pytest.mark.parametrize(
    "groups",
    [[[0], [1, 2], [3, 4, 5]], [[5, 0], [3], [1, 4, 2]], [[0], [1], [2], [3], [4], [5]]],
)
def test_micro_batch_split_changes_neither_loss_nor_gradients(groups: list[list[int]]) -> None:
    samples = _random_samples(6, vocab=11, seed=3)
    normalizer = int(sum(s["mask"].sum() for s in samples))

    whole = _micro_batch_loss(samples, normalizer)
    whole.backward()
    whole_grads = [s["logits"].grad.clone() for s in samples]
    for s in samples:
        s["logits"].grad = None

    total = 0.0
    for group in groups:  # one backward per micro-batch: gradients accumulate as in training
        loss = _micro_batch_loss([samples[i] for i in group], normalizer)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(whole.item(), rel=1e-12)
    for s, expected in zip(samples, whole_grads, strict=True):
        torch.testing.assert_close(s["logits"].grad, expected, rtol=1e-12, atol=1e-12)
