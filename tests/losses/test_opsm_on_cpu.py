"""Off-policy sequence masking (DeepSeek-V3.2, Eq. 9): the rule against a hand-computed example,
the gradient it removes from verl's vanilla loss and from ppo_ewma, its registration and config
through verl's own registry and instantiation, and verl's own ``ppo_loss`` handing it the rows'
rollout log-probs."""

import inspect

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

import verl_ext.losses.registration  # noqa: F401  (registers opsm and ppo_ewma)
from verl_ext.losses.behaviour import holding
from verl_ext.losses.config import OPSMPolicyLossConfig, PPOEWMAPolicyLossConfig
from verl_ext.losses.opsm import DELTA_KEY, check_delta, opsm_mask, opsm_stats
from verl_ext.losses.opsm_loss import BASE_LOSSES

OPSM = "verl_ext.losses.config.OPSMPolicyLossConfig"
EWMA = "verl_ext.losses.config.PPOEWMAPolicyLossConfig"


def _actor_config(policy_loss: dict | None = None) -> ActorConfig:
    raw = {"_target_": "verl.workers.config.ActorConfig", "strategy": "fsdp", "rollout_n": 1,
           "ppo_micro_batch_size_per_gpu": 1, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    if policy_loss is not None:
        raw["policy_loss"] = policy_loss
    return omega_conf_to_dataclass(OmegaConf.create(raw))


# ---------------------------------------------------------------- the rule, by hand (δ = 0.5)
# log π_θ = -2 everywhere (exact in float32); log μ = -2 + d with the per-token d below, so each
# sequence's KL (1/|o_i|) Σ_t log(μ/π_θ) is the mean of d over its response tokens.
DELTA = 0.5
D = torch.tensor([
    [1.0, 0.5, 0.0, 100.0],  # A<0, KL = 1.5/3 = 0.5 exactly = δ: kept (the paper's strict ">")
    [1.0, 0.2, 9.0, 9.0],    # A<0, KL = 0.6 > δ: masked
    [0.8, 0.6, -10.0, -10.0],  # A<0, KL = 0.7 > δ: masked; with its padding counted it would be -4.65: kept
    [3.0, 3.0, 3.0, 3.0],    # A>0, KL = 3: kept whatever the KL
    [0.1, 0.1, 0.1, 0.1],    # A<0, KL = 0.1 <= δ: kept
    [3.0, 3.0, 3.0, 3.0],    # A=0, KL = 3: kept (only Â < 0 is masked)
])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
SEQ_ADV = torch.tensor([-1.0, -1.0, -1.0, 1.0, -1.0, 0.0])
EXPECTED_KL = torch.tensor([0.5, 0.6, 0.7, 3.0, 0.1, 3.0])
EXPECTED_KEEP = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])


def test_golden_example_against_the_published_definition():
    log_prob = torch.full(D.shape, -2.0)
    mu = log_prob + D
    per_token_adv = SEQ_ADV[:, None].expand_as(D)
    mask, seq_kl = opsm_mask(mu, log_prob, per_token_adv, MASK, DELTA)
    torch.testing.assert_close(seq_kl, EXPECTED_KL)
    assert seq_kl[0].item() == DELTA  # exactly at δ, and kept
    assert torch.equal(mask, EXPECTED_KEEP[:, None].expand_as(D))
    # one advantage per sequence: one mask value per sequence
    seq_mask, _ = opsm_mask(mu, log_prob, SEQ_ADV, MASK, DELTA)
    assert torch.equal(seq_mask, EXPECTED_KEEP)
    # just below δ the at-δ sequence goes too
    assert opsm_mask(mu, log_prob, SEQ_ADV, MASK, DELTA - 1e-3).mask[0] == 0
    stats = opsm_stats(opsm_mask(mu, log_prob, per_token_adv, MASK, DELTA), MASK)
    assert stats["masked_seq_frac"].item() == pytest.approx(2 / 6)
    assert stats["masked_token_frac"].item() == pytest.approx(4 / MASK.sum().item())
    assert stats["seq_kl_mean"].item() == pytest.approx(EXPECTED_KL.mean().item())


def test_per_token_advantages_mask_only_the_negative_tokens_and_an_empty_row_is_kept():
    log_prob = torch.zeros(2, 3)
    mu = torch.ones(2, 3)  # KL 1 on every row
    adv = torch.tensor([[-1.0, 2.0, -0.5], [-1.0, -1.0, -1.0]])
    mask, seq_kl = opsm_mask(mu, log_prob, adv, torch.tensor([[1, 1, 1], [0, 0, 0]]), 0.5)
    assert torch.equal(mask[0], torch.tensor([0.0, 1.0, 0.0]))
    assert seq_kl[1] == 0 and torch.equal(mask[1], torch.ones(3))  # no tokens: KL 0, kept


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.5", True])
def test_a_bad_delta_names_the_key_and_the_fix(bad):
    with pytest.raises(ValueError, match="opsm_delta") as info:
        check_delta(bad)
    assert DELTA_KEY in str(info.value) and "null" in str(info.value)
    with pytest.raises(ValueError, match="opsm_delta"):
        OPSMPolicyLossConfig(opsm_delta=bad)
    with pytest.raises(ValueError, match="opsm_delta"):
        PPOEWMAPolicyLossConfig(opsm_delta=bad)
    with pytest.raises(Exception, match="policy_loss.opsm_delta"):  # through verl's own instantiation
        _actor_config({"_target_": OPSM, "opsm_delta": bad})


def test_a_bad_base_loss_names_the_key():
    with pytest.raises(ValueError, match="opsm_base_loss"):
        OPSMPolicyLossConfig(opsm_delta=0.5, opsm_base_loss="geo_mean")


# ---------------------------------------------------------------- the gradient it removes
def _inputs(seed: int, bs: int = 8, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, length, generator=g) * 3
    logp = (old + torch.randn(bs, length, generator=g) * 0.1).detach()
    adv = torch.randn(bs, 1, generator=g).expand(bs, length).clone()  # outcome advantages
    adv[:4] = -adv[:4].abs() - 0.1  # rows 0-3 negative
    adv[4:] = adv[4:].abs() + 0.1  # rows 4-7 positive
    mask = torch.rand(bs, length, generator=g) > 0.2
    mask[:, 0] = True
    mu = old.clone()
    mu[[0, 1, 4, 5]] += 2.0  # far off-policy: rows 0, 1 (negative) masked; 4, 5 (positive) kept
    is_w = torch.rand(bs, length, generator=g) + 0.5
    return old, logp, adv, mask, mu, is_w


def _grad(name, cfg, old, logp, adv, mask, agg, is_w, mu):
    logp = logp.clone().requires_grad_()
    with holding(mu):
        loss, metrics = get_policy_loss_fn(name)(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                                                 loss_agg_mode=agg, config=cfg, rollout_is_weights=is_w)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("name,target", [("opsm", OPSM), ("ppo_ewma", EWMA)])
@pytest.mark.parametrize("with_is", [False, True])
def test_masked_rows_lose_their_gradient_and_the_others_keep_theirs(agg, name, target, with_is):
    old, logp, adv, mask, mu, is_w = _inputs(seed=7)
    is_w = is_w if with_is else None
    _, grad_off, m_off = _grad(name, _actor_config({"_target_": target, "opsm_delta": None}), old, logp, adv, mask,
                               agg, is_w, mu)
    _, grad_on, m_on = _grad(name, _actor_config({"_target_": target, "opsm_delta": 0.5}), old, logp, adv, mask,
                             agg, is_w, mu)
    masked = torch.tensor([True, True, False, False, False, False, False, False])
    assert (grad_off[masked] != 0).any()  # there was a gradient to remove
    assert torch.equal(grad_on[masked], torch.zeros_like(grad_on[masked]))
    assert torch.equal(grad_on[~masked], grad_off[~masked])
    assert not any(k.startswith("actor/opsm/") for k in m_off)
    assert m_on["actor/opsm/masked_seq_frac"] == pytest.approx(2 / 8)
    assert m_on["actor/opsm/behaviour_is_rollout"] == 1.0
    expected_kl = ((mu - logp) * mask).sum(-1) / mask.sum(-1)
    assert m_on["actor/opsm/seq_kl_mean"] == pytest.approx(expected_kl.mean().item(), rel=1e-5)


def test_opsm_without_delta_is_verls_vanilla_bit_for_bit_and_without_rollout_log_probs_uses_old():
    old, logp, adv, mask, mu, is_w = _inputs(seed=3)
    loss_v, grad_v, m_v = _grad("vanilla", _actor_config(), old, logp, adv, mask, "token-mean", is_w, None)
    loss_o, grad_o, m_o = _grad("opsm", _actor_config({"_target_": OPSM}), old, logp, adv, mask, "token-mean", is_w, mu)
    assert torch.equal(loss_v, loss_o) and torch.equal(grad_v, grad_o) and m_v == m_o
    # no rollout log-probs held: π_old falls back to old_log_prob, here close to log π_θ: nothing masked
    _, _, m = _grad("opsm", _actor_config({"_target_": OPSM, "opsm_delta": 0.5}), old, logp, adv, mask, "token-mean",
                    is_w, None)
    assert m["actor/opsm/behaviour_is_rollout"] == 0.0 and m["actor/opsm/masked_seq_frac"] == 0.0


# ---------------------------------------------------------------- through verl's registry and config
def test_registered_in_verls_registry_and_configured_through_target():
    assert get_policy_loss_fn("opsm") is POLICY_LOSS_REGISTRY["opsm"]
    cfg = _actor_config({"_target_": OPSM, "opsm_delta": 0.25, "opsm_base_loss": "gspo"})
    assert isinstance(cfg.policy_loss, OPSMPolicyLossConfig)
    assert (cfg.policy_loss.loss_mode, cfg.policy_loss.opsm_delta, cfg.policy_loss.opsm_base_loss) == ("opsm", 0.25, "gspo")
    assert _actor_config({"_target_": EWMA, "opsm_delta": 0.25}).policy_loss.opsm_delta == 0.25


@pytest.mark.parametrize("base", BASE_LOSSES)
def test_every_base_loss_weights_its_token_losses_by_rollout_is_weights(base):
    """The mask rides on rollout_is_weights: each base must multiply its per-token losses by them
    right before aggregating (verl 0.9.1's source)."""
    source = inspect.getsource(POLICY_LOSS_REGISTRY[base])
    weighted = source.index("pg_losses = pg_losses * rollout_is_weights")
    assert "agg_loss(" in source[weighted:] and "pg_losses =" not in source[weighted + 1:].split("agg_loss(")[0]


def test_verls_ppo_loss_hands_the_rows_rollout_log_probs_to_the_opsm_loss():
    """verl's own ppo_loss, through the name the actor worker builds its loss function from, on a
    jagged micro-batch: the loss sees μ (padded as its other inputs) and masks by it."""
    import verl.workers.engine_workers as engine_workers

    assert getattr(engine_workers.ppo_loss, "_verl_ext_patched", False)  # the post-import hook ran

    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    prompt_len, resp_lens = 2, [3, 2, 4]
    full = torch.linspace(-3.0, -0.5, sum(prompt_len + n for n in resp_lens))
    starts = torch.tensor([0, *[prompt_len + n for n in resp_lens]]).cumsum(0).tolist()
    model_output = {"log_probs": nested([full[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)])}
    # the response log-probs ppo_loss slices out: positions prompt_len-1 .. end-1 of each sequence
    logp = [full[a + prompt_len - 1:b - 1] for a, b in zip(starts[:-1], starts[1:], strict=True)]
    shift = [2.0, 2.0, 0.0]  # μ far above π_θ on rows 0, 1; row 2 on-policy
    data = TensorDict({
        "prompts": nested([torch.ones(prompt_len, dtype=torch.long) for _ in resp_lens]),
        "responses": nested([torch.ones(n, dtype=torch.long) for n in resp_lens]),
        "response_mask": nested([torch.ones(n) for n in resp_lens]),
        "old_log_probs": nested(logp),  # π_old = π_θ: by old_log_probs nothing would be masked
        "advantages": nested([torch.full((n,), a) for n, a in zip(resp_lens, [-1.0, 1.0, -1.0], strict=True)]),
        "rollout_log_probs": nested([lp + s for lp, s in zip(logp, shift, strict=True)]),
    }, batch_size=len(resp_lens))
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    cfg = _actor_config({"_target_": OPSM, "opsm_delta": 0.5})
    _, metrics = engine_workers.ppo_loss(cfg, model_output, data)
    value = {k: v.values[-1] for k, v in metrics.items()}
    assert value["actor/opsm/behaviour_is_rollout"] == 1.0
    assert value["actor/opsm/masked_seq_frac"] == pytest.approx(1 / 3)  # row 0 only: row 1 has A > 0
    assert value["actor/opsm/seq_kl_mean"] == pytest.approx(4 / 3, rel=1e-5)
    # without opsm_delta the wrapper is verl's ppo_loss: nothing OPSM in the metrics
    _, plain = engine_workers.ppo_loss(_actor_config({"_target_": OPSM}), model_output, data)
    assert not any(k.startswith("actor/opsm/") for k in plain)
