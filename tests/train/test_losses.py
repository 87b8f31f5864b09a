"""The learner's math on cases small enough to compute by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tempering.train.losses import (  # noqa: E402
    aggregate,
    decoupled_ppo_loss,
    kl_k2,
    kl_k3,
    ppo_clip_loss,
    token_logprobs,
)


def test_token_logprobs_are_the_tempered_log_softmax_of_the_previous_position() -> None:
    logits = torch.tensor([[[1.0, 2.0, 0.0], [0.5, -1.0, 3.0], [9.0, 9.0, 9.0]]])  # (1, 3, 3)
    ids = torch.tensor([[2, 1, 0]])

    def by_hand(row: list[float], i: int, temperature: float) -> float:
        z = sum(math.exp(x / temperature) for x in row)
        return math.log(math.exp(row[i] / temperature) / z)

    for temperature in (1.0, 0.5, 2.0):
        out = token_logprobs(logits, ids, temperature)
        assert out.shape == (1, 3)
        expected = [0.0, by_hand([1.0, 2.0, 0.0], 1, temperature),
                    by_hand([0.5, -1.0, 3.0], 0, temperature)]
        assert out[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_ppo_clip_by_hand_both_signs_and_clip_higher() -> None:
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    logprobs = old + ratios.log()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    # r=1.5,A=+1 -> clipped to 1.2; r=0.5,A=+1 -> 0.5; r=1.1,A=-1 -> -1.1; r=0.7,A=-1 -> -0.8
    loss, stats = ppo_clip_loss(logprobs, old, advantages, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1 + 0.8) / 4)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx(0.95)
    high, stats = ppo_clip_loss(logprobs, old, advantages, mask, clip_eps=0.2, clip_eps_high=0.6)
    assert high.item() == pytest.approx((-1.5 - 0.5 + 1.1 + 0.8) / 4)  # 1.5 is inside 1 + 0.6
    assert stats["clip_frac"].item() == pytest.approx(0.25)


def test_masked_tokens_contribute_nothing_and_get_zero_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(2, 5, generator=gen)).requires_grad_()
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 0]])
    old = -torch.rand(2, 5, generator=gen)
    advantages = torch.tensor([0.7, -1.3])
    garbage = old.masked_fill(mask == 0, 80.0)  # exp(80 - x) would be inf if it were used
    losses = [
        ppo_clip_loss(logprobs, garbage, advantages, mask)[0],
        decoupled_ppo_loss(logprobs, garbage, garbage.masked_fill(mask == 0, -90.0),
                           advantages, mask, is_cap=None)[0],
        kl_k3(logprobs, garbage, mask)[0],
        kl_k2(logprobs, garbage, mask)[0],
    ]
    clean = [
        ppo_clip_loss(logprobs, old, advantages, mask)[0],
        decoupled_ppo_loss(logprobs, old, old, advantages, mask, is_cap=None)[0],
        kl_k3(logprobs, old, mask)[0],
        kl_k2(logprobs, old, mask)[0],
    ]
    for dirty, expected in zip(losses, clean, strict=True):
        assert torch.isfinite(dirty) and dirty.item() == pytest.approx(expected.item())
        (grad,) = torch.autograd.grad(dirty, logprobs)
        assert torch.all(grad[mask == 0] == 0)
        assert torch.any(grad[mask == 1] != 0)


def test_decoupled_equals_ppo_when_prox_is_the_behaviour_policy() -> None:
    gen = torch.Generator().manual_seed(1)
    prox = -torch.rand(3, 6, generator=gen) * 3
    logprobs = (prox + 0.4 * torch.randn(3, 6, generator=gen)).requires_grad_()
    advantages = torch.randn(3, generator=gen)
    mask = (torch.rand(3, 6, generator=gen) > 0.3).long()
    mask[:, 0] = 0
    for agg in ("token-mean", "seq-mean-token-mean"):
        ppo, ppo_stats = ppo_clip_loss(logprobs, prox, advantages, mask, 0.2, 0.28,
                                       loss_agg=agg)
        dec, dec_stats = decoupled_ppo_loss(logprobs, prox, prox, advantages, mask, 0.2, 2.0,
                                            0.28, loss_agg=agg)
        assert dec.item() == pytest.approx(ppo.item(), abs=1e-7)
        assert ppo_stats["clip_frac"].item() > 0  # the case exercises the clip
        assert dec_stats["is_weight_mean"].item() == 1.0
        assert dec_stats["is_truncated_frac"].item() == 0.0
        assert torch.allclose(torch.autograd.grad(dec, logprobs)[0],
                              torch.autograd.grad(ppo, logprobs)[0])


def test_truncation_caps_the_behaviour_weight() -> None:
    prox = torch.tensor([[0.0, -1.0, -2.0]])
    behav = prox - torch.tensor([[0.0, math.log(3.0), math.log(0.5)]])  # weights 3 and 0.5
    logprobs = prox.clone().requires_grad_()  # ratio 1: no clipping
    mask = torch.tensor([[0, 1, 1]])
    advantages = torch.tensor([1.0])
    capped, stats = decoupled_ppo_loss(logprobs, prox, behav, advantages, mask, is_cap=2.0)
    assert capped.item() == pytest.approx(-(2.0 + 0.5) / 2)
    assert stats["is_weight_mean"].item() == pytest.approx(1.25)
    assert stats["is_truncated_frac"].item() == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(capped, logprobs)
    assert grad[0].tolist() == pytest.approx([0.0, -1.0, -0.25])  # -w / tokens
    free, stats = decoupled_ppo_loss(logprobs, prox, behav, advantages, mask, is_cap=None)
    assert free.item() == pytest.approx(-(3.0 + 0.5) / 2)
    assert stats["is_truncated_frac"].item() == 0.0


def test_kl_k3_by_hand() -> None:
    logprobs = torch.tensor([[0.0, math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[5.0, math.log(0.25), math.log(0.2)]])
    mask = torch.tensor([[0, 1, 1]])
    kl, stats = kl_k3(logprobs, ref, mask)
    k3 = 0.5 - math.log(0.5) - 1  # exp(log r) - log r - 1 with r = 0.25 / 0.5
    assert kl.item() == pytest.approx(k3 / 2)
    assert stats["kl"].item() == pytest.approx(k3 / 2)
    assert kl_k3(ref, ref, mask)[0].item() == 0.0


def test_kl_k2_by_hand_and_its_gradient_stays_bounded_where_k3s_explodes() -> None:
    logprobs = torch.tensor([[0.0, math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[5.0, math.log(0.25), math.log(0.2)]])
    mask = torch.tensor([[0, 1, 1]])
    kl, stats = kl_k2(logprobs, ref, mask)
    assert kl.item() == pytest.approx(0.5 * math.log(2) ** 2 / 2)
    assert stats["kl"].item() == pytest.approx(kl.item())
    # a stale token the policy has made 1e-6 likely while the reference gives it 0.5
    logp = torch.tensor([[0.0, math.log(1e-6)]], requires_grad=True)
    liked = torch.tensor([[0.0, math.log(0.5)]])
    one = torch.tensor([[0, 1]])
    (k2_grad,) = torch.autograd.grad(kl_k2(logp, liked, one)[0], logp)
    (k3_grad,) = torch.autograd.grad(kl_k3(logp, liked, one)[0], logp)
    assert abs(k2_grad[0, 1].item()) == pytest.approx(math.log(0.5 / 1e-6), rel=1e-4)  # ~13
    assert abs(k3_grad[0, 1].item()) > 1e5  # 1 - 0.5 / 1e-6


def test_aggregation_and_denominators_that_split_a_batch() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    # Micro-batches of one row each, divided by the whole batch's count, sum to the whole.
    rows = [(values[i:i + 1], mask[i:i + 1]) for i in range(2)]
    assert sum(aggregate(v, m, "token-mean", 4).item() for v, m in rows) == pytest.approx(2.5)
    assert sum(aggregate(v, m, "seq-mean-token-mean", 2).item()
               for v, m in rows) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="loss_agg='sum'"):
        aggregate(values, mask, "sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_sgd_step_moves_the_sampled_tokens_with_the_advantage(sign: float) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 6, 11, generator=gen).requires_grad_()  # (B, T, V)
    ids = torch.randint(0, 11, (1, 6), generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    before = token_logprobs(logits, ids).detach()
    loss, _ = decoupled_ppo_loss(token_logprobs(logits, ids), before, before,
                                 torch.tensor([sign]), mask)
    loss.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad  # one plain SGD step
    moved = (token_logprobs(logits, ids).detach() - before)[mask == 1]
    assert torch.all(moved * sign > 0), moved
