"""Dataset rows for ``hybrid_gui_tool`` training (verl ``RLHFDataset`` layout), no browser needed.

``minidesk_rows(n, seed, split)`` has the signature of ``verl_ext.data.DATASETS`` entries. Train
and validation draw disjoint task seeds (validation from ``VAL_SEED_OFFSET`` up), templates are
spread evenly, and each row names its task in ``extra_info.env`` for the agent loop.
"""

from __future__ import annotations

import random
from typing import Any

from verl_ext.envs.policies import SYSTEM_PROMPT
from verl_ext.errors import UserError

AGENT_NAME = "hybrid_gui_tool"
VAL_SEED_OFFSET = 1_000_000


def choose_templates(env: str, templates: list[str] | None, known: list[str]) -> list[str]:
    """``templates`` (every one of ``known`` when none are given); an unknown name raises
    ``UserError`` listing the known ones (``verl-ext prepare-data --templates``)."""
    unknown = sorted(set(templates or ()) - set(known))
    if unknown:
        raise UserError(f"unknown {env} templates {unknown} (--templates); known: {', '.join(known)}")
    return list(templates or known)


def minidesk_rows(n: int, seed: int, split: str, templates: list[str] | None = None) -> list[dict[str, Any]]:
    """``n`` MiniDesk task rows; every template appears ``n // len(templates)`` or one more times."""
    from verl_ext.envs.minidesk.env import template_catalog

    catalog = template_catalog()
    chosen = choose_templates("MiniDesk", templates, list(catalog))
    return [
        {
            "data_source": "verl_ext/minidesk",
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": "Complete the task on the desktop below."}],
            "ability": "computer_use",
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {"split": split, "index": index, "tool_beneficial": catalog[template]["tool_beneficial"],
                           "env": {"backend": "minidesk", "task": template, "seed": task_seed}},
        }
        for index, (template, task_seed) in enumerate(spread_tasks("minidesk", chosen, n, seed, split))
    ]


def spread_tasks(family: str, templates: list[str], n: int, seed: int, split: str) -> list[tuple[str, int]]:
    """(template, task seed) of ``n`` rows of a task family: every template ``n // len(templates)``
    or one more times, in shuffled order; validation task seeds from ``VAL_SEED_OFFSET`` up, so
    train and validation tasks never coincide."""
    rng = random.Random(f"{family}-{seed}-{split}")
    base = VAL_SEED_OFFSET if split != "train" else 0
    task_seeds = rng.sample(range(base, base + VAL_SEED_OFFSET), n)
    order = (templates * (n // len(templates) + 1))[:n]
    rng.shuffle(order)
    return list(zip(order, task_seeds))
