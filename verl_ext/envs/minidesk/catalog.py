"""The MiniDesk tool catalogue: app tools (one group per app, OSWorld-MCP style) and distractors.

App tools call the page's JS API (``DESK.callTool``) on the same state the GUI shows; ``files_*``
tools first resolve their paths inside the episode's sandbox folder (see ``sandbox.py``), and
``files_read`` reads the sandbox mirror on disk. Distractors look useful but do nothing for any
task (OSWorld-MCP ships 25 such tools to test tool selection).
"""

from __future__ import annotations

import dataclasses

from verl_ext.envs.tools import Param, ToolDef


def _s(description: str, required: bool = True) -> Param:
    return Param("string", description, required=required)


_MAIL = [
    ToolDef("mail_search",
            "Search emails by text in sender, subject or body; returns up to 10 matches with their full text.",
            {"query": _s("text to look for (empty string matches all)"),
             "folder": Param("string", "only this folder (optional)", required=False,
                             enum=("inbox", "archive", "sent", "trash"))}),
    ToolDef("mail_star", "Star every received email whose sender contains the given name.",
            {"sender": _s("sender name")}),
    ToolDef("mail_move", "Move received emails matching a sender and/or an exact subject to a folder.",
            {"folder": Param("string", "destination folder", enum=("inbox", "archive", "trash")),
             "sender": _s("sender name (optional)", required=False),
             "subject": _s("exact subject (optional)", required=False)}),
    ToolDef("mail_send", "Send an email.",
            {"to": _s("recipient address"), "subject": _s("subject line"), "body": _s("message text")}),
]
_FILES = [
    ToolDef("files_list", "List the files of a folder.", {"folder": _s("folder name")}),
    ToolDef("files_read", "Read a text file.", {"path": _s("file path as Folder/name")}),
    ToolDef("files_write", "Create or overwrite a text file.",
            {"path": _s("file path as Folder/name"), "content": _s("file text")}),
    ToolDef("files_move", "Move a file into another folder.",
            {"path": _s("file path as Folder/name"), "folder": _s("destination folder")}),
    ToolDef("files_rename", "Rename a file within its folder.",
            {"path": _s("file path as Folder/name"), "new_name": _s("new file name")}),
    ToolDef("files_delete", "Delete a file.", {"path": _s("file path as Folder/name")}),
    ToolDef("files_mkdir", "Create a top-level folder.", {"name": _s("folder name")}),
    ToolDef("files_find", "Find files whose name contains the given text; returns their paths.",
            {"name": _s("part of a file name")}),
]
_SHEET = [
    ToolDef("sheet_get_range", "Read the values of a cell range such as B2:B6.",
            {"range": _s("A1-style range, columns A-D")}),
    ToolDef("sheet_set_cell", "Set one cell.", {"cell": _s("cell such as C4"), "value": _s("new value")}),
    ToolDef("sheet_set_range",
            "Set a cell range. values: rows separated by ';', cells by ','; a single value fills the whole range.",
            {"range": _s("A1-style range"), "values": _s("e.g. '1,2;3,4' or 'North'")}),
    ToolDef("sheet_sort", "Sort the data rows (row 2 onwards) by a column.",
            {"column": Param("string", "column letter", enum=("A", "B", "C", "D")),
             "descending": Param("boolean", "sort descending (optional, default false)", required=False)}),
    ToolDef("sheet_sum", "Sum the numbers in a cell range.", {"range": _s("A1-style range")}),
    ToolDef("sheet_append_row", "Append a row at the bottom.",
            {"values": _s("comma-separated values for columns A-D")}),
]
_SETTINGS = [
    ToolDef("settings_get", "Read a setting (theme, language, timezone, font_size, notifications, autosave).",
            {"key": _s("setting name")}),
    ToolDef("settings_set", "Change one setting.",
            {"key": _s("setting name"), "value": _s("new value (on/off for toggles)")}),
    ToolDef("settings_apply", "Change several settings at once, all or nothing.",
            {"changes": _s("'key=value;key=value'")}),
]
_CALENDAR = [
    ToolDef("calendar_list", "List events, optionally only those on one date.",
            {"date": _s("YYYY-MM-DD (optional)", required=False)}),
    ToolDef("calendar_add", "Add an event.",
            {"title": _s("event title"), "date": _s("YYYY-MM-DD"), "time": _s("HH:MM")}),
    ToolDef("calendar_delete", "Delete events matching a title and/or a date.",
            {"title": _s("exact title (optional)", required=False),
             "date": _s("YYYY-MM-DD (optional)", required=False)}),
    ToolDef("calendar_move", "Move an event to another date, keeping its time.",
            {"title": _s("exact title"), "date": _s("YYYY-MM-DD")}),
]
_DISTRACTORS = [
    ToolDef("weather_forecast", "Get the weather forecast for a city.", {"city": _s("city name")}),
    ToolDef("translate_text", "Translate text into another language.",
            {"text": _s("text"), "target_language": _s("language name")}),
    ToolDef("unit_convert", "Convert a value between units.",
            {"value": Param("number", "the value"), "from_unit": _s("unit"), "to_unit": _s("unit")}),
    ToolDef("web_search", "Search the web.", {"query": _s("search query")}),
    ToolDef("image_resize", "Resize an image file.",
            {"path": _s("image path"), "width": Param("integer", "pixels"), "height": Param("integer", "pixels")}),
    ToolDef("clipboard_copy", "Copy text to the clipboard.", {"text": _s("text")}),
    ToolDef("timer_start", "Start a countdown timer.", {"seconds": Param("integer", "duration")}),
    ToolDef("contacts_lookup", "Look up a contact's phone number.", {"name": _s("person name")}),
]



def _in_group(group: str, tools: list[ToolDef]) -> list[ToolDef]:
    return [dataclasses.replace(t, group=group) for t in tools]


APP_TOOLS: dict[str, list[ToolDef]] = {
    group: _in_group(group, tools)
    for group, tools in (("mail", _MAIL), ("files", _FILES), ("sheet", _SHEET), ("settings", _SETTINGS),
                         ("calendar", _CALENDAR))
}
DISTRACTORS = _in_group("distractor", _DISTRACTORS)
ALL_TOOLS: dict[str, ToolDef] = {t.name: t for tools in (*APP_TOOLS.values(), DISTRACTORS) for t in tools}
# files_* tools whose arguments are paths/folder names that must stay inside the sandbox.
PATH_ARGS: dict[str, tuple[str, ...]] = {
    "files_list": ("folder",), "files_read": ("path",), "files_write": ("path",), "files_move": ("path", "folder"),
    "files_rename": ("path",), "files_delete": ("path",), "files_mkdir": ("name",),
}


def distractor_result(tool: ToolDef, arguments: dict) -> dict:
    """What a distractor returns: plausible, useless, and nothing ever leaves the machine."""
    canned = {
        "weather_forecast": f"Forecast for {arguments.get('city')}: 18C, light clouds.",
        "translate_text": arguments.get("text"),
        "unit_convert": arguments.get("value"),
        "web_search": None,
        "image_resize": None,
        "clipboard_copy": "copied",
        "timer_start": "started",
        "contacts_lookup": None,
    }
    errors = {
        "web_search": "no network access in this sandbox",
        "image_resize": "no such image",
        "contacts_lookup": "contact not found",
    }
    error = errors.get(tool.name, "")
    return {"success": not error, "result": canned.get(tool.name), "error_message": error}
