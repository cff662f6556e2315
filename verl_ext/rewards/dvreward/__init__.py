"""DVReward: decompositional verifiable rewards (AlphaGRPO, arXiv 2605.12495).

Modules, cheapest first:

* ``scoring``: pure maths: per-question P(yes), DSG gating, aggregation (no I/O, no numpy).
* ``question_set``: the question schema stored in ``extra_info["dv_questions"]`` + validation.
* ``settings``: the manager/judge settings read from verl's ``reward.reward_kwargs.dvreward``.
* ``transport``: one OpenAI-compatible endpoint: POST with timeouts, retries, a rate limiter.
* ``judge``: async OpenAI-compatible judge client (httpx), cache, concurrency limit, metrics.
* ``questions``: ``verl-ext dv-questions``, the offline question builder.
* ``judge_server``: ``verl-ext judge-server``, a local judge; ``judge_backends``: what answers its
  requests (transformers or a fake map).
* ``manager`` / ``registration``: the verl reward-loop manager ``dvreward``.

Importing this package imports none of them.
"""
