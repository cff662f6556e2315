"""EWMA of the policy parameters: the proximal network of PPO-EWMA.

Hilton, Cobbe, Schulman, "Batch size-invariance for policy optimization" (NeurIPS 2022), §3:
keep an exponentially-weighted moving average of the policy network, update it after every
optimizer step, and use it as the proximal policy. With bias correction the average after the
n-th update is the closed form

    θ̄_n = Σ_{j=0..n} β^{n-j} θ_j / W_n,        W_n = Σ_{j=0..n} β^{n-j} = β W_{n-1} + 1,

whose centre of mass (mean age, in updates) is β / (1 - β) once W has converged. The shadow
tracks that age exactly (``age``), whatever decays were used, and can choose the decay of each
update so that the age follows a target (``target_age``, set from the measured age of the batch's
tokens: ``decay_for_target_age``).
See docs/explanation/old_logit_problem.md for why θ̄ stands in for the missing old logits
π_train(θ_v) in asynchronous RL (Hilton, Cobbe and Schulman, "Batch size-invariance for policy
optimization", NeurIPS 2022; Guan et al., arXiv 2605.12070).

What differs from the reference implementation, and why:
  * The shadow is stored as a *scaled sum*: θ̄ = g · A with a host scalar g. One update is then a
    single ``A += θ / (β W g)`` per tensor (read θ, read A, write A: 10 bytes/param for a bf16 θ
    and fp32 A), instead of the cast + lerp (18 bytes/param) that a mixed-precision
    ``torch._foreach_lerp_`` needs. g shrinks like β^n, so A is renormalised (A *= g, g = 1)
    whenever g falls below 2^-60; that costs one extra pass every ~60/log2(1/β) updates.
  * On CUDA the add is one Triton launch over all tensors (``fused_add.py``; 1.1-1.2x the
    bandwidth floor on an H200, docs/results.md); elsewhere ``torch._foreach_add_``.
  * ``bias_correction=False`` starts W at its fixed point 1/(1-β), which makes every update the
    plain θ̄ ← β θ̄ + (1-β) θ with θ̄_0 = θ_0.
  * The shadow is fp32 whatever the parameter dtype: a bf16 average would round away the ~1e-6
    relative updates of LLM fine-tuning (bf16 has 8 significant bits).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from verl_ext.old_logits.fused_add import make_scaled_add
from verl_ext.old_logits.swap import Resharder, WeightSwap, local_tensors

logger = logging.getLogger("verl_ext.old_logits")

# Renormalise the scaled sum when g gets this small, so A ~ θ/g and the multiplier 1/(βWg) stay far
# inside fp32's range (~3e38).
_MIN_GAIN = 2.0**-60


def beta_from_com(com: float) -> float:
    """Decay β of an EWMA whose centre of mass (mean age in updates) is ``com``: β = com / (1 + com)."""
    if com < 0:
        raise ValueError(f"EWMA centre of mass must be >= 0, got {com}")
    return com / (1.0 + com)


def decay_for_target_age(target_age: float, age: float, total_weight: float, max_beta: float) -> float:
    """Decay β of the next update that makes the EWMA's centre-of-mass age equal ``target_age``
    right after it (all ages in updates).

    An update with decay β turns total weight W and age a into W' = βW + 1 and
    a' = βW (a + 1) / (βW + 1) (every earlier θ_j ages by one update, the new θ weighs 1 at age 0),
    so a' = t for β = t / (W (a + 1 - t)). A target of at least a + 1 cannot be reached in one
    update (the age grows by less than one per update): then the largest decay allowed. In steady
    state (W = 1/(1-β), a = t) this is β = t / (1 + t), the usual com rule (Hilton et al. 2022, appendix).

    Args:
        target_age: wanted age in updates (>= 0); 0 gives β = 0 (the EWMA equals the weights).
        age: the age now, in updates.
        total_weight: W now (1 after initialisation with bias correction).
        max_beta: upper bound on the decay, in [0, 1).

    Returns:
        β in [0, max_beta].
    """
    if target_age <= 0.0:
        return 0.0
    slack = total_weight * (age + 1.0 - target_age)
    return max_beta if slack <= 0.0 else min(max_beta, target_age / slack)


def com_from_beta(beta: float) -> float:
    """Centre of mass β / (1 - β) of an EWMA with decay β (Hilton et al. 2022, appendix)."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"EWMA beta must be in [0, 1), got {beta}")
    return beta / (1.0 - beta)


class EWMAShadow:
    """fp32, bias-corrected EWMA of a list of (local-shard) parameter tensors.

    Call ``update()`` after every optimizer step (or every published version, see
    ``algorithm.old_logits.ewma.update_every``); use ``swap_in()`` around the forward that
    computes the proximal log-probs.

    Args:
        params: the live parameters this shadow follows; plain tensors or DTensors (their local
            shard is averaged, nothing is communicated). θ̄_0 = θ_0 (Hilton's initialisation).
        beta: decay in [0, 1). β = 0 makes θ̄ = θ after every update.
        bias_correction: use the total-weight scheme of the closed form above.
        fused: the single-launch Triton update on CUDA (None: when available; see ``fused_add.py``).
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        beta: float,
        bias_correction: bool = True,
        fused: bool | None = None,
    ) -> None:
        com_from_beta(beta)  # validates the range
        self.params = list(params)
        self.beta = float(beta)
        self.bias_correction = bias_correction
        with torch.no_grad():
            self._acc = [t.to(dtype=torch.float32, copy=True) for t in self._local()]  # beside each shard
        self._scaled_add = make_scaled_add(self._acc, self._local(), fused)
        self._gain = 1.0
        self.total_weight = 1.0 if bias_correction or beta == 0.0 else 1.0 / (1.0 - beta)
        # Σ_j w_j (age of θ_j in updates); without bias correction θ_0 stands for an infinite
        # history, so the age starts at its fixed point β / (1 - β).
        self._age_sum = 0.0 if bias_correction else self.total_weight * com_from_beta(beta)
        self.num_updates = 0
        # age (in updates) the next updates aim at, None: keep β (``decay_for_target_age``)
        self.target_age: float | None = None
        self.max_beta = 0.0
        self._swap: WeightSwap | None = None

    def set_beta(self, beta: float) -> None:
        """Changes the decay used by the next updates (the average so far is kept).

        With bias correction the average stays the normalised weighted sum, each θ_j weighted by
        the product of the decays applied after it; without, W moves to the new fixed point
        1/(1-β) so every update stays θ̄ ← β θ̄ + (1-β) θ.
        """
        com_from_beta(beta)  # validates the range
        self.beta = float(beta)
        if not self.bias_correction:
            self.total_weight = 1.0 / (1.0 - beta)
            self._age_sum = self.total_weight * com_from_beta(beta)

    def set_target_age(self, age: float | None, max_beta: float) -> None:
        """Lets every following update pick its decay so that the age right after it is ``age``
        updates (``decay_for_target_age``, at most ``max_beta``); None keeps the current β.
        Without bias correction the average has no finite history to re-weight: β = age/(1+age)."""
        if age is not None and age < 0:
            raise ValueError(f"EWMA target age must be >= 0 updates, got {age}")
        com_from_beta(max_beta)  # validates the range
        self.target_age, self.max_beta = age, float(max_beta)
        if age is not None and not self.bias_correction:
            self.set_beta(min(max_beta, beta_from_com(age)))

    @property
    def com(self) -> float:
        return com_from_beta(self.beta)

    @property
    def shadow(self) -> list[torch.Tensor]:
        """The fp32 tensors the shadow keeps (its memory: one fp32 copy of the local shards)."""
        return self._acc

    @property
    def age(self) -> float:
        """Centre-of-mass age of θ̄ in updates: Σ_j w_j (n - j) / Σ_j w_j over the updates so far
        (β / (1 - β) once a constant β has converged)."""
        return self._age_sum / self.total_weight

    @property
    def swapped_in(self) -> bool:
        return self._swap is not None and self._swap.active

    def _local(self) -> list[torch.Tensor]:
        return local_tensors(self.params)

    @torch.no_grad()
    def update(self) -> None:
        """Folds the current parameter values into the average. Call after each optimizer step."""
        if self.swapped_in:
            raise RuntimeError("EWMAShadow.update() called while the EWMA weights are swapped in; swap_out() first")
        new = self._local()
        self.num_updates += 1
        if self.target_age is not None and self.bias_correction:
            self.beta = decay_for_target_age(self.target_age, self.age, self.total_weight, self.max_beta)
        if self.beta == 0.0:
            torch._foreach_copy_(self._acc, new)
            self._gain, self.total_weight, self._age_sum = 1.0, 1.0, 0.0
            return
        w_prev = self.total_weight
        self.total_weight = self.beta * w_prev + 1.0
        if self.bias_correction:
            self._age_sum = self.beta * (self._age_sum + w_prev)
        # θ̄' = (β W θ̄ + θ) / W'  ⇔  A' = A + θ / (β W g),  g' = β W g / W'
        self._scaled_add(new, 1.0 / (self.beta * w_prev * self._gain))
        self._gain *= self.beta * w_prev / self.total_weight
        if self._gain < _MIN_GAIN:
            torch._foreach_mul_(self._acc, self._gain)
            self._gain = 1.0

    @torch.no_grad()
    def average(self) -> list[torch.Tensor]:
        """The bias-corrected average θ̄ as new fp32 tensors, one per parameter (local shard shapes)."""
        return torch._foreach_mul(self._acc, self._gain)

    @torch.no_grad()
    def _write_average(self, targets: list[torch.Tensor]) -> None:
        for t, a in zip(targets, self._acc, strict=True):
            torch.mul(a, self._gain, out=t)  # one fused read-scale-cast-write per tensor

    def swap_in(self, backup_device: str | torch.device | None = None, reshard: Resharder | None = None) -> WeightSwap:
        """Loads θ̄ (cast to the parameters' dtype) into the live parameters.

        Returns a ``WeightSwap``: use it as a context manager, or call ``swap_out()``; the live
        values are then restored bit-exactly.

        Args:
            backup_device: where to keep the live values meanwhile (``None``: same device).
            reshard: frees gathered parameter copies around the swap (``swap.fsdp_resharder``).
        """
        if self.swapped_in:
            raise RuntimeError("EWMA weights are already swapped in; call swap_out() first")
        self._swap = WeightSwap(self.params, self._write_average, backup_device, reshard)
        return self._swap

    def swap_out(self) -> None:
        """Restores the live parameters saved by ``swap_in()`` (bit-exact). Idempotent."""
        if self._swap is not None:
            self._swap.swap_out()
        self._swap = None

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: the normalised average (so the format does not depend on g) and the
        scalars. Tensors stay on their device; the caller moves them as its checkpointer wants."""
        return {
            "average": self.average(),
            "beta": self.beta,
            "bias_correction": self.bias_correction,
            "total_weight": self.total_weight,
            "age_sum": self._age_sum,
            "num_updates": self.num_updates,
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], same_beta: bool = True) -> None:
        """Restores a ``state_dict()``. With ``same_beta`` the decay must match the configured
        one; otherwise (a decay calibrated from the data) the checkpoint's decay is taken."""
        if (same_beta and not math.isclose(state["beta"], self.beta)) or state["bias_correction"] != self.bias_correction:
            raise ValueError(
                f"EWMA checkpoint has beta={state['beta']}, bias_correction={state['bias_correction']} but the config "
                f"asks for beta={self.beta}, bias_correction={self.bias_correction}; set algorithm.old_logits.ewma.beta "
                "to the checkpoint's value or algorithm.old_logits.ewma.on_missing_state=reset to restart the average"
            )
        if len(state["average"]) != len(self._acc):
            raise ValueError(f"EWMA checkpoint holds {len(state['average'])} tensors, the model has {len(self._acc)}")
        for a, s in zip(self._acc, state["average"], strict=True):
            a.copy_(s)
        self._gain = 1.0
        self.beta = float(state["beta"])
        self.total_weight = float(state["total_weight"])
        # checkpoints from before the age was tracked: the steady-state age of their decay
        self._age_sum = float(state.get("age_sum", self.total_weight * com_from_beta(self.beta)))
        self.num_updates = int(state["num_updates"])

    def resume(self, state: dict[str, Any] | None, on_missing_state: str = "error", same_beta: bool = True) -> None:
        """Checkpoint resume. ``state=None`` (checkpoint saved without EWMA state) raises unless
        ``on_missing_state="reset"``, which restarts the average at the current weights (θ̄ = θ,
        W = 1, as at the start of a run) and logs it."""
        if state is not None:
            self.load_state_dict(state, same_beta)
            return
        if on_missing_state != "reset":
            raise RuntimeError(
                "resuming PPO-EWMA without EWMA state in the checkpoint; the proximal policy would silently restart "
                "at the current weights. Save it with the checkpoint, or set "
                "algorithm.old_logits.ewma.on_missing_state=reset to restart the average explicitly"
            )
        logger.warning("verl-ext: no EWMA state in the checkpoint; restarting the EWMA at the current weights")
        with torch.no_grad():
            torch._foreach_copy_(self._acc, self._local())
        self._gain = 1.0
        self.total_weight = 1.0 if self.bias_correction else 1.0 / (1.0 - self.beta)
        self._age_sum = 0.0 if self.bias_correction else self.total_weight * self.com
        self.num_updates = 0
