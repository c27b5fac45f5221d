"""The learning rate of a step: warmup, then constant, linear or cosine decay to 0 at max_steps.

A pure function of the step number (the rollout batch being trained, `policy.version`), not a
scheduler object with state of its own: a resumed run restores its step from the checkpoint and so
continues the schedule exactly where it stopped, and every learner rank computes the same value.
Every optimizer step of one rollout batch (`updates_per_batch`, `epochs`) uses that step's rate.
"""

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_at(step: int, *, lr: float, schedule: str, warmup_steps: int, max_steps: int) -> float:
    """The rate for 0-based `step`: lr x (step + 1) / (warmup_steps + 1) during warmup, then lr x the
    schedule's factor at progress (step - warmup_steps) / (max_steps - warmup_steps) in [0, 1)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {schedule!r}")
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    progress = (step - warmup_steps) / max(max_steps - warmup_steps, 1)
    if schedule == "linear":
        return lr * (1.0 - progress)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr
