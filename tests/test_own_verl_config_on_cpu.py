"""``docs/howto/own_verl_config.md`` is true: its complete config passes every start-up check, its
first table explains exactly the lines of that config, and each change in its second table is refused
with the words the page quotes (by verl-ext's start-up checks, or by Hydra while composing).

Configs are composed as ``main_ppo`` composes them and checked by ``verl_ext.validation`` (what the
driver, the verl-ext trainers and ``verl-ext doctor`` run); nothing starts Ray or a worker."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from verl_ext import validation
from verl_ext.compose import compose

PAGE = Path(__file__).resolve().parents[1] / "docs" / "howto" / "own_verl_config.md"


def _section(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _complete_config() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", _section("A complete config"), re.S).group(1)
    lines = [line.strip().rstrip("\\").strip() for line in block.splitlines()]
    assert lines[0] == "python -m verl.trainer.main_ppo"
    return lines[1:]


def _table_rows(heading: str) -> list[list[str]]:
    rows = [line for line in _section(heading).splitlines() if line.startswith("| `")]
    return [[cell.strip().strip("`") for cell in row.strip("|").split(" | ")] for row in rows]


def _key(override: str) -> str:
    """The config key an override sets: ``plugins/advantage`` for a fragment, else the dotted key."""
    return override.split("=", 1)[0].lstrip("+")


def _with_change(config: list[str], change: str) -> list[str]:
    """``config`` with each override of ``change`` replacing the line for the same key (or added)."""
    changed = list(config)
    for override in change.split():
        same_key = [i for i, line in enumerate(changed) if _key(line) == _key(override)]
        if same_key:
            changed[same_key[0]] = override
        else:
            changed.append(override)
    return changed


@pytest.fixture(scope="module")
def your_run(tiny_model_dir, tmp_path_factory) -> list[str]:
    """What the page calls "your model, data and batch sizes": the tiny model, multi-turn rows that
    name no agent loop (so ``default_agent_loop`` decides), one micro-batch per stage, cpu backend."""
    from verl_ext.data import main as prepare_data

    data = tmp_path_factory.mktemp("own_config_data")
    prepare_data(["text_corridor", str(data), "--train-size", "8", "--val-size", "2"])
    for split in ("train", "val"):
        rows = pd.read_parquet(data / f"{split}.parquet")
        rows.drop(columns=["agent_name"]).to_parquet(data / f"{split}.parquet")
    return [
        "+plugins/backend=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
    ]


def _refusals(overrides: list[str]) -> str:
    """Everything that stops this config before a worker starts, as one text ('' when nothing does)."""
    try:
        config = compose(overrides, None, "ppo_trainer")
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors are refusals too
        return f"{type(exc).__name__}: {exc}"
    return "\n".join(validation.problems(config, list(config.hydra.overrides.task)))


def test_the_complete_config_passes_every_start_up_check(your_run):
    assert _refusals([*your_run, *_complete_config()]) == ""


def test_the_first_table_explains_exactly_the_lines_of_the_complete_config():
    assert [row[0] for row in _table_rows("A complete config")] == _complete_config()


@pytest.mark.parametrize(("change", "refusal"), _table_rows("What each line refuses"))
def test_each_change_is_refused_with_the_quoted_words(your_run, change, refusal):
    found = _refusals(_with_change([*your_run, *_complete_config()], change))
    assert refusal in found.replace("\n", " "), found
