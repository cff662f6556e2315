"""``verl_ext.replacements``: every verl name verl-ext replaces or overrides is in the inventory, and
every guard holds against the installed verl (the one verl-ext is built for)."""

from __future__ import annotations

import dataclasses

import pytest

from verl_ext import replacements


@pytest.mark.parametrize("replacement", replacements.inventory(), ids=lambda r: r.target)
def test_every_guard_holds_on_the_installed_verl(replacement):
    assert replacements.problem(replacement) is None


def test_a_changed_signature_is_named():
    entry = replacements.OTHERS[0]
    changed = dataclasses.replace(entry, parameters=(*entry.parameters, "extra"))
    message = replacements.problem(changed)
    assert message is not None and entry.target in message and "'extra'" in message


def test_every_private_verl_trainer_method_the_verl_ext_trainers_override_is_listed():
    """A new override of a verl trainer method cannot land without its inventory entry."""
    from verl_ext.trainer import VerlExtTrainerColocateAsync, VerlExtTrainerMixin, VerlExtTrainerSeparateAsync, VerlExtTrainerSync

    listed = {r.target for r in replacements.OVERRIDES}
    found = set()
    for trainer in (VerlExtTrainerSync, VerlExtTrainerColocateAsync, VerlExtTrainerSeparateAsync):
        verls = trainer.__mro__[trainer.__mro__.index(VerlExtTrainerMixin) + 1]
        ours = {name for klass in trainer.__mro__[:trainer.__mro__.index(verls)] for name in vars(klass)}
        for name in ours:
            if name.startswith("_") and not name.startswith("__") and callable(getattr(verls, name, None)):
                owner = next(k for k in verls.__mro__ if name in vars(k))
                found.add(f"{owner.__module__}:{owner.__qualname__}.{name}")
    assert found == listed


def test_every_patch_is_listed_with_the_name_it_rebinds():
    from verl_ext import patches

    assert {(p.name, p.replaces) for p in patches.ALL} == {(r.patch, r.target) for r in replacements.inventory() if r.patch}


def test_on_another_verl_the_trainer_guard_names_each_changed_target(monkeypatch):
    import importlib.metadata

    replacements.assert_targets_unchanged()  # the verl it is built for: nothing to check at start-up
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0")
    replacements.assert_targets_unchanged()  # another verl whose targets are unchanged starts
    entry = replacements.OTHERS[0]
    monkeypatch.setattr(replacements, "OTHERS", (dataclasses.replace(entry, parameters=("data",)),))
    with pytest.raises(replacements.VerlChangedError, match="built for verl 0.9.1, found verl 0.10.0") as info:
        replacements.assert_targets_unchanged()
    assert entry.target in str(info.value)


def test_the_architecture_page_lists_the_inventory():
    from verl_ext.doc_sections import DOCS, section_of

    page = (DOCS / "explanation" / "architecture.md").read_text()
    assert section_of(page, replacements.SECTION_HEADING) == replacements.render_section(), \
        "run: python -m verl_ext.replacements --write"
