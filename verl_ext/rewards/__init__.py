"""Reward plugins (DVReward judge rewards, env rewards). Importing this package is free."""
