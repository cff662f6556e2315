"""One row per turn through verl's real `main_ppo` (v1 `verl_ext_sync` trainer, cpu backend): the
`text_env` agent loop with `layout: per_turn` returns a list of outputs, one per model turn, each
prompt holding the task, the last two actions and the current cell; HGPO scores the turn rows.
Slow: one run of 3-6 minutes (5.6 on a loaded 2-core machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

STEPS = 2
PROMPTS, ROLLOUTS = 8, 4  # run_cpu.sh: data.train_batch_size, actor_rollout_ref.rollout.n
PAD_MULTIPLE = 16  # run_cpu.sh: ppo_mini_batch_size (4) x rollout.n (4), one data-parallel rank
SOURCE = "verl_ext/text_corridor"
AGENT_LOOPS = """\
- name: text_env
  _target_: verl_ext.agent_loops.text_env.TextEnvAgentLoop
  layout: per_turn
  history_window: 2
"""


@pytest.fixture(scope="module")
def per_turn_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text_corridor_per_turn")
    (out / "agent_loops.yaml").write_text(AGENT_LOOPS)
    run_recipe(
        "text_corridor/run_cpu.sh", out,
        "algorithm.adv_estimator=hgpo", "+algorithm.hgpo.history_length=2",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={out / 'agent_loops.yaml'}",
        # task + two past actions + the current cell: about 120-140 prompt tokens with the tiny tokenizer
        "data.max_prompt_length=192",
        # verl pads a batch of varying size to a multiple of ppo_mini_batch_size x n (16 rows here),
        # not of the micro-batch sizes; without dynamic batch sizes those must divide 16.
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PAD_MULTIPLE}",
        f"trainer.test_freq={STEPS}",
        steps=STEPS,
    )
    return out


def test_turn_rows_reach_hgpo_and_every_step_trains(per_turn_run: Path):
    metrics = read_metrics(per_turn_run / "metrics.jsonl")
    assert set(range(1, STEPS + 1)) <= set(metrics), f"steps logged: {sorted(metrics)}"
    for step in range(1, STEPS + 1):
        m = metrics[step]
        assert_finite(m, ["critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
                          "actor/pg_loss", "actor/grad_norm", "critic/score/mean", "perf/total_num_tokens",
                          "prompt_length/mean", "response_length/mean"])
        # hgpo only runs if every turn row's StepMetadata reached the advantage hook (the glue
        # raises MissingStepMetadataError otherwise); distinct values mean the groups compared turns.
        assert m["critic/advantages/max"] > m["critic/advantages/min"], f"step {step}: all advantages equal"
        assert m["num_turns/max"] == m["num_turns/min"] == 2  # every row: one prompt, one answer
        # More rows than trajectories: total tokens = rows x mean row length + at most
        # PAD_MULTIPLE - 1 padding rows of 128 tokens (verl's synthetic padding).
        row_tokens = m["prompt_length/mean"] + m["response_length/mean"]
        rows_at_least = (m["perf/total_num_tokens"] - (PAD_MULTIPLE - 1) * 128) / row_tokens
        assert rows_at_least > PROMPTS * ROLLOUTS, f"step {step}: at least {rows_at_least:.0f} rows"
        assert 0.0 <= m["critic/score/mean"] <= 1.0


def test_each_validation_episode_is_scored_from_its_last_turn(per_turn_run: Path):
    # verl's validation keeps the last row of each session ({uid}_{session}_{index}); the reward is
    # computed on that row, whose StepMetadata extras carry the episode's success.
    metrics = read_metrics(per_turn_run / "metrics.jsonl")
    for step in (0, STEPS):
        m = metrics[step]
        assert_finite(m, [f"val-aux/{SOURCE}/success/mean@1", "val-aux/num_turns/mean"])
        assert 0.0 <= m[f"val-aux/{SOURCE}/success/mean@1"] <= 1.0 and m["val-aux/num_turns/mean"] == 2
