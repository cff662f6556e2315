"""The file manager: folder tabs, path-taking move/delete tools, GUI-only renaming."""

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
    type_,
    widget,
)
from verl_ext.envs.tools import Param, ToolDef

_FOLDERS = ("Documents", "Reports", "Photos", "Downloads", "Archive")
_STEMS = ("notes", "budget", "minutes", "draft", "summary", "plan", "ideas", "invoice", "agenda", "memo", "report",
          "specs", "outline", "review", "backlog", "roadmap", "ledger", "survey", "brief", "checklist", "quote",
          "schedule", "contract", "proposal", "timeline", "receipts", "letter", "journal", "index", "digest")
_EXTS = (".txt", ".md", ".csv", ".pdf")


class FileManager(App):
    name = "file_manager"
    tools = (
        ToolDef("files_move", "Move a file into another folder.",
                {"path": string_param("Folder/name"), "folder": Param("string", "destination folder", enum=_FOLDERS)},
                group="files"),
        ToolDef("files_delete", "Delete one file.", {"path": string_param("Folder/name")}, group="files"),
        ToolDef("files_move_matching", "Move every file of one folder whose name ends with an extension.",
                {"folder": Param("string", "source folder", enum=_FOLDERS), "extension": string_param("such as .log"),
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
