"""A policy that collapses says so: the distinct final answers of each group.

GRPO learns from the differences inside a group. A policy that answers every question the same way (a constant
guess that a fixed share of the tasks rewards) leaves its groups with one distinct answer each: the rewards inside a
group are then all the same, the advantages 0, and nothing more is learned, while the reward curve stays flat at
the share the guess earns, which reads as a plateau rather than a collapse. `rollout/distinct_answers` shows it
per step.

An episode's final answer is its last step's `action` (what the env graded: the math env's boxed answer,
reasoning-gym's <answer>) or, where the env records none, its last response, stripped. Failed episodes (an env
error, a score that could not be computed) say nothing about the policy and are not counted.
"""

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult


def final_answer(result: RolloutResult) -> str:
    """The episode's last graded `action` as text (an --agent's may be any JSON value), else its last response
    stripped ('' for an episode with no step)."""
    steps = result.trajectory.steps
    if not steps:
        return ""
    action = steps[-1].action
    return steps[-1].model_response.strip() if action is None else str(action)


def group_answers(results: list[RolloutResult]) -> list[list[str]]:
    """The final answers of each group's scored episodes (groups with none left out)."""
    groups = ([final_answer(r) for r in g if not r.failed] for g in group_by_task_id(results).values())
    return [g for g in groups if g]


def distinct_answers(results: list[RolloutResult]) -> float | None:
    """Mean over the groups of the number of distinct final answers in each (None: no scored episode)."""
    groups = group_answers(results)
    return sum(len(set(g)) for g in groups) / len(groups) if groups else None
