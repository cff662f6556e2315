"""Controlled CPU experiment: which old logits keep the discrepancy thresholds meaning "numerics"?

A tiny softmax policy (one-hidden-layer MLP over (context, position, previous token)) learns a short
token-sequence task (for each of C contexts a hidden target sequence of T tokens; reward = fraction of
matching tokens, GRPO advantages within each context's group) through an exactly simulated asynchronous
pipeline (``run_cell``):

* the batch of step n comes from the "inference engine" holding the weights of version n - d (d = staleness);
  partial rollouts switch to version n - d + 1 at a random position, so tokens carry per-token versions;
* the engine's logits are the trainer's plus noise of std σ (the numerics gap): it samples from, and reports
  log-probs μ of, that noisy distribution;
* the trainer asks an old-logit provider (``verl_ext.old_logits``, the trainer plugin's classes, through the
  in-process host) for old_log_probs, applies verl's rollout correction (token TIS 2.0 and a token_k1 rejection
  band on ρ = π_old/μ) and takes Adam steps per version on the ``ppo_ewma`` loss.

``--study`` (the one mode): the mechanism study, every seed of a cell trained at once (the model's seed
dimension), fair arms (only the old-logit source differs), staleness drawn per sequence, heavy-tailed mismatch,
learning rate and epochs as knobs. ``scripts/bench/old_logits_probe.py`` reuses this toy.

    python -m scripts.bench.old_logits_experiment --study --json runs/old_logits_study.json [--eps-matched] [--write]

Docs section (``--write``; printed otherwise): docs/experiments/old_logit_mechanism_study.md,
"## Old-logit mechanism study" (``--eps-matched``: "## Old-logit mechanism study, ε-matched arms").
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from scripts.bench.report import figure, publish, script_parser, table as md_table
from scripts.bench.stats import collapsed, fmt_mean_se, last_finite, paired_verdict
from verl_ext.old_logits import OldLogitsConfig, OldLogitWorkerState, build_provider
from verl_ext.old_logits.local_host import LocalPolicyHost
from verl_ext.losses.decoupled_ppo import decoupled_ppo_token_losses
from verl_ext.losses.opsm import opsm_mask
from verl_ext.old_logits.metrics import ratio_out_of_band
from verl_ext.old_logits.weight_specs import EWMA

CONTEXTS, LENGTH, VOCAB, HIDDEN, GROUP = 16, 6, 8, 64, 8
IN_DIM = CONTEXTS + LENGTH + VOCAB + 1  # one-hots: context, position, previous token (or start)
TIS = 2.0
ROOT = Path(__file__).resolve().parents[2]
STUDY_DOC = ROOT / "docs" / "experiments" / "old_logit_mechanism_study.md"
# The providers see one flattened batch of S * bs rows; shared between the seeds of a cell: the calibrated
# EWMA's target age (the mean over all rows) and the random draws' generator.
STUDY_HEADING = "## Old-logit mechanism study"
# label -> algorithm.old_logits (BOUND is replaced by the cell's staleness bound), plus the arm's own knobs
# (ArmKnobs): "clip", "correction" (CORRECTIONS), "opsm" (DeepSeek-V3.2's sequence masking) and "ewma_anchor"
STUDY_ARMS = {
    "current": {"provider": "current"},
    "rollout": {"provider": "rollout"},
    "snapshot": {"provider": "snapshot"},
    "ewma calibrated": {"provider": "ewma", "ewma": {"fresh_exact": True}},
    "ewma calibrated, no fresh_exact": {"provider": "ewma", "ewma": {"fresh_exact": False}},
    "ewma com = bound (old default)": {"provider": "ewma", "ewma": {"com": "BOUND"}},
    "loglinear": {"provider": "loglinear"},
}
CLIP = 0.2
CORRECTIONS = {"tis+band": ("token", "token_k1"), "tis": ("token", None), "none": (None, None)}
# --eps-matched: does a correction matter at all (no band, no correction), and the exact anchor at the ε that
# makes its update size (KL(π_new || π_old) per token and step) match current's: ε chosen by update size alone
EPS_ARMS = {
    "current": {"provider": "current"},
    "current, no band": {"provider": "current", "correction": "tis"},
    "current, no correction": {"provider": "current", "correction": "none"},
    "snapshot": {"provider": "snapshot"},
    **{f"snapshot, ε {eps}": {"provider": "snapshot", "clip": eps} for eps in (0.3, 0.5, 0.8)},
    "ewma calibrated": {"provider": "ewma", "ewma": {"fresh_exact": True}},
    "current, OPSM δ 0.05": {"provider": "current", "opsm": 0.05},
}
EPS_HEADING = "## Old-logit mechanism study, ε-matched arms"
# the EWMA anchor as verl-ext's trainer computes it (once per batch, frozen over its mini-batches) against
# Hilton et al.'s PPO-EWMA (θ̄'s log-probs recomputed before every mini-batch): an arm knob, "ewma_anchor"
EWMA_ANCHOR_ARMS = {"ewma calibrated": STUDY_ARMS["ewma calibrated"],
                    "ewma calibrated, minibatch anchor": {**STUDY_ARMS["ewma calibrated"], "ewma_anchor": "minibatch"}}
SPIKE_P, SPIKE_SCALE = 0.01, 8.0  # the study's heavy-tailed mismatch: 1% of logits get 8x the noise

# The policy of each seed carries a leading seed dimension S (w1: (S, IN, H), b1: (S, 1, H), ...): batched
# matmuls keep the seeds independent, and so do Adam and the EWMA/snapshot state (elementwise).


def init_params(seeds: list[int]) -> list[torch.Tensor]:
    """Each seed's initial policy, stacked: (S, IN, H), (S, 1, H), (S, H, V), (S, 1, V)."""
    per_seed = [[torch.randn(IN_DIM, HIDDEN, generator=g) / IN_DIM**0.5, torch.zeros(1, HIDDEN),
                 torch.randn(HIDDEN, VOCAB, generator=g) * 0.01, torch.zeros(1, VOCAB)]
                for g in (torch.Generator().manual_seed(seed) for seed in seeds)]
    return [torch.stack(p).requires_grad_() for p in zip(*per_seed)]


def logits(params: list[torch.Tensor], ctx: torch.Tensor, position: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """``(S, N, VOCAB)`` logits of the one-hidden-layer MLP over the one-hots of context, position and
    previous token (VOCAB = start), all long ``(S, N)``. The one-hot input layer is the sum of three
    rows of w1 (the same numbers as the matmul, 10x fewer flops on a 2-core machine)."""
    w1, b1, w2, b2 = params
    rows = torch.stack([ctx, CONTEXTS + position, CONTEXTS + LENGTH + prev], dim=-1)  # (S, N, 3)
    rows = rows + IN_DIM * torch.arange(w1.shape[0])[:, None, None]  # row of w1 flattened over seeds
    pre = torch.nn.functional.embedding(rows, w1.reshape(-1, HIDDEN)).sum(2)
    return torch.tanh(pre + b1) @ w2 + b2


def distributions(params: list[torch.Tensor], ctx: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(S, bs, T, VOCAB)`` log π(· | context, prefix) at every position of ``tokens (S, bs, T)``."""
    n_seeds, bs, _ = tokens.shape
    prev = torch.cat([torch.full((n_seeds, bs, 1), VOCAB), tokens[..., :-1]], dim=-1)
    flat = (n_seeds, bs * LENGTH)
    z = logits(params, ctx[:, None].expand(bs, LENGTH).reshape(-1).expand(flat),
               torch.arange(LENGTH).repeat(bs).expand(flat), prev.reshape(flat))
    return torch.log_softmax(z, dim=-1).view(n_seeds, bs, LENGTH, VOCAB)


def log_probs(params: list[torch.Tensor], ctx: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(S, bs, T)`` log π(token | context, prefix) for ``ctx (bs,)`` and ``tokens (S, bs, T)``."""
    return distributions(params, ctx, tokens).gather(-1, tokens[..., None]).squeeze(-1)


@torch.no_grad()
def update_kl(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``(S,)`` KL(π_new || π_old) per token, averaged over the batch's positions: the size of one
    version's update. ``new``, ``old``: ``distributions`` after and before it."""
    return (new.exp() * (new - old)).sum(-1).mean(dim=(1, 2))


def mismatch_noise(shape: tuple[int, ...], sigma: float, g: torch.Generator, spike_p: float = SPIKE_P) -> torch.Tensor:
    """Inference-engine logit error: Gaussian σ plus rare spikes of ``SPIKE_SCALE`` σ (the heavy tail of low-precision
    kernels: bf16 accumulation, fp8 outliers); ``spike_p`` 0: Gaussian only, drawn even at σ = 0."""
    if not spike_p:
        return sigma * torch.randn(shape, generator=g)
    if sigma == 0:
        return torch.zeros(shape)
    spikes = (torch.rand(shape, generator=g) < spike_p).float() * SPIKE_SCALE
    return sigma * torch.randn(shape, generator=g) * (1.0 + spikes)


@torch.no_grad()
def generate(engine: dict[int, list[torch.Tensor]], ctx: torch.Tensor, versions: torch.Tensor, sigma: float,
             g: torch.Generator, spike_p: float = SPIKE_P) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples ``(S, bs, T)`` tokens, each with the engine weights of its version and the mismatch
    noise; returns tokens, μ (the engine's log-probs of them) and the exact old logits π_train(θ_v(t))
    (the engine holds the trainer's weights of each version; the noise is the only difference)."""
    n_seeds, bs, _ = versions.shape
    tokens = torch.zeros(n_seeds, bs, LENGTH, dtype=torch.long)
    mu, exact = torch.zeros(n_seeds, bs, LENGTH), torch.zeros(n_seeds, bs, LENGTH)
    seed_ctx = ctx.expand(n_seeds, bs)
    for t in range(LENGTH):
        prev = tokens[..., t - 1] if t else torch.full((n_seeds, bs), VOCAB)
        position = torch.full((n_seeds, bs), t)
        z = torch.zeros(n_seeds, bs, VOCAB)
        for v in versions[..., t].unique().tolist():
            z = torch.where((versions[..., t] == v)[..., None], logits(engine[v], seed_ctx, position, prev), z)
        logp = torch.log_softmax(z + mismatch_noise(z.shape, sigma, g, spike_p), dim=-1)
        tokens[..., t] = torch.multinomial(logp.exp().view(-1, VOCAB), 1, generator=g).view(n_seeds, bs)
        mu[..., t] = logp.gather(-1, tokens[..., t : t + 1]).squeeze(-1)
        exact[..., t] = torch.log_softmax(z, dim=-1).gather(-1, tokens[..., t : t + 1]).squeeze(-1)
    return tokens, mu, exact


@torch.no_grad()
def eval_reward(params: list[torch.Tensor], targets: torch.Tensor, g: torch.Generator, samples: int,
                spike_p: float = SPIKE_P) -> torch.Tensor:
    """``(S,)`` mean reward of ``samples`` noise-free samples per context (of ``targets (S, C, T)``)
    under each seed's policy."""
    ctx = torch.arange(targets.shape[1]).repeat_interleave(samples)
    versions = torch.zeros(targets.shape[0], len(ctx), LENGTH, dtype=torch.long)  # the live weights: version 0
    tokens, _, _ = generate({0: [p.detach() for p in params]}, ctx, versions, 0.0, g, spike_p)
    return (tokens == targets[:, ctx]).float().mean(dim=(1, 2))


@dataclass(frozen=True)
class Setup:
    """The knobs around the one training loop (``run_cell``) besides the cell's; defaults: the study's."""

    band: tuple[float, float] = (0.5, 2.0)  # token_k1 rejection band on ρ (recipes/async_agentic)
    minibatches: int = 2  # Adam steps per epoch, as the text_hybrid study's two optimizer steps per step
    partial: float = 0.5  # share of sequences (partial rollouts) that move to the next version mid-sequence
    spike_p: float = SPIKE_P  # 0: Gaussian mismatch only
    eval_every: int = 10
    eval_samples: int = 16


def draw_versions(n: int, n_seeds: int, bs: int, mean: float, bound: int, g: torch.Generator,
                  setup: Setup = Setup()) -> torch.Tensor:
    """``(S, bs, T)`` per-token versions at trainer version n: each sequence starts d ~ Poisson(mean)
    versions back (at most ``bound``, at most n), and a ``setup.partial`` share of them switch to the next
    version at a random position."""
    d = torch.poisson(torch.full((n_seeds, bs), mean), generator=g).long().clamp(max=min(bound, n))
    switch = torch.where(torch.rand(n_seeds, bs, generator=g) < setup.partial,
                         torch.randint(1, LENGTH, (n_seeds, bs), generator=g), torch.full((n_seeds, bs), LENGTH))
    return ((n - d)[..., None] + (torch.arange(LENGTH) >= switch[..., None]).long()).clamp(max=n)


def per_seed_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(S,)`` mean of ``x`` over the mask-1 entries of each seed (NaN where a seed has none)."""
    dims = tuple(range(1, x.dim()))
    return (x * mask).sum(dims) / mask.sum(dims).where(mask.sum(dims) > 0, torch.tensor(float("nan")))


@dataclass(frozen=True)
class ArmKnobs:
    """One arm's dict, parsed: ``algorithm.old_logits`` (``config``) plus the arm's own knobs."""

    config: OldLogitsConfig
    clip: float = CLIP  # PPO's ε, both sides
    rollout_is: str | None = "token"  # verl's rollout correction (CORRECTIONS)
    rollout_rs: str | None = "token_k1"
    opsm_delta: float | None = None  # off-policy sequence masking against μ at this δ (None: off)
    ewma_anchor: str = "batch"  # or "minibatch": the EWMA's log-probs (and correction) redone per mini-batch


def arm_knobs(arm: dict, bound: int) -> ArmKnobs:
    """Parses a study arm (``BOUND`` replaced by ``bound``): its ``clip``, ``correction``, ``opsm`` and
    ``ewma_anchor`` knobs, the rest ``algorithm.old_logits``."""
    raw = json.loads(json.dumps(arm).replace('"BOUND"', str(bound)))
    rollout_is, rollout_rs = CORRECTIONS[raw.pop("correction", "tis+band")]
    clip, opsm_delta, anchor = raw.pop("clip", CLIP), raw.pop("opsm", None), raw.pop("ewma_anchor", "batch")
    if anchor not in ("batch", "minibatch") or (anchor == "minibatch" and raw.get("provider") != "ewma"):
        raise ValueError(f"ewma_anchor must be 'batch' or 'minibatch' (the latter with provider ewma), got {arm}")
    config = OldLogitsConfig.from_config(raw, max_off_policy_threshold=bound)
    return ArmKnobs(config, clip, rollout_is, rollout_rs, opsm_delta, anchor)


def task_targets(seeds: list[int]) -> torch.Tensor:
    """``(S, CONTEXTS, T)`` hidden target sequences of each seed's task."""
    return torch.stack([torch.randint(0, VOCAB, (CONTEXTS, LENGTH), generator=torch.Generator().manual_seed(s))
                        for s in seeds])


def rollout(n: int, engine: dict[int, list[torch.Tensor]], ctx: torch.Tensor, targets: torch.Tensor,
            mean_staleness: float, bound: int, sigma: float, g: torch.Generator,
            setup: Setup) -> tuple[torch.Tensor, ...]:
    """The batch of trainer version n from the engine's versions with the mismatch noise: versions, tokens,
    μ, exact old log-probs (all ``(S, bs, T)``) and the GRPO advantages per context, expanded over tokens."""
    n_seeds, bs = targets.shape[0], len(ctx)
    versions = draw_versions(n, n_seeds, bs, mean_staleness, bound, g, setup)
    tokens, mu, exact = generate(engine, ctx, versions, sigma, g, setup.spike_p)
    grouped = (tokens == targets[:, ctx]).float().mean(-1).view(n_seeds, -1, GROUP)  # rewards by context
    adv = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)).view(n_seeds, bs)
    return versions, tokens, mu, exact, adv[..., None].expand(n_seeds, bs, LENGTH)


def correction(old: torch.Tensor, mu: torch.Tensor, knobs: ArmKnobs, setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's rollout correction on ρ = π_old/μ for ``(S, rows, T)`` log-probs: the IS weights and the
    kept (not rejected) tokens."""
    shape = old.shape
    is_proto, rs_mask, _ = compute_rollout_correction_and_rejection_mask(
        old.reshape(-1, LENGTH), mu.reshape(-1, LENGTH), torch.ones(old.numel() // LENGTH, LENGTH, dtype=torch.bool),
        rollout_is=knobs.rollout_is, rollout_is_threshold=TIS, rollout_rs=knobs.rollout_rs,
        rollout_rs_threshold=f"{setup.band[0]}_{setup.band[1]}")
    is_w = is_proto.batch["rollout_is_weights"].view(shape) if is_proto is not None else torch.ones(shape)
    return is_w, rs_mask.bool().view(shape)


def ppo_update(params: list[torch.Tensor], optim: torch.optim.Optimizer, states: list[OldLogitWorkerState],
               knobs: ArmKnobs, n: int, ctx: torch.Tensor, batch: tuple[torch.Tensor, ...], old: torch.Tensor,
               is_w: torch.Tensor, kept: torch.Tensor, epochs: int, setup: Setup,
               g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One version's Adam steps on the ppo_ewma loss (``setup.minibatches`` per epoch) over ``batch`` =
    ``rollout``'s (versions, tokens, μ, exact, advantages); every step calls the ``states``' hooks (the
    first state: the arm's own, whose EWMA a ``minibatch`` anchor reads). Returns the clip fraction
    (mean over the steps) and the largest ratio, ``(S,)`` each."""
    versions, tokens, mu, _, adv = batch
    n_seeds, bs = tokens.shape[:2]
    clipped, max_r = torch.zeros(n_seeds), torch.zeros(n_seeds)
    for _ in range(epochs):
        for mb in torch.randperm(bs, generator=g).chunk(setup.minibatches):
            for state in states:
                state.before_optimizer_step(n)
            old_mb, is_mb, kept_mb = old[:, mb], is_w[:, mb], kept[:, mb]
            if knobs.ewma_anchor == "minibatch":  # Hilton's PPO-EWMA: the proximal log-probs under θ̄ as it is now
                with torch.no_grad(), states[0].weights(EWMA):
                    proximal = log_probs(params, ctx[mb], tokens[:, mb])
                stand_in = versions[:, mb] < n if knobs.config.ewma.fresh_exact else torch.ones_like(old_mb, dtype=bool)
                old_mb = torch.where(stand_in, proximal, old_mb)
                is_mb, kept_mb = correction(old_mb, mu[:, mb], knobs, setup)
            logp = log_probs(params, ctx[mb], tokens[:, mb])
            m = kept_mb.float()
            out = decoupled_ppo_token_losses(logp, old_mb, adv[:, mb], is_mb, knobs.clip, knobs.clip, 3.0)
            losses = out.losses
            if knobs.opsm_delta is not None:  # the sequence's mean log(μ/π_θ) against δ, on negative advantages
                flat_mb = (n_seeds * len(mb), LENGTH)
                keep = opsm_mask(mu[:, mb].reshape(flat_mb), logp.reshape(flat_mb), adv[:, mb].reshape(flat_mb),
                                 torch.ones(flat_mb), knobs.opsm_delta).mask
                losses = losses * keep.view_as(losses)
            optim.zero_grad()
            per_seed_mean(losses, m).nan_to_num().sum().backward()  # token-mean per seed
            optim.step()
            for state in states:
                state.after_optimizer_step()
            clipped += per_seed_mean(out.clipped.float(), m).nan_to_num() / (epochs * setup.minibatches)
            max_r = torch.maximum(max_r, out.log_ratio.detach().exp().amax(dim=(1, 2)))
    return clipped, max_r


def provider_old_logits(provider, host: LocalPolicyHost, n: int, data: tuple[torch.Tensor, ...],
                        metrics: dict[str, float] | None = None) -> torch.Tensor:
    """``(S, bs, T)`` old log-probs of ``provider`` at trainer version ``n`` for ``rollout``'s batch ``data``."""
    versions, tokens, mu, _, _ = data
    n_seeds, bs = tokens.shape[:2]
    batch = {"tokens": tokens, "response_mask": torch.ones(n_seeds * bs, LENGTH, dtype=torch.bool),
             "token_versions": versions.reshape(-1, LENGTH), "rollout_log_probs": mu.reshape(-1, LENGTH)}
    host.version = n
    provider.compute(host, batch, {} if metrics is None else metrics)
    return batch["old_log_probs"].view(n_seeds, bs, LENGTH)


def run_cell(arm: dict, seeds: list[int], steps: int, mean_staleness: float, bound: int, sigma: float,
             lr: float, epochs: int, contexts: int = CONTEXTS, setup: Setup = Setup()) -> dict[str, torch.Tensor]:
    """One arm (``algorithm.old_logits``, ``BOUND`` replaced by ``bound``) of one cell, every seed at once,
    on the first ``contexts`` contexts of the task, the random stream common to the arms. Returns per-step
    ``(steps, S)`` series (rewards at the evaluation steps only, NaN elsewhere)."""
    n_seeds, bs = len(seeds), contexts * GROUP
    g = torch.Generator().manual_seed(1000 + seeds[0])
    targets = task_targets(seeds)
    params = init_params(seeds)
    optim = torch.optim.Adam(params, lr=lr)
    knobs = arm_knobs(arm, bound)
    steps_per_version = setup.minibatches * epochs
    state = OldLogitWorkerState(knobs.config, params, updates_per_version=steps_per_version)
    engine = {0: [p.detach().clone() for p in params]}  # weights the inference engine received, per version
    ctx = torch.arange(contexts).repeat_interleave(GROUP)

    def log_prob_fn(batch: dict, rows: torch.Tensor) -> torch.Tensor:
        return log_probs(params, ctx, batch["tokens"]).reshape(n_seeds * bs, LENGTH)[rows]

    host = LocalPolicyHost(log_prob_fn, state)
    provider = build_provider(knobs.config)
    hist: dict[str, list[torch.Tensor]] = defaultdict(list)
    for n in range(steps):
        # --- rollout by the engine's versions with the mismatch noise; GRPO advantages per context
        data = rollout(n, engine, ctx, targets, mean_staleness, bound, sigma, g, setup)
        versions, tokens, mu, exact, _ = data
        # --- old logits from the provider, then verl's rollout correction on ρ = π_old/μ
        metrics: dict[str, float] = {}
        old = provider_old_logits(provider, host, n, data, metrics)
        is_w, kept = correction(old, mu, knobs, setup)
        # --- what the band removes and why (against the exact old logits)
        proxy_out, exact_out = (ratio_out_of_band(x - mu, *setup.band) for x in (old, exact))
        stale = (versions < n).float()
        ones = torch.ones_like(stale)
        hist["masked"].append(per_seed_mean((~kept).float(), ones))
        hist["masked_staleness"].append(per_seed_mean((proxy_out & ~exact_out).float(), ones))
        hist["masked_numerics"].append(per_seed_mean(exact_out.float(), ones))
        rho = torch.exp(old - mu)
        hist["tis_truncated"].append(per_seed_mean((rho > TIS).float(), ones))
        hist["max_rho"].append(rho.amax(dim=(1, 2)))
        w = is_w * kept
        hist["ess"].append(w.sum((1, 2)) ** 2 / (kept.sum((1, 2)) * (w**2).sum((1, 2))).clamp(min=1e-12))
        hist["abs_error_stale"].append(per_seed_mean((old - exact).abs(), stale))
        hist["token_age_steps"].append(per_seed_mean((n - versions).float(), ones) * steps_per_version)
        hist["ewma_age_steps"].append(torch.full((n_seeds,), metrics.get("old_logits/ewma/age_steps", float("nan"))))
        # --- Adam steps on the ppo_ewma loss
        before = distributions(params, ctx, tokens).detach()
        clipped, max_r = ppo_update(params, optim, [state], knobs, n, ctx, data, old, is_w, kept, epochs, setup, g)
        hist["clipfrac"].append(clipped)
        hist["update_kl"].append(update_kl(distributions(params, ctx, tokens), before))
        hist["max_ratio"].append(max_r)
        engine[n + 1] = [p.detach().clone() for p in params]
        engine.pop(n - bound - 1, None)
        state.on_version_published(n + 1)
        hist["reward"].append(eval_reward(params, targets[:, :contexts], g, setup.eval_samples, setup.spike_p)
                              if (n + 1) % setup.eval_every == 0 else torch.full((n_seeds,), float("nan")))
    return {key: torch.stack(values) for key, values in hist.items()}


def toy_parser(module_doc: str, seeds: int) -> argparse.ArgumentParser:
    """``script_parser`` (docs page: ``STUDY_DOC``) with the options of every study of this toy."""
    parser = script_parser(module_doc, doc=STUDY_DOC)
    parser.add_argument("--seeds", type=int, default=seeds, help="paired seeds, trained at once")
    parser.add_argument("--lr", type=float, default=3e-3, help="base learning rate")
    parser.add_argument("--contexts", type=int, default=8, help="contexts of the task used")
    parser.add_argument("--json", type=Path, default=None, help="results, saved after every run and reused")
    return parser


def main() -> None:
    parser = toy_parser(__doc__, seeds=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--study", action="store_true", help="the mechanism study (the one mode)")
    parser.add_argument("--eps-matched", action="store_true",
                        help="with --study: EPS_ARMS on the base, lr x10 and 4-epoch cells, into their own section")
    parser.add_argument("--arms", nargs="+", default=None, help="--study: arms to run (default: all of the study's)")
    parser.add_argument("--report-only", action="store_true", help="--study: report the cells in --json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.study:  # the providers experiment (docs/results.md, "## Old-logit providers") was retired
        parser.error("--study: the mechanism study is the one mode")
    if args.json is None:
        raise SystemExit("--study needs --json PATH (results are saved there after every run, and reused)")
    t0 = time.time()
    meta_file = args.json.with_suffix(".meta.json")
    resumed = args.json.exists() and meta_file.exists()  # run_study reuses the cells done: count their time too
    results = json.loads(args.json.read_text()) if args.report_only else run_study(args)
    if not args.report_only:
        earlier = json.loads(meta_file.read_text())["seconds"] if resumed else 0.0
        meta = {"seconds": earlier + time.time() - t0, "seeds": args.seeds, "steps": args.steps, "lr": args.lr,
                "contexts": args.contexts, "eps_matched": args.eps_matched}
        meta_file.write_text(json.dumps(meta))
    study_report(results, json.loads(meta_file.read_text()), args.doc if args.write else None)


# One knob at a time around a base cell (the full 3 x 3 x 2 x 2 grid would take ~2 h on the shared 2-core
# machine): staleness mean 0.5 / 2 / 4 versions, mismatch σ 0 / 0.1 / 0.3, learning rate x1 / x10, 1 / 4 epochs.
STUDY_BASE = {"staleness": 2.0, "sigma": 0.1, "lr_scale": 1, "epochs": 1}
STUDY_VARIATIONS = {"staleness": [0.5, 4.0], "sigma": [0.0, 0.3], "lr_scale": [10], "epochs": [4]}


def study_cells(eps_matched: bool = False) -> list[dict]:
    """The base cell, then each knob's other values with the rest at the base (``eps_matched``: the base
    cell and the two large-update cells only)."""
    cells = [STUDY_BASE] + [{**STUDY_BASE, knob: value} for knob, values in STUDY_VARIATIONS.items() for value in values]
    return [c for c in cells if c["lr_scale"] > 1 or c["epochs"] > 1 or c == STUDY_BASE] if eps_matched else cells


def resumable_runs(path: Path | None, jobs: dict[tuple[str, str], Callable[[], dict]], label: str = "") -> dict:
    """results[key][arm] = job ``(key, arm)``'s series as lists; the jobs already in ``path`` are reused
    (a cut-short study resumes) and ``path`` is saved after every job."""
    results = json.loads(path.read_text()) if path and path.exists() else {}
    t0 = time.time()
    for (key, arm), job in jobs.items():
        if arm not in results.get(key, {}):
            results.setdefault(key, {})[arm] = {k: v.tolist() for k, v in job().items()}
            print(f"{label}{key} | {arm}: {time.time() - t0:.0f} s", flush=True)
            if path:
                path.write_text(json.dumps(results))
    return results


def run_study(args: argparse.Namespace) -> dict:
    """Runs every (cell, arm) not yet in ``args.json``; results[cell][arm] = {series: list (steps, S)}."""
    arms, jobs = EPS_ARMS if args.eps_matched else STUDY_ARMS, {}
    for cell in study_cells(args.eps_matched):
        key = f"d={cell['staleness']:g} sigma={cell['sigma']:g} lr=x{cell['lr_scale']} epochs={cell['epochs']}"
        bound = max(1, int(2 * cell["staleness"]))  # the staleness bound, twice the mean
        for arm in args.arms or arms:
            jobs[key, arm] = partial(run_cell, arms[arm], list(range(args.seeds)), args.steps, cell["staleness"],
                                     bound, cell["sigma"], args.lr * cell["lr_scale"], cell["epochs"], args.contexts)
    return resumable_runs(args.json, jobs)


def _per_seed(series: list, how: str, window: slice = slice(None)) -> np.ndarray:
    """Reduce a ``(steps, S)`` series to ``(S,)``: ``mean``/``max`` over ``window`` (NaN-aware) or
    ``final`` (last finite value, ``stats.last_finite``)."""
    x = np.asarray(series, float)[window]
    warnings.filterwarnings("ignore", "Mean of empty slice|All-NaN slice", RuntimeWarning)  # non-EWMA arms' age
    return last_finite(x.T) if how == "final" else {"mean": np.nanmean, "max": np.nanmax}[how](x, axis=0)


def study_rows(runs: dict, steps: int) -> dict[str, dict[str, np.ndarray]]:
    """Per arm, per-seed summaries: final reward, area under the reward curve (mean over the
    evaluations), collapse (final < half the seed's peak, peak >= 0.3), and the training
    diagnostics averaged over the second half (max ratio / max ρ: their maximum there)."""
    half, out = slice(steps // 2, None), {}
    for arm, h in runs.items():
        final = _per_seed(h["reward"], "final")
        out[arm] = {"final reward": final, "reward AUC": _per_seed(h["reward"], "mean"),
                    "collapsed": collapsed(final, _per_seed(h["reward"], "max"))}
        for key in ("masked", "masked_staleness", "masked_numerics", "tis_truncated", "ess", "clipfrac",
                    "abs_error_stale", "token_age_steps", "ewma_age_steps", "update_kl"):
            out[arm][key] = _per_seed(h[key], "mean", half) if key in h else np.full(len(final), np.nan)
        out[arm]["max_rho"], out[arm]["max_ratio"] = (_per_seed(h[k], "max", half) for k in ("max_rho", "max_ratio"))
    return out


STUDY_COLUMNS = [  # (label, row key, digits)
    ("final reward", "final reward", 3), ("reward AUC", "reward AUC", 3), ("masked", "masked", 4),
    ("of which staleness", "masked_staleness", 4), ("numerics (exact old)", "masked_numerics", 4),
    ("TIS-truncated", "tis_truncated", 4), ("ESS", "ess", 3), ("max ρ", "max_rho", 1),
    ("max r", "max_ratio", 2), ("clip frac", "clipfrac", 3), ("update KL", "update_kl", 5),
    ("abs err vs exact (stale tokens)", "abs_error_stale", 3), ("collapses", "collapsed", 0),
]
STUDY_PAIRS = [  # (a, b): paired differences reported in every cell
    ("snapshot", "current"), ("ewma calibrated", "current"), ("ewma com = bound (old default)", "current"),
    ("rollout", "current"), ("loglinear", "current"), ("ewma calibrated", "ewma com = bound (old default)"),
    ("ewma calibrated", "ewma calibrated, no fresh_exact"), ("snapshot", "ewma calibrated"),
    ("current, no band", "current"), ("current, no correction", "current"),
]


def update_kls(rows: dict[str, dict[str, np.ndarray]], anchor: str) -> dict[str, float]:
    """Mean update KL of each arm of ``anchor`` (any ε)."""
    return {arm: float(np.nanmean(row["update_kl"])) for arm, row in rows.items() if arm.split(",")[0] == anchor}


def eps_match(rows: dict[str, dict[str, np.ndarray]], anchor: str = "snapshot", reference: str = "current") -> str | None:
    """The ``anchor`` arm (any ε) whose mean update KL is nearest ``reference``'s on a log scale: ε is
    chosen by the size of the update alone, never by the outcome."""
    target = np.nanmean(rows[reference]["update_kl"]) if reference in rows else np.nan
    candidates = {arm: kl for arm, kl in update_kls(rows, anchor).items() if np.isfinite(kl) and kl > 0}
    if not np.isfinite(target) or not candidates:
        return None
    return min(candidates, key=lambda arm: abs(np.log(candidates[arm] / target)))


def study_checks(results: dict, meta: dict) -> list[str]:
    """The two sanity checks the page asks: the baseline shows the failure, the knobs are what they
    claim to be (measured, not assumed)."""
    cells = {key: study_rows(runs, meta["steps"]) for key, runs in results.items()}
    failures = [f"- Baseline failure, {key}: `current` masks {fmt_mean_se(rows['current']['masked_staleness'], 4)} "
                f"of the tokens *because of staleness* (band on ρ̂ out, on exact ρ in); snapshot − current masked "
                f"fraction: {paired_verdict(rows['snapshot']['masked'], rows['current']['masked'], 4)} (the failure "
                "is present where this interval excludes 0)."
                for key, rows in cells.items() if "current" in rows and "snapshot" in rows and "sigma=0 " not in key]
    knobs = [f"- Knobs, {key}: mean token age {fmt_mean_se(arm['token_age_steps'], 2)} optimizer steps; the calibrated "
             f"EWMA's age {fmt_mean_se(arm['ewma_age_steps'], 2)} (|difference| "
             f"{fmt_mean_se(np.abs(arm['ewma_age_steps'] - arm['token_age_steps']), 2)}; calibration: com := the "
             "tokens' mean lag); the old default's com = bound × steps per version."
             for key, rows in cells.items() if (arm := rows.get("ewma calibrated, no fresh_exact")) is not None]
    return failures + knobs + [""]


def study_report(results: dict, meta: dict, doc: Path | None) -> None:
    """``## Old-logit mechanism study``, printed and written into ``doc`` with its learning-curve plot."""
    steps, eps = meta["steps"], meta.get("eps_matched", False)
    command = (f"python -m scripts.bench.old_logits_experiment --study{' --eps-matched' if eps else ''} "
               f"--seeds {meta['seeds']} --steps {steps} --lr {meta['lr']:g} --contexts {meta['contexts']} "
               f"--json runs/old_logits_study{'_eps' if eps else ''}.json --write")
    heading = EPS_HEADING if eps else STUDY_HEADING
    # the design, the knobs and the checks' question are the page's own prose, above doc_sections.GENERATED
    lines = [heading, "",
             f"`{command}`: {meta['seconds'] / 60:.0f} min niced on the shared 2-core machine ({platform.machine()}, "
             f"Python {platform.python_version()}, torch {torch.__version__}; one thread); {meta['contexts']} contexts "
             f"x {GROUP} samples, {meta['seeds']} paired seeds per arm, {steps} steps, base lr {meta['lr']:g}.", ""]
    lines += study_checks(results, meta)
    for key, runs in results.items():
        rows = study_rows(runs, steps)
        lines += [f"### {key}", "", md_table(["arm", *(c for c, _, _ in STUDY_COLUMNS)],
                                              [[arm, *(fmt_mean_se(row[k], d) for _, k, d in STUDY_COLUMNS)]
                                               for arm, row in rows.items()])]
        lines += ["", "Paired differences, mean and t-based 95% interval over the seeds (final reward; reward AUC; "
                  "masked fraction):", ""]
        matched = eps_match(rows)
        pairs = list(STUDY_PAIRS)
        if matched is not None and matched != "snapshot":
            pairs.insert(0, (matched, "current"))
            snapshot_kls = update_kls(rows, "snapshot").values()
            lines.append(f"- ε-matched: `{matched}` (update KL {np.nanmean(rows[matched]['update_kl']):.2e} against "
                         f"`current`'s {np.nanmean(rows['current']['update_kl']):.2e}; the nearest of the snapshot arms, "
                         f"whose update KL spans {min(snapshot_kls):.2e}-{max(snapshot_kls):.2e}: where that span is "
                         "narrow, ε hardly sets the step and the match is weak)")
        keys = ("final reward", "reward AUC", "masked")
        lines += [f"- {a} − {b}: " + "; ".join(paired_verdict(rows[a][k], rows[b][k]) for k in keys)
                  for a, b in pairs if a in rows and b in rows]
        lines.append("")
    image = ROOT / "docs" / "img" / f"old_logits_study{'_eps' if eps else ''}.png"
    lines += [f"![old-logit mechanism study](../img/{image.name})", ""]
    if doc is not None:
        study_plot(results, image)
    publish(doc, heading, "\n".join(lines))


def study_plot(results: dict, path: Path) -> None:
    """Learning curves (evaluation reward, mean over seeds), one panel per cell."""
    with figure(path, 1, len(results), (4 * len(results), 3.6), 90) as axes:
        for ax, (key, runs) in zip(axes[0], results.items()):
            for i, (arm, h) in enumerate(runs.items()):
                x = np.asarray(h["reward"], float)
                at = np.flatnonzero(np.isfinite(x).all(axis=1))
                ax.plot(at + 1, x[at].mean(axis=1), color=f"C{i}", label=arm, linewidth=1)
            ax.set(title=key, xlabel="step", ylim=(0, 1))
            ax.title.set_fontsize(8)
        axes[0][0].set_ylabel("reward (noise-free samples)")
        axes[0][-1].legend(fontsize=6)


if __name__ == "__main__":
    main()
