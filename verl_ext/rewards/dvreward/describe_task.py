"""``dv_describe``: a templated text task scored by DVReward (``recipes/dvreward_judge``).

Each prompt asks for one short sentence describing a coloured object ("Describe a red car in one
short sentence."). Its DVReward questions come from the same template, not from an LLM: a tiny
random policy model cannot decompose prompts, and templated questions keep CI and the recipe
deterministic. They have the stored schema ``verl-ext dv-questions`` writes
(``extra_info["dv_questions"]``, version ``template-v1``), with a DSG parent link, and pass the same
validation (``question_set.clean_questions``). For a real prompt set, build the questions with
``verl-ext dv-questions`` instead.

Questions per prompt (semantic first, then quality)::

    0 semantic  Does the text mention a {object}?
    1 semantic  Is the {object} described as {color}?        parents [0]
    2 quality   Is the text a single sentence?
    3 quality   Is the text free of markup or code?

``compute_score`` is the task's rule-based format check (one sentence, at most 30 words); the
recipe logs it as ``env_score`` next to the judge's score (``env_weight: 0``), and it is what verl's
GenRM path requires as ``reward.custom_reward_function``.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from verl_ext.rewards.dvreward.question_set import clean_questions
from verl_ext.rewards.dvreward.scoring import QUALITY, SEMANTIC

DATA_SOURCE = "verl_ext/dv_describe"
QUESTIONS_VERSION = "template-v1"
COLORS = ("red", "blue", "green", "yellow")
OBJECTS = ("car", "house", "cup", "kite")
MAX_WORDS = 30


def questions_record(color: str, obj: str, prompt: str) -> dict[str, Any]:
    """The ``extra_info["dv_questions"]`` record of one prompt."""
    raw = [
        (f"Does the text mention a {obj}?", SEMANTIC, ()),
        (f"Is the {obj} described as {color}?", SEMANTIC, (0,)),
        ("Is the text a single sentence?", QUALITY, ()),
        ("Is the text free of markup or code?", QUALITY, ()),
    ]
    question_set, dropped = clean_questions(raw, max_semantic=len(raw), max_quality=len(raw))
    if dropped:  # the template itself is wrong: fail loudly, never ship a silently shorter set
        raise ValueError(f"template questions failed validation: {dropped}")
    return {**question_set.to_record(), "version": QUESTIONS_VERSION, "model": "template",
            "prompt_sha": hashlib.sha256(prompt.encode()).hexdigest()[:16]}


def describe_rows(n: int, seed: int, split: str) -> list[dict]:
    """``n`` rows in verl's ``RLHFDataset`` layout; colour and object drawn from ``seed``/``split``."""
    rng = random.Random(f"dv_describe-{seed}-{split}")
    rows = []
    for index in range(n):
        color, obj = rng.choice(COLORS), rng.choice(OBJECTS)
        prompt = f"Describe a {color} {obj} in one short sentence."
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "description",
            "reward_model": {"style": "judge", "ground_truth": f"{color} {obj}"},
            "extra_info": {"split": split, "index": index, "dv_questions": questions_record(color, obj, prompt)},
        })
    return rows


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """1.0 if the response is one sentence (one final ``.``/``!``, no other sentence end) of 1 to
    ``MAX_WORDS`` words, else 0.0."""
    text = solution_str.strip()
    words = text.split()
    one_sentence = bool(re.fullmatch(r"[^.!?]+[.!]", text))
    return float(one_sentence and 1 <= len(words) <= MAX_WORDS)
