"""Reward sources beyond a user's function: each scores a batch of episodes for envs/reward_fns.py's RewardBundle
(name, spec, weight, and a call returning one float, None or NaN per episode). Imported only when a run names one."""
