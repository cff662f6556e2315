"""The four TextHybrid apps: settings panel, contacts book, file manager, inventory sheet.

Each app is a small pure-Python program with a screen (widgets with stable keys), GUI handlers,
app tools (:class:`~verl_ext.envs.tools.ToolDef`) and a task generator. A task is 4 to 6
*subgoals*; each subgoal can be done through the GUI or, where a tool exists, through tool calls,
and says what each costs from the current view (page or tab). Why the costs differ:

- ``settings_panel``: tabs; one tool, ``settings_set``, for 3 of the 4 settings of each section;
  GUI edits in the open section cost 1 step, elsewhere 2 (tab + edit); restoring a section's
  defaults is one GUI button but one tool call per changed setting.
- ``contacts_book``: 5 contacts a page, Previous/Next only; the page does not show contact ids,
  so a tool edit costs 2 calls (``contacts_find`` + ``contacts_update``) while a GUI edit costs
  the page distance + 1; favourites have no tool; adding is 1 call or 3 GUI steps.
- ``file_manager``: folder tabs; ``files_move``/``files_delete`` take a path (1 call), renaming has
  no tool, emptying a folder is one GUI button but one call per file, moving every file of an
  extension is one call but one GUI step per file.
- ``inventory_sheet``: 6 rows a page, Previous/Next only; row numbers are visible only for the rows
  on screen, so ``sheet_set_cell`` needs a ``sheet_find`` first for an item on another page;
  filling a range is one call but one GUI step per cell (plus pages); clearing a row is one GUI
  button but three calls.

Every subgoal writes DVReward yes/no questions (``Question``) with a predicate that answers them
on the app's state; the verifier ``check`` is the conjunction of the predicates, so a state passes
``check`` exactly when every question's answer is yes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.tools import Param, ToolDef

Step = dict[str, Any]  # a reference-plan step, MiniDesk's format: {gui, k, text?} or {tool, args}


def click(key: str) -> Step:
    return {"gui": "click", "k": key}


def type_(key: str, text: str) -> Step:
    return {"gui": "type", "k": key, "text": str(text)}


def choose(key: str, text: str) -> Step:
    return {"gui": "select", "k": key, "text": str(text)}


def call(tool: str, /, **args: Any) -> Step:
    return {"tool": tool, "args": args}


@dataclass(frozen=True)
class Question:
    """A DVReward question about the final state and the predicate that answers it.
    ``parents`` index earlier questions of the same subgoal (made global by the env)."""

    text: str
    holds: Callable[[Any], bool]
    parents: tuple[int, ...] = ()
    kind: str = "semantic"


@dataclass(frozen=True)
class Subgoal:
    """One decision of a task. ``gui(view)`` -> (GUI steps from ``view``, view afterwards);
    ``tool(view)`` -> tool-path steps from ``view`` (they never change the view), or None when no
    tool does this operation."""

    text: str
    questions: tuple[Question, ...]
    gui: Callable[[int], tuple[list[Step], int]]
    tool: Callable[[int], list[Step] | None]


def same(a: Any, b: Any) -> bool:
    """Values equal as numbers when both are numbers, else as trimmed, case-folded text."""
    x, y = str(a).strip().lower(), str(b).strip().lower()
    try:
        return abs(float(x) - float(y)) < 1e-9
    except ValueError:
        return x == y


def widget(role: str, text: str, key: str, value: str | None = None, states: tuple[str, ...] = ()) -> dict[str, Any]:
    """One screen element in the shape ``Browser.observe`` returns (the env numbers them)."""
    return {"role": role, "text": text, "value": value, "states": list(states), "key": key}


def page_steps(current: int, target: int) -> list[Step]:
    """Previous/Next clicks from page ``current`` to page ``target``."""
    key = "page-next" if target > current else "page-prev"
    return [click(key)] * abs(target - current)


class App:
    """Base of the apps. ``view`` is the open tab or page (an int); subclasses fill ``subgoals``.

    ``variant``: ``mixed`` or ``gui``; for ``gui`` the generator leaves out the operations whose
    tool always wins (bulk tool operations, adding), so that a GUI-only optimum can be drawn.
    """

    name = ""
    tools: tuple[ToolDef, ...] = ()

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        self.rng = rng
        self.tool_ops = variant != "gui"
        self.view = 0
        self.subgoals: list[Subgoal] = []

    # --- screen and GUI -----------------------------------------------------------------------
    def title(self) -> str:
        raise NotImplementedError

    def widgets(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def click(self, key: str) -> None:
        """An element without a click action: nothing happens (as in a browser), the step is spent."""

    def type(self, key: str, text: str) -> None:
        raise ActionError("this element is not a text field")

    def select(self, key: str, text: str) -> None:
        raise ActionError("this element is not a drop-down")

    def scroll(self, direction: str) -> None:
        """Scrolling moves nothing on these small screens (paged apps page)."""

    # --- tools and state ----------------------------------------------------------------------
    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def dump(self) -> dict[str, Any]:
        raise NotImplementedError

    def quality(self) -> list[Question]:
        """Questions about changes the task forbids (DVReward ``quality`` kind)."""
        return []

    def instruction(self) -> str:
        items = "; ".join(f"({i}) {goal.text}" for i, goal in enumerate(self.subgoals, 1))
        return f"In the {self.title().split(' - ')[0]} app, do all of the following: {items}."


class PagedApp(App):
    """A list shown ``page_size`` items a page, with Previous/Next buttons (no page jumps)."""

    page_size = 5

    def n_items(self) -> int:
        raise NotImplementedError

    def pages(self) -> int:
        return max(1, math.ceil(self.n_items() / self.page_size))

    def page_of(self, index: int) -> int:
        return index // self.page_size

    def visible(self) -> range:
        start = self.view * self.page_size
        return range(start, min(start + self.page_size, self.n_items()))

    def pager(self) -> list[dict[str, Any]]:
        first, last = self.view == 0, self.view >= self.pages() - 1
        return [widget("button", "Previous page", "page-prev", states=("disabled",) if first else ()),
                widget("text", f"Page {self.view + 1} of {self.pages()}", "page-label"),
                widget("button", "Next page", "page-next", states=("disabled",) if last else ())]

    def page_click(self, key: str) -> bool:
        """Handle Previous/Next (a disabled one does nothing, as in a browser); True if it was one."""
        if key == "page-prev":
            self.view = max(0, self.view - 1)
        elif key == "page-next":
            self.view = min(self.pages() - 1, self.view + 1)
        else:
            return False
        return True

    def scroll(self, direction: str) -> None:
        self.page_click("page-next" if direction == "down" else "page-prev")


def _s(description: str) -> Param:
    return Param("string", description)


# ============================================================================== settings_panel
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
                 "value": _s("'on'/'off' for toggles, else one of the setting's options")}, group="settings"),
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
_FIRST = ("Alice", "Bob", "Carla", "Deepak", "Eva", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kaito", "Lena",
          "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wen", "Yara")
_LAST = ("Moreau", "Tanaka", "Diaz", "Rao", "Novak", "Haddad", "Kim", "Berg", "Silva", "Weber", "Sato", "Fischer")


def _phone(rng: random.Random) -> str:
    return f"555-{rng.randrange(10000):04d}"


class ContactsBook(PagedApp):
    name = "contacts_book"
    page_size = 5
    tools = (
        ToolDef("contacts_find", "Find a contact by name; returns its id and phone number.",
                {"name": _s("full or partial name")}, group="contacts"),
        ToolDef("contacts_update", "Change the phone number of the contact with this id.",
                {"id": Param("integer", "contact id (from contacts_find)"), "phone": _s("new phone number")},
                group="contacts"),
        ToolDef("contacts_add", "Add a contact.", {"name": _s("full name"), "phone": _s("phone number")},
                group="contacts"),
    )

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        super().__init__(rng, variant)
        names = [f"{f} {l}" for f, l in zip(rng.sample(_FIRST, 24), rng.choices(_LAST, k=24))]
        n = rng.randint(16, 21)
        self.contacts = [{"id": 100 + i * 7, "name": name, "phone": _phone(rng), "favorite": False}
                         for i, name in enumerate(sorted(names[:n]))]
        for c in rng.sample(self.contacts, 2):
            c["favorite"] = True
        self.form = {"name": "", "phone": ""}
        extra = ("phone", "favorite", "add") if self.tool_ops else ("phone", "favorite")
        kinds = ["phone", "phone", "favorite", rng.choice(extra)]
        if rng.random() < 0.5:
            kinds.append(rng.choice(extra))
        rng.shuffle(kinds)
        targets = iter(rng.sample([i for i, c in enumerate(self.contacts) if not c["favorite"]], len(kinds)))
        adds, goals = iter(names[n:]), []
        for kind in kinds:
            if kind == "add":
                goals.append(self._add_goal(next(adds), _phone(rng)))
            elif kind == "phone":
                goals.append(self._phone_goal(next(targets), _phone(rng)))
            else:
                goals.append(self._fav_goal(next(targets)))
        self.subgoals = goals
        self._n_contacts = n + kinds.count("add")
        self._n_favorites = 2 + kinds.count("favorite")

    def n_items(self) -> int:
        return len(self.contacts)

    def _by_name(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.contacts if c["name"] == name), None)

    def _phone_goal(self, index: int, phone: str) -> Subgoal:
        c = self.contacts[index]
        name, page = c["name"], self.page_of(index)
        return Subgoal(
            f"change {name}'s phone number to {phone}",
            (Question(f'Is the phone number of the contact "{name}" {phone}?',
                      lambda app: (app._by_name(name) or {}).get("phone") == phone),),
            gui=lambda view: ([*page_steps(view, page), type_(f"phone-{c['id']}", phone)], page),
            tool=lambda view: [call("contacts_find", name=name), call("contacts_update", id=c["id"], phone=phone)],
        )

    def _fav_goal(self, index: int) -> Subgoal:
        c = self.contacts[index]
        name, page = c["name"], self.page_of(index)
        return Subgoal(
            f"mark {name} as a favorite",
            (Question(f'Is the contact "{name}" marked as a favorite?',
                      lambda app: bool((app._by_name(name) or {}).get("favorite"))),),
            gui=lambda view: ([*page_steps(view, page), click(f"fav-{c['id']}")], page),
            tool=lambda view: None,
        )

    def _add_goal(self, name: str, phone: str) -> Subgoal:
        return Subgoal(
            f"add a contact {name} with phone number {phone}",
            (Question(f'Is there a contact named "{name}"?', lambda app: app._by_name(name) is not None),
             Question(f'Is the phone number of the contact "{name}" {phone}?',
                      lambda app: (app._by_name(name) or {}).get("phone") == phone, parents=(0,))),
            gui=lambda view: ([type_("add-name", name), type_("add-phone", phone), click("add-save")], view),
            tool=lambda view: [call("contacts_add", name=name, phone=phone)],
        )

    def title(self) -> str:
        return "Contacts - All contacts"

    def widgets(self) -> list[dict[str, Any]]:
        out = [widget("textbox", "New contact name", "add-name", value=self.form["name"]),
               widget("textbox", "New contact phone", "add-phone", value=self.form["phone"]),
               widget("button", "Add contact", "add-save")]
        for i in self.visible():
            c = self.contacts[i]
            out += [widget("text", c["name"], f"name-{c['id']}"),
                    widget("textbox", f"Phone of {c['name']}", f"phone-{c['id']}", value=c["phone"]),
                    widget("checkbox", f"Favorite {c['name']}", f"fav-{c['id']}",
                           states=("checked",) if c["favorite"] else ())]
        return out + self.pager()

    def _contact(self, key: str) -> dict[str, Any]:
        cid = int(key.partition("-")[2])
        return next(c for c in self.contacts if c["id"] == cid)

    def click(self, key: str) -> None:
        if self.page_click(key):
            return
        if key.startswith("fav-"):
            contact = self._contact(key)
            contact["favorite"] = not contact["favorite"]
        elif key == "add-save":
            if not self.form["name"].strip() or not self.form["phone"].strip():
                raise ActionError("fill in the new contact's name and phone before adding")
            self._add(self.form["name"], self.form["phone"])
            self.form = {"name": "", "phone": ""}
        else:
            super().click(key)

    def type(self, key: str, text: str) -> None:
        if key in ("add-name", "add-phone"):
            self.form[key[4:]] = text
        elif key.startswith("phone-"):
            self._contact(key)["phone"] = text
        else:
            super().type(key, text)

    def _add(self, name: str, phone: str) -> None:
        self.contacts.append({"id": 100 + len(self.contacts) * 7, "name": name.strip(), "phone": phone.strip(),
                              "favorite": False})

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "contacts_find":
            hits = [{"id": c["id"], "name": c["name"], "phone": c["phone"]} for c in self.contacts
                    if args["name"].strip().lower() in c["name"].lower()]
            return tool_result(bool(hits), hits[:5], "" if hits else f"no contact matches {args['name']!r}")
        if name == "contacts_update":
            contact = next((c for c in self.contacts if c["id"] == args["id"]), None)
            if contact is None:
                return tool_result(False, None, f"no contact with id {args['id']} (use contacts_find)")
            contact["phone"] = args["phone"]
            return tool_result(True, f"{contact['name']}: {args['phone']}")
        self._add(args["name"], args["phone"])
        return tool_result(True, f"added {args['name']}")

    def dump(self) -> dict[str, Any]:
        return {"page": self.view + 1, "contacts": [dict(c) for c in self.contacts]}

    def quality(self) -> list[Question]:
        n, f = self._n_contacts, self._n_favorites
        return [Question(f"Does the contact list hold exactly {n} contacts?",
                         lambda app: len(app.contacts) == n, kind="quality"),
                Question(f"Are exactly {f} contacts marked as favorites?",
                         lambda app: sum(c["favorite"] for c in app.contacts) == f, kind="quality")]


# ============================================================================== file_manager
_FOLDERS = ("Documents", "Reports", "Photos", "Downloads", "Archive")
_STEMS = ("notes", "budget", "minutes", "draft", "summary", "plan", "ideas", "invoice", "agenda", "memo", "report",
          "specs", "outline", "review", "backlog", "roadmap", "ledger", "survey", "brief", "checklist", "quote",
          "schedule", "contract", "proposal", "timeline", "receipts", "letter", "journal", "index", "digest")
_EXTS = (".txt", ".md", ".csv", ".pdf")


class FileManager(App):
    name = "file_manager"
    tools = (
        ToolDef("files_move", "Move a file into another folder.",
                {"path": _s("Folder/name"), "folder": Param("string", "destination folder", enum=_FOLDERS)},
                group="files"),
        ToolDef("files_delete", "Delete one file.", {"path": _s("Folder/name")}, group="files"),
        ToolDef("files_move_matching", "Move every file of one folder whose name ends with an extension.",
                {"folder": Param("string", "source folder", enum=_FOLDERS), "extension": _s("such as .log"),
                 "to_folder": Param("string", "destination folder", enum=_FOLDERS)}, group="files"),
        ToolDef("files_list", "List the files of a folder.", {"folder": Param("string", "folder", enum=_FOLDERS)},
                group="files"),
    )

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        super().__init__(rng, variant)
        stems = iter(rng.sample(_STEMS, len(_STEMS)))
        self.files: list[dict[str, Any]] = []  # {id, folder, name}
        for folder in _FOLDERS:
            for _ in range(rng.randint(2, 3)):
                self._new(folder, next(stems) + rng.choice(_EXTS))
        bulk_from, empty, *rest = rng.sample(_FOLDERS, len(_FOLDERS))
        for _ in range(rng.randint(2, 3)):  # the files the bulk move takes: .log only lives here
            self._new(bulk_from, next(stems) + ".log")
        self.view = _FOLDERS.index(rng.choice(_FOLDERS))
        bulk_to = rng.choice(rest)
        # Other subgoals leave the bulk source, the folder to empty and the bulk files alone.
        pool = rng.sample([f for f in self.files if f["folder"] in rest], 4)
        kinds = ["rename", "move", rng.choice(("delete", "move", "rename"))]
        if rng.random() < 0.5:
            kinds.append(rng.choice(("delete", "rename")))
        goals = [self._goal(kind, pool.pop(), rest, next(stems)) for kind in kinds]
        goals.insert(rng.randrange(len(goals) + 1), self._empty_goal(empty))
        if self.tool_ops:
            goals.insert(rng.randrange(len(goals) + 1), self._bulk_goal(bulk_from, ".log", bulk_to))
        self.subgoals = goals
        self._n_files = len(self.files) - kinds.count("delete") - sum(f["folder"] == empty for f in self.files)

    def _new(self, folder: str, name: str) -> None:
        self.files.append({"id": len(self.files) + 1, "folder": folder, "name": name})

    def _at(self, folder: str) -> list[dict[str, Any]]:
        return [f for f in self.files if f["folder"] == folder]

    def _has(self, folder: str, name: str) -> bool:
        return any(f["name"] == name for f in self._at(folder))

    @staticmethod
    def _tab(view: int, folder: str) -> list[Step]:
        return [] if _FOLDERS[view] == folder else [click(f"tab-{folder}")]

    def _goal(self, kind: str, f: dict[str, Any], folders: list[str], stem: str) -> Subgoal:
        folder, name, fid = f["folder"], f["name"], f["id"]
        tab = _FOLDERS.index(folder)
        if kind == "rename":
            new = stem + name[name.rfind("."):]
            return Subgoal(f"rename {folder}/{name} to {new}",
                           (Question(f'Is there a file named "{new}" in the folder {folder}?',
                                     lambda app: app._has(folder, new)),),
                           gui=lambda view: ([*self._tab(view, folder), type_(f"name-{fid}", new)], tab),
                           tool=lambda view: None)
        if kind == "delete":
            return Subgoal(f"delete {folder}/{name}",
                           (Question(f'Is every folder free of a file named "{name}"?',
                                     lambda app: not any(g["name"] == name for g in app.files)),),
                           gui=lambda view: ([*self._tab(view, folder), click(f"del-{fid}")], tab),
                           tool=lambda view: [call("files_delete", path=f"{folder}/{name}")])
        to = self.rng.choice([d for d in folders if d != folder])
        return Subgoal(f"move {folder}/{name} to {to}",
                       (Question(f'Is the file "{name}" in the folder {to}?', lambda app: app._has(to, name)),),
                       gui=lambda view: ([*self._tab(view, folder), choose(f"move-{fid}", to)], tab),
                       tool=lambda view: [call("files_move", path=f"{folder}/{name}", folder=to)])

    def _empty_goal(self, folder: str) -> Subgoal:
        names = [f["name"] for f in self._at(folder)]
        tab = _FOLDERS.index(folder)
        return Subgoal(f"delete every file in {folder}",
                       (Question(f"Is the folder {folder} empty?", lambda app: not app._at(folder)),),
                       gui=lambda view: ([*self._tab(view, folder), click(f"empty-{folder}")], tab),
                       tool=lambda view: [call("files_delete", path=f"{folder}/{n}") for n in names])

    def _bulk_goal(self, folder: str, ext: str, to: str) -> Subgoal:
        moved = [f for f in self._at(folder) if f["name"].endswith(ext)]
        tab, n = _FOLDERS.index(folder), len(moved)
        return Subgoal(
            f"move every {ext} file from {folder} to {to}",
            (Question(f'Does the folder {folder} hold no file ending in "{ext}"?',
                      lambda app: not any(g["name"].endswith(ext) for g in app._at(folder))),
             Question(f'Does the folder {to} hold exactly {n} files ending in "{ext}"?',
                      lambda app: sum(g["name"].endswith(ext) for g in app._at(to)) == n, parents=(0,))),
            gui=lambda view: ([*self._tab(view, folder), *(choose(f"move-{g['id']}", to) for g in moved)], tab),
            tool=lambda view: [call("files_move_matching", folder=folder, extension=ext, to_folder=to)],
        )

    def title(self) -> str:
        return f"Files - {_FOLDERS[self.view]}"

    def widgets(self) -> list[dict[str, Any]]:
        folder = _FOLDERS[self.view]
        out = [widget("tab", d, f"tab-{d}", states=("selected",) if d == folder else ()) for d in _FOLDERS]
        out.append(widget("button", f"Delete all files in {folder}", f"empty-{folder}"))
        for f in self._at(folder):
            out += [widget("textbox", "File name", f"name-{f['id']}", value=f["name"]),
                    widget("select", f"Move {f['name']} to", f"move-{f['id']}", value=folder,
                           states=("options: " + " | ".join(_FOLDERS),)),
                    widget("button", f"Delete {f['name']}", f"del-{f['id']}")]
        return out

    def _file(self, key: str) -> dict[str, Any]:
        fid = int(key.partition("-")[2])
        return next(f for f in self.files if f["id"] == fid)

    def click(self, key: str) -> None:
        kind, _, name = key.partition("-")
        if kind == "tab":
            self.view = _FOLDERS.index(name)
        elif kind == "del":
            self.files.remove(self._file(key))
        elif kind == "empty":
            self.files = [f for f in self.files if f["folder"] != name]
        else:
            super().click(key)

    def type(self, key: str, text: str) -> None:
        if not key.startswith("name-"):
            super().type(key, text)
        f, text = self._file(key), text.strip()
        if not text or "/" in text:
            raise ActionError(f"invalid file name {text!r}")
        if text != f["name"] and self._has(f["folder"], text):
            raise ActionError(f"{f['folder']} already has a file named {text!r}")
        f["name"] = text

    def select(self, key: str, text: str) -> None:
        if not key.startswith("move-"):
            super().select(key, text)
        folder = next((d for d in _FOLDERS if same(d, text)), None)
        if folder is None:
            raise ActionError(f"no folder {text!r}; options: {list(_FOLDERS)}")
        self._move(self._file(key), folder)

    def _move(self, f: dict[str, Any], folder: str) -> str:
        if folder != f["folder"] and self._has(folder, f["name"]):
            return f"{folder} already has a file named {f['name']!r}"
        f["folder"] = folder
        return ""

    def _by_path(self, path: str) -> dict[str, Any] | None:
        folder, _, name = path.strip().partition("/")
        return next((f for f in self._at(folder) if f["name"] == name), None)

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "files_list":
            return tool_result(True, [f["name"] for f in self._at(args["folder"])])
        if name == "files_move_matching":
            moving = [f for f in self._at(args["folder"]) if f["name"].endswith(args["extension"])]
            errors = [e for e in (self._move(f, args["to_folder"]) for f in moving) if e]
            return tool_result(not errors, f"moved {len(moving) - len(errors)} file(s)", "; ".join(errors))
        f = self._by_path(args["path"])
        if f is None:
            return tool_result(False, None, f"no file {args['path']!r} (paths are Folder/name)")
        if name == "files_delete":
            self.files.remove(f)
            return tool_result(True, f"deleted {args['path']}")
        error = self._move(f, args["folder"])
        return tool_result(not error, None if error else f"moved to {args['folder']}", error)

    def dump(self) -> dict[str, Any]:
        return {"open_folder": _FOLDERS[self.view],
                "folders": {d: sorted(f["name"] for f in self._at(d)) for d in _FOLDERS}}

    def quality(self) -> list[Question]:
        n = self._n_files
        return [Question(f"Are there exactly {n} files in total across all folders?",
                         lambda app: len(app.files) == n, kind="quality")]


# ============================================================================== inventory_sheet
_ITEMS = ("Pens", "Paper", "Stapler", "Folders", "Markers", "Tape", "Binders", "Clips", "Envelopes", "Labels",
          "Scissors", "Glue", "Rulers", "Erasers", "Notebooks", "Toner", "Cables", "Batteries", "Badges", "Lamps")
_REGIONS = ("North", "South", "East", "West")
_COLUMNS = {"B": "Qty", "C": "Price", "D": "Region"}


class InventorySheet(PagedApp):
    name = "inventory_sheet"
    page_size = 6
    tools = (
        ToolDef("sheet_find", "Find the cells whose text equals the given text; returns cell references like A7.",
                {"text": _s("text to look for")}, group="sheet"),
        ToolDef("sheet_set_cell", "Set one cell.", {"cell": _s("cell such as C4"), "value": _s("new value")},
                group="sheet"),
        ToolDef("sheet_set_range", "Fill a range of one column with a single value.",
                {"range": _s("such as D3:D9 (one column)"), "value": _s("the value for every cell")},
                group="sheet"),
    )

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        super().__init__(rng, variant)
        n = rng.randint(14, 20)
        self.rows = [{"Item": item, "Qty": str(rng.choice((3, 5, 8, 12, 15, 20, 25, 30, 42, 50))),
                      "Price": f"{rng.randint(100, 999) / 100:.2f}", "Region": rng.choice(_REGIONS)}
                     for item in rng.sample(_ITEMS, n)]
        span = rng.randint(3, 6)
        start = rng.randrange(n - span + 1)
        fill = range(start, start + span)  # data indices; sheet row = index + 2
        singles = rng.sample([i for i in range(n) if i not in fill], rng.choice((3, 4)) + (not self.tool_ops))
        goals = [self._clear_goal(i) if rng.random() < 0.3 else self._cell_goal(i, rng.choice(("Qty", "Price")))
                 for i in singles]
        if self.tool_ops:
            goals.insert(rng.randrange(len(goals) + 1), self._fill_goal(fill))
        self.subgoals = goals

    def n_items(self) -> int:
        return len(self.rows)

    def _cell_goal(self, index: int, column: str) -> Subgoal:
        item, page = self.rows[index]["Item"], self.page_of(index)
        ref = next(c for c, name in _COLUMNS.items() if name == column) + str(index + 2)
        while True:  # a value the cell does not hold already
            value = str(self.rng.choice((4, 6, 9, 14, 18, 24, 36, 60))) if column == "Qty" \
                else f"{self.rng.randint(100, 999) / 100:.2f}"
            if not same(value, self.rows[index][column]):
                break

        def tool(view: int) -> list[Step]:
            # Row numbers are on screen only for the open page; elsewhere the cell must be found first.
            find = [] if page == view else [call("sheet_find", text=item)]
            return [*find, call("sheet_set_cell", cell=ref, value=value)]

        return Subgoal(
            f"set the {column} of {item} to {value}",
            (Question(f'Is the {column} of the item "{item}" {value}?',
                      lambda app: same(app.rows[index][column], value)),),
            gui=lambda view: ([*page_steps(view, page), type_(f"cell-{ref}", value)], page),
            tool=tool,
        )

    def _clear_goal(self, index: int) -> Subgoal:
        """One "Clear row" button on screen; three ``sheet_set_cell`` calls (plus a find) by tool."""
        item, page, r = self.rows[index]["Item"], self.page_of(index), index + 2

        def tool(view: int) -> list[Step]:
            find = [] if page == view else [call("sheet_find", text=item)]
            return [*find, *(call("sheet_set_cell", cell=f"{c}{r}", value="") for c in _COLUMNS)]

        return Subgoal(
            f"clear the Qty, Price and Region of {item}",
            (Question(f'Are the Qty, Price and Region cells of the item "{item}" all empty?',
                      lambda app: not any(app.rows[index][name] for name in _COLUMNS.values())),),
            gui=lambda view: ([*page_steps(view, page), click(f"clear-{r}")], page), tool=tool,
        )

    def _fill_goal(self, fill: range) -> Subgoal:
        # The region fewest rows of the range hold already; the GUI types only the others.
        region = min(self.rng.sample(_REGIONS, len(_REGIONS)),
                     key=lambda r: sum(self.rows[i]["Region"] == r for i in fill))
        first, last = fill[0] + 2, fill[-1] + 2
        todo = [i for i in fill if self.rows[i]["Region"] != region]

        def gui(view: int) -> tuple[list[Step], int]:
            steps = []
            for i in todo:
                steps += [*page_steps(view, self.page_of(i)), type_(f"cell-D{i + 2}", region)]
                view = self.page_of(i)
            return steps, view

        return Subgoal(
            f"set the Region of rows {first} to {last} to {region}",
            (Question(f'Do the Region cells of rows {first} to {last} all hold "{region}"?',
                      lambda app: all(same(app.rows[i]["Region"], region) for i in fill)),),
            gui=gui, tool=lambda view: [call("sheet_set_range", range=f"D{first}:D{last}", value=region)],
        )

    def title(self) -> str:
        return "Sheet - Inventory"

    def widgets(self) -> list[dict[str, Any]]:
        out = [widget("text", "Columns: A Item | B Qty | C Price | D Region", "header")]
        for i in self.visible():
            row, r = self.rows[i], i + 2
            out.append(widget("text", f"Row {r}: {row['Item']}", f"row-{r}"))
            out.append(widget("button", f"Clear row {r}", f"clear-{r}"))
            out += [widget("textbox", f"{c}{r} {name}", f"cell-{c}{r}", value=row[name])
                    for c, name in _COLUMNS.items()]
        return out + self.pager()

    def click(self, key: str) -> None:
        if key.startswith("clear-"):
            self.rows[int(key[6:]) - 2].update(dict.fromkeys(_COLUMNS.values(), ""))
        else:
            self.page_click(key)

    def type(self, key: str, text: str) -> None:
        if not key.startswith("cell-"):
            super().type(key, text)
        error = self._set(key[5:], text)
        if error:
            raise ActionError(error)

    def _set(self, ref: str, value: str) -> str:
        """Set cell ``ref`` (B..D of a data row); return an error message, '' on success."""
        column, digits = ref[:1].upper(), ref[1:]
        if column not in _COLUMNS or not digits.isdigit() or not 2 <= int(digits) < len(self.rows) + 2:
            return f"no editable cell {ref!r}: columns B-D, rows 2-{len(self.rows) + 1}"
        self.rows[int(digits) - 2][_COLUMNS[column]] = str(value).strip()
        return ""

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "sheet_find":
            hits = [f"{c}{i + 2}" for i, row in enumerate(self.rows)
                    for c, key in (("A", "Item"), *_COLUMNS.items()) if same(row[key], args["text"])]
            return tool_result(bool(hits), hits[:10], "" if hits else f"no cell holds {args['text']!r}")
        if name == "sheet_set_cell":
            error = self._set(args["cell"], args["value"])
            return tool_result(not error, None if error else f"{args['cell']} = {args['value']}", error)
        start, _, end = args["range"].upper().partition(":")
        if not end or start[:1] != end[:1] or not (start[1:].isdigit() and end[1:].isdigit()):
            return tool_result(False, None, f"range {args['range']!r} must be one column, like D3:D9")
        refs = [f"{start[0]}{r}" for r in range(int(start[1:]), int(end[1:]) + 1)]
        errors = [e for e in (self._set(ref, args["value"]) for ref in refs) if e]
        return tool_result(not errors, f"set {len(refs) - len(errors)} cell(s)", "; ".join(errors[:1]))

    def dump(self) -> dict[str, Any]:
        return {"page": self.view + 1, "rows": [{"row": i + 2, **row} for i, row in enumerate(self.rows)]}


APPS: dict[str, type[App]] = {cls.name: cls for cls in (SettingsPanel, ContactsBook, FileManager, InventorySheet)}
