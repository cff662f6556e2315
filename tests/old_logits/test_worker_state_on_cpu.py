"""OldLogitWorkerState driven as verl's trainer drives it: EWMA decay from the optimizer steps
actually taken, and snapshots of versions trained without an actor update (critic warm-up)."""

import copy

import pytest
import torch
from old_logits_tiny_policy import perturb

from verl_ext.old_logits import OldLogitsConfig, OldLogitWorkerState, build_provider
from verl_ext.old_logits.ewma import beta_from_com
from verl_ext.old_logits.local_host import LocalPolicyHost
from verl_ext.timing import hook_timer


def _train_version(state, policy, version, steps, seed, local_updates=1):
    """One version as verl's v1 trainer runs it: ``local_updates`` (parameter_sync_step) calls of
    update_actor, each taking its optimizer steps through the wrapped ``optimizer_step``, each
    followed by a publish of the same version number."""
    for _ in range(local_updates):
        for k in range(steps // local_updates):
            state.before_optimizer_step(version)
            perturb(policy, seed + k)
            state.after_optimizer_step()
        state.on_version_published(version + 1)


def test_ewma_decay_follows_the_optimizer_steps_counted_per_version(policy):
    com = 2.0
    config = OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"com": com}}, max_off_policy_threshold=4)
    # The trainer's estimate, 8 steps per version, is wrong: the versions below take 4, 6 and 2
    # steps (one row per turn: the row count, hence the mini-batch count, varies per step).
    state = OldLogitWorkerState(config, list(policy.parameters()), updates_per_version=8)
    expected_avg = [p.detach().clone().double() for p in policy.parameters()]
    weight = 1.0
    betas = []
    for version, (steps, local_updates) in enumerate([(4, 2), (6, 2), (2, 1)]):
        beta = beta_from_com(com * 8) if version == 0 else beta_from_com(com * [4, 6][version - 1])
        betas.append(beta)
        for k in range(steps):
            state.before_optimizer_step(version)
            perturb(policy, 100 * version + k)
            state.after_optimizer_step()
            # independent bias-corrected EWMA with the decay of this version
            new_weight = beta * weight + 1.0
            expected_avg = [(beta * weight * a + p.detach().double()) / new_weight
                            for a, p in zip(expected_avg, policy.parameters())]
            weight = new_weight
            if k == steps // local_updates - 1 and local_updates == 2:
                state.on_version_published(version + 1)  # the first of two local updates
        state.on_version_published(version + 1)
    assert state.ewma.beta == pytest.approx(betas[-1])
    assert state.steps_per_version == 6
    for got, want in zip(state.ewma.average(), expected_avg):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_fixed_beta_is_never_recalibrated(policy):
    config = OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"beta": 0.5}}, max_off_policy_threshold=4)
    state = OldLogitWorkerState(config, list(policy.parameters()), updates_per_version=8)
    for version in range(3):
        _train_version(state, policy, version, steps=3, seed=version)
    assert state.ewma.beta == 0.5


def test_version_updates_happen_once_per_version_with_several_local_updates(policy):
    config = OldLogitsConfig.from_config(
        {"provider": "ewma", "ewma": {"com": 1.0, "update_every": "version"}}, max_off_policy_threshold=4
    )
    state = OldLogitWorkerState(config, list(policy.parameters()))
    for version in range(3):  # parameter_sync_step = 2: two publishes of each version number
        _train_version(state, policy, version, steps=4, seed=version, local_updates=2)
    assert state.ewma.num_updates == 3


def test_checkpoint_keeps_the_calibrated_decay(policy):
    config = OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"com": 2.0}}, max_off_policy_threshold=4)
    state = OldLogitWorkerState(config, list(policy.parameters()), updates_per_version=8)
    for version in range(2):
        _train_version(state, policy, version, steps=3, seed=version)
    state.before_optimizer_step(2)  # the count of version 1 is in
    saved = copy.deepcopy(state.state_dict())
    resumed = OldLogitWorkerState(config, list(policy.parameters()), updates_per_version=8)
    resumed.load_state_dict(saved)  # the decay the average was built with, not the estimate's
    assert resumed.ewma.beta == state.ewma.beta == pytest.approx(beta_from_com(2.0 * 3))


def test_snapshot_serves_versions_trained_without_actor_updates(policy, batch):
    """trainer.critic_warmup=3: steps 1..2 update only the critic, so versions 0, 1 and 2 all hold
    the initial weights; the actor's first optimizer step runs in step 3 (version 2)."""
    config = OldLogitsConfig.from_config({"provider": "snapshot"}, max_off_policy_threshold=4)
    state = OldLogitWorkerState(config, list(policy.parameters()), first_version=0)
    initial = copy.deepcopy(policy.state_dict())
    versions = batch["token_versions"] - 2  # the fixture's versions 2..5 -> 0..3
    versions[batch["token_versions"] < 0] = -1
    all_rows = torch.arange(versions.shape[0])

    def old_log_probs(current_version):
        host = LocalPolicyHost(policy.response_log_probs, state, version=current_version)
        return build_provider(config).compute(host, {**batch, "token_versions": versions}, {})["old_log_probs"]

    def forward(state_dict):
        live = copy.deepcopy(policy.state_dict())
        policy.load_state_dict(state_dict)
        with torch.no_grad():
            out = policy.response_log_probs(batch, all_rows)
        policy.load_state_dict(live)
        return out

    mask = batch["response_mask"].bool()
    # During the warm-up (step 3 computes its old log-probs at version 2), before any actor update.
    warm = versions.clamp(max=2)
    host = LocalPolicyHost(policy.response_log_probs, state, version=2)
    out = build_provider(config).compute(host, {**batch, "token_versions": warm}, {})["old_log_probs"]
    torch.testing.assert_close(out[mask], forward(initial)[mask], rtol=0, atol=1e-6)
    # Step 3 updates the actor (version 2 -> 3); step 4 scores tokens of versions 0..3.
    _train_version(state, policy, version=2, steps=2, seed=7)
    trained = copy.deepcopy(policy.state_dict())
    out = old_log_probs(current_version=3)
    expected = torch.where(versions == 3, forward(trained), forward(initial))
    torch.testing.assert_close(out[mask], expected[mask], rtol=0, atol=1e-6)
    assert state.snapshots.nbytes == sum(p.numel() * p.element_size() for p in policy.parameters())  # one copy


def test_snapshot_under_the_sync_trainer_keeps_no_copies_and_scores_exactly(policy, batch):
    """verl's sync trainer samples every token with the live weights: the snapshot provider then
    saves nothing (a per-step host copy nobody reads was the cost in the GPU step breakdown) and
    scores every step's tokens with the current weights, which are the sampling weights."""
    config = OldLogitsConfig.from_config({"provider": "snapshot"}, max_off_policy_threshold=4, trainer_mode="sync")
    assert not config.stale_tokens
    state = OldLogitWorkerState(config, list(policy.parameters()), first_version=0)
    assert state.snapshots is None
    mask = batch["response_mask"].bool()
    all_rows = torch.arange(mask.shape[0])
    for version in range(3):  # each step: score the fresh tokens of `version`, then train on them
        on_policy = torch.where(mask, torch.full_like(batch["token_versions"], version), -1)
        host = LocalPolicyHost(policy.response_log_probs, state, version=version)
        out = build_provider(config).compute(host, {**batch, "token_versions": on_policy}, {})["old_log_probs"]
        with torch.no_grad():
            live = policy.response_log_probs(batch, all_rows)
        torch.testing.assert_close(out[mask], live[mask], rtol=0, atol=0)
        _train_version(state, policy, version=version, steps=2, seed=11 + version)
    with pytest.raises(RuntimeError, match="sync trainer keeps no snapshots"):
        state.weights("snapshot:0")  # a stale token would be a bug of the trainer: say so


@pytest.mark.parametrize("provider", ["ewma", "snapshot"])
def test_each_step_reports_the_hooks_it_ran_and_the_memory_it_holds(policy, provider):
    """What ``publish_worker_version`` sends back per step (verl_ext.timing): the worker hooks'
    times and the bytes of the provider's state, counted from the tensors it keeps."""
    config = OldLogitsConfig.from_config({"provider": provider}, max_off_policy_threshold=2)
    state = OldLogitWorkerState(config, list(policy.parameters()), first_version=0)
    hook_timer().collect()  # spans of earlier tests in this process
    param_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    # a snapshot is one host buffer holding every parameter at a 512-byte aligned offset
    buffer_bytes = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in policy.parameters())
    for version in range(3):
        state.set_version(version)
        _train_version(state, policy, version, steps=2, seed=version)
        report = state.report()
        if provider == "ewma":
            assert report["verl_ext/time/ewma_update"] > 0
            assert report["verl_ext/mem/ewma_shadow/host_bytes"] == 4 * sum(p.numel() for p in policy.parameters())
        else:
            assert report["verl_ext/time/snapshot_save"] > 0 and "verl_ext/time/snapshot_save_wait" in report
            assert report["verl_ext/mem/snapshots/host_bytes"] == 2 * buffer_bytes  # both copies reserved up front
            # one save a version, here from host memory (on CUDA: 0 while the live weights are on the GPU)
            assert report["old_logits/snapshot/saved_from_host_bytes"] == param_bytes
            assert report["old_logits/snapshot/save_host_s"] > 0
        assert ("old_logits/snapshot/saved_from_host_bytes" in report) == (provider == "snapshot")
        assert report["verl_ext/mem/swap_backup/gpu_bytes"] == 0


@pytest.mark.parametrize("update_every", ["optimizer_step", "version"])
def test_calibrated_ewma_age_follows_the_tokens_age_in_optimizer_steps(policy, batch, update_every):
    """The default decay: each version, the provider measures the batch's token age and the
    workers aim the EWMA's centre-of-mass age at it (in optimizer steps, 3 per version here)."""
    config = OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"update_every": update_every}},
                                         max_off_policy_threshold=4)
    state = OldLogitWorkerState(config, list(policy.parameters()), updates_per_version=3)
    provider = build_provider(config)
    mask = batch["response_mask"].bool()
    reports = []
    for version in range(12):
        # tokens one and two versions old, 3:1 -> mean age 1.25 versions = 3.75 optimizer steps
        age = torch.where(torch.arange(mask.shape[1]) % 4 == 0, 2, 1).expand_as(mask)
        versions = torch.where(mask, version - age, -1)
        metrics: dict = {}
        host = LocalPolicyHost(policy.response_log_probs, state, version=version)
        provider.compute(host, {**batch, "token_versions": versions}, metrics)
        reports.append(metrics)
        _train_version(state, policy, version, steps=3, seed=version)
    last = reports[-1]
    assert last["old_logits/token_age_steps/mean"] == pytest.approx(float(age[mask].float().mean()) * 3)
    assert last["old_logits/token_age_steps/max"] == 6
    assert last["old_logits/ewma/age_steps"] == pytest.approx(last["old_logits/token_age_steps/mean"], abs=1e-6)
    assert reports[0]["old_logits/ewma/age_steps"] == 0.0  # θ̄_0 = θ_0
    assert 0 < last["old_logits/ewma/beta"] < 1


def test_swap_backup_picks_where_live_weights_wait_and_rejects_other_values():
    def config(**raw):
        return OldLogitsConfig.from_config({"provider": "ewma", **raw}, max_off_policy_threshold=2)

    assert config().swap_backup_device == "cpu"  # default: pinned host memory
    assert config(swap_backup="device").swap_backup_device is None  # beside the weights
    expected = r"algorithm\.old_logits\.swap_backup='gpu'; expected one of \('host', 'device'\)"
    with pytest.raises(ValueError, match=expected):
        config(swap_backup="gpu")


@pytest.mark.parametrize("swap_backup", ["host", "device"])
def test_a_swap_restores_the_live_weights_wherever_they_wait(policy, swap_backup):
    config = OldLogitsConfig.from_config({"provider": "ewma", "swap_backup": swap_backup, "ewma": {"beta": 0.5}},
                                         max_off_policy_threshold=2)
    state = OldLogitWorkerState(config, list(policy.parameters()), backup_device=config.swap_backup_device)
    state.set_version(0)
    _train_version(state, policy, 0, steps=2, seed=0)
    live = [p.detach().clone() for p in policy.parameters()]
    with state.weights("ewma"):
        assert any(not torch.equal(p, q) for p, q in zip(policy.parameters(), live))  # the EWMA's values
    assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), live))  # bit-exact restore


def test_snapshot_dtype_bf16_halves_the_host_bytes_the_worker_reports(policy):
    """algorithm.old_logits.snapshot.dtype=bf16 reaches the worker's store: its reported host memory is the
    bfloat16 size of the fp32 parameters (one buffer, 512-byte aligned views)."""
    config = OldLogitsConfig.from_config({"provider": "snapshot", "snapshot": {"dtype": "bf16"}},
                                         max_off_policy_threshold=1)
    state = OldLogitWorkerState(config, list(policy.parameters()), first_version=0)
    state.set_version(0)
    _train_version(state, policy, 0, steps=1, seed=0)
    report = state.report()
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert report["verl_ext/mem/snapshots/host_bytes"] == sum(-(-p.numel() * 2 // 512) * 512 for p in policy.parameters())
