"""Old-logit providers: recover (or approximate) π_train(θ_v), the training-side log-probs at the
version that generated each token, which asynchronous RL pipelines lose.

Pure torch; importing this package touches no Ray, no verl trainer and no accelerator. The verl
glue sits beside the math but is never imported from here: ``host`` (the verl trainer's
``OldLogitHost`` and the worker-side state) and ``rollout_client`` (the LLM clients that record
each token's weight version). See docs/reference/old_logits.md.
"""

from verl_ext.old_logits.config import EWMAConfig, OldLogitsConfig, SnapshotConfig
from verl_ext.old_logits.ewma import EWMAShadow, beta_from_com, com_from_beta
from verl_ext.old_logits.providers import (
    OldLogitHost,
    OldLogitProvider,
    ProviderNeeds,
    build_provider,
    get_provider,
    register_provider,
    registered_providers,
)
from verl_ext.old_logits.snapshot import (
    SnapshotMissingError,
    SnapshotStore,
    scatter_by_version,
)
from verl_ext.old_logits.worker import OldLogitWorkerState

__all__ = [
    "EWMAConfig",
    "EWMAShadow",
    "OldLogitHost",
    "OldLogitProvider",
    "OldLogitWorkerState",
    "OldLogitsConfig",
    "ProviderNeeds",
    "SnapshotConfig",
    "SnapshotMissingError",
    "SnapshotStore",
    "beta_from_com",
    "build_provider",
    "com_from_beta",
    "get_provider",
    "register_provider",
    "registered_providers",
    "scatter_by_version",
]
