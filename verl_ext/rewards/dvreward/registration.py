"""Registers ``DVRewardManager`` in verl's reward-loop registry as ``dvreward``.

``verl_ext.plugin`` imports this module when verl imports
``verl.experimental.reward_loop.reward_manager``, in every process that resolves a reward
manager (the TaskRunner and each ``RewardLoopWorker``). Select it with
``reward.reward_manager.name=dvreward``.
"""

from verl.experimental.reward_loop.reward_manager import register

from verl_ext.rewards.dvreward.manager import DVRewardManager

register("dvreward")(DVRewardManager)
