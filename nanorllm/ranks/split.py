"""One step's work cut into one share per learner rank, balanced by tokens (the forward and backward cost).

RL (`split_groups`): a group's advantages are computed from all of its episodes, so a group never spans
ranks: each rank computes the same advantages the 1-rank step would. SFT (`split_conversations`): a conversation
is trained whole on one rank. Either way the largest unit goes first onto the least loaded rank, items
keep their order inside a share, and a rank may get an empty share when there are fewer units than
ranks (it still joins the gradient all-reduce).
"""

from collections.abc import Callable, Sequence

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult, StepSample


def episode_tokens(r: RolloutResult) -> int:
    """Length of the episode's merged sequence: its last turn's prompt + response."""
    last = r.step_samples[-1] if r.step_samples else None
    return len(last.prompt_ids) + len(last.response_ids) if last else 0


def row_tokens(row: list[StepSample]) -> int:
    """Length of an SFT row's merged sequence: its last assistant turn's prompt + response."""
    return len(row[-1].prompt_ids) + len(row[-1].response_ids) if row else 0


def balance(units: Sequence[list], n: int, cost: Callable) -> list[int]:
    """For each unit (a list of items), the rank that trains it: the costliest first onto the least loaded."""
    load, owner = [0] * n, [0] * len(units)
    for i in sorted(range(len(units)), key=lambda i: -sum(cost(x) for x in units[i])):
        owner[i] = min(range(n), key=lambda k: (load[k], k))
        load[owner[i]] += sum(cost(x) for x in units[i])
    return owner


def split_groups(results: list[RolloutResult], n: int) -> list[list[RolloutResult]]:
    """`n` shares of `results`, each group in exactly one share, episodes in their arrival order."""
    groups = list(group_by_task_id(results).values())
    owner = {id(r): k for g, k in zip(groups, balance(groups, n, episode_tokens)) for r in g}
    return [[r for r in results if owner[id(r)] == k] for k in range(n)]


def split_conversations(rows: list[list[StepSample]], n: int) -> list[list[list[StepSample]]]:
    """`n` shares of SFT `rows` (each a conversation's StepSamples), each row whole in one share, in order."""
    owner = balance([[row] for row in rows], n, row_tokens)
    return [[row for row, k in zip(rows, owner) if k == rank] for rank in range(n)]
