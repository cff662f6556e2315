"""The DVReward question schema stored in a dataset row, and the rules a question must pass.

Stored form (``extra_info["dv_questions"]``; a list of structs, so every parquet row has the
same schema)::

    {"version": "dvq-v1", "model": "...", "prompt_sha": "...",
     "questions": [{"text": "Is there a red car?", "kind": "semantic", "parents": []},
                   {"text": "Is the car's door open?", "kind": "semantic", "parents": [0]},
                   {"text": "Is the image free of visual artifacts?", "kind": "quality", "parents": []}]}

``parents`` are DSG-style dependencies (indices of earlier questions). AlphaGRPO's own format,
``extra_info["semantic_questions"]`` / ``["quality_questions"]`` (strings or
``{"question": ...}``), is read too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.rewards.dvreward.scoring import QUALITY, SEMANTIC

# A yes/no question opens with an auxiliary verb; "What colour is ...?" cannot be answered yes/no.
_YES_NO_OPENERS = frozenset(
    "is are am was were do does did has have had can could will would should shall may might must".split()
)
# A self-contained question names its subject; "Is it red?" needs the request to make sense.
# (Demonstratives are allowed: "Is this image sharp?" names its subject.)
_BARE_PRONOUNS = frozenset("it they them he she its their his her".split())
MIN_CHARS, MAX_CHARS = 8, 300


@dataclass(frozen=True)
class Question:
    """One atomic yes/no question. ``parents`` index earlier questions of the same set."""

    text: str
    kind: str = SEMANTIC
    parents: tuple[int, ...] = ()


@dataclass(frozen=True)
class QuestionSet:
    """The questions of one dataset row, semantic and quality, with DSG parent links.

    Raises:
        ValueError: a parent index that does not name an earlier question of the set: a
            negative index would wrap to the last question in Python, and a forward reference
            would gate on a value not yet gated (``scoring.gate_by_parents`` is one forward pass).
    """

    questions: tuple[Question, ...]
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, q in enumerate(self.questions):
            bad = [p for p in q.parents if not 0 <= p < i]
            if bad:
                raise ValueError(
                    f"question {i} ({q.text!r}) has parent index {bad[0]}; parents must index earlier "
                    f"questions of the same set (0..{i - 1})"
                )

    @property
    def texts(self) -> list[str]:
        return [q.text for q in self.questions]

    @property
    def kinds(self) -> list[str]:
        return [q.kind for q in self.questions]

    @property
    def parents(self) -> list[tuple[int, ...]]:
        return [q.parents for q in self.questions]

    def to_record(self) -> dict[str, Any]:
        """The JSON/parquet-friendly form written into ``extra_info``."""
        return {
            **dict(self.meta),
            "questions": [{"text": q.text, "kind": q.kind, "parents": list(q.parents)} for q in self.questions],
        }


def question_problem(text: str) -> str | None:
    """Why ``text`` is not an atomic, self-contained yes/no question, or ``None`` if it is one.

    The checks are heuristics on the surface form: length, a question mark, an auxiliary-verb
    opener, no bare pronoun as the subject, and no "and/or" joining two questions.
    """
    words = re.findall(r"[a-z']+", text.lower())
    if not MIN_CHARS <= len(text) <= MAX_CHARS:
        return f"length {len(text)} outside [{MIN_CHARS}, {MAX_CHARS}]"
    if not text.endswith("?") or text.count("?") > 1:
        return "not exactly one question mark, at the end"
    if not words or words[0] not in _YES_NO_OPENERS:
        return "does not open like a yes/no question"
    if len(words) > 1 and words[1] in _BARE_PRONOUNS:
        return "subject is a bare pronoun (not self-contained)"
    if re.search(r"\?\s*(and|or)\b|,\s*(and|or)\s+(is|are|does|do|can|has|have)\b", text.lower()):
        return "joins two questions"
    return None


def dedupe_key(text: str) -> str:
    """Questions equal up to case, whitespace and punctuation are duplicates."""
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def clean_questions(
    raw: Iterable[tuple[str, str, Sequence[int]]], max_semantic: int, max_quality: int
) -> tuple[QuestionSet, list[str]]:
    """Validate, deduplicate and cap questions, and remap their parent links.

    Args:
        raw: ``(text, kind, parents)`` in generation order; ``parents`` index this sequence.
        max_semantic / max_quality: caps per kind (the earliest questions are kept, so parents,
            which come first, survive the cap).

    Returns:
        The cleaned set (semantic questions first, then quality) and one line per question
        dropped, saying why. A parent link to a dropped or later question (also one that the
        semantic-first order puts later) is removed; the child stays because a valid question is
        self-contained.
    """
    raw = [(" ".join(str(t).split()), k, tuple(p)) for t, k, p in raw]
    kept: dict[int, Question] = {}  # raw index -> question (parents still raw indices)
    seen: set[str] = set()
    caps = {SEMANTIC: max_semantic, QUALITY: max_quality}
    counts = {SEMANTIC: 0, QUALITY: 0}
    dropped: list[str] = []
    for i, (text, kind, parents) in enumerate(raw):
        problem = (
            f"unknown kind {kind!r}"
            if kind not in caps
            else question_problem(text)
            or ("duplicate" if dedupe_key(text) in seen else None)
            or ("over the cap" if counts[kind] >= caps[kind] else None)
        )
        if problem:
            dropped.append(f"{text!r}: {problem}")
            continue
        seen.add(dedupe_key(text))
        counts[kind] += 1
        kept[i] = Question(text, kind, tuple(p for p in parents if isinstance(p, int) and 0 <= p < i))
    order = [i for i in kept if kept[i].kind == SEMANTIC] + [i for i in kept if kept[i].kind == QUALITY]
    new_index = {raw_i: j for j, raw_i in enumerate(order)}
    # semantic-first reordering can put a (quality) parent after its child: such a link goes too
    questions = tuple(
        Question(kept[i].text, kept[i].kind, tuple(new_index[p] for p in kept[i].parents if new_index.get(p, j) < j))
        for j, i in enumerate(order)
    )
    return QuestionSet(questions), dropped


def _as_list(value: Any) -> list[Any]:
    # Rows read through pandas hold numpy arrays where the parquet file has lists.
    return list(value) if value is not None and not isinstance(value, (str, bytes, Mapping)) else []


def from_extra_info(extra_info: Mapping[str, Any] | None, key: str = "dv_questions") -> QuestionSet | None:
    """Read a row's questions: our ``extra_info[key]`` record, else AlphaGRPO's two lists.

    A dotted ``key`` descends into nested mappings when no field has the dotted name itself
    (``verl_ext.extras.dv_questions``: the questions the ``hybrid_gui_tool`` agent loop copies
    from a MiniDesk reset into its step metadata). Returns ``None`` when the row has no questions
    in either form.
    """
    extra_info = extra_info or {}
    record = extra_info.get(key)
    if record is None and "." in key:
        record = extra_info
        for part in key.split("."):
            record = record.get(part) if isinstance(record, Mapping) else None
    if isinstance(record, Mapping) and record.get("questions") is not None:
        questions = tuple(
            Question(str(q["text"]), str(q.get("kind", SEMANTIC)), tuple(int(p) for p in _as_list(q.get("parents"))))
            for q in _as_list(record["questions"])
        )
        meta = {k: str(v) for k, v in record.items() if k != "questions" and v is not None}
        try:
            return QuestionSet(questions, meta) if questions else None
        except ValueError as err:
            row = ", ".join(f"{k}={extra_info[k]!r}" for k in ("split", "index") if k in extra_info) or "unknown"
            raise ValueError(
                f"extra_info[{key!r}] of dataset row ({row}): {err}. Rebuild the row's questions "
                "(verl-ext dv-questions) or fix its parents lists"
            ) from err
    questions = tuple(
        Question(str(item["question"] if isinstance(item, Mapping) else item), kind)
        for kind in (SEMANTIC, QUALITY)
        for item in _as_list(extra_info.get(f"{kind}_questions"))
    )
    return QuestionSet(questions) if questions else None
