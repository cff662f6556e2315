"""The README as a short front door, and ``docs/reference/compatibility.md`` as the record behind its claims.

- ``docs/reference/compatibility.md`` names the tests behind each claim: every test file and test function it names
  must exist (a renamed or deleted test cannot leave a claim standing), every path of its claims
  table too, and every registered estimator and provider has a status row.
- The README's test command is what CI runs (``.ci/run``), its quickstart is on the first screen,
  it stays under 100 lines, and every path, doc, recipe and plugin fragment it names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
STATUS = REPO / "docs" / "status.md"
FIRST_SCREEN = 40  # lines


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _repo_path(path: str) -> Path:
    """A path as docs write it: from the repository root when it starts with one of its folders,
    else under tests/ (the status table omits `tests/`)."""
    first = path.split("/")[0]
    return REPO / path if (REPO / first).is_dir() and first not in ("gpu", "e2e") else REPO / "tests" / path


def test_every_test_the_status_page_names_exists():
    references = re.findall(r"`([\w/]+\.py)(?:::([\w.]+))?(?:\[[^\]]*\])?`", STATUS.read_text())
    assert len(references) > 30, "the status page should name the tests behind its cells"
    for path, function in references:
        file = _repo_path(path)
        assert file.exists(), f"docs/reference/compatibility.md names {path}, which does not exist"
        if function and not function.startswith("..."):  # `...[snapshot]`: the row above's test
            assert re.search(rf"def {re.escape(function)}\(", file.read_text()), \
                f"docs/reference/compatibility.md names {path}::{function}, which does not exist"


def test_every_path_of_the_claims_table_exists():
    table = _section(STATUS.read_text(), "## What is here, and what backs each claim")
    table = table[:table.index("Status per plugin.")]
    paths = [p for p in re.findall(r"`([^`\s<]+/[^`\s<]*)`", table) if not p.startswith("+")]
    assert len(paths) > 10
    for path in paths:
        assert (REPO / path).exists(), f"docs/reference/compatibility.md's claims table names {path}, which does not exist"


def test_every_registered_estimator_and_provider_has_a_row():
    from verl_ext.advantages import ESTIMATORS
    from verl_ext.old_logits import registered_providers

    table = STATUS.read_text()[STATUS.read_text().index("| plugin | unit |"):]
    for name in [*ESTIMATORS, *registered_providers()]:
        assert f"| `{name}` |" in table, f"no status row for {name} in docs/reference/compatibility.md"


def _bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_readme_test_command_is_what_ci_runs_and_the_quickstart_is_on_the_first_screen():
    readme = README.read_text()
    train, test = _bash_blocks(readme)[:2]
    ci_commands = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    for command in test.split("&&"):
        assert any(line.startswith(command.strip()) for line in ci_commands), \
            f"the README's test command runs `{command.strip()}`, which .ci/run does not"
    for script in re.findall(r"bash ([\w/.]+\.sh)", train + test):
        assert (REPO / script).is_file(), f"the README's quickstart runs {script}, which does not exist"
    first_screen = "\n".join(readme.splitlines()[:FIRST_SCREEN])
    assert train in first_screen and test in first_screen


def test_readme_is_short_and_every_path_doc_recipe_and_fragment_it_names_exists():
    readme = README.read_text()
    assert len(readme.splitlines()) < 100, "the README is a front door: move details to docs/"
    paths = re.findall(r"(?<![\w/.])((?:docs|recipes|scripts|tests|verl_ext|plugins|\.ci)/[\w/.-]*[\w])", readme)
    assert len(paths) > 10
    for path in paths:
        assert (REPO / path).exists(), f"the README names {path}, which does not exist"
    for kind, name in re.findall(r"\+plugins/(\w+)=(\w+)", readme):
        assert (REPO / "plugins" / kind / f"{name}.yaml").is_file(), f"the README names +plugins/{kind}={name}"
    for recipe in (REPO / "recipes").iterdir():
        if recipe.is_dir():
            assert f"`{recipe.name}`" in readme, f"the README does not list recipes/{recipe.name}"
    for doc in (REPO / "docs" / "plugins").glob("*.md"):
        assert f"(docs/plugins/{doc.name})" in readme, f"the README's plugin table does not link docs/plugins/{doc.name}"
