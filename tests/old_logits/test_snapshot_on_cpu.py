"""SnapshotStore and scatter-by-version (exact per version)."""

import copy

import pytest
import torch
from old_logits_tiny_policy import perturb

from verl_ext.old_logits.snapshot import (
    SnapshotMissingError,
    SnapshotStore,
    scatter_by_version,
)


def test_eviction_keeps_the_staleness_window(policy):
    store = SnapshotStore(max_versions=3)
    for v in range(6):
        store.save(v, list(policy.parameters()))
    # after save(5), version 6 is current; versions >= 6 - 3 stay sampleable
    assert store.versions == [3, 4, 5]
    assert store.nbytes == 3 * sum(p.numel() * p.element_size() for p in policy.parameters())
    with pytest.raises(SnapshotMissingError, match="max_off_policy_threshold"):
        store.get(2)


def test_snapshot_holds_the_weights_at_save_time(policy):
    store = SnapshotStore(max_versions=2)
    before = [p.detach().clone() for p in policy.parameters()]
    store.save(0, list(policy.parameters()))
    perturb(policy, 1)
    assert all(torch.equal(s, b) for s, b in zip(store.get(0), before))


def test_swap_in_loads_and_restores_bit_exactly(policy):
    store = SnapshotStore(max_versions=2)
    store.save(0, list(policy.parameters()))
    old = [p.detach().clone() for p in policy.parameters()]
    perturb(policy, 1)
    live = [p.detach().clone() for p in policy.parameters()]
    with store.swap_in(0, list(policy.parameters())):
        assert all(torch.equal(p.detach(), o) for p, o in zip(policy.parameters(), old))
    assert all(torch.equal(p.detach(), x) for p, x in zip(policy.parameters(), live))


def test_scatter_equals_per_version_forwards(policy, batch):
    # Reference: a full-batch forward with an independent copy of each version's weights.
    weights = {}
    for v in range(2, 6):
        perturb(policy, v)
        weights[v] = copy.deepcopy(policy.state_dict())
    reference = torch.zeros(batch["token_versions"].shape)
    all_rows = torch.arange(batch["token_versions"].shape[0])
    for v, state in weights.items():
        policy.load_state_dict(state)
        with torch.no_grad():
            lp = policy.response_log_probs(batch, all_rows)
        reference = torch.where(batch["token_versions"] == v, lp, reference)

    calls = []

    def logprob_fn(version, rows):
        calls.append((version, rows.tolist()))
        policy.load_state_dict(weights[version])
        with torch.no_grad():
            return policy.response_log_probs(batch, rows)

    out, rows_per_version = scatter_by_version(batch["token_versions"], logprob_fn)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
    # one forward per version present, over only the rows that hold it
    assert [v for v, _ in calls] == [2, 3, 4, 5]
    for v, rows in calls:
        assert rows == sorted({i for i in range(6) if (batch["token_versions"][i] == v).any()})
    assert rows_per_version == {v: len(r) for v, r in calls}


def test_saves_reuse_the_evicted_buffers_and_restore_bit_exactly(policy):
    """The trainer's path (``begin_save`` when the update starts, ``wait_saved`` before the
    optimizer step): after ``max_versions`` saves every save writes into an evicted version's
    buffers, and each stored version swaps in exactly the weights it was saved with."""
    store = SnapshotStore(max_versions=2)
    params = list(policy.parameters())
    saved, storages = {}, {}
    for v in range(6):
        store.begin_save(v, params)
        store.wait_saved()
        saved[v] = [p.detach().clone() for p in params]
        storages[v] = [t.untyped_storage().data_ptr() for t in store.get(v)]
        perturb(policy, v)  # the optimizer step
    first_two = {tuple(storages[0]), tuple(storages[1])}
    assert len(first_two) == 2
    assert all(tuple(storages[v]) in first_two for v in range(2, 6))  # no new allocation
    assert len(store.buffers) == 2 * len(params)  # nothing allocated beside the two sets
    live = [p.detach().clone() for p in params]
    for v in store.versions:
        with store.swap_in(v, params):
            assert all(torch.equal(p.detach(), s) for p, s in zip(params, saved[v]))
        assert all(torch.equal(p.detach(), x) for p, x in zip(params, live))


def test_bf16_snapshots_give_a_bf16_forward_the_weights_it_saw_at_save_time(policy, batch):
    """snapshot.dtype=bf16 (``float32_as``): half the bytes, and a forward that computes with
    bfloat16 parameters (FSDP mixed precision) gives the same logits under the swapped-in snapshot
    as it did under the weights when they were saved; the live fp32 weights come back bit-exactly."""
    params = list(policy.parameters())
    store = SnapshotStore(max_versions=1, float32_as=torch.bfloat16)
    store.save(0, params)
    assert all(s.dtype == torch.bfloat16 for s in store.get(0))
    assert store.nbytes == sum(p.numel() * 2 for p in params)
    rows = torch.arange(len(batch["input_ids"]))

    def bf16_forward():  # the forward of a copy cast to bfloat16, as FSDP's all-gather casts the shards
        return copy.deepcopy(policy).to(torch.bfloat16).response_log_probs(batch, rows)

    saved_forward = bf16_forward()
    perturb(policy, 1)
    live = [p.detach().clone() for p in params]
    with store.swap_in(0, params):
        assert torch.equal(bf16_forward(), saved_forward)
    assert all(torch.equal(p.detach(), x) for p, x in zip(params, live))


def test_reserve_allocates_every_copy_up_front_and_saves_write_into_it(policy):
    """``reserve`` (the worker calls it at start-up) allocates ``max_versions`` copies once; the saves
    that follow allocate nothing and still hold exactly the weights of their version."""
    params = list(policy.parameters())
    store = SnapshotStore(max_versions=2)
    assert store.reserve(params) == 2 * store.buffers[0].untyped_storage().nbytes()
    reserved = {t.untyped_storage().data_ptr() for t in store.buffers}
    assert len(reserved) == 2 and store.versions == []
    saved = {}
    for v in range(3):
        store.save(v, params)
        saved[v] = [p.detach().clone() for p in params]
        perturb(policy, v)
    assert {t.untyped_storage().data_ptr() for t in store.buffers} == reserved
    assert store.versions == [1, 2]
    assert all(torch.equal(s, x) for v in (1, 2) for s, x in zip(store.get(v), saved[v]))
    assert store.reserve(params) == 0  # buffers exist: nothing more


def test_reserve_refuses_more_copies_than_the_host_has_memory_for(policy, monkeypatch):
    """A snapshot store the host cannot hold is refused at start-up, with the numbers and the knobs,
    instead of the OOM killer taking the worker inside a training step."""
    from verl_ext.old_logits import swap

    params = list(policy.parameters())
    one_copy = swap.host_buffer_bytes(params)
    monkeypatch.setattr(swap, "host_memory_available", lambda: 3 * one_copy)
    with pytest.raises(MemoryError, match="keeps 4 host copies.*snapshot.dtype=bf16.*max_off_policy_threshold"):
        SnapshotStore(max_versions=4).reserve(params)
    assert SnapshotStore(max_versions=3).reserve(params) == 3 * one_copy


def test_host_memory_available_reads_the_kernels_estimate():
    from verl_ext.old_logits.swap import host_memory_available

    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < host_memory_available() <= total
