"""The log-linear proxy is a widened clip of the total ratio (its interpolation identity,
verl_ext/old_logits/loglinear.py), checked through the ppo_ewma loss."""

import pytest
import torch

from verl_ext.losses.decoupled_ppo import decoupled_ppo_token_losses
from verl_ext.old_logits.loglinear import (
    loglinear_alpha,
    loglinear_proxy,
    widened_clip_bounds,
)

EPS_LOW, EPS_HIGH, CLIP_C = 0.2, 0.28, 3.0


def _inputs(seed=0, shape=(16, 12)):
    g = torch.Generator().manual_seed(seed)
    mu = -torch.rand(shape, generator=g) * 4
    log_pi = (mu + torch.randn(shape, generator=g) * 0.6).requires_grad_()
    versions = torch.randint(0, 9, shape, generator=g)
    adv = torch.randn(shape, generator=g)
    return mu, log_pi, versions, adv


def test_alpha_follows_areal_by_default():
    # AReaL compute_prox_logp_approximations: v_theta = the trainer's version n, v_proximal = n - 1,
    # alpha = (v_proximal - v_behave) / (v_theta - v_behave), 0 where v_theta - v_behave <= 0,
    # clamped to [0, 1]; unversioned tokens (-1) get 0.
    n = 8
    versions = torch.tensor([[8, 7, 6, 5, 4, 0, -1]])
    areal = torch.tensor([[0.0, 0.0, 1 / 2, 2 / 3, 3 / 4, 7 / 8, 0.0]])
    torch.testing.assert_close(loglinear_alpha(versions, n), areal)
    # the other convention: the trainer's weights are the proxy, pi_theta is one version ahead
    ahead = torch.tensor([[0.0, 1 / 2, 2 / 3, 3 / 4, 4 / 5, 8 / 9, 0.0]])
    torch.testing.assert_close(loglinear_alpha(versions, n, proximal_version="current"), ahead)
    with pytest.raises(ValueError, match="loglinear.proximal_version"):
        loglinear_alpha(versions, n, proximal_version="next")


@pytest.mark.parametrize("proximal_version", ["previous", "current"])
def test_log_ratio_identity(proximal_version):
    mu, log_pi, versions, _ = _inputs()
    alpha = loglinear_alpha(versions, 8, proximal_version)
    prox = loglinear_proxy(mu, log_pi.detach(), alpha)
    torch.testing.assert_close(log_pi.detach() - prox, (1 - alpha) * (log_pi.detach() - mu))


def test_equals_widened_total_ratio_clip():
    mu, log_pi, versions, adv = _inputs()
    alpha = loglinear_alpha(versions, 8)
    # first mini-batch: the proxy is built from the same π_θ the loss sees
    prox = loglinear_proxy(mu, log_pi.detach(), alpha)
    out = decoupled_ppo_token_losses(log_pi, prox, adv, torch.exp(prox - mu), EPS_LOW, EPS_HIGH, CLIP_C)
    (grad_proxy,) = torch.autograd.grad(out.losses.sum(), log_pi)

    # reference: dual-clip PPO on the total ratio R = π_θ/μ with per-token widened bounds, no IS weight
    lo, hi = widened_clip_bounds(EPS_LOW, EPS_HIGH, alpha)
    c_wide = CLIP_C ** (1.0 / (1.0 - alpha))
    total = torch.exp(log_pi - mu)
    unclipped, clipped = -adv * total, -adv * torch.minimum(torch.maximum(total, lo), hi)
    pess = torch.maximum(unclipped, clipped)
    ref = torch.where(adv < 0, torch.minimum(-adv * c_wide, pess), pess)
    (grad_ref,) = torch.autograd.grad(ref.sum(), log_pi)

    torch.testing.assert_close(grad_proxy, grad_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.clipped, torch.gt(clipped, unclipped))
    assert out.clipped.any() and (~out.clipped).any()  # both regimes exercised
