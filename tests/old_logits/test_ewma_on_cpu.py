"""EWMAShadow: closed form, centre of mass, β=0, swap bit-exactness, checkpoint round trip
(Hilton et al. 2022 §3 and appendix)."""

import logging

import pytest
import torch

from verl_ext.old_logits.ewma import EWMAShadow, beta_from_com, com_from_beta, decay_for_target_age


def _params(seed: int = 0, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in [(5, 3), (7,), (2, 2, 2)]]


def _step(params, g: torch.Generator, scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * scale)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.889, 0.99])
def test_closed_form_with_bias_correction(beta):
    params = _params()
    history = [[p.detach().double().clone() for p in params]]
    shadow = EWMAShadow(params, beta)
    g = torch.Generator().manual_seed(1)
    for _ in range(150):  # beta=0.5 renormalises the scaled sum twice in 150 updates
        _step(params, g)
        shadow.update()
        history.append([p.detach().double().clone() for p in params])
    n = len(history) - 1
    weights = [beta ** (n - j) for j in range(n + 1)]
    for i, avg in enumerate(shadow.average()):
        expected = sum(w * h[i] for w, h in zip(weights, history)) / sum(weights)
        torch.testing.assert_close(avg.double(), expected, rtol=1e-5, atol=1e-6)
    assert shadow.total_weight == pytest.approx(sum(weights))


def test_without_bias_correction_is_plain_recursion():
    beta = 0.8
    params = _params()
    ref = [p.detach().double().clone() for p in params]
    shadow = EWMAShadow(params, beta, bias_correction=False)
    g = torch.Generator().manual_seed(2)
    for _ in range(40):
        _step(params, g)
        shadow.update()
        ref = [beta * r + (1 - beta) * p.detach().double() for r, p in zip(ref, params)]
    for avg, r in zip(shadow.average(), ref):
        torch.testing.assert_close(avg.double(), r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("com", [1.0, 2.0, 8.0])
def test_centre_of_mass_on_a_straight_path(com):
    # θ_j = j·δ  ⇒  θ_n - θ̄_n → com·δ  (the average lags com updates behind; Hilton appendix)
    beta = beta_from_com(com)
    assert com_from_beta(beta) == pytest.approx(com)
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    shadow = EWMAShadow([p], beta)
    for _ in range(400):
        with torch.no_grad():
            p.add_(1.0)
        shadow.update()
    torch.testing.assert_close(
        p.detach() - shadow.average()[0].double(), torch.full((3,), com, dtype=torch.float64), rtol=1e-4, atol=1e-4
    )


def test_beta_zero_tracks_params_bit_exactly():
    params = _params(dtype=torch.bfloat16)
    shadow = EWMAShadow(params, 0.0)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        _step(params, g)
        shadow.update()
        with shadow.swap_in():
            swapped = [p.detach().clone() for p in params]
        assert all(torch.equal(a.to(torch.bfloat16), p) for a, p in zip(shadow.average(), params))
        assert all(torch.equal(s, p) for s, p in zip(swapped, params))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backup_device", [None, "cpu"])
def test_swap_in_out_restores_bit_exactly(dtype, backup_device):
    params = _params(dtype=dtype)
    shadow = EWMAShadow(params, 0.7)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        _step(params, g)
        shadow.update()
    live = [p.detach().clone() for p in params]
    with shadow.swap_in(backup_device):
        assert shadow.swapped_in
        for p, avg in zip(params, shadow.average()):
            assert torch.equal(p.detach(), avg.to(dtype))
        with pytest.raises(RuntimeError, match="swap_out"):
            shadow.update()
    assert not shadow.swapped_in
    assert all(torch.equal(p.detach(), x) for p, x in zip(params, live))
    shadow.swap_in()  # explicit form
    shadow.swap_out()
    shadow.swap_out()  # idempotent
    assert all(torch.equal(p.detach(), x) for p, x in zip(params, live))


def test_checkpoint_round_trip_continues_identically():
    params_a, params_b = _params(), _params()
    a = EWMAShadow(params_a, 0.9)
    ga, gb = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(7):
        _step(params_a, ga)
        _step(params_b, gb)
        a.update()
    b = EWMAShadow(params_b, 0.9)
    b.load_state_dict(a.state_dict())
    assert (b.total_weight, b.num_updates) == (a.total_weight, a.num_updates)
    for _ in range(7):
        _step(params_a, ga)
        _step(params_b, gb)
        a.update()
        b.update()
    for x, y in zip(a.average(), b.average()):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_checkpoint_with_other_beta_is_rejected():
    state = EWMAShadow(_params(), 0.9).state_dict()
    with pytest.raises(ValueError, match="algorithm.old_logits.ewma.beta"):
        EWMAShadow(_params(), 0.5).load_state_dict(state)


def test_resume_without_state(caplog):
    params = _params()
    shadow = EWMAShadow(params, 0.9)
    _step(params, torch.Generator().manual_seed(6))
    with pytest.raises(RuntimeError, match="on_missing_state=reset"):
        shadow.resume(None)
    with caplog.at_level(logging.WARNING, logger="verl_ext.old_logits"):
        shadow.resume(None, on_missing_state="reset")
    assert "restarting the EWMA" in caplog.text
    assert all(torch.equal(a, p.detach()) for a, p in zip(shadow.average(), params))
    assert shadow.total_weight == 1.0


def test_dtensor_local_shards_match_plain_tensors():
    dist = pytest.importorskip("torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    plain = _params()
    sharded = [torch.nn.Parameter(distribute_tensor(p.detach().clone(), mesh, [Shard(0)])) for p in plain]
    s_plain, s_sharded = EWMAShadow(plain, 0.6), EWMAShadow(sharded, 0.6)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(4):
        _step(plain, g1)
        with torch.no_grad():
            for p in sharded:
                p.to_local().add_(torch.randn(p.to_local().shape, generator=g2) * 0.1)
        s_plain.update()
        s_sharded.update()
    assert all(torch.equal(a, b) for a, b in zip(s_plain.average(), s_sharded.average()))
    live = [p.to_local().clone() for p in sharded]
    with s_sharded.swap_in():
        assert all(torch.equal(p.to_local(), a) for p, a in zip(sharded, s_sharded.average()))
    assert all(torch.equal(p.to_local(), x) for p, x in zip(sharded, live))


def _closed_form_age(betas: list[float]) -> float:
    """Centre-of-mass age of a bias-corrected EWMA after updates with decays ``betas``: θ_j
    (j = 0 the initial weights) weighs the product of the decays applied after it."""
    n = len(betas)
    weights = [1.0] * (n + 1)
    for j in range(n + 1):
        for b in betas[j:]:
            weights[j] *= b
    return sum(w * (n - j) for j, w in enumerate(weights)) / sum(weights)


def test_age_is_the_centre_of_mass_of_the_weights_used():
    params = _params()
    shadow = EWMAShadow(params, 0.5)
    g = torch.Generator().manual_seed(2)
    betas = []
    for beta in [0.5, 0.5, 0.9, 0.0, 0.7, 0.8, 0.8]:
        shadow.set_beta(beta)
        _step(params, g)
        shadow.update()
        betas.append(beta)
        assert shadow.age == pytest.approx(_closed_form_age(betas))
    for _ in range(200):  # a constant decay converges to Hilton's com β / (1 - β)
        shadow.update()
    assert shadow.age == pytest.approx(com_from_beta(0.8))


@pytest.mark.parametrize("age,weight", [(0.0, 1.0), (1.3, 2.5), (4.0, 5.0)])
@pytest.mark.parametrize("target", [0.0, 0.5, 2.0, 3.5])
def test_decay_for_target_age_hits_the_target_when_reachable(age, weight, target):
    beta = decay_for_target_age(target, age, weight, max_beta=0.99)
    reached = beta * weight * (age + 1) / (beta * weight + 1)  # the age after one update with β
    if target < age + 1 and target / (weight * (age + 1 - target)) <= 0.99:
        assert reached == pytest.approx(target)
    else:  # too far for one update: the largest decay, the age grows as fast as it can
        assert beta == 0.99 and reached < target


def test_decay_for_target_age_is_the_com_rule_in_steady_state():
    for com in (0.5, 2.0, 8.0):
        beta = beta_from_com(com)
        assert decay_for_target_age(com, com, 1.0 / (1.0 - beta), 0.999) == pytest.approx(beta)
    assert decay_for_target_age(3.0, 1.0, 2.0, max_beta=0.6) == 0.6  # bounded


def test_target_age_is_followed_after_warm_up_and_survives_a_checkpoint():
    params = _params()
    shadow = EWMAShadow(params, 0.0)
    shadow.set_target_age(3.0, max_beta=beta_from_com(8.0))
    g = torch.Generator().manual_seed(3)
    for _ in range(12):  # from age 0 the age grows by < 1 per update (β <= 8/9 here)
        _step(params, g)
        shadow.update()
    assert shadow.age == pytest.approx(3.0)
    shadow.set_target_age(1.0, max_beta=beta_from_com(8.0))  # a fresher batch: one update gets there
    shadow.update()
    assert shadow.age == pytest.approx(1.0)
    resumed = EWMAShadow(params, 0.0)
    resumed.load_state_dict(shadow.state_dict(), same_beta=False)
    assert resumed.age == pytest.approx(1.0) and resumed.beta == shadow.beta
