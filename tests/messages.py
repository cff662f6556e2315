"""Error messages are checked for what a user acts on, the key, the value and the fix, not for
their wording: rephrasing a message must not break a test, dropping the fix must."""

from __future__ import annotations


def assert_names(message: str, *parts: str) -> None:
    """``message`` contains every one of ``parts`` (each a key, a ``key=value``, a value or a fix)."""
    missing = [part for part in parts if part not in message]
    assert not missing, f"the message does not name {missing}:\n{message}"
