"""verl's vLLM rollout server, counting the segments it serves (``ServedSegments``), for the
exact old-logit providers ``dedicated`` and ``interrupt``. Imported only when one of them runs
with ``actor_rollout_ref.rollout.name=vllm`` (it imports vLLM); the trainer registers
``SegmentCountingVLLMReplica`` under verl's name ``vllm`` while it builds its rollout replicas
(``verl_ext.trainer``, listed in patches/README.md), so everything else about the servers is
verl's: the same actor names, adapters, weight sync, abort and resume."""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from verl_ext.old_logits.segment_log import ServedSegments


class SegmentCountingVLLMServer(ServedSegments, vLLMHttpServer):
    """verl's ``vLLMHttpServer``; every call that returns tokens is counted under the version
    stamped on it before the result leaves the server."""

    async def generate(self, *args: Any, **kwargs: Any) -> TokenOutput:
        output = await super().generate(*args, **kwargs)
        if output.token_ids:
            self.count_served(output.extra_fields.get("global_steps"))
        return output


class SegmentCountingVLLMReplica(vLLMReplica):
    """verl's ``vLLMReplica`` whose servers are ``SegmentCountingVLLMServer``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(SegmentCountingVLLMServer)
