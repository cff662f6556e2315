"""What a screen-backed env drives: a ``Screen`` shows the task's page as numbered elements and
takes GUI primitives on them. Two implementations: ``verl_ext.envs.browser.Browser`` (headless
Chromium: MiniDesk, MiniWoB++) and ``verl_ext.envs.text_hybrid.TextScreen`` (in-process Python apps).
"""

from __future__ import annotations

from typing import Any, Protocol


class Screen(Protocol):
    """The lifecycle and GUI primitives ``verl_ext.envs.base.ScreenEnv`` uses.

    ``driver`` is None until ``start`` and after ``close``. ``observe`` returns ``{"title",
    "elements": [{id, role, text, value, states, key}], "status"}`` (``status``: the backend's
    verifier status) and raises ``EnvFault`` when the screen died; a primitive on an unknown element
    raises ``ActionError``.
    """

    driver: Any

    def start(self) -> Screen: ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...

    def observe(self, root_selector: str = "body", status_js: str = "") -> dict[str, Any]: ...

    def click(self, element: int) -> None: ...

    def click_at(self, x: int, y: int) -> None: ...

    def type(self, element: int, text: str) -> None: ...

    def select(self, element: int, option: str) -> None: ...

    def key(self, name: str) -> None: ...

    def scroll(self, direction: str, element: int | None = None) -> None: ...

    def screenshot(self) -> bytes: ...
