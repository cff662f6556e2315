"""The contacts book: paged contacts without visible ids, a find-then-update tool pair."""

from __future__ import annotations

import random
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.text_hybrid_apps.app import (
    PagedApp,
    Question,
    Subgoal,
    call,
    click,
    page_steps,
    string_param,
    type_,
    widget,
)
from verl_ext.envs.tools import Param, ToolDef

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
                {"name": string_param("full or partial name")}, group="contacts"),
        ToolDef("contacts_update", "Change the phone number of the contact with this id.",
                {"id": Param("integer", "contact id (from contacts_find)"), "phone": string_param("new phone number")},
                group="contacts"),
        ToolDef("contacts_add", "Add a contact.", {"name": string_param("full name"), "phone": string_param("phone number")},
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
