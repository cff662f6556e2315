"""The README's status table names the tests behind each claim: every named test file and test
function must exist, so a renamed or deleted test cannot leave a claim standing."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _status_table() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("Status per plugin.")
    return readme[start:readme.index("\n\n", readme.index("| plugin |", start))]


def test_every_test_the_status_table_names_exists():
    table = _status_table()
    references = re.findall(r"`([\w/]+\.py)(?:::([\w.]+))?(?:\[[^\]]*\])?`", table)
    assert len(references) > 30, "the table should name the tests behind its cells"
    for path, function in references:
        if path.startswith("..."):
            continue
        file = REPO / "tests" / path
        assert file.exists(), f"README status table names tests/{path}, which does not exist"
        if function and not function.startswith("..."):
            assert re.search(rf"def {re.escape(function)}\(", file.read_text()), \
                f"README status table names tests/{path}::{function}, which does not exist"


def test_every_registered_estimator_and_provider_has_a_row():
    from verl_ext.advantages import ESTIMATORS
    from verl_ext.old_logits import registered_providers

    table = _status_table()
    for name in [*ESTIMATORS, *registered_providers()]:
        assert f"| `{name}` |" in table, f"no status row for {name}"
