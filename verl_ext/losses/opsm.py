"""Off-policy sequence masking (OPSM): pure torch, no verl. ``verl_ext.losses.opsm_loss`` applies it
inside verl's policy losses; ``verl_ext.losses.behaviour`` brings the behaviour log-probs to them.

DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models" (arXiv 2512.02556),
"Off-Policy Sequence Masking" (Eq. 9): the policy-gradient term of sequence i is multiplied by

    M_i,t = 0   if  Â_i,t < 0  and  (1/|o_i|) Σ_t log( π_old(o_i,t) / π_θ(o_i,t) ) > δ
    M_i,t = 1   otherwise

with π_old the *sampling* policy (DeepSeek: the inference framework's log-probs, so the rule sees
staleness and train/inference mismatch together). Negative-advantage sequences the current policy
has drifted far from are dropped; positive-advantage ones are always kept.

This implementation, and where it departs from the paper and from the two public implementations
(THUDM/slime ``slime/utils/ppo_utils.py:compute_opsm_mask``, added in commit caa4af2 "Add off-policy
sequence masking algorithm proposed in DeepSeek v3.2"; huggingface/trl
``GRPOTrainer.get_off_policy_mask``, added in commit 05a4017 "DeepSeek V3.2 Off-policy sequence
masking"):

* π_old: the behaviour log-probs μ (verl's ``rollout_log_probs``) when the rows carry them — the
  paper's and trl's choice (trl falls back to its recomputed old log-probs without vLLM). slime uses
  the PPO ratio's denominator: the recomputed old log-probs by default, μ only with
  ``--use-rollout-logprobs``. verl-ext's start-up checks require the rollout log-probs
  (``actor_rollout_ref.rollout.calculate_log_probs``) whenever δ is set; where rows still carry none
  (verl's distillation loss, a direct call) ``old_log_probs`` (whatever the old-logit provider wrote)
  stands in, as in trl's fallback, and the metric ``actor/opsm/behaviour_is_rollout`` says so.
* the mean: over the response mask (padding and masked-out tokens excluded), |o_i| clamped to 1 for
  an empty row (KL 0, kept), as slime and trl.
* the inequality: strict, KL > δ masks and KL = δ keeps — the paper, slime and trl agree.
* the advantage test is per token (Â_i,t < 0) as in the paper's Â_i,t and slime; with outcome
  advantages (GRPO, RLOO, ...) it is one value per sequence, so the whole sequence goes. trl tests
  one advantage per sequence. A 1-D ``advantages`` gives a per-sequence mask.
* δ: no default (the paper gives none); off when None. slime's default is 1e-4 (with
  ``--use-opsm``), trl's is None with 0.5 suggested in its docs; the ``opsm`` plugin fragment uses 0.5.
* the mask multiplies the per-token losses before aggregation and leaves the response mask (so the
  token-mean denominator) as it is, as slime and trl do: unmasked rows' gradients are unchanged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

DELTA_KEY = "actor_rollout_ref.actor.policy_loss.opsm_delta"


class OPSMResult(NamedTuple):
    """``opsm_mask``'s output (unpacks as ``mask, seq_kl``)."""

    mask: torch.Tensor  # 1 keep / 0 drop, the advantages' shape: (bsz,) or (bsz, response_length)
    seq_kl: torch.Tensor  # (bsz,) float32: (1/|o_i|) Σ_t (log π_old - log π_θ) over the response mask


def check_delta(delta: object) -> float | None:
    """δ as a float (None: OPSM off); a ValueError naming the key and the fix otherwise."""
    if delta is None:
        return None
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise ValueError(
            f"{DELTA_KEY}={delta!r}: expected a finite number >= 0, the mean per-token log-ratio "
            f"log(pi_old/pi_theta) in nats above which a negative-advantage sequence is masked (e.g. 0.5), "
            f"or null to turn off-policy sequence masking off"
        )
    return float(delta)


def opsm_mask(
    behaviour_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    delta: float,
) -> OPSMResult:
    """The DeepSeek-V3.2 off-policy sequence mask (module docstring for the rule and its sources).

    Args:
        behaviour_log_prob: log π_old, the sampling policy's log-probs, ``(bsz, response_length)``.
        log_prob: log π_θ, ``(bsz, response_length)``; read detached (the mask carries no gradient).
        advantages: Â, ``(bsz, response_length)`` per token or ``(bsz,)`` per sequence.
        response_mask: ``(bsz, response_length)``, bool or 0/1: the tokens of o_i (padding excluded).
        delta: δ >= 0 (``check_delta``).

    Returns:
        ``OPSMResult(mask, seq_kl)``: ``mask`` has the advantages' shape and ``log_prob``'s dtype,
        0 where Â < 0 and the sequence's KL > δ, else 1; ``seq_kl`` is ``(bsz,)`` float32.
    """
    delta = check_delta(delta)
    if delta is None:
        raise ValueError(f"opsm_mask needs a threshold: {DELTA_KEY} is null (OPSM off)")
    if behaviour_log_prob.shape != log_prob.shape or response_mask.shape != log_prob.shape or log_prob.dim() != 2:
        raise ValueError(
            f"opsm_mask: behaviour_log_prob {tuple(behaviour_log_prob.shape)}, log_prob {tuple(log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must all be (bsz, response_length)"
        )
    if advantages.shape not in (log_prob.shape, log_prob.shape[:1]):
        raise ValueError(f"opsm_mask: advantages {tuple(advantages.shape)} must be (bsz, response_length) or (bsz,)")
    with torch.no_grad():
        valid = response_mask.to(torch.float32)
        log_ratio = (behaviour_log_prob.detach().to(torch.float32) - log_prob.detach().to(torch.float32)) * valid
        seq_kl = log_ratio.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1.0)
        off_policy = seq_kl > delta  # strict, as the paper: KL = δ keeps the sequence
        if advantages.dim() == 2:
            off_policy = off_policy.unsqueeze(-1)
        drop = (advantages.detach() < 0) & off_policy
        return OPSMResult((~drop).to(log_prob.dtype), seq_kl)


def opsm_stats(result: OPSMResult, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-micro-batch statistics (0-d tensors) over the rows that hold at least one token:
    ``masked_seq_frac`` (rows with a masked token), ``masked_token_frac`` (of the response tokens)
    and ``seq_kl_mean`` (the mean sequence KL the rule thresholds)."""
    valid = response_mask.bool()
    rows = valid.any(dim=-1)
    mask = result.mask if result.mask.dim() == 2 else result.mask.unsqueeze(-1).expand_as(valid)
    dropped = (mask == 0) & valid
    n_rows = rows.sum().clamp(min=1)
    return {
        "masked_seq_frac": (dropped.any(dim=-1) & rows).sum() / n_rows,
        "masked_token_frac": dropped.sum() / valid.sum().clamp(min=1),
        "seq_kl_mean": (result.seq_kl * rows).sum() / n_rows,
    }
