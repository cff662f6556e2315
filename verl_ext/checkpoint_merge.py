"""A transformers-loadable folder from a verl checkpoint, merged with verl's own model merger.

Lives outside ``verl_ext.envs`` because it imports verl; the envs' local-model policy calls it
lazily.
"""

from __future__ import annotations

import os
import sys


def hf_model_dir(path: str) -> str:
    """A folder transformers can load: ``path`` itself when it holds weights, else a verl FSDP
    checkpoint (``.../global_step_N`` or its ``actor/``) merged once, with verl's own model merger,
    into ``<actor>/huggingface_merged``."""
    if any(os.path.exists(os.path.join(path, name)) for name in ("model.safetensors", "model.safetensors.index.json",
                                                                  "pytorch_model.bin")):
        return path
    actor = os.path.join(path, "actor") if os.path.isdir(os.path.join(path, "actor")) else path
    if not os.path.exists(os.path.join(actor, "fsdp_config.json")):
        raise FileNotFoundError(f"{path} holds neither a transformers model nor a verl FSDP checkpoint "
                                "(expected model.safetensors, or actor/fsdp_config.json in a global_step_N folder)")
    merged = os.path.join(actor, "huggingface_merged")
    if not os.path.exists(os.path.join(merged, "model.safetensors")):
        from verl.model_merger.base_model_merger import ModelMergerConfig
        from verl.model_merger.fsdp_model_merger import FSDPModelMerger

        print(f"verl-ext: merging the FSDP checkpoint {actor} into {merged} (verl.model_merger)", file=sys.stderr)
        merger = FSDPModelMerger(ModelMergerConfig(operation="merge", backend="fsdp", local_dir=actor,
                                                   target_dir=merged,
                                                   hf_model_config_path=os.path.join(actor, "huggingface")))
        merger.merge_and_save()
        merger.cleanup()
    return merged
