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

from verl_ext.envs.text_hybrid_apps.app import App, PagedApp, Question, Step, Subgoal
from verl_ext.envs.text_hybrid_apps.contacts_book import ContactsBook
from verl_ext.envs.text_hybrid_apps.file_manager import FileManager
from verl_ext.envs.text_hybrid_apps.inventory_sheet import InventorySheet
from verl_ext.envs.text_hybrid_apps.settings_panel import SettingsPanel

APPS: dict[str, type[App]] = {cls.name: cls for cls in (SettingsPanel, ContactsBook, FileManager, InventorySheet)}

__all__ = ["APPS", "App", "ContactsBook", "FileManager", "InventorySheet", "PagedApp", "Question", "SettingsPanel",
           "Step", "Subgoal"]
