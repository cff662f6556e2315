"""Reward plugins (DVReward judge rewards, env rewards) and the group-level reward post-processors
the verl-ext trainers apply (``postprocess``). Importing this package is free."""
