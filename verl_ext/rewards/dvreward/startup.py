"""Start-up checks of a run that uses the ``dvreward`` reward manager, before any worker starts.

verl builds the manager inside each ``RewardLoopWorker``, lazily: a bad key, a question set with a
typo or a judge that is not running used to surface only as a failure of every rollout, or as a
run where every row is excluded and nothing is learnt. ``check_config`` (no network) runs with
verl-ext's start-up checks (``verl_ext.validation``: doctor, the driver, the trainers); the verl-ext
trainers then call ``probe_configured_judge``.

* ``check_config``: every ``reward.reward_kwargs.dvreward`` key and value, that there is a judge,
  and every question set stored in ``data.train_files`` / ``data.val_files``
  (``question_set.validate_question_set``);
* ``probe_judge``: one ``GET /models`` to ``judge_url``; a judge where nothing listens, or that
  refuses the API key, stops the run naming the URL (never the key).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from verl_ext.errors import UserError
from verl_ext.rewards.dvreward.settings import KEY_PREFIX, DVRewardSettings

MANAGER_NAME = "dvreward"


def _get(node: Any, key: str) -> Any:
    # OmegaConf's DictConfig is a Mapping too
    return node.get(key) if isinstance(node, Mapping) else None


def settings_of(config: Any) -> DVRewardSettings | None:
    """The run's DVReward settings (``reward.reward_kwargs.dvreward``), or ``None`` when
    ``reward.reward_manager.name`` is not ``dvreward``. Raises ``ValueError`` naming an unknown
    key or a bad value."""
    reward = _get(config, "reward")
    if _get(_get(reward, "reward_manager"), "name") != MANAGER_NAME:
        return None
    return DVRewardSettings.from_mapping(_get(_get(reward, "reward_kwargs"), MANAGER_NAME))


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def check_data_files(paths: Iterable[str], questions_key: str) -> int:
    """Validate the question set of every row of the local parquet files in ``paths``; returns
    the number of rows with questions. A file none of whose rows has questions under a plain
    ``questions_key`` raises too: every row would be flagged ``no_questions`` (a dotted key may
    name questions the agent loop supplies, so it is not required in the file). Files that are not
    local parquet files are left to verl."""
    import pyarrow.parquet as pq

    from verl_ext.rewards.dvreward.question_set import from_extra_info

    with_questions = 0
    for path in paths:
        if not (path.endswith(".parquet") and os.path.isfile(path)):
            continue
        n_rows = pq.read_metadata(path).num_rows
        has_extra_info = "extra_info" in pq.read_schema(path).names
        rows = pq.read_table(path, columns=["extra_info"]).column(0).to_pylist() if has_extra_info else []
        found = sum(from_extra_info(extra_info, questions_key, where=f"{path} row {row}") is not None
                    for row, extra_info in enumerate(rows))
        if n_rows and not found and "." not in questions_key:
            raise UserError(
                f"{path}: none of its {n_rows} rows has questions in extra_info[{questions_key!r}] (nor AlphaGRPO's "
                f"semantic_questions/quality_questions); check {KEY_PREFIX}.questions_key or build them with "
                "verl-ext dv-questions"
            )
        with_questions += found
    return with_questions


def check_config(config: Any) -> DVRewardSettings | None:
    """The checks that need no network, for the trainers' start-up and ``verl-ext doctor``.

    Returns the settings, or ``None`` when the run does not use ``dvreward``. Raises
    ``ValueError`` (``UserError`` for the data) naming the key or the file, row, question and field.
    """
    settings = settings_of(config)
    if settings is None:
        return None
    reward = _get(config, "reward")
    genrm = bool(_get(_get(reward, "reward_model"), "enable"))
    settings.endpoint("<verl's GenRM router>" if genrm else None, None)  # raises when there is no judge
    problem = settings.env_score_problem(reward)
    if problem:
        raise ValueError(problem)
    data = _get(config, "data")
    check_data_files(_files(_get(data, "train_files")) + _files(_get(data, "val_files")), settings.questions_key)
    return settings


def probe_judge(settings: DVRewardSettings) -> None:
    """Raise ``UserError`` naming ``judge_url`` when nothing answers there within one request's
    bound (``timeout_s``) or the key is refused. verl's GenRM router (no ``judge_url``) is started
    by verl itself later and is not probed."""
    from verl_ext.rewards.dvreward.transport import probe

    if not settings.judge_url:
        return
    failure = probe(settings.endpoint(None, None), settings.timeout_s)
    if failure is None:
        return
    if failure.reason in ("no_api_key", "http_401", "http_403"):
        fix = f"check the environment variable named by {KEY_PREFIX}.api_key_env={settings.api_key_env!r}"
    elif failure.reason == "timeout":
        fix = f"start the judge, or raise {KEY_PREFIX}.timeout_s={settings.timeout_s:g} if it is only slow"
    else:
        fix = "start the judge (verl-ext judge-server, vLLM, SGLang) or fix the URL"
    raise UserError(
        f"the DVReward judge {KEY_PREFIX}.judge_url={settings.judge_url} does not answer ({failure}); {fix}. "
        "Without a judge every row would be excluded and the run would train on nothing"
    )


def probe_configured_judge(config: Any) -> None:
    """``probe_judge`` for the run's settings, when it uses ``dvreward`` (its keys and data are
    checked by ``check_config``, which ``verl_ext.validation`` runs)."""
    settings = settings_of(config)
    if settings is not None:
        probe_judge(settings)


def describe_judge(config: Any) -> str:
    """A sentence saying where the run's judge is, for an error message ("" without dvreward)."""
    settings = settings_of(config)
    if settings is None:
        return ""
    where = f"{KEY_PREFIX}.judge_url={settings.judge_url}" if settings.judge_url else "verl's GenRM router"
    return f"The judge: {where}"
