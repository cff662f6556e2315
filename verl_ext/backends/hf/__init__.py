"""verl-ext's transformers-based rollout server and scorer, on CPU or CUDA: the ``hf`` rollout
(replica, server and server adapter, with an optional fp8 rollout) and the ``dedicated`` provider's
old-logit scorer, which is that server with its own weights. Backend-neutral: the cpu backend and
GPU runs both use it."""
