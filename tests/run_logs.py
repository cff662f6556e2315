"""Reading a verl run's console log for errors (shared by the GPU tests and their cpu test)."""

from __future__ import annotations

import re

TRACEBACK = "Traceback (most recent call last):"
# verl's progress bar reaching the last step (tqdm redraws it: the last such line counts)
TRAINING_DONE = re.compile(r"Training Progress: 100%")


def is_teardown_race(block: str, previous_line: str) -> bool:
    """One traceback of verl's colocate_async exit: ``fit`` returns right after ``on_step_end`` has
    resumed generation, so at exit a prompt still in flight can lose its vLLM server ("The actor is
    dead because its owner has died"), which verl's agent loop logs ("Error in _run_prompt")."""
    return ("Error in _run_prompt" in previous_line and "ActorDiedError" in block
            and "because its owner has died" in block)


def unexplained_tracebacks(log: str) -> list[str]:
    """Every traceback in ``log`` (up to the next one, at most 3000 characters) except the
    teardown race of ``is_teardown_race`` printed after the last step finished."""
    starts = [m.start() for m in re.finditer(re.escape(TRACEBACK), log)]
    done = max((m.end() for m in TRAINING_DONE.finditer(log)), default=len(log) + 1)
    found = []
    for i, start in enumerate(starts):
        block = log[start:starts[i + 1] if i + 1 < len(starts) else len(log)]
        previous_line = log[log.rfind("\n", 0, max(0, log.rfind("\n", 0, start))) + 1:start]
        if not (start > done and is_teardown_race(block, previous_line)):
            found.append(block[:3000])
    return found
