"""Speed of the vectorised step-aware advantage estimators and their verl glue against plain Python loops.

The public entry point ``verl_ext.advantages.compute`` against a plain per-row loop of the same GiGPO math,
every estimator against the test reference loops (tests/advantages/loop_reference.py), and
``compute_token_advantages`` (per-row metadata in, token advantages out) on batches of realistic shapes.
Both sides get the same random step batch (tests/advantages/step_data.py) and are timed in alternation,
so machine load hits both alike.

    python -m scripts.bench.bench_advantages                  # 1k, 10k, 100k, 1M rows + glue
    python -m scripts.bench.bench_advantages --sizes 1000 10000 --write

Docs section (``--write``; printed otherwise): docs/results.md, "## Advantage estimators".
"""

from __future__ import annotations

import math
import os
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]

from scripts.bench.report import cpu_machine, publish, script_parser, target
from scripts.bench.report import table as md_table  # table() below is the docs section
from tests.advantages.loop_reference import LOOPS
from tests.advantages.step_data import BASE, random_steps

from verl_ext.advantages import compute, compute_with_returns, grouping  # noqa: E402
from verl_ext.advantages.verl_glue import compute_token_advantages  # noqa: E402
from verl_ext.steps import StepMetadata, anchor_key  # noqa: E402

# name -> (hyper-parameters, optional step columns): the published scripts' settings.
SETTINGS = {
    "gigpo": (dict(gamma=0.95, mode="mean_std_norm"), ()),
    "hgpo": (dict(gamma=0.95, mode="mean_std_norm", history_length=2), ()),
    "step_grouped": (dict(gamma=0.5, mode="mean_std_norm"), ("action_match",)),
    "himac": (dict(gamma=0.95, mode="mean_std_norm"), ("role",)),
    "hiper": (dict(gamma=1.0, lam=1.0, lam_seg=0.95), ("role", "values", "truncated")),
}
GROUP_SIZE, MAX_LEN, N_ANCHORS = 8, 30, 20
ROWS_PER_GROUP = (1 + GROUP_SIZE) / 2 * (1 + MAX_LEN) / 2  # expected rows of one random group
HEADING = "## Advantage estimators"
# (label, trajectories, (min, max) steps per trajectory, response tokens per row, layout) of the glue batches.
GLUE_SHAPES = [
    ("text corridor (`run_cpu.sh`): 32 trajectories x 1-6 steps, one row each, 144 tokens", 32, (1, 6), 144,
     "trajectory"),
    ("256 trajectories x 15 steps, one row each, 8,192 tokens", 256, (15, 15), 8192, "trajectory"),
    ("256 trajectories x 15 steps, one row per turn, 1,024 tokens", 256, (15, 15), 1024, "per_turn"),
]
GLUE_CONFIG = OmegaConf.create({"gamma": 1.0, "gigpo": {"gamma": 0.95, "mode": "mean_std_norm"},
                                "hgpo": {"gamma": 0.95, "history_length": 2}})
# A documented step time: one verl-agent GiGPO iteration on ALFWorld (Qwen2.5-1.5B, 128 trajectories
# of up to 50 one-row-per-turn steps) took 362.83 s (GiGPO paper, arXiv 2505.10978
# the GiGPO paper, arXiv 2505.10978).
DOCUMENTED_STEP_S = 362.83

ENTRY_POINT_GIGPO = dict(gamma=0.95, mode="mean_std_norm")  # the published GiGPO setting, as above
EPSILON = 1e-6  # the estimators' default


def _normalised(groups: dict, value: list[float], singleton_keeps_value: bool) -> dict[int, float]:
    """(v - group mean) / (group std (n - 1) + eps) per row; a one-row group keeps its value or gets 0."""
    out = {}
    for members in groups.values():
        if len(members) == 1:
            out[members[0]] = value[members[0]] if singleton_keeps_value else 0.0
            continue
        values = [value[i] for i in members]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, v in zip(members, values):
            out[i] = (v - mean) / (std + EPSILON)
    return out


def plain_gigpo(uid: list, traj_uid: list, step_idx: list, anchor: list, step_reward: list, *, gamma: float,
                mode: str) -> list[float]:
    """GiGPO (``mean_std_norm``) as a plain per-row Python loop over lists, without numpy: episode
    advantage of the trajectory's total reward within its ``uid`` group (one entry per step row)
    plus step advantage of the discounted return within its ``(uid, anchor)`` group."""
    assert mode == "mean_std_norm"
    n = len(uid)
    trajectories: dict = {}
    for i in range(n):
        trajectories.setdefault(traj_uid[i], []).append(i)
    score, returns = [0.0] * n, [0.0] * n
    for rows in trajectories.values():
        rows.sort(key=step_idx.__getitem__)
        total, running = sum(step_reward[i] for i in rows), 0.0
        for i in reversed(rows):
            running = step_reward[i] + gamma * running
            returns[i], score[i] = running, total
    episode_groups: dict = {}
    step_groups: dict = {}
    for i in range(n):
        episode_groups.setdefault(uid[i], []).append(i)
        step_groups.setdefault((uid[i], anchor[i]), []).append(i)
    episode = _normalised(episode_groups, score, True)
    step = _normalised(step_groups, returns, False)
    return [episode[i] + step[i] for i in range(n)]


def bench_entry_point(sizes: list[int], repeats: int = 7) -> list[dict]:
    """``verl_ext.advantages.compute("gigpo", ...)`` with string ids and anchors against
    ``plain_gigpo`` on the same rows: both warmed up once, then timed alternately; medians."""
    rows = []
    for size in sizes:
        data = random_steps(1, n_groups=max(1, round(size / ROWS_PER_GROUP)), group_size=GROUP_SIZE,
                            max_len=MAX_LEN, n_anchors=N_ANCHORS)
        inputs = {k: data[k] for k in BASE}
        lists = {k: v.tolist() for k, v in inputs.items()}
        vectorised = compute("gigpo", **inputs, **ENTRY_POINT_GIGPO)
        np.testing.assert_allclose(vectorised, plain_gigpo(**lists, **ENTRY_POINT_GIGPO), rtol=1e-9, atol=1e-9)
        vec, loop = [], []
        for _ in range(repeats):
            vec.append(timed(partial(compute, "gigpo", **inputs, **ENTRY_POINT_GIGPO)))
            loop.append(timed(partial(plain_gigpo, **lists, **ENTRY_POINT_GIGPO)))
        row = dict(n=len(data["uid"]), vec=statistics.median(t[0] for t in vec), loop=statistics.median(t[0] for t in loop),
                   vec_wall=statistics.median(t[1] for t in vec), loop_wall=statistics.median(t[1] for t in loop))
        rows.append(row)
        print(f"entry point gigpo n={row['n']:>9,d}  plain loop {row['loop'] * 1e3:10.1f} ms  compute "
              f"{row['vec'] * 1e3:8.2f} ms  speedup {row['loop'] / row['vec']:7.1f}x", flush=True)
    return rows


def timed(fn) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def repeats_for(n: int) -> int:
    return 7 if n <= 10_000 else 5 if n <= 100_000 else 3


def integer_keys(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same batch with uid, traj_uid and anchor as int64 codes (e.g. ids and anchor hashes
    an agent loop already stores as integers)."""
    return {k: grouping.factorize(v)[0] if k in ("uid", "traj_uid", "anchor") else v for k, v in data.items()}


def bench(sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        strings = random_steps(0, n_groups=max(1, round(size / ROWS_PER_GROUP)), group_size=GROUP_SIZE,
                               max_len=MAX_LEN, n_anchors=N_ANCHORS)
        for keys, data in (("str", strings), ("int", integer_keys(strings))):
            n = len(data["uid"])
            for name, (params, columns) in SETTINGS.items():
                inputs = {k: data[k] for k in BASE + columns}
                loop_inputs = {k: v.tolist() for k, v in inputs.items()}  # the loops work on lists
                vec, loop = [], []
                for _ in range(repeats_for(n)):  # alternate, so load changes hit both sides
                    vec.append(timed(partial(compute_with_returns, name, **inputs, **params)))
                    loop.append(timed(partial(LOOPS[name], **loop_inputs, **params)))
                row = dict(name=name, keys=keys, n=n)
                for label, times in (("vec", vec), ("loop", loop)):
                    row[label] = statistics.median(t[0] for t in times)
                    row[label + "_wall"] = statistics.median(t[1] for t in times)
                rows.append(row)
                print(f"{name:13s} {keys} n={n:>9,d}  loop {row['loop'] * 1e3:10.1f} ms  vectorised "
                      f"{row['vec'] * 1e3:8.2f} ms  speedup {row['loop'] / row['vec']:7.1f}x "
                      f"(wall {row['loop_wall'] / row['vec_wall']:.1f}x)", flush=True)
    return rows


def glue_batch(n_traj: int, n_steps: tuple[int, int], length: int, layout: str, seed: int = 0) -> dict:
    """What the trainer hands ``compute_token_advantages``: right-padded response masks, one
    ``extra_fields`` dict per row (StepMetadata as the agent loops write it), uids, scores; groups of
    8 trajectories, 20 anchor states, padding rows up to a multiple of 16."""
    rng = np.random.default_rng(seed)
    states = [anchor_key(np.full(4, i, dtype=np.uint8)) for i in range(N_ANCHORS)]  # sha256 keys
    extra, uids, masks, scores = [], [], [], []
    for t in range(n_traj):
        steps = int(rng.integers(n_steps[0], n_steps[1] + 1))
        rewards = [0.0] * (steps - 1) + [float(rng.integers(0, 2))]
        anchors = [states[i] for i in rng.integers(0, N_ANCHORS, steps)]
        extras = {"success": bool(rewards[-1]), "num_steps": steps, "actions": ["R"] * steps}
        uid = f"{t // GROUP_SIZE:08d}-7f3a-4b1c-9d2e-{t // GROUP_SIZE:012d}"
        if layout == "trajectory":
            width = length // n_steps[1]
            spans = [[i * width, i * width + width // 2] for i in range(steps)]  # model turn, then observation
            metas = [StepMetadata(f"traj-{t}", list(range(steps)), anchors, rewards, spans=spans,
                                  action_valid=[True] * steps, extras=extras)]
            mask = np.zeros((1, length), dtype=np.int64)
            for start, end in spans:
                mask[0, start:end] = 1
        else:
            metas = [StepMetadata(f"traj-{t}", [i], [anchors[i]], [rewards[i]], action_valid=[True], extras=extras)
                     for i in range(steps)]
            mask = (np.arange(length) < rng.integers(length // 4, length, (steps, 1))).astype(np.int64)
        extra += [{**m.to_extra_fields(), "min_global_steps": 3, "max_global_steps": 3} for m in metas]
        uids += [uid] * len(metas)
        masks.append(mask)
        scores += [rewards[-1]] * len(metas)
    pad = -len(uids) % 16  # verl's padding rows: a copy of row 0's fields under a "pad..." uid
    extra += [extra[0]] * pad
    uids += ["pad" + "0" * 32] * pad
    masks.append(np.zeros((pad, length), dtype=np.int64))
    return dict(response_mask=torch.from_numpy(np.concatenate(masks)), extra_fields=extra, uids=uids,
                scores=torch.tensor(scores + [0.0] * pad), row_keys=[f"{u}_0_{i}" for i, u in enumerate(uids)])


def bench_glue() -> list[dict]:
    rows = []
    for label, n_traj, n_steps, length, layout in GLUE_SHAPES:
        batch = glue_batch(n_traj, n_steps, length, layout)
        n_steps_total = sum(len(e["verl_ext"]["step_idx"]) for e, u in zip(batch["extra_fields"], batch["uids"])
                            if not u.startswith("pad"))
        row = dict(label=label, rows=len(batch["uids"]), steps=n_steps_total, length=length)
        for name in ("gigpo", "hgpo"):
            compute_token_advantages(name, algo_config=GLUE_CONFIG, **batch)  # warm-up (imports)
            times = [timed(partial(compute_token_advantages, name, algo_config=GLUE_CONFIG, **batch))
                     for _ in range(11)]
            row[name] = statistics.median(t[0] for t in times)
            row[name + "_wall"] = statistics.median(t[1] for t in times)
            print(f"glue {name:6s} {label}: {row[name] * 1e3:.2f} ms CPU (wall {row[name + '_wall'] * 1e3:.2f} ms)",
                  flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict], glue_rows: list[dict], entry_rows: list[dict]) -> str:
    sizes = sorted({r["n"] for r in rows})
    names = list(dict.fromkeys(r["name"] for r in rows))
    by = {(r["name"], r["keys"], r["n"]): r for r in rows}
    load = os.getloadavg()[0]
    lines = [
        HEADING,
        "",
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} with `python -m scripts.bench.bench_advantages` "
        f"on {cpu_machine()}, shared with other engineers' jobs (load average {load:.1f} at the end of the run); "
        f"numpy {np.__version__}.",
        "",
        "- Loop: the plain Python reference in `tests/advantages/loop_reference.py` (dicts of lists, "
        "numpy for each group's mean/std, as the reference implementations do with torch).",
        "- Vectorised: `verl_ext.advantages.compute_with_returns`, validation and sorting included.",
        f"- Both get the same shuffled batch: groups of 1-{GROUP_SIZE} trajectories of 1-{MAX_LEN} steps, "
        f"{N_ANCHORS} anchor states; settings of the published scripts.",
        "- Cells: median process CPU time, loop / vectorised = speedup, timed alternately (7 runs up "
        "to 10k rows, 5 at 100k, 3 at 1M). CPU time, because other jobs share the 2 cores; the "
        "wall-clock speedup is in brackets. numpy runs these ops on one thread.",
        "",
        f"**Public entry point** (`verl_ext.advantages.compute(\"gigpo\", ...)` with string ids and anchors, "
        f"{', '.join(f'{k}={v}' for k, v in ENTRY_POINT_GIGPO.items())}) against `plain_gigpo` in this script, a plain per-row Python loop of the same math "
        "over lists (no numpy; its outputs are checked equal first). Both warmed up by that check, then timed "
        "alternately 7 times; median process CPU time, wall-clock speedup in brackets:",
        "",
        md_table(["rows", "plain loop", "`compute`", "speedup"], [
            [f"{r['n']:,}", _ms(r["loop"]), _ms(r["vec"]), _speedup(r)] for r in entry_rows]),
        "",
        "**Every estimator against the test reference loops** (`tests/advantages/loop_reference.py`):",
        "",
    ]
    for keys, title in (("str", "String ids and anchors (python objects, as `compute` usually gets them)"),
                        ("int", "Integer ids and anchors (int64 codes or hashes)")):
        rows = [[name, *(f"{_ms(r['loop'])} / {_ms(r['vec'])} = {_speedup(r)}" for n in sizes
                         for r in [by[(name, keys, n)]])] for name in names]
        lines += [f"**{title}**", "", md_table(["estimator", *(f"{n:,} rows" for n in sizes)], rows), ""]
    lines += ["Vectorised CPU time per row in µs (string keys | integer keys), for linear growth:", "",
              md_table(["estimator", *(f"{n:,}" for n in sizes)], [
                  [name, *(f"{by[(name, 'str', n)]['vec'] / n * 1e6:.2f} \\| {by[(name, 'int', n)]['vec'] / n * 1e6:.2f}"
                           for n in sizes)] for name in names])]
    lines += ["", "**verl glue** (`verl_glue.compute_token_advantages`, what the trainer's advantage hook runs: "
              "per-row `extra_fields` parsing, the estimator, token painting; median process CPU time of 11 calls, "
              "wall time in brackets)", "",
              md_table(["batch", "rows (incl. padding)", "steps", "gigpo", "hgpo"], [
                  [r["label"], f"{r['rows']:,}", f"{r['steps']:,}",
                   *(f"{r[e] * 1e3:.1f} ms ({r[e + '_wall'] * 1e3:.1f})" for e in ("gigpo", "hgpo"))] for r in glue_rows])]
    largest = max(max(r["gigpo_wall"], r["hgpo_wall"]) for r in glue_rows)
    lines += ["", f"Share of a training step (reasoning, not a measurement): the slowest glue call above took "
              f"{largest * 1e3:.0f} ms of wall time on this CPU. A documented GPU step of the same kind of "
              f"training, one verl-agent GiGPO iteration on ALFWorld (Qwen2.5-1.5B, 128 trajectories of up to "
              f"50 one-row-per-turn steps), took {DOCUMENTED_STEP_S:.0f} s (GiGPO paper, arXiv 2505.10978; "
              f"the GiGPO paper, arXiv 2505.10978): {largest / DOCUMENTED_STEP_S * 100:.3f}% of it. A step ten times "
              f"faster would still put it at {largest / DOCUMENTED_STEP_S * 1000:.2f}%."]
    return "\n".join(lines) + "\n"


def _speedup(r: dict) -> str:
    """CPU-time speedup of the vectorised side, wall-clock speedup in brackets."""
    return f"**{r['loop'] / r['vec']:.0f}x** ({r['loop_wall'] / r['vec_wall']:.0f}x)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    publish(target(args), HEADING, table(bench(args.sizes), bench_glue(), bench_entry_point(args.sizes)))


if __name__ == "__main__":
    main()
