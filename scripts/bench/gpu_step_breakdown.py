"""What the GPU benchmarks share: the per-step section's heading and the card and versions a GPU table names.

Its own run, plain verl GRPO against hgpo + ppo_ewma with the ``ewma`` / ``snapshot`` provider one after
another on one GPU, was retired on 2026-11-28, when ``hook_cost_gpu``'s cost table replaced its numbers under
the same heading; ``hook_cost_gpu`` and ``flagship_gpu_scripts`` import what is left here.

Docs section: none of its own (``HEADING`` is the one ``hook_cost_gpu`` writes: docs/results.md, "## GPU: per-step breakdown").
"""

from __future__ import annotations

HEADING = "## GPU: per-step breakdown"


def machine_info(context: str) -> dict:
    """The card and the versions a GPU benchmark's table names (``machine.json``)."""
    import torch

    info = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "context": context}
    for module in ("vllm", "verl", "transformers"):
        info[module] = __import__(module).__version__
    return info
