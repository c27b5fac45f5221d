"""A policy that collapses says so: the distinct final answers of each group, and the alarm they feed.

GRPO learns from the differences inside a group. A policy that answers every question the same way (a constant
guess that a fixed share of the tasks rewards) leaves its groups with one distinct answer each: the rewards inside a
group are then all the same, the advantages 0, and nothing more is learned, while the reward curve stays flat at
the share the guess earns, which reads as a plateau rather than a collapse. `rollout/distinct_answers` shows it
per step; `CollapseAlarm` prints one warning when it lasted --collapse-alarm-steps steps with a reward mean below 1
(a policy that solves every task may well agree with itself).

An episode's final answer is its last step's `action` (what the env graded: the math env's boxed answer,
reasoning-gym's <answer>) or, where the env records none, its last response, stripped. Failed episodes (an env
error, a score that could not be computed) say nothing about the policy and are not counted.

The alarm's state is this process's: a resumed run starts its count afresh at the resume.
"""

from collections import Counter

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


class CollapseAlarm:
    """Fed each step's episodes; says once when `steps` steps in a row held one distinct final answer in every
    group and a reward mean below 1, and one answer is more than half of those steps' episodes (steps = 0: never).
    Without that last condition a policy that answers each task consistently, if not always right, would read as
    collapsed."""

    def __init__(self, steps: int):
        self.steps = steps
        self.streak: list[tuple[Counter, float, int]] = []  # the steps in a row so far: answers, reward sum, episodes
        self.said = False

    def feed(self, results: list[RolloutResult], step: int) -> str | None:
        """The warning when step `step` completes the streak (once a run), else None."""
        if not self.steps or self.said:
            return None
        groups = group_answers(results)
        rewards = [r.reward for r in results if not r.failed]
        if not groups or any(len(set(g)) > 1 for g in groups) or sum(rewards) / len(rewards) >= 1:
            self.streak.clear()
            return None
        self.streak = [*self.streak, (Counter(a for g in groups for a in g), sum(rewards), len(rewards))][-self.steps:]
        if len(self.streak) < self.steps:
            return None
        answers = sum((c for c, _, _ in self.streak), Counter())
        n = sum(k for _, _, k in self.streak)
        (answer, count), = answers.most_common(1)
        if count * 2 <= n:  # each task its own answer: a policy consistent per task, not a constant one
            return None
        self.said = True
        shown = answer if len(answer) <= 80 else answer[:80] + "..."
        return (f"[collapse] step {step}: warning: the last {self.steps} steps' groups each held one distinct final "
                f"answer (reward mean {sum(s for _, s, _ in self.streak) / n:.2f} < 1); the most common, {shown!r}, "
                f"is {count / n:.2f} of their {n} episodes: the policy may have collapsed to a constant answer "
                f"(docs/metrics.md)")
