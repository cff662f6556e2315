"""What a composed config's data files and agent-loop settings say: the agent loops a run will use
and the env backends its training rows name. Read by the start-up checks and the preconditions.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from verl_ext.gpu_checks import select
from verl_ext.registry import load_all

AGENT_LOOP_FILE_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def agent_loops(config: Any) -> dict[str, tuple[str | None, str]]:
    """The agent loops a run will use: ``name -> (class path or None where unknown, where it is set)``;
    the rows' ``agent_name`` column of ``data.train_files`` where present, else ``default_agent_loop``."""
    agent = select(config, "actor_rollout_ref.rollout.agent")
    names: dict[str, str] = {}
    for path in data_files(config, "train_files"):
        for name in agent_names(path):
            names.setdefault(name, f"agent_name in {path}")
    if not names:
        default = select(agent, "default_agent_loop", "single_turn_agent")
        names[str(default)] = "actor_rollout_ref.rollout.agent.default_agent_loop"
    targets = {name: entry.get("_target_") for name, entry in registered_agent_loops().items()}
    try:
        targets.update({entry.name: entry.get("_target_") for entry in agent_loop_file(config)})
    except Exception:  # noqa: BLE001 - agent_loop_settings reports an unreadable file; this check then knows less
        pass
    return {name: (targets.get(name), source) for name, source in names.items()}



def agent_loop_file(config: Any) -> list[Any]:
    """The entries of ``agent_loop_config_path``, loaded as verl loads them (none when unset)."""
    path = select(config, AGENT_LOOP_FILE_KEY)
    if not path:
        return []
    from omegaconf import OmegaConf
    from verl.utils.import_utils import resolve_config_path

    return list(OmegaConf.load(resolve_config_path(path)))


def registered_agent_loops() -> dict[str, dict]:
    load_all()
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    return dict(_agent_loop_registry)


def data_files(config: Any, key: str) -> list[str]:
    value = select(config, f"data.{key}")
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def column(path: str, name: str) -> list[Any]:
    """Column ``name`` of a parquet data file; empty when the file or the column is absent."""
    if not os.path.exists(path) or not path.endswith(".parquet"):
        return []
    import pyarrow.parquet as pq

    if name not in pq.read_schema(path).names:
        return []
    return pq.read_table(path, columns=[name]).column(0).to_pylist()


def agent_names(path: str) -> list[str]:
    return sorted({str(v) for v in column(path, "agent_name") if v})


def env_backends(config: Any) -> set[str]:
    """The ``hybrid_gui_tool`` env backends the training rows name (``extra_info.env.backend``; the
    loop's default ``minidesk`` where a row names none or no data file is readable)."""
    backends = set()
    for path in data_files(config, "train_files"):
        stat = os.stat(path) if os.path.exists(path) else None
        backends |= _file_env_backends(path, stat and (stat.st_mtime_ns, stat.st_size))
    return backends or {"minidesk"}


@functools.lru_cache(maxsize=64)
def _file_env_backends(path: str, version: tuple[int, int] | None) -> frozenset[str]:
    # several start-up checks ask (doctor's dependencies, the browser checks): one read of the
    # extra_info column per file version (mtime, size), not one per check
    backends = set()
    for extra_info in column(path, "extra_info"):
        env = (extra_info or {}).get("env") or {}
        backends.add(env.get("backend") or (extra_info or {}).get("env_backend") or "minidesk")
    return frozenset(backends)
