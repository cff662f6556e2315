"""The settings panel: tabbed sections, one tool for most settings, a reset button per section."""

from __future__ import annotations

import random
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.text_hybrid_apps.app import (
    App,
    Question,
    Step,
    Subgoal,
    call,
    choose,
    click,
    same,
    string_param,
    widget,
)
from verl_ext.envs.tools import Param, ToolDef

_SETTINGS = (  # section, key, label, options (None: an on/off toggle), default
    ("Display", "dark_mode", "Dark mode", None, "off"),
    ("Display", "brightness", "Brightness", ("Low", "Medium", "High"), "Medium"),
    ("Display", "font_size", "Font size", ("Small", "Medium", "Large"), "Medium"),
    ("Display", "night_light", "Night light", None, "off"),
    ("Sound", "system_sounds", "System sounds", None, "on"),
    ("Sound", "volume", "Volume", ("Low", "Medium", "High"), "Medium"),
    ("Sound", "ringtone", "Ringtone", ("Chime", "Bells", "Pulse"), "Chime"),
    ("Sound", "vibrate", "Vibrate", None, "on"),
    ("Privacy", "location", "Location services", None, "on"),
    ("Privacy", "camera", "Camera access", None, "on"),
    ("Privacy", "ad_tracking", "Ad tracking", None, "on"),
    ("Privacy", "history", "Keep history", ("7 days", "30 days", "90 days"), "30 days"),
    ("Network", "wifi", "Wi-Fi", None, "on"),
    ("Network", "bluetooth", "Bluetooth", None, "off"),
    ("Network", "airplane", "Airplane mode", None, "off"),
    ("Network", "proxy", "Proxy", ("None", "Auto", "Manual"), "None"),
    ("Accessibility", "captions", "Captions", None, "off"),
    ("Accessibility", "high_contrast", "High contrast", None, "off"),
    ("Accessibility", "screen_reader", "Screen reader", None, "off"),
    ("Accessibility", "cursor", "Cursor size", ("Small", "Medium", "Large"), "Small"),
)
_SECTIONS = tuple(dict.fromkeys(row[0] for row in _SETTINGS))
# settings_set covers every setting but the last of each section: a tool exists for some operations only.
_TOOL_KEYS = tuple(row[1] for i, row in enumerate(_SETTINGS) if i % 4 != 3)
_SETTING = {row[1]: row for row in _SETTINGS}


class SettingsPanel(App):
    name = "settings_panel"
    tools = (
        ToolDef("settings_set", "Change one setting. Not every setting has a key here: the others are "
                "changed on screen.",
                {"key": Param("string", "setting key", enum=_TOOL_KEYS),
                 "value": string_param("'on'/'off' for toggles, else one of the setting's options")}, group="settings"),
        ToolDef("settings_get", "Read the current value of a setting.",
                {"key": Param("string", "setting key", enum=_TOOL_KEYS)}, group="settings"),
    )

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        super().__init__(rng, variant)
        self.values = {key: default for _, key, _, _, default in _SETTINGS}
        self.view = rng.randrange(len(_SECTIONS))
        n_single = rng.choice((3, 4))
        reset_section = rng.choice(_SECTIONS)
        # The section to restore starts with 2 or 3 of its tool-covered settings changed.
        covered = [k for k in _TOOL_KEYS if _SETTING[k][0] == reset_section]
        for key in rng.sample(covered, rng.choice((2, 3))):
            self.values[key] = self._other(key, self.values[key])
        singles = rng.sample([k for k in self.values if _SETTING[k][0] != reset_section], n_single)
        goals = [self._single(key) for key in singles]
        goals.insert(rng.randrange(len(goals) + 1), self._reset_goal(reset_section))
        self.subgoals = goals
        self._n_targets = n_single

    def _other(self, key: str, current: str) -> str:
        options = _SETTING[key][3] or ("on", "off")
        return self.rng.choice([o for o in options if o != current])

    def _non_default(self, key: str) -> bool:
        return self.values[key] != _SETTING[key][4]

    def _single(self, key: str) -> Subgoal:
        section, _, label, options, default = _SETTING[key]
        want = self._other(key, default)
        tab = _SECTIONS.index(section)
        edit = click(f"set-{key}") if options is None else choose(f"set-{key}", want)
        text = f"turn {label} {want}" if options is None else f'set {label} to "{want}"'
        question = (f"Is the {label} setting turned {want}?" if options is None
                    else f'Is the {label} setting "{want}"?')
        return Subgoal(
            text, (Question(question, lambda app: app.values[key] == want),),
            gui=lambda view: ([*self._tab(view, tab), edit], tab),
            tool=lambda view: [call("settings_set", key=key, value=want)] if key in _TOOL_KEYS else None,
        )

    def _reset_goal(self, section: str) -> Subgoal:
        tab = _SECTIONS.index(section)
        keys = [k for k in self.values if _SETTING[k][0] == section and self._non_default(k)]
        questions = tuple(Question(f'Is the {_SETTING[k][2]} setting back at its default "{_SETTING[k][4]}"?',
                                   lambda app, k=k: not app._non_default(k)) for k in keys)
        return Subgoal(
            f"restore the {section} section to its defaults", questions,
            gui=lambda view: ([*self._tab(view, tab), click(f"reset-{section}")], tab),
            tool=lambda view: [call("settings_set", key=k, value=_SETTING[k][4]) for k in keys],
        )

    @staticmethod
    def _tab(view: int, tab: int) -> list[Step]:
        return [] if view == tab else [click(f"tab-{_SECTIONS[tab]}")]

    def title(self) -> str:
        return f"Settings - {_SECTIONS[self.view]}"

    def widgets(self) -> list[dict[str, Any]]:
        out = [widget("tab", s, f"tab-{s}", states=("selected",) if i == self.view else ())
               for i, s in enumerate(_SECTIONS)]
        section = _SECTIONS[self.view]
        for _, key, label, options, _ in (row for row in _SETTINGS if row[0] == section):
            if options is None:
                out.append(widget("checkbox", label, f"set-{key}",
                                  states=("checked",) if self.values[key] == "on" else ()))
            else:
                out.append(widget("select", label, f"set-{key}", value=self.values[key],
                                  states=("options: " + " | ".join(options),)))
        out.append(widget("button", f"Restore {section} defaults", f"reset-{section}"))
        return out

    def click(self, key: str) -> None:
        kind, _, name = key.partition("-")
        if kind == "tab":
            self.view = _SECTIONS.index(name)
        elif kind == "set" and _SETTING[name][3] is None:
            self.values[name] = "off" if self.values[name] == "on" else "on"
        elif kind == "reset":
            for _, k, _, _, default in _SETTINGS:
                if _SETTING[k][0] == name:
                    self.values[k] = default
        else:
            super().click(key)

    def select(self, key: str, text: str) -> None:
        kind, _, name = key.partition("-")
        options = _SETTING[name][3] if kind == "set" else None
        if not options:
            super().select(key, text)
        match = [o for o in options if same(o, text)]
        if not match:
            raise ActionError(f"{_SETTING[name][2]} has no option {text!r}; options: {list(options)}")
        self.values[name] = match[0]

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        key = args["key"]
        if name == "settings_get":
            return tool_result(True, self.values[key])
        options = _SETTING[key][3] or ("on", "off")
        match = [o for o in options if same(o, args["value"])]
        if not match:
            return tool_result(False, None, f"{key} takes one of {list(options)}, got {args['value']!r}")
        self.values[key] = match[0]
        return tool_result(True, f"{key} = {match[0]}")

    def dump(self) -> dict[str, Any]:
        return {"open_section": _SECTIONS[self.view],
                "settings": [{"section": s, "key": k, "label": label, "value": self.values[k], "default": d}
                             for s, k, label, _, d in _SETTINGS]}

    def quality(self) -> list[Question]:
        n = self._n_targets
        return [Question(f"Do exactly {n} settings differ from their default values?",
                         lambda app: sum(app._non_default(k) for k in app.values) == n, kind="quality")]


# ============================================================================== contacts_book
