"""Reward sources beyond user functions (docs/rewards.md): each file one source scoring a batch of episodes for
rewards/functions.py's RewardBundle (name, spec, weight, and a call returning one float, None or NaN per episode),
imported only when a run names it."""
