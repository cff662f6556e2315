"""Hydra discovers this module through the ``hydra_plugins`` namespace package and adds
verl-ext's plugin fragments to every search path, so ``python -m verl.trainer.main_ppo
+plugins/backend=cpu`` composes ``plugins/backend/cpu.yaml`` with verl's own config."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class VerlExtSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # The package root, so fragments are addressed by their path: `+plugins/backend=cpu`.
        # (verl already has a `reward` group; a `plugins/` prefix keeps ours from colliding.)
        search_path.append(provider="verl-ext", path="pkg://verl_ext")
