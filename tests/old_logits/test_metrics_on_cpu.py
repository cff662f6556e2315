"""Old-logit metrics against their definitions (verl_ext/old_logits/metrics.py)."""

import math

import pytest
import torch

from verl_ext.old_logits.metrics import (
    approximation_errors,
    discrepancy_mask_by_cause,
    staleness_metrics,
)


def test_approximation_errors_definitions():
    g = torch.Generator().manual_seed(0)
    exact, mu = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    approx = exact + torch.randn(4, 6, generator=g) * 0.1
    mask = torch.rand(4, 6, generator=g) > 0.3
    m = approximation_errors(approx, exact, mask)
    assert m["old_logits/abs_error"] == pytest.approx(float((approx - exact).abs()[mask].mean()), rel=1e-5)
    # the IS weight the approximation induces, relative to the exact one: |w_approx / w_exact - 1|
    w_approx, w_exact = torch.exp(approx - mu), torch.exp(exact - mu)
    assert m["old_logits/imp_weight_error"] == pytest.approx(
        float((w_approx / w_exact - 1).abs()[mask].mean()), rel=1e-4
    )
    assert approximation_errors(exact, exact, mask)["old_logits/abs_error"] == 0.0


def test_staleness_histogram():
    versions = torch.tensor([[5, 5, 4, -1], [3, 3, 3, 3], [0, -1, -1, -1]])
    mask = versions >= 0
    m = staleness_metrics(versions, 5, mask, max_bucket=4)
    d = (5 - versions)[mask].float()
    assert m["old_logits/stale/version_gap_mean"] == pytest.approx(float(d.mean()))
    assert m["old_logits/stale/version_gap_max"] == 5
    assert sum(v for k, v in m.items() if "/frac_d" in k) == pytest.approx(1.0)
    assert m["old_logits/stale/frac_d4+"] == pytest.approx(1 / 8)
    assert m["old_logits/stale/partial_frac"] == pytest.approx(1 / 3)


def test_mask_split_by_cause_adds_up():
    g = torch.Generator().manual_seed(1)
    mu = -torch.rand(8, 10, generator=g) * 3
    exact = mu + torch.randn(8, 10, generator=g) * 0.05  # numerics only
    stale = exact + torch.randn(8, 10, generator=g) * 0.8  # plus staleness
    mask = torch.ones(8, 10, dtype=torch.bool)
    m = discrepancy_mask_by_cause(stale, exact, mu, mask, 0.9, 1.1)
    assert m["old_logits/mask/frac"] == pytest.approx(
        m["old_logits/mask/numerics_frac"] + m["old_logits/mask/staleness_frac"] - m["old_logits/mask/rescued_frac"]
    )
    assert discrepancy_mask_by_cause(exact, exact, mu, mask, 0.9, 1.1)["old_logits/mask/staleness_frac"] == 0.0


def k3(log_rho: float) -> float:
    return math.exp(log_rho) - 1 - log_rho


def test_correction_by_staleness_splits_fresh_and_stale_tokens():
    from verl_ext.old_logits.metrics import correction_by_staleness

    mu = torch.zeros(2, 4)
    # row 0 fresh (version 5), row 1 stale (version 3); the last token of each is padding
    versions = torch.tensor([[5, 5, 5, -1], [3, 3, 3, -1]])
    mask = versions >= 0
    old = torch.tensor([[0.0, 1.0, 0.0, 9.0], [1.0, 1.0, -1.0, 9.0]])  # log ρ̂: e > 2 for 1.0, < 1/2 for -1.0
    out = correction_by_staleness(old, mu, versions, 5, mask, is_threshold=2.0, band=(0.5, 2.0))
    assert out["old_logits/correction/masked_fresh"] == pytest.approx(1 / 3)
    assert out["old_logits/correction/masked_stale"] == pytest.approx(1.0)
    assert out["old_logits/correction/masked_staleness_excess"] == pytest.approx(2 / 3)
    assert out["old_logits/correction/truncated_fresh"] == pytest.approx(1 / 3)
    assert out["old_logits/correction/truncated_stale"] == pytest.approx(2 / 3)
    assert out["old_logits/correction/stale_token_frac"] == pytest.approx(0.5)
    # KL(μ‖π_old), k3 = ρ̂ - 1 - log ρ̂ averaged over each group's tokens (padding excluded)
    assert out["old_logits/correction/kl_fresh"] == pytest.approx((k3(0) + k3(1) + k3(0)) / 3)
    assert out["old_logits/correction/kl_stale"] == pytest.approx((k3(1) + k3(1) + k3(-1)) / 3)
    assert out["old_logits/correction/abs_log_ratio_p99_fresh"] == pytest.approx(0.98)  # |log ρ̂| 0, 0, 1
    # verl's token_k1 bounds μ/π_old: ρ̂ = e^{-0.5} = 0.61 is inside [0.5, 1.5], μ/π_old = 1.65 is not
    asym = correction_by_staleness(torch.full((1, 1), -0.5), torch.zeros(1, 1), torch.tensor([[5]]), 5,
                                   torch.ones(1, 1, dtype=torch.bool), None, (0.5, 1.5))
    assert asym["old_logits/correction/masked_fresh"] == 1.0 and "old_logits/correction/truncated_fresh" not in asym


def test_rollout_correction_thresholds_read_verl_config():
    from omegaconf import OmegaConf

    from verl_ext.old_logits.trainer_side import rollout_correction_thresholds

    cfg = OmegaConf.create({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1",
                            "rollout_rs_threshold": "0.5_2.0", "bypass_mode": False})
    assert rollout_correction_thresholds(cfg) == (2.0, (0.5, 2.0))
    cfg.rollout_rs_threshold = 4.0
    assert rollout_correction_thresholds(cfg) == (2.0, (0.25, 4.0))  # verl: one value = [1/x, x]
    cfg.rollout_is, cfg.rollout_rs = "sequence", "seq_mean_k1"
    assert rollout_correction_thresholds(cfg) == (None, None)
    assert rollout_correction_thresholds(None) == (None, None)
