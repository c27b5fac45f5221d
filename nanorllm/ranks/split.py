"""split_groups: one step's episodes cut into one share per learner rank, groups kept whole.

A group's advantages are computed from all of its episodes, so a group never spans ranks: each
rank computes the same advantages the 1-rank step would. Shares are balanced by tokens (the
forward and backward cost), largest group first onto the least loaded rank; a rank may get an
empty share when there are fewer groups than ranks (it still joins the gradient all-reduce).
"""

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult


def episode_tokens(r: RolloutResult) -> int:
    """Length of the episode's merged sequence: its last turn's prompt + response."""
    last = r.step_samples[-1] if r.step_samples else None
    return len(last.prompt_ids) + len(last.response_ids) if last else 0


def split_groups(results: list[RolloutResult], n: int) -> list[list[RolloutResult]]:
    """`n` shares of `results`, each group in exactly one share, episodes in their arrival order."""
    groups = list(group_by_task_id(results).values())
    load, owner = [0] * n, {}
    for g in sorted(groups, key=lambda g: -sum(episode_tokens(r) for r in g)):
        rank = min(range(n), key=lambda k: (load[k], k))
        load[rank] += sum(episode_tokens(r) for r in g)
        for r in g:
            owner[id(r)] = rank
    return [[r for r in results if owner[id(r)] == k] for k in range(n)]
