"""GRPO-lite: the advantage of an episode is its reward relative to the other episodes of its group.

A group is every episode sampled for one task in one round (RolloutResult.group_id, which defaults
to the task_id). Terminal reward only, so every turn of an episode gets the episode's advantage.
"""

from collections import defaultdict

from nanorllm.core.types import RolloutResult, StepSample


def group_by_task_id(results: list[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Group episodes by group_id (or task_id when no group_id was set), keeping arrival order."""
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        groups[r.group_id or r.task_id].append(r)
    return dict(groups)


def compute_advantage(groups: dict[str, list[RolloutResult]], *, normalize_std: bool = True,
                      eps: float = 1e-6) -> dict[str, list[RolloutResult]]:
    """Write (r - mean) [/ (std + eps)] into every StepSample of every episode; returns `groups`.

    A constant-reward group gets advantage exactly 0, never NaN, whatever eps is.
    std is the population std of the group (a group of one has std 0 and advantage 0).
    """
    for results in groups.values():
        rewards = [r.reward for r in results]
        mean = sum(rewards) / len(rewards)
        std = (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5
        constant = is_zero_std(results)  # exact test: a float mean can differ from r by 1e-17
        for r in results:
            adv = 0.0 if constant else r.reward - mean
            if normalize_std and not constant:
                adv = adv / (std + eps)
            for s in r.step_samples:
                s.advantage = adv
    return groups


def is_zero_std(results: list[RolloutResult]) -> bool:
    return len({r.reward for r in results}) <= 1


def flatten_step_samples(groups: dict[str, list[RolloutResult]], *,
                         drop_zero_std: bool = False) -> list[StepSample]:
    """All StepSamples of all groups, episodes kept contiguous and in turn order.

    drop_zero_std skips groups whose episodes all got the same reward: they carry no learning
    signal (advantage 0) and would only dilute a token-mean loss. Count them with `is_zero_std`.
    """
    samples = []
    for results in groups.values():
        if drop_zero_std and is_zero_std(results):
            continue
        for r in results:
            samples.extend(r.step_samples)
    return samples
