"""The docs as a user reads them.

- Nothing in code, tests, scripts or docs narrates how the project was made (sessions, holds,
  device time, issue numbers) or cites a file outside the repository (a machine's absolute path,
  unpublished notes): a reader has none of those. Raw results (run logs, metrics) are left as the
  machines wrote them.
- Every command the tutorials and the README give exists: the script, its knobs, the ``verl-ext``
  command and its flags, the plugin fragment.
- Every relative link in the docs resolves, and every docs page is of one kind (tutorial, how-to,
  reference, explanation, experiment) or the results page.
- The README is a short front door whose test command is what CI runs; the compatibility page names
  only tests that exist and has a row for every registered estimator and provider.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
COMPATIBILITY = DOCS / "reference" / "compatibility.md"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))

_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))")
NARRATION = re.compile("|".join([
    rf"\b{_ORDINAL} (?:session|hold)s?\b",                     # "the sixth hold", "twelfth session"
    r"\b(?:this|the|a|one|each|every|next|previous|later|earlier|same) hold\b", r"\bhold's\b", r"\bhold ?\d\b",
    r"\b(?:this|next|previous|later|earlier|same|one|a) session\b", r"\bsession's\b",
    r"\bdevice[- ](?:time|minutes)\b",
    r"\bissues? #?\d+", r"\bissue-\d+",                         # the project's tracker; "verl #7566" is fine
    r"\bthe lead's\b",
]), re.I)
OUTSIDE_PATHS = re.compile("|".join([
    r"(?:^|[\s`'\"(])/work/", r"\.\./shared/", r"\bshared/research\b",  # the development machine's folders
    r"\bresearch (?:brief|notes?)\b", r"\bthe brief\b", r"\bbrief §", r"\bnotes §",
    r"\b(?:stepwise_advantages|gui_tool_env_dvreward|old_logits_ppo_ewma|verl_extension_points|cpu_backend_findings"
    r"|gpu_machine)\.md\b",                                     # unpublished notes, by name
]), re.I)

TEXT_SUFFIXES = (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".in", ".js", ".json", ".html", ".css")
RAW_RESULTS = ("docs/bench_results/",)  # logs and metrics as the runs wrote them; their notes and card files are prose
RESULT_PROSE = ("notes.md", "machine.json", "card.json", "card.txt")


def _tracked_text_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in listed if f.endswith(TEXT_SUFFIXES) or f in (".ci/run", "LICENSE")]
    return [f for f in files if not f.startswith(RAW_RESULTS) or f.endswith(RESULT_PROSE)]


def _hits(path: str) -> list[str]:
    text = (REPO / path).read_text(errors="replace")
    return [f"{path}:{number}: {match.group(0)!r}"
            for number, line in enumerate(text.splitlines(), 1)
            for pattern in (NARRATION, OUTSIDE_PATHS) for match in pattern.finditer(line)]


THIS_FILE = "tests/test_docs_on_cpu.py"  # holds the vocabulary and examples of it


def test_no_narration_and_no_path_outside_the_repository():
    files = _tracked_text_files()
    assert len(files) > 300
    hits = [hit for f in files if f != THIS_FILE for hit in _hits(f)]
    assert not hits, "narration or a path outside the repository:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "the twelfth session's run", "on the sixth hold", "the hold's time ran out", "2026-11-26 (device time ran out)",
    "as issue 19 asked", "the pre-issue-19 decay", "see /work/shared/research/x.md", "(research brief §6.1)",
    "stepwise_advantages.md §3.7",
])
def test_the_patterns_catch_narration(line):
    assert NARRATION.search(line) or OUTSIDE_PATHS.search(line)


@pytest.mark.parametrize("line", [
    "batches that hold both fresh and stale tokens", "a Ray session", "one tiny model per test session",
    "verl #7566 fixed it", "an issue with the tokenizer", "GiGPO (arXiv 2505.10978, §3)",
])
def test_the_patterns_leave_ordinary_words_alone(line):
    assert not NARRATION.search(line) and not OUTSIDE_PATHS.search(line)


# ------------------------------------------------------------------------- commands the docs give


def _bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def _commands(text: str) -> list[list[str]]:
    """Each command of the bash blocks as words: continuation lines joined, comments and
    ``&&`` / ``;`` split off."""
    commands = []
    for block in _bash_blocks(text):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line)
            for part in re.split(r"&&|;", line):
                if part.strip():
                    commands.append(shlex.split(part))
    return commands


def _help(command: str) -> str:
    return subprocess.run([sys.executable, "-m", "verl_ext.cli", command, "--help"], capture_output=True,
                          text=True).stdout


def _check_command(words: list[str]) -> list[str]:
    """What in one documented command does not exist: a script, a knob (``NAME=`` before it) or a
    flag of the script or of ``verl-ext <command>``, a plugin fragment."""
    knobs = [w.split("=", 1)[0] for w in words if re.match(r"^[A-Z_]+=", w)]
    words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
    problems = []
    if words[:1] == ["bash"]:
        script = REPO / words[1]
        if not script.is_file():
            return [f"{words[1]} does not exist"]
        # a recipe script may hand knobs and flags to the scripts beside it
        source = "\n".join(sh.read_text() for sh in sorted(script.parent.glob("*.sh")))
        problems += [f"{words[1]} has no knob {knob}" for knob in knobs if f"${{{knob}" not in source]
        problems += [f"{words[1]} has no flag {flag}" for flag in words[2:] if flag.startswith("--") and flag not in source]
    elif words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2].startswith("scripts."):
        script = REPO / (words[2].replace(".", "/") + ".py")  # a benchmark: python -m scripts.bench.<name>
        if not script.is_file():
            return [f"{words[2]} does not exist"]
        source = script.read_text()
        problems += [f"{words[2]} has no flag {flag}" for flag in words[3:]
                     if flag.startswith("--") and f'"{flag.split("=")[0]}"' not in source]
    elif words[:1] == ["verl-ext"] and words[1] != "--version":
        if words[1] not in cli.COMMANDS:
            return [f"verl-ext has no command {words[1]}"]
        options = set(re.findall(r"--[\w-]+", _help(words[1])))
        problems += [f"verl-ext {words[1]} has no flag {flag}" for flag in words[2:]
                     if flag.startswith("--") and flag.split("=")[0] not in options]
    problems += [f"no fragment {kind}/{name}" for w in words for kind, name in re.findall(r"^\+plugins/(\w+)=(\w+)$", w)
                 if not (REPO / "verl_ext" / "plugins" / kind / f"{name}.yaml").is_file()]
    return problems


@pytest.mark.parametrize("page", [README, *TUTORIALS, DOCS / "howto" / "own_verl_config.md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_the_page_gives_exists(page):
    commands = _commands(page.read_text())
    assert commands
    problems = [problem for words in commands for problem in _check_command(words)]
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_a_missing_script_knob_flag_or_fragment_is_caught():
    assert _check_command(["bash", "recipes/nope/run_cpu.sh"]) == ["recipes/nope/run_cpu.sh does not exist"]
    assert _check_command(["NOPE=1", "bash", "recipes/quickstart/run_cpu.sh"]) == [
        "recipes/quickstart/run_cpu.sh has no knob NOPE"]
    assert _check_command(["verl-ext", "doctor", "--nope"]) == ["verl-ext doctor has no flag --nope"]
    assert _check_command(["verl-ext", "nope"]) == ["verl-ext has no command nope"]
    assert _check_command(["python", "-m", "scripts.bench.nope"]) == ["scripts.bench.nope does not exist"]
    assert _check_command(["python", "-m", "scripts.bench.bench_envs", "--nope"]) == [
        "scripts.bench.bench_envs has no flag --nope"]
    assert _check_command(["python", "-m", "verl.trainer.main_ppo", "+plugins/advantage=nope"]) == [
        "no fragment advantage/nope"]


# ------------------------------------------------------------------------------- links and layout


def _doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "bench_results" not in p.parts)


def _is_redirect(page: Path) -> bool:
    return page.read_text().startswith("Moved to ")


def test_every_relative_link_resolves():
    broken = []
    for page in [README, *_doc_pages(), *sorted((REPO / "recipes").glob("*/README.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"^[a-z]+://", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "\n".join(broken)


def test_every_docs_file_that_code_tests_and_recipes_name_exists():
    """Error messages, docstrings and scripts point users at docs pages by path; a moved page must
    take those pointers with it (a redirect stub counts: it still leads to the page)."""
    named = []
    for f in _tracked_text_files():
        if f.startswith("docs/"):
            continue  # pages link to each other (test_every_relative_link_resolves)
        for number, line in enumerate((REPO / f).read_text(errors="replace").splitlines(), 1):
            named += [(f"{f}:{number}", path) for path in re.findall(r"\bdocs/[\w./-]+\.(?:md|png|json)\b", line)]
    missing = [f"{where}: {path}" for where, path in named if not (REPO / path).exists()]
    assert named and not missing, "\n".join(missing)


def test_every_docs_page_is_of_one_kind():
    kinds = {"tutorials", "howto", "reference", "explanation", "experiments"}
    loose = [p.relative_to(REPO) for p in _doc_pages()
             if p.parent.name not in kinds and p != DOCS / "results.md" and not _is_redirect(p)]
    assert not loose, f"pages outside tutorials/ howto/ reference/ explanation/ experiments/: {loose}"


def test_redirect_stubs_are_one_line_to_a_page_that_exists():
    for page in filter(_is_redirect, _doc_pages()):
        lines = page.read_text().splitlines()
        target = re.search(r"\]\(([^)]+)\)", lines[0]).group(1)
        assert len(lines) == 1 and (page.parent / target).is_file(), page


# ----------------------------------------------------------------------- README and compatibility


FIRST_SCREEN = 40  # lines


def test_readme_test_command_is_what_ci_runs_and_the_quickstart_is_on_the_first_screen():
    readme = README.read_text()
    train, test = _bash_blocks(readme)[:2]
    ci_commands = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    for command in test.split("&&"):
        assert any(line.startswith(command.strip()) for line in ci_commands), \
            f"the README's test command runs `{command.strip()}`, which .ci/run does not"
    first_screen = "\n".join(readme.splitlines()[:FIRST_SCREEN])
    assert train in first_screen and test in first_screen


def test_readme_is_short_and_names_every_recipe_and_reference_page():
    readme = README.read_text()
    assert len(readme.splitlines()) < 100, "the README is a front door: move details to docs/"
    for recipe in (REPO / "recipes").iterdir():
        if recipe.is_dir():
            assert f"`{recipe.name}`" in readme, f"the README does not list recipes/{recipe.name}"
    for family in ("cpu_backend", "advantages", "old_logits", "envs", "dvreward"):
        assert f"(docs/reference/{family}.md)" in readme, f"the README's plugin table does not link {family}"


def test_every_test_the_compatibility_page_names_exists():
    references = re.findall(r"`([\w/]+\.py)(?:::([\w.]+))?(?:\[[^\]]*\])?`", COMPATIBILITY.read_text())
    assert len(references) > 30, "the compatibility page should name the tests behind its cells"
    for path, function in references:
        first = path.split("/")[0]
        file = REPO / path if (REPO / first).is_dir() and first not in ("gpu", "e2e") else REPO / "tests" / path
        assert file.exists(), f"docs/reference/compatibility.md names {path}, which does not exist"
        if function and not function.startswith("..."):  # `...[snapshot]`: the row above's test
            assert re.search(rf"def {re.escape(function)}\(", file.read_text()), \
                f"docs/reference/compatibility.md names {path}::{function}, which does not exist"


def test_every_registered_estimator_and_provider_has_a_compatibility_row():
    from verl_ext.advantages import ESTIMATORS
    from verl_ext.old_logits import registered_providers

    table = COMPATIBILITY.read_text()[COMPATIBILITY.read_text().index("| plugin | unit |"):]
    for name in [*ESTIMATORS, *registered_providers()]:
        assert f"| `{name}` |" in table, f"no row for {name} in docs/reference/compatibility.md"
