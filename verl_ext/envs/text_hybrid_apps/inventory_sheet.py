"""The inventory sheet: paged rows, cell tools that need a find for rows off screen."""

from __future__ import annotations

import random
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.text_hybrid_apps.app import (
    PagedApp,
    Question,
    Step,
    Subgoal,
    call,
    click,
    page_steps,
    same,
    string_param,
    type_,
    widget,
)
from verl_ext.envs.tools import ToolDef

_ITEMS = ("Pens", "Paper", "Stapler", "Folders", "Markers", "Tape", "Binders", "Clips", "Envelopes", "Labels",
          "Scissors", "Glue", "Rulers", "Erasers", "Notebooks", "Toner", "Cables", "Batteries", "Badges", "Lamps")
_REGIONS = ("North", "South", "East", "West")
_COLUMNS = {"B": "Qty", "C": "Price", "D": "Region"}


class InventorySheet(PagedApp):
    name = "inventory_sheet"
    page_size = 6
    tools = (
        ToolDef("sheet_find", "Find the cells whose text equals the given text; returns cell references like A7.",
                {"text": string_param("text to look for")}, group="sheet"),
        ToolDef("sheet_set_cell", "Set one cell.", {"cell": string_param("cell such as C4"), "value": string_param("new value")},
                group="sheet"),
        ToolDef("sheet_set_range", "Fill a range of one column with a single value.",
                {"range": string_param("such as D3:D9 (one column)"), "value": string_param("the value for every cell")},
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
