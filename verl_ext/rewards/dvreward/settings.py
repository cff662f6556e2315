"""DVReward manager settings: the keys under ``reward.reward_kwargs.dvreward`` and how a row's
fields are read with them (questions, artifact, environment score).

verl's ``reward`` section stays an OmegaConf dict at run time; the ``dvreward`` manager reads
``config.reward.reward_kwargs.dvreward`` the way verl's ``dapo`` manager reads
``config.reward.reward_kwargs``. On the command line the keys need ``+`` because they are new:
``+reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:8000/v1``.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_ext.rewards.dvreward.judge import Artifact, JudgeOptions
from verl_ext.rewards.dvreward.scoring import AGGREGATIONS
from verl_ext.rewards.dvreward.transport import Endpoint

KEY_PREFIX = "reward.reward_kwargs.dvreward"


def has_verifier(reward_cfg: Mapping[str, Any]) -> bool:
    """Whether ``reward.custom_reward_function`` names an environment verifier."""
    return bool((reward_cfg.get("custom_reward_function") or {}).get("path"))


@dataclass(frozen=True)
class DVRewardSettings(JudgeOptions):
    """Every key of ``reward.reward_kwargs.dvreward`` (docs/reference/dvreward.md has the table).

    The judge-client keys (``max_concurrency``, ``requests_per_minute``, ``max_tokens``,
    ``top_logprobs``, ``binary``, ``cache_size``) are inherited from ``JudgeOptions``.
    """

    # judge endpoint: judge_url wins; else verl's GenRM router (reward.reward_model.enable=True)
    judge_url: str | None = None
    model: str | None = None  # default: reward.reward_model.model_path, else "judge"
    api_key_env: str | None = None
    timeout_s: float = Endpoint.timeout_s  # the endpoint's defaults, kept in one place
    max_retries: int = Endpoint.max_retries
    backoff_s: float = Endpoint.backoff_s
    # scoring
    aggregation: str = "geometric"
    dsg_gating: bool = True
    gate_threshold: float = 0.5
    min_answered_fraction: float = 0.0
    # where a row keeps things (keys of extra_info / the agent loop's extra_fields; dots descend)
    questions_key: str = "dv_questions"
    artifact_key: str | None = None  # None: the decoded response text
    artifact_kind: str = "auto"  # auto | text | image
    env_score_key: str | None = None
    # combination and faults
    dv_weight: float = 1.0
    env_weight: float = 0.0
    failed_score: float = 0.0
    on_failure: str = "flag"  # flag | raise

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> DVRewardSettings:
        """Build from a plain mapping; an unknown key or a bad value raises, naming the key."""
        mapping = dict(mapping or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ValueError(f"unknown keys {[f'{KEY_PREFIX}.{k}' for k in unknown]}; known: {sorted(known)}")
        settings = cls(**mapping)
        checks = {
            "aggregation": settings.aggregation in AGGREGATIONS,
            "artifact_kind": settings.artifact_kind in ("auto", "text", "image"),
            "on_failure": settings.on_failure in ("flag", "raise"),
            "max_concurrency": settings.max_concurrency >= 1,
            # each judge request is bounded: timeout_s per attempt, 1 + max_retries attempts
            "timeout_s": settings.timeout_s > 0,
            "max_retries": settings.max_retries >= 0,
            "backoff_s": settings.backoff_s >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"bad value for {[f'{KEY_PREFIX}.{k}={getattr(settings, k)!r}' for k in bad]}")
        return settings

    def env_score_problem(self, reward_cfg: Mapping[str, Any]) -> str | None:
        """Why ``env_weight`` cannot be applied (no environment score to weigh), or None. verl passes
        its default (math) scorer when no custom function is configured; only a configured
        ``reward.custom_reward_function`` is an environment verifier."""
        if self.env_weight and not has_verifier(reward_cfg) and not self.env_score_key:
            return (f"{KEY_PREFIX}.env_weight={self.env_weight} needs an environment score: set "
                    f"{KEY_PREFIX}.env_score_key or reward.custom_reward_function.path")
        return None

    def endpoint(self, reward_router_address: str | None, default_model: str | None) -> Endpoint:
        """The judge endpoint: ``judge_url``, else verl's GenRM router address."""
        if self.judge_url:
            base_url = self.judge_url
        elif reward_router_address:
            base_url = f"http://{reward_router_address}/v1"
        else:
            raise ValueError(
                f"DVReward has no judge: set {KEY_PREFIX}.judge_url (an OpenAI-compatible /v1 URL) or enable "
                "verl's GenRM (reward.reward_model.enable=True, enable_resource_pool=True, "
                "reward.custom_reward_function.path set)"
            )
        return Endpoint(
            base_url=base_url,
            model=self.model or default_model or "judge",
            api_key_env=self.api_key_env,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            backoff_s=self.backoff_s,
        )

    def judge_options(self) -> JudgeOptions:
        return JudgeOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(JudgeOptions)})

    def artifact(self, fields: Mapping[str, Any], response_text: str) -> Artifact | None:
        """What the judge looks at: ``fields[artifact_key]`` or, without a key, the response.

        Bytes and ``data:image/...;base64,`` strings are images; other strings are images only
        with ``artifact_kind=image`` (then they hold base64). ``None`` when the key is missing.
        """
        if self.artifact_key is None:
            return Artifact.text(response_text)
        value = field_value(fields, self.artifact_key)
        if value is None:
            return None
        if isinstance(value, (bytes, bytearray)):
            return Artifact.image(bytes(value))
        text = str(value)
        if text.startswith("data:image/") and ";base64," in text:
            header, data = text.split(",", 1)
            return Artifact("image", data, header[len("data:") : header.index(";")])
        if self.artifact_kind == "image":
            base64.b64decode(text, validate=True)  # fail here, not as a judge fault on every question
            return Artifact("image", text, "image/png")
        return Artifact.text(text)


def field_value(fields: Mapping[str, Any], path: str) -> Any:
    """``fields["a"]["b"]`` for ``path="a.b"``; ``None`` when any step is missing."""
    value: Any = fields
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
