"""verl's ``separate_async`` trainer with verl-ext's hooks on one GPU: the FSDP2 trainer and a
standalone vLLM rollout pool share the card (``SHARE_CARD=1`` in ``recipes/text_corridor/run_gpu.sh``:
Ray is shown the card twice, weights move through host memory with the ``host_memory`` checkpoint
engine, since NCCL refuses two ranks on one device; a fixed KV cache, so vLLM never profiles memory
the trainer is using).

The rollout never pauses: partial rollouts resume across weight versions, and every step is two local
updates. Exact providers leave bf16 vLLM-vs-trainer numerics alone in |log π_old − log μ|, on stale
tokens as on fresh ones; verl's own window anchor (``current``) adds staleness on the tokens of
earlier windows."""

from __future__ import annotations

import pytest

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script

SCRIPT = "text_corridor/run_gpu.sh"
RUN = {"MODE": "separate_async", "SHARE_CARD": "1", "ADV": "gigpo", "LOSS": "ppo_ewma", "WARMUP": "1", "BOUND": "2",
       "SAMPLER": "wait", "MAX_NUM_SEQS": "8", "STEPS": "4"}
FRESH, STALE = "old_logits/correction/abs_log_ratio_max_fresh", "old_logits/correction/abs_log_ratio_max_stale"


@pytest.mark.parametrize("provider", ["current", "snapshot", "dedicated", "interrupt"])
def test_separate_async_on_one_card(provider, tmp_path):
    run_script(SCRIPT, tmp_path, PROVIDER=provider, **RUN)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    stale = [s for s, m in metrics.items() if m.get("old_logits/stale/version_gap_max", 0) >= 1]
    assert stale, "no stale tokens"
    for m in metrics.values():
        assert_finite(m, ["actor/pg_loss", "training/rollout_probs_diff_max", "old_logits/exact_token_share",
                          "verl_ext/time/share_of_step"])
    fresh_numerics = max(m[FRESH] for m in metrics.values() if FRESH in m)  # bf16 vLLM vs the trainer
    stale_gap = max(metrics[s][STALE] for s in stale)
    print(f"provider={provider} fresh |log rho| max {fresh_numerics:.3g}, stale {stale_gap:.3g}, exact share "
          f"{[round(m['old_logits/exact_token_share'], 3) for m in metrics.values()]}")
    if provider == "current":  # verl's anchor: the window's weights for every token
        assert min(metrics[s]["old_logits/exact_token_share"] for s in stale) < 1.0
    else:  # each token under its own version: stale tokens carry numerics only
        assert all(m["old_logits/exact_token_share"] == 1.0 for m in metrics.values())
        assert max(m["training/rollout_probs_diff_max"] for m in metrics.values()) < 1e-2  # as colocate_async
    assert_clean_end(tmp_path)
