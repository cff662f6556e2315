"""The old-logit provider is the unit of change: outside the module that registers the providers,
no code decides anything by a provider's name (``provider == "snapshot"``,
``provider.name in ("dedicated", "interrupt")``); it asks the provider's declarations instead."""

from __future__ import annotations

import ast
from pathlib import Path

import verl_ext
from verl_ext.old_logits import registered_providers

PACKAGE = Path(verl_ext.__file__).parent
PROVIDERS_MODULE = PACKAGE / "old_logits" / "providers.py"


def _names_in(node: ast.AST) -> set[str]:
    """String constants ``node`` is or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(element) for element in node.elts)) if node.elts else set()
    return set()


def _provider_name_comparisons(path: Path) -> list[str]:
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        about_a_provider = any("provider" in ast.get_source_segment(source, op).lower() for op in operands)
        names = set().union(*(_names_in(op) for op in operands)) & set(registered_providers())
        collections = [op for op in operands if isinstance(op, ast.Name) and op.id.endswith("_PROVIDERS")]
        if about_a_provider and (names or collections):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_code_outside_the_providers_module_compares_a_provider_name():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != PROVIDERS_MODULE
             for hit in _provider_name_comparisons(path)]
    assert not found, "decide by the provider's declarations (ProviderNeeds, rollout_side, ...):\n" + "\n".join(found)


def test_the_check_finds_a_name_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('if config.provider == "snapshot" or provider.name in ("dedicated", "interrupt"):\n    pass\n'
                       "if old_logit_provider.name in ROLLOUT_SIDE_PROVIDERS:\n    pass\n"
                       'if mode == "sync":\n    pass\n')
    global PACKAGE
    package, PACKAGE = PACKAGE, tmp_path
    try:
        assert len(_provider_name_comparisons(planted)) == 3  # not the trainer mode's
    finally:
        PACKAGE = package
