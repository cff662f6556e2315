"""Frozen-trajectory probe of the old-logit arms: one batch of stale data, one update per arm, the true objective.

The toy of ``old_logits_experiment`` (its policy, engine, providers, rollout correction and ``ppo_ewma`` update,
reused from there). Per cell and seed (all seeds at once, the model's seed dimension): train to a mid-training state
(``--warmup`` versions with the ``current`` arm; every arm's provider state, EWMA shadow and snapshots, follows
the same trajectory), draw ONE batch from the engine (staleness per sequence ~ Poisson(bound / 2), at most the
bound; partial rollouts; mismatch noise), then, from that same state and batch, apply one version's update
(the cell's lr and epochs, 2 mini-batches per epoch, the same mini-batch order) per arm and measure

* the improvement of the true objective: the expected reward of the policy after the update minus before,
  computed exactly (the policy is a Markov chain over (context, position, previous token): forward recursion
  of the token marginals, no sampling noise);
* the update size: KL(π_new ‖ π_old) per token over the batch's positions (the study's ``update_kl``).

Cells: update size (lr x1 / lr x10 / 4 epochs) x staleness bound (4 / 12) x mismatch (bf16-like: Gaussian
logit error σ 0.05; fp8-like: σ 0.3 with 1% of the logits at 8x). Arms: the mechanism study's and its ε-matched
study's, plus the EWMA anchor recomputed per mini-batch (``EWMA_ANCHOR_ARMS``). ``--study-cells``: the two
EWMA anchors also in full training runs (``run_cell``) on the study's base and large-update cells.

    python -m scripts.bench.old_logits_probe [--seeds 10] [--warmup 60] [--write]

Docs section (``--write``; printed otherwise): docs/experiments/old_logit_mechanism_study.md,
"## Frozen-trajectory probe".
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from functools import partial

import numpy as np
import torch

from scripts.bench.old_logits_experiment import (
    EPS_ARMS, EWMA_ANCHOR_ARMS, GROUP, LENGTH, SPIKE_P, STUDY_ARMS, VOCAB, Setup, arm_knobs,
    correction, distributions, init_params, log_probs, logits, ppo_update, provider_old_logits, resumable_runs, rollout,
    run_cell, study_rows, task_targets, toy_parser, update_kl,
)
from scripts.bench.report import cpu_machine, publish, table as md_table
from scripts.bench.stats import fmt_interval, fmt_mean_se, paired_difference, paired_verdict
from verl_ext.old_logits import OldLogitWorkerState, build_provider
from verl_ext.old_logits.local_host import LocalPolicyHost

HEADING = "## Frozen-trajectory probe"
ARMS = {**STUDY_ARMS, **EPS_ARMS, **EWMA_ANCHOR_ARMS}
REFERENCE = "current"
UPDATES = {"small": (1, 1), "lr x10": (10, 1), "4 epochs": (1, 4)}  # (lr scale, epochs)
BOUNDS = [4, 12]
MISMATCH = {"bf16-like": (0.05, 0.0), "fp8-like": (0.3, SPIKE_P)}  # (σ, share of logits at SPIKE_SCALE σ)
ANCHOR_PAIR = ("ewma calibrated, minibatch anchor", "ewma calibrated")


@torch.no_grad()
def exact_reward(params: list[torch.Tensor], targets: torch.Tensor, contexts: int) -> torch.Tensor:
    """``(S,)`` expected reward (the mean over the first ``contexts`` contexts and the positions of
    P(token = target)) of each seed's policy, exactly: the next token depends on (context, position,
    previous token) only, so the token marginals follow by forward recursion."""
    n_seeds = targets.shape[0]
    grid = torch.cartesian_prod(torch.arange(contexts), torch.arange(LENGTH), torch.arange(VOCAB + 1))
    z = logits(params, *(grid[:, i].expand(n_seeds, -1) for i in range(3)))
    step = torch.softmax(z, -1).view(n_seeds, contexts, LENGTH, VOCAB + 1, VOCAB)  # P(v | c, t, previous u)
    marginal = step[:, :, 0, VOCAB]  # (S, C, V): the first token follows the start symbol
    hit = [marginal.gather(-1, targets[:, :contexts, :1])]
    for t in range(1, LENGTH):
        marginal = (marginal[..., None] * step[:, :, t, :VOCAB]).sum(-2)
        hit.append(marginal.gather(-1, targets[:, :contexts, t : t + 1]))
    return torch.cat(hit, -1).mean(dim=(1, 2))


def probe_cell(arms: dict[str, dict], seeds: list[int], warmup: int, bound: int, sigma: float, lr: float,
               epochs: int, contexts: int = 8, setup: Setup | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """One cell: ``warmup`` versions of training with the ``current`` arm (every arm's provider state attached to the
    same parameters and hooks), one frozen batch at version ``warmup``, then each arm's one update from the same
    parameters, Adam state and mini-batch order. Per arm, ``(S,)`` tensors: ``improvement`` (exact expected reward
    after - before), ``update_kl``, ``masked`` (band), ``clipfrac``, ``reward_before``."""
    setup = setup or Setup()
    n_seeds, bs = len(seeds), contexts * GROUP
    g = torch.Generator().manual_seed(1000 + seeds[0])
    targets = task_targets(seeds)
    params = init_params(seeds)
    optim = torch.optim.Adam(params, lr=lr)
    ctx = torch.arange(contexts).repeat_interleave(GROUP)
    knobs = {arm: arm_knobs(spec, bound) for arm, spec in arms.items()}
    states = {arm: OldLogitWorkerState(k.config, params, updates_per_version=setup.minibatches * epochs)
              for arm, k in knobs.items()}

    def log_prob_fn(batch: dict, rows: torch.Tensor) -> torch.Tensor:
        return log_probs(params, ctx, batch["tokens"]).reshape(n_seeds * bs, LENGTH)[rows]

    hosts = {arm: LocalPolicyHost(log_prob_fn, state) for arm, state in states.items()}
    providers = {arm: build_provider(k.config) for arm, k in knobs.items()}
    trainer = arm_knobs(ARMS[REFERENCE], bound)
    trainer_provider = build_provider(trainer.config)
    trainer_host = LocalPolicyHost(log_prob_fn)
    engine = {0: [p.detach().clone() for p in params]}
    for n in range(warmup):
        data = rollout(n, engine, ctx, targets, bound / 2, bound, sigma, g, setup)
        for arm in arms:  # what each arm's provider would do with this batch (the calibrated EWMA aims its age)
            provider_old_logits(providers[arm], hosts[arm], n, data)
        old = provider_old_logits(trainer_provider, trainer_host, n, data)
        is_w, kept = correction(old, data[2], trainer, setup)
        ppo_update(params, optim, list(states.values()), trainer, n, ctx, data, old, is_w, kept, epochs, setup, g)
        engine[n + 1] = [p.detach().clone() for p in params]
        engine.pop(n - bound - 1, None)
        for state in states.values():
            state.on_version_published(n + 1)
    # --- the frozen batch, the shared starting point, then one update per arm
    n = warmup
    data = rollout(n, engine, ctx, targets, bound / 2, bound, sigma, g, setup)
    start = [p.detach().clone() for p in params]
    adam = copy.deepcopy(optim.state_dict())
    before = distributions(params, ctx, data[1]).detach()
    reward_before = exact_reward(params, targets, contexts)
    out = {}
    for arm in arms:
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        optim.load_state_dict(copy.deepcopy(adam))
        old = provider_old_logits(providers[arm], hosts[arm], n, data)
        is_w, kept = correction(old, data[2], knobs[arm], setup)
        order = torch.Generator().manual_seed(2000 + seeds[0])  # the same mini-batches in every arm
        clipped, _ = ppo_update(params, optim, [states[arm]], knobs[arm], n, ctx, data, old, is_w, kept, epochs,
                                setup, order)
        out[arm] = {"improvement": exact_reward(params, targets, contexts) - reward_before,
                    "update_kl": update_kl(distributions(params, ctx, data[1]), before),
                    "masked": (~kept).float().mean(dim=(1, 2)), "clipfrac": clipped, "reward_before": reward_before}
    return out


def run_probe(args) -> dict:
    """results[cell][arm] = ``probe_cell``'s measures as lists; the cells already in ``args.json`` are reused."""
    results = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    t0 = time.time()
    for update, bound, mismatch in itertools.product(UPDATES, BOUNDS, MISMATCH):
        key = f"{update}, bound {bound}, {mismatch}"
        if key not in results:
            (lr_scale, epochs), (sigma, spike_p) = UPDATES[update], MISMATCH[mismatch]
            out = probe_cell(ARMS, list(range(args.seeds)), args.warmup, bound, sigma, args.lr * lr_scale, epochs,
                             args.contexts, Setup(spike_p=spike_p))
            results[key] = {arm: {k: v.tolist() for k, v in row.items()} for arm, row in out.items()}
            print(f"{key}: {time.time() - t0:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results))
    return results


STUDY_CELLS = {"lr x10": (10, 1), "4 epochs": (1, 4)}  # the large-update cells, where the anchors can part


def run_study_cells(args) -> dict:
    """The two EWMA anchors in full runs on the study's large-update cells: results[cell][arm] = series."""
    path = args.json.with_name(args.json.stem + "_study.json") if args.json else None
    jobs = {(key, arm): partial(run_cell, spec, list(range(args.seeds)), args.study_steps, 2.0, 4, 0.1,
                                args.lr * lr_scale, epochs, args.contexts)
            for key, (lr_scale, epochs) in STUDY_CELLS.items() for arm, spec in EWMA_ANCHOR_ARMS.items()}
    return resumable_runs(path, jobs, "study ")


MATERIAL = 0.10  # a difference of at least this share of `current`'s improvement


def beyond_interval(results: dict) -> dict[str, list[tuple[str, float, float]]]:
    """Per cell, (arm, paired difference of the improvement vs ``current``, that difference as a share of
    ``current``'s mean improvement) where its t-based 95% interval excludes 0."""
    found = {}
    for key, rows in results.items():
        ref = rows[REFERENCE]["improvement"]
        for arm, row in rows.items():
            d = paired_difference(row["improvement"], ref)
            if arm != REFERENCE and d.n >= 2 and (d.low > 0 or d.high < 0):
                found.setdefault(key, []).append((arm, d.mean, d.mean / abs(float(np.mean(ref)))))
    return found


def worth_gpu_time(results: dict) -> list[str]:
    """The cells where some arm differs from ``current`` beyond the interval by at least ``MATERIAL``."""
    return [key for key, arms in beyond_interval(results).items() if any(abs(rel) >= MATERIAL for *_, rel in arms)]


def report(results: dict, meta: dict, study: dict | None) -> str:
    command = (f"python -m scripts.bench.old_logits_probe --seeds {meta['seeds']} --warmup {meta['warmup']} "
               f"--lr {meta['lr']:g} --contexts {meta['contexts']}"
               f"{' --study-cells --study-steps ' + str(meta['study_steps']) if study else ''} "
               f"--json runs/old_logits_probe.json --write")
    lines = [HEADING, "", f"`{command}`: {meta['date']}, {meta['seconds'] / 60:.0f} min niced on the shared "
             f"machine ({cpu_machine()}, torch {torch.__version__}; one thread); {meta['contexts']} contexts x "
             f"{GROUP} samples, {meta['seeds']} paired seeds, {meta['warmup']} warm-up versions, base lr "
             f"{meta['lr']:g}, 2 mini-batches per epoch.", ""]
    lines += [f"Worth GPU time (an arm's improvement differs from `current`'s beyond the paired 95% interval by at "
              f"least {MATERIAL:.0%} of it): {'; '.join(worth_gpu_time(results)) or 'none'}.", "",
              "Every difference beyond the interval, as a share of `current`'s improvement:", ""]
    lines += [f"- {key}: " + "; ".join(f"`{arm}` {rel:+.0%}" for arm, _, rel in arms)
              for key, arms in beyond_interval(results).items()] or ["- none"]
    lines += ["", "EWMA anchor per mini-batch (Hilton) − per batch (verl-ext), improvement, per cell:", ""]
    a, b = ANCHOR_PAIR
    lines += [f"- {key}: {paired_verdict(rows[a]['improvement'], rows[b]['improvement'], 5)}; "
              f"{np.mean(np.subtract(rows[a]['improvement'], rows[b]['improvement'])) / abs(np.mean(rows[b]['improvement'])):+.1%}"
              " of the per-batch anchor's improvement" for key, rows in results.items() if a in rows and b in rows]
    if study:
        lines += ["", f"Same pair in full runs ({meta['study_steps']} steps, staleness mean 2 / bound 4, σ 0.1 with "
                  "spikes; final reward; reward AUC):", ""]
        cells = {key: study_rows(runs, meta["study_steps"]) for key, runs in study.items()}
        keys = ("final reward", "reward AUC")
        lines += [f"- {key}: " + "; ".join(paired_verdict(rows[a][k], rows[b][k]) for k in keys)
                  for key, rows in cells.items() if a in rows and b in rows]
    lines.append("")
    for key, rows in results.items():
        ref = rows[REFERENCE]["improvement"]
        lines += [f"### {key} (expected reward before: {fmt_mean_se(rows[REFERENCE]['reward_before'], 3)})", "",
                  md_table(["arm", "improvement [95%]", "− current [95%]", "update KL", "masked", "clip frac"],
                           [[arm, fmt_interval(row["improvement"], 4, "+"),
                             "" if arm == REFERENCE else fmt_interval(np.asarray(row["improvement"]) - ref, 4, "+"),
                             f"{np.mean(row['update_kl']):.2e}", f"{np.mean(row['masked']):.4f}",
                             f"{np.mean(row['clipfrac']):.3f}"] for arm, row in rows.items()]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = toy_parser(__doc__, seeds=10)
    parser.add_argument("--warmup", type=int, default=60, help="versions of training before the frozen batch")
    parser.add_argument("--study-cells", action="store_true", help="also the EWMA anchors in full training runs")
    parser.add_argument("--study-steps", type=int, default=300)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    meta_file = args.json.with_suffix(".meta.json") if args.json else None
    earlier = json.loads(meta_file.read_text())["seconds"] if meta_file and meta_file.exists() else 0.0
    results = run_probe(args)
    study = run_study_cells(args) if args.study_cells else None
    meta = {"seconds": earlier + time.time() - t0, "seeds": args.seeds, "warmup": args.warmup, "lr": args.lr,
            "contexts": args.contexts, "study_steps": args.study_steps, "date": time.strftime("%Y-%m-%d")}
    if meta_file:
        meta_file.write_text(json.dumps(meta))
    publish(args.doc if args.write else None, HEADING, report(results, meta, study))


if __name__ == "__main__":
    main()
