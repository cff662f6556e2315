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

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.errors import UserError
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
            problem = parents_problem(q.parents, i)
            if problem:
                raise ValueError(f"question {i} ({q.text!r}): {problem}")

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


def parents_problem(parents: Sequence[int], index: int) -> str | None:
    """Why ``parents`` cannot be the parent links of question ``index``, or ``None``.

    A negative index would wrap to the last question in Python, and a forward reference would
    gate on a value not yet gated (``scoring.gate_by_parents`` is one forward pass).
    """
    bad = [p for p in parents if not 0 <= p < index]
    if bad:
        return f"has parent index {bad[0]}; parents must index earlier questions of the same set (0..{index - 1})"
    return None


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


QUESTION_FIELDS = ("text", "kind", "parents")
_FIX = (
    "fix the row's questions or rebuild them with verl-ext dv-questions "
    "(docs/reference/dvreward.md, 'Building the questions')"
)


def _question(entry: Any, index: int, where: str) -> Question:
    """One stored question, every field checked; ``where`` names the record for the message."""

    def fail(field: str, value: Any, problem: str) -> UserError:
        return UserError(f"{where}, question {index}: {field}={value!r} {problem}; {_FIX}")

    if not isinstance(entry, Mapping):
        raise fail("question", entry, "is not a mapping with 'text', 'kind' and 'parents'")
    unknown = sorted(k for k, v in entry.items() if k not in QUESTION_FIELDS and v is not None)
    if unknown:
        raise fail(unknown[0], entry[unknown[0]], f"is not a question field (known: {', '.join(QUESTION_FIELDS)})")
    text, kind = entry.get("text"), entry.get("kind")
    if not isinstance(text, str) or not text.strip():
        raise fail("text", text, "is not a non-empty string: the judge would be asked about nothing")
    if kind not in (SEMANTIC, QUALITY):
        raise fail("kind", kind, f"is not {SEMANTIC!r} or {QUALITY!r}: the question would count in neither mean")
    parents = entry.get("parents")
    if parents is not None and (
        isinstance(parents, (str, bytes, Mapping))
        or not all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in _as_list(parents))
    ):
        raise fail("parents", parents, "is not a list of question indices")
    parents = tuple(int(p) for p in _as_list(parents))
    problem = parents_problem(parents, index)
    if problem:
        raise fail("parents", list(parents), problem)
    return Question(text, kind, parents)


def validate_question_set(record: Any, where: str) -> QuestionSet | None:
    """Check every field of one stored question record (the ``extra_info["dv_questions"]`` form
    in the module docstring) and build its ``QuestionSet``; ``None`` when it holds no question
    (``questions`` empty or null: the manager flags such a row ``no_questions``).

    Args:
        record: the stored record, as read from JSON or parquet (numpy arrays for lists).
        where: where the record is, for the message: a file and row, or a dataset row.

    Raises:
        UserError: naming ``where``, the question index, the field, its value and the fix: a
            record without a ``questions`` list, a question with unknown fields, a missing or
            empty ``text``, a ``kind`` other than ``semantic``/``quality``, or ``parents`` that are
            not indices of earlier questions. Before this check such a question was judged as
            "None", or fell out of both means while the sample still counted as valid.
    """
    if not isinstance(record, Mapping) or isinstance(record.get("questions"), (str, bytes, Mapping, numbers.Number)):
        raise UserError(f"{where}: {str(record)[:200]!r} is not a record with a 'questions' list; {_FIX}")
    questions = tuple(_question(entry, i, where) for i, entry in enumerate(_as_list(record.get("questions"))))
    meta = {k: str(v) for k, v in record.items() if k != "questions" and v is not None}
    return QuestionSet(questions, meta) if questions else None


def _alphagrpo_questions(extra_info: Mapping[str, Any], where: str) -> QuestionSet | None:
    """AlphaGRPO's ``semantic_questions`` / ``quality_questions`` (strings or ``{"question": ...}``)."""
    questions = []
    for kind in (SEMANTIC, QUALITY):
        for i, item in enumerate(_as_list(extra_info.get(f"{kind}_questions"))):
            text = item.get("question") if isinstance(item, Mapping) else item
            if not isinstance(text, str) or not text.strip():
                raise UserError(f"{where}['{kind}_questions'][{i}]={item!r} is not a non-empty question; {_FIX}")
            questions.append(Question(text, kind))
    return QuestionSet(tuple(questions)) if questions else None


def from_extra_info(
    extra_info: Mapping[str, Any] | None, key: str = "dv_questions", where: str | None = None
) -> QuestionSet | None:
    """Read a row's questions: our ``extra_info[key]`` record, else AlphaGRPO's two lists, every
    field checked (``validate_question_set``).

    A dotted ``key`` descends into nested mappings when no field has the dotted name itself
    (``verl_ext.extras.dv_questions``: the questions the ``hybrid_gui_tool`` agent loop copies
    from a MiniDesk reset into its step metadata). Returns ``None`` when the row has no questions
    in either form. ``where`` names the row in an error (default: its ``split`` and ``index``).
    """
    extra_info = extra_info or {}
    if where is None:
        row = ", ".join(f"{k}={extra_info[k]!r}" for k in ("split", "index") if k in extra_info) or "unknown"
        where = f"dataset row ({row})"
    record = extra_info.get(key)
    if record is None and "." in key:
        record = extra_info
        for part in key.split("."):
            record = record.get(part) if isinstance(record, Mapping) else None
    if record is not None:
        return validate_question_set(record, f"{where}, extra_info[{key!r}]")
    return _alphagrpo_questions(extra_info, f"{where}, extra_info")
