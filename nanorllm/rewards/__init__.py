"""Reward sources beyond user functions (docs/rewards.md): each file one source, imported only when a run names it."""
