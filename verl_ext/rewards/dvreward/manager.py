"""The verl reward-loop manager ``dvreward`` (``reward.reward_manager.name=dvreward``).

verl's ``RewardLoopWorker`` builds it with ``load_reward_manager(config, tokenizer,
reward_router_address=..., reward_model_tokenizer=...)`` and awaits ``run_single(data)`` once
per trajectory. ``data`` is a ``DataProto`` of all outputs of one trajectory (streaming mode:
``prompts``/``responses``/``attention_mask`` tensors; non-tensor fields: every dataset column,
``tool_extra_fields`` = each output's agent-loop ``extra_fields``, ``__num_turns__``, ...).
Like verl's ``naive`` manager it scores the last output.

Per trajectory: read the questions (``extra_info[questions_key]``), pick the artifact (the
decoded response, or a field such as a final screenshot), ask the judge every question, gate
(DSG) and aggregate, then combine with an optional environment score::

    score = dv_weight * dv_score + env_weight * env_score

A trajectory the judge could not score is flagged (``dv_valid=0``, ``dv_failed=1``,
``dv_fail_reason``) and gets ``failed_score``, or raises with ``on_failure=raise``; it is
never a silent 0. ``reward_extra_info`` has the same scalar keys for every trajectory (verl
stacks them into arrays).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.protocol import DataProtoItem

from verl_ext.rewards.dvreward.judge import JudgeReport, OpenAIJudge
from verl_ext.rewards.dvreward.question_set import from_extra_info
from verl_ext.rewards.dvreward.scoring import DVScore, aggregate, gate_by_parents
from verl_ext.rewards.dvreward.settings import KEY_PREFIX, DVRewardSettings, field_value, has_verifier
from verl_ext.steps import EXTRA_FIELDS_KEY, step_metadata

logger = logging.getLogger(__name__)


def _plain(node: Any) -> dict[str, Any]:
    """A config node (OmegaConf or a plain mapping) as a plain dict."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node or {})


class DVRewardManager(RewardManagerBase):
    """DVReward: decomposed yes/no questions answered by an LLM/MLLM judge (AlphaGRPO)."""

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        reward_cfg = config.get("reward") or {}
        self.settings = DVRewardSettings.from_mapping(_plain((reward_cfg.get("reward_kwargs") or {}).get("dvreward")))
        rm_cfg = reward_cfg.get("reward_model") or {}
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer
        self.judge = OpenAIJudge(
            self.settings.endpoint(reward_router_address, rm_cfg.get("model_path")), self.settings.judge_options()
        )
        self.verifier = compute_score if has_verifier(reward_cfg) else None  # else verl's default (math) scorer
        self._n_flagged = 0
        problem = self.settings.env_score_problem(reward_cfg)  # the start-up checks refuse this already
        if problem:
            raise ValueError(problem)

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        item = data[-1]  # multi-output trajectories: score the last output, as verl's managers do
        tool_extra_fields = item.non_tensor_batch.get("tool_extra_fields") or {}
        fields: dict[str, Any] = dict(item.non_tensor_batch.get("extra_info") or {})
        fields.update(tool_extra_fields)
        response_ids = item.batch["responses"]
        valid_length = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        # the running loop, not self.loop: robust when the caller's loop is not the one at init
        response_text = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:valid_length], skip_special_tokens=True)
        )
        env_score = await self._env_score(item, response_text, fields)

        if EXTRA_FIELDS_KEY in tool_extra_fields:
            # The agent loop marked the trajectory untrainable (env fault): judging its final state
            # would spend judge calls on a reward nobody uses.
            meta = step_metadata(tool_extra_fields)
            if not meta.valid:
                return self._result(None, None, env_score, f"trajectory_invalid:{meta.invalid_reason}")
        questions = from_extra_info(fields, self.settings.questions_key)
        artifact = self.settings.artifact(fields, response_text)
        if questions is None or artifact is None:
            # verl's colocated-GenRM path sends no dataset columns at all (trainer_base.py,
            # _compute_reward_colocate): name it, since the fix is a config change.
            has_row = "extra_info" in item.non_tensor_batch
            reason = "no_artifact" if questions is not None else "no_questions" if has_row else "no_extra_info"
            return self._result(None, None, env_score, reason)
        report = await self.judge.answer_detailed(questions.texts, artifact)
        answers = report.answers
        if self.settings.dsg_gating:
            answers = gate_by_parents(answers, questions.parents, self.settings.gate_threshold)
        dv = aggregate(answers, questions.kinds, self.settings.aggregation, self.settings.min_answered_fraction)
        # dv.score is None only when the judge failed on questions (every sample has >= 1).
        reason = "" if dv.score is not None else "judge_failed:" + ",".join(sorted(report.failures))
        return self._result(dv, report, env_score, reason)

    def _result(self, dv: DVScore | None, report: JudgeReport | None, env_score: float | None, reason: str) -> dict:
        """verl's ``{"reward_score", "reward_extra_info"}``; the same keys for every trajectory."""
        s = self.settings
        if not reason and s.env_weight and env_score is None:
            reason = "no_env_score"
        valid = not reason
        if valid:
            score = s.dv_weight * dv.score + (s.env_weight * env_score if s.env_weight else 0.0)
        else:
            if s.on_failure == "raise":
                raise RuntimeError(
                    f"DVReward could not score a trajectory ({reason}{self._timeout_note(reason)}); "
                    f"{KEY_PREFIX}.on_failure=flag flags it instead"
                )
            score = s.failed_score
            self._warn_failure(reason)
        n_questions = dv.n_questions if dv else 0
        info = {
            "score": score,
            "dv_score": dv.score if dv else None,
            "dv_semantic": dv.semantic if dv else None,
            "dv_quality": dv.quality if dv else None,
            "dv_valid": int(valid),
            "dv_failed": int(not valid),
            "dv_fail_reason": reason,
            "dv_n_questions": n_questions,
            "dv_n_failed": dv.n_failed if dv else 0,
            "dv_failure_rate": dv.n_failed / n_questions if n_questions else None,
            "dv_cache_hit_rate": report.cache_hits / n_questions if report and n_questions else None,
            "dv_judge_latency_s": report.latency_s if report else None,
            # a string: per-sample lengths differ, and verl's metric code skips strings
            "dv_question_scores": json.dumps(list(dv.per_question) if dv else []),
            "env_score": env_score,
        }
        return {"reward_score": score, "reward_extra_info": info}

    def _warn_failure(self, reason: str) -> None:
        # Log the 1st, 2nd, 4th, 8th, ... failure of this worker: visible, never a flood.
        self._n_flagged += 1
        if self._n_flagged & (self._n_flagged - 1) == 0:
            logger.warning(
                "DVReward: trajectory flagged dv_failed=1 (%s%s); %d flagged so far in this worker; judge %s",
                reason,
                "; a colocated reward model passes no extra_info: set reward.reward_model.enable_resource_pool=True"
                if reason == "no_extra_info"
                else self._timeout_note(reason),
                self._n_flagged,
                self.judge.stats.summary(),
            )

    def _timeout_note(self, reason: str) -> str:
        """Where a judge request timed out: which judge, the bound and the keys that change it."""
        if "timeout" not in reason:
            return ""
        endpoint = self.judge.endpoint
        return (f"; the DVReward judge at {endpoint.chat_url} did not answer within {endpoint.timeout_s:g} s in "
                f"{endpoint.max_retries + 1} attempts ({KEY_PREFIX}.timeout_s, {KEY_PREFIX}.max_retries)")

    async def _env_score(self, item: DataProtoItem, response_text: str, fields: Mapping[str, Any]) -> float | None:
        """The environment verifier's score: ``env_score_key`` in the row, else the custom function."""
        if self.settings.env_score_key:
            value = field_value(fields, self.settings.env_score_key)
            return None if value is None else float(value)
        if self.verifier is None:
            return None
        kwargs = dict(
            data_source=item.non_tensor_batch.get("data_source"),
            solution_str=response_text,
            ground_truth=(item.non_tensor_batch.get("reward_model") or {}).get("ground_truth"),
            extra_info=dict(fields),
        )
        if self.reward_router_address is not None:
            kwargs.update(
                reward_router_address=self.reward_router_address, reward_model_tokenizer=self.reward_model_tokenizer
            )
        if inspect.iscoroutinefunction(self.verifier):
            result = await self.verifier(**kwargs)
        else:
            result = await asyncio.get_running_loop().run_in_executor(None, lambda: self.verifier(**kwargs))
        return float(result["score"] if isinstance(result, Mapping) else result)
