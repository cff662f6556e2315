"""The ppo_ewma policy loss: registration, config through verl's own instantiation, and its
reductions (Hilton et al. 2022 §2: with π_prox = μ the loss is verl's vanilla PPO clip)."""

import pytest
import torch
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

import verl_ext.losses.registration  # noqa: F401  (registers ppo_ewma)
from verl_ext.losses.config import PPOEWMAPolicyLossConfig
from verl_ext.losses.decoupled_ppo import decoupled_ppo_token_losses

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _actor_config(policy_loss: dict | None = None, **kw) -> ActorConfig:
    raw = {
        "_target_": "verl.workers.config.ActorConfig",
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        **kw,
    }
    if policy_loss is not None:
        raw["policy_loss"] = policy_loss
    return omega_conf_to_dataclass(OmegaConf.create(raw))


def _inputs(seed: int, bs: int = 8, length: int = 10):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, length, generator=g) * 3
    logp = (old + torch.randn(bs, length, generator=g) * 0.3).requires_grad_()
    adv = torch.randn(bs, length, generator=g)
    mask = torch.rand(bs, length, generator=g) > 0.2
    is_w = torch.rand(bs, length, generator=g) * 2
    return old, logp, adv, mask, is_w


def _call(name, config, old, logp, adv, mask, agg, is_w):
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=is_w,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


def test_registered_and_configured_through_target():
    cfg = _actor_config(
        {"_target_": "verl_ext.losses.config.PPOEWMAPolicyLossConfig", "variant": "kl", "imp_weight_cap": 100.0}
    )
    assert isinstance(cfg.policy_loss, PPOEWMAPolicyLossConfig)
    assert (cfg.policy_loss.loss_mode, cfg.policy_loss.variant, cfg.policy_loss.imp_weight_cap) == (
        "ppo_ewma",
        "kl",
        100.0,
    )
    with pytest.raises(InstantiationException):  # verl's own dataclass still rejects the keys: hence the subclass
        _actor_config({"_target_": "verl.workers.config.PolicyLossConfig", "variant": "kl"})
    with pytest.raises(ValueError, match="policy_loss.variant"):
        PPOEWMAPolicyLossConfig(variant="nope")
    with pytest.raises(ValueError, match="imp_weight_cap"):
        PPOEWMAPolicyLossConfig(imp_weight_cap=0.5)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("global_info", [{}, {"dp_size": 2, "batch_num_tokens": 100, "global_batch_size": 16}])
def test_equals_verl_vanilla_bit_for_bit(agg, with_is, global_info):
    old, logp, adv, mask, is_w = _inputs(seed=len(agg))
    is_w = is_w if with_is else None
    results = {}
    for name, policy_loss in [
        ("vanilla", None),
        ("ppo_ewma", {"_target_": "verl_ext.losses.config.PPOEWMAPolicyLossConfig"}),
    ]:
        cfg = _actor_config(policy_loss)
        cfg.global_batch_info.update(global_info)
        results[name] = _call(name, cfg, old, logp, adv, mask, agg, is_w)
    (loss_v, grad_v, m_v), (loss_e, grad_e, m_e) = results["vanilla"], results["ppo_ewma"]
    assert torch.equal(loss_v, loss_e)
    assert torch.equal(grad_v, grad_e)
    for key in m_v:
        assert m_e[key] == pytest.approx(m_v[key], rel=1e-6, abs=1e-7)


def test_plain_policy_loss_config_gives_the_defaults():
    old, logp, adv, mask, is_w = _inputs(seed=3)
    cfg = _actor_config()  # loss_mode vanilla config object, but ppo_ewma called: defaults apply
    loss_v, grad_v, _ = _call("vanilla", cfg, old, logp, adv, mask, "token-mean", is_w)
    loss_e, grad_e, _ = _call("ppo_ewma", cfg, old, logp, adv, mask, "token-mean", is_w)
    assert torch.equal(loss_v, loss_e) and torch.equal(grad_v, grad_e)


def test_cap_equals_clipping_the_behaviour_probability():
    # Original PPO-EWMA: π_behav is raised to π_θ/cap where π_θ/π_behav > cap; IS = π_prox/π_behav'.
    old, logp, adv, _mask, _ = _inputs(seed=4)
    g = torch.Generator().manual_seed(5)
    mu = old - torch.rand(old.shape, generator=g) * 6  # some total ratios far above the cap
    cap = 20.0
    out = decoupled_ppo_token_losses(logp, old, adv, torch.exp(old - mu), 0.2, 0.2, 3.0, imp_weight_cap=cap)
    mu_capped = torch.maximum(mu, logp.detach() - torch.log(torch.tensor(cap)))
    torch.testing.assert_close(out.is_weights, torch.exp(old - mu_capped))
    assert out.capped.any() and (~out.capped).any()
    total = torch.exp(logp.detach() - old) * out.is_weights
    assert (total <= cap * (1 + 1e-5)).all()


def test_kl_variant_reductions():
    old, logp, adv, _mask, is_w = _inputs(seed=6)
    # c = 0 and no clipping: the KL variant is the unclipped decoupled PG, i.e. clip with ε, c → ∞
    kl = decoupled_ppo_token_losses(logp, old, adv, is_w, 0.2, 0.2, 3.0, variant="kl", kl_coef=0.0)
    wide = decoupled_ppo_token_losses(logp, old, adv, is_w, 1.0, 1e9, 1e9, variant="clip")
    torch.testing.assert_close(kl.losses, wide.losses)
    # the penalty is c·½(log r)² on top
    pen = decoupled_ppo_token_losses(logp, old, adv, is_w, 0.2, 0.2, 3.0, variant="kl", kl_coef=0.5)
    torch.testing.assert_close(pen.losses - kl.losses, 0.25 * (logp - old).square())


def test_metrics_report_masking_and_lag():
    old, logp, adv, mask, is_w = _inputs(seed=7)
    is_w = torch.where(torch.rand(is_w.shape, generator=torch.Generator().manual_seed(8)) < 0.25, 0.0, is_w)
    cfg = _actor_config({"_target_": "verl_ext.losses.config.PPOEWMAPolicyLossConfig", "imp_weight_cap": 1.5})
    _, _, m = _call("ppo_ewma", cfg, old, logp, adv, mask, "token-mean", is_w)
    assert m["actor/ppo_ewma/is_masked_frac"] == pytest.approx(float((is_w == 0)[mask].float().mean()), rel=1e-6)
    assert m["actor/ppo_ewma/prox_lag"] == pytest.approx(float((logp.detach() - old).abs()[mask].mean()), rel=1e-5)
    assert 0.0 < m["actor/ppo_ewma/is_cap_frac"] < 1.0
