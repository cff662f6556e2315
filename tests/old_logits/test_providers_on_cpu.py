"""Every provider through the in-process host (the reference OldLogitHost) against an
independent computation of what it must produce (the identities each provider reduces to)."""

import copy

import pytest
import torch
from old_logits_tiny_policy import perturb

from verl_ext.old_logits import (
    OldLogitsConfig,
    OldLogitWorkerState,
    build_provider,
    get_provider,
    registered_providers,
)
from verl_ext.old_logits.local_host import LocalPolicyHost
from verl_ext.old_logits.snapshot import SnapshotMissingError

CURRENT_VERSION = 5


def _run(provider_name, policy, batch, raw=None, history=range(2, 6), bound=4):
    """Trains the tiny policy through versions in ``history`` with the worker hooks as the trainer
    would call them, then lets the provider compute old_log_probs at version CURRENT_VERSION."""
    config = OldLogitsConfig.from_config({"provider": provider_name, **(raw or {})}, max_off_policy_threshold=bound)
    state = OldLogitWorkerState(config, list(policy.parameters()), first_version=history[0])
    weights = {}
    for v in history:
        if v > history[0]:
            state.before_optimizer_step(v - 1)
            perturb(policy, v)
            state.after_optimizer_step()
            state.on_version_published(v)
        weights[v] = copy.deepcopy(policy.state_dict())
    host = LocalPolicyHost(policy.response_log_probs, state, version=CURRENT_VERSION)
    metrics: dict = {}
    out = build_provider(config).compute(host, dict(batch), metrics)
    return out["old_log_probs"], weights, host, metrics, state


def _forward(policy, batch, state_dict):
    policy.load_state_dict(state_dict)
    with torch.no_grad():
        return policy.response_log_probs(batch, torch.arange(batch["input_ids"].shape[0]))


def test_registry():
    assert set(registered_providers()) >= {
        "current",
        "rollout",
        "snapshot",
        "dedicated",
        "interrupt",
        "ewma",
        "loglinear",
    }
    with pytest.raises(ValueError, match="algorithm.old_logits.provider"):
        get_provider("nope")


def test_current_and_rollout(policy, batch):
    old, weights, *_ = _run("current", policy, batch)
    assert torch.equal(old, _forward(policy, batch, weights[CURRENT_VERSION]))
    old, *_ = _run("rollout", policy, batch)
    assert torch.equal(old, batch["rollout_log_probs"])


def test_snapshot_is_exact_per_token_version(policy, batch):
    old, weights, host, metrics, state = _run("snapshot", policy, batch)
    mask = batch["response_mask"].bool()
    expected = torch.zeros_like(old)
    for v, sd in weights.items():
        expected = torch.where(batch["token_versions"] == v, _forward(policy, batch, sd), expected)
    torch.testing.assert_close(old[mask], expected[mask], rtol=0, atol=1e-6)
    assert state.snapshots.versions == [2, 3, 4]  # version 5 is live, never copied
    # the live weights are back in place after the provider's swaps
    assert all(torch.equal(p, q) for p, q in zip(policy.state_dict().values(), weights[CURRENT_VERSION].values()))
    assert metrics["old_logits/snapshot/forward_rows"] == host.forward_rows
    assert metrics["old_logits/stale/frac_d0"] + metrics["old_logits/stale/frac_d1"] + metrics[
        "old_logits/stale/frac_d2"
    ] + metrics["old_logits/stale/frac_d3"] == pytest.approx(1.0)


def test_snapshot_beyond_the_bound_is_a_clear_error(policy, batch):
    with pytest.raises(SnapshotMissingError, match="on_missing=current"):
        _run("snapshot", policy, batch, bound=2)


def test_ewma_beta_zero_equals_current_bit_exactly(policy, batch):
    old_ewma, *_ = _run("ewma", policy, batch, {"ewma": {"beta": 0.0}})
    old_current, *_ = _run("current", copy.deepcopy(policy), batch, history=[CURRENT_VERSION])
    assert torch.equal(old_ewma, old_current)


def test_ewma_is_the_forward_under_the_average(policy, batch):
    old, _weights, host, _, state = _run("ewma", policy, batch, {"ewma": {"com": 1.0, "fresh_exact": False}})
    avg = copy.deepcopy(policy)
    with torch.no_grad():
        for p, a in zip(avg.parameters(), state.ewma.average()):
            p.copy_(a)
    assert torch.equal(old, _forward(avg, batch, avg.state_dict()))
    assert host.forward_rows == batch["input_ids"].shape[0]  # no extra forward


def test_ewma_fresh_exact_uses_current_weights_for_fresh_tokens(policy, batch):
    old, weights, _, metrics, _ = _run("ewma", policy, batch, {"ewma": {"com": 1.0, "fresh_exact": True}})
    fresh = batch["token_versions"] == CURRENT_VERSION
    current = _forward(policy, batch, weights[CURRENT_VERSION])
    torch.testing.assert_close(old[fresh], current[fresh], rtol=0, atol=1e-6)
    assert metrics["old_logits/abs_error"] > 0


@pytest.mark.parametrize("name", ["dedicated", "interrupt"])
def test_precomputed_fills_only_fresh_tokens(policy, batch, name):
    pre = torch.where(
        batch["token_versions"] < CURRENT_VERSION, -torch.ones_like(batch["rollout_log_probs"]), float("nan")
    )
    old, weights, *_ = _run(name, policy, {**batch, "precomputed_old_log_probs": pre})
    fresh = batch["token_versions"] == CURRENT_VERSION
    stale = batch["response_mask"].bool() & ~fresh
    current = _forward(policy, batch, weights[CURRENT_VERSION])
    torch.testing.assert_close(old[fresh], current[fresh], rtol=0, atol=1e-6)
    assert torch.equal(old[stale], pre[stale])
    pre[1, 0] = float("nan")  # a stale token nobody scored
    with pytest.raises(ValueError, match=f"provider={name}"):
        _run(name, policy, {**batch, "precomputed_old_log_probs": pre})


@pytest.mark.parametrize("raw, alpha_of_d", [
    ({}, lambda d: torch.where(d > 1, (d - 1) / d.clamp(min=1), 0.0)),  # AReaL: v_prox = n - 1
    ({"loglinear": {"proximal_version": "current"}}, lambda d: d / (d + 1)),
])
def test_loglinear_is_the_interpolation(policy, batch, raw, alpha_of_d):
    old, weights, *_ = _run("loglinear", policy, batch, raw)
    versions = batch["token_versions"]
    alpha = torch.where(versions >= 0, alpha_of_d((CURRENT_VERSION - versions).float()), 0.0)
    mu, cur = batch["rollout_log_probs"], _forward(policy, batch, weights[CURRENT_VERSION])
    torch.testing.assert_close(old, mu + alpha * (cur - mu))
    fresh = versions == CURRENT_VERSION
    assert torch.equal(old[fresh], mu[fresh])  # α = 0 on fresh tokens: the behaviour policy itself


def test_config_defaults_and_errors():
    cfg = OldLogitsConfig.from_config({"provider": "ewma"}, max_off_policy_threshold=8)
    assert cfg.ewma.calibrated and cfg.ewma_beta() == 0.0  # calibrated: starts at θ̄ = θ
    assert cfg.ewma_max_com() == 8  # the calibrated age is capped at the staleness bound
    fixed = OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"com": 8}}, max_off_policy_threshold=8)
    assert fixed.ewma_beta() == pytest.approx(8 / 9)  # Hilton's 0.889
    assert fixed.ewma_beta(updates_per_version=2) == pytest.approx(16 / 17)
    assert cfg.snapshot_max_versions() == 8
    with pytest.raises(ValueError, match="ewma.max_com"):
        OldLogitsConfig.from_config({"ewma": {"com": 2, "max_com": 4}}, 8)
    with pytest.raises(ValueError, match="algorithm.old_logits.ewma.bogus"):
        OldLogitsConfig.from_config({"ewma": {"bogus": 1}}, 8)
    with pytest.raises(ValueError, match="max_off_policy_threshold is null"):
        OldLogitsConfig.from_config({"provider": "ewma"}, None).ewma_max_com()
    with pytest.raises(ValueError, match="only one"):
        OldLogitsConfig.from_config({"ewma": {"beta": 0.5, "com": 1}}, 8)


def _loss_and_grads(policy, batch, old, loss_mode, policy_loss):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    import verl_ext.losses.registration  # noqa: F401

    raw = {
        "_target_": "verl.workers.config.ActorConfig",
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
    }
    if policy_loss:
        raw["policy_loss"] = policy_loss
    config = omega_conf_to_dataclass(OmegaConf.create(raw))
    policy.zero_grad()
    rows = torch.arange(batch["input_ids"].shape[0])
    adv = torch.linspace(-1, 1, rows.numel())[:, None].expand_as(old)
    loss, _ = get_policy_loss_fn(loss_mode)(
        old_log_prob=old,
        log_prob=policy.response_log_probs(batch, rows),
        advantages=adv,
        response_mask=batch["response_mask"].bool(),
        loss_agg_mode="token-mean",
        config=config,
        rollout_is_weights=torch.exp(old - batch["rollout_log_probs"]).clamp(max=2.0),
    )
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in policy.parameters()]


@pytest.mark.parametrize("raw", [{"ewma": {"beta": 0.0}}, {"ewma": {"com": 4.0, "fresh_exact": True}}])
def test_ewma_with_ppo_ewma_reduces_to_verl_decoupled_ppo_bit_for_bit(policy, batch, raw):
    # β = 0 (any data), or fresh data with fresh_exact (any β): old logits and the whole update
    # equal verl's decoupled PPO (provider current + loss vanilla).
    if raw["ewma"].get("fresh_exact"):
        batch = {**batch, "token_versions": torch.where(batch["response_mask"].bool(), CURRENT_VERSION, -1)}
    reference = copy.deepcopy(policy)
    old_ewma, *_ = _run("ewma", policy, batch, raw)
    old_current, *_ = _run("current", reference, batch)
    mask = batch["response_mask"].bool()
    assert torch.equal(old_ewma[mask], old_current[mask])  # padding / tool positions are never used
    loss_e, grads_e = _loss_and_grads(
        policy, batch, old_ewma, "ppo_ewma", {"_target_": "verl_ext.losses.config.PPOEWMAPolicyLossConfig"}
    )
    loss_v, grads_v = _loss_and_grads(reference, batch, old_current, "vanilla", None)
    assert torch.equal(loss_e, loss_v)
    assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_v))


def test_snapshot_on_missing_current_scores_evicted_versions_with_current_weights(policy, batch):
    old, weights, _, metrics, _ = _run("snapshot", policy, batch, {"snapshot": {"on_missing": "current"}}, bound=2)
    evicted = batch["token_versions"] == 2  # version 2 < 5 - 2: not kept
    current = _forward(policy, batch, weights[CURRENT_VERSION])
    torch.testing.assert_close(old[evicted], current[evicted], rtol=0, atol=1e-6)
    assert metrics["old_logits/snapshot/missing_frac"] == pytest.approx(
        float(evicted.sum()) / float((batch["token_versions"] >= 0).sum())
    )


def test_declared_needs_follow_the_config(policy):
    def needs(raw):
        return build_provider(OldLogitsConfig.from_config(raw, max_off_policy_threshold=4)).requirements()

    assert needs({"provider": "ewma"}).fields == ("token_versions",)  # the calibration measures token age
    assert needs({"provider": "ewma", "ewma": {"fresh_exact": False}}).weights == ("ewma",)
    assert needs({"provider": "ewma"}).weights == ("ewma", "current")  # fresh_exact by default
    assert needs({"provider": "snapshot"}).snapshots == 4  # the staleness bound
    assert needs({"provider": "rollout"}).weights == ()
    assert not needs({"provider": "rollout"}).worker_state

    def separate(raw):  # separate pools: a copy of version n wherever the provider forwards under it
        config = OldLogitsConfig.from_config(raw, max_off_policy_threshold=4, trainer_mode="separate_async")
        return build_provider(config).requirements()

    assert separate({"provider": "snapshot"}).snapshots == 5
    for name in ("ewma", "loglinear", "dedicated", "interrupt"):
        assert separate({"provider": name}).snapshots == 1 and separate({"provider": name}).worker_state, name
    assert not separate({"provider": "current"}).worker_state  # verl's own anchor keeps its own copy
    assert not separate({"provider": "rollout"}).worker_state
    state = OldLogitWorkerState(OldLogitsConfig.from_config({"provider": "snapshot"}, 4), list(policy.parameters()))
    with pytest.raises(RuntimeError, match="provider=snapshot"):
        state.weights("ewma")
    with pytest.raises(ValueError, match="weight spec"):
        state.weights("snapshot")


def test_shipped_plugin_fragments_build_a_config():
    from pathlib import Path

    from omegaconf import OmegaConf

    import verl_ext

    fragments = sorted((Path(verl_ext.__file__).parent / "plugins" / "old_logits").glob("*.yaml"))
    assert fragments
    for path in fragments:
        fragment = OmegaConf.load(path)
        fragment.trainer = {"v1": {"sampler": {"max_off_policy_threshold": 4}}}  # what verl's config has
        config = OldLogitsConfig.from_config(fragment.algorithm.old_logits, max_off_policy_threshold=4)
        assert path.stem.split("_")[0] == config.provider  # `ewma_bound`: a variant of `ewma`
        build_provider(config)
