"""A policy that collapses says so: the distinct final answers of each group, and the alarm they feed.

GRPO learns from the differences inside a group. A policy that answers every question the same way (a constant
guess that a fixed share of the tasks rewards) leaves its groups with one distinct answer each: the rewards inside a
group are then all the same, the advantages 0, and nothing more is learned, while the reward curve stays flat at
the share the guess earns, which reads as a plateau rather than a collapse. `rollout/distinct_answers` shows it
per step; `CollapseAlarm` prints one warning when it lasted --collapse-alarm-steps steps with a reward mean below 1
(a policy that solves every task may well agree with itself).

A policy may also collapse onto a few fixed guesses spread over its turns (1, then 2 after the retry): its groups
keep two answers, but across the step's tasks its answers no longer follow the question. Where the tasks carry a
gold `answer`, the alarm compares the spread of the policy's final answers with the spread of the golds of the same
episodes, each as an effective number of answers (1 / the sum of the squared shares: 1 for one answer, k for k
answers of equal share): a policy whose answers spread over at most half as many as the golds' says so too.

An episode's final answer is its last step's `action` (what the env graded: the math env's boxed answer,
reasoning-gym's <answer>) or, where the env records none, its last response, stripped. Failed episodes (an env
error, a score that could not be computed) say nothing about the policy and are not counted.

The alarm's state is this process's: a resumed run starts its count afresh at the resume.
"""

from collections import Counter, deque
from dataclasses import dataclass

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


def effective_count(counts: Counter) -> float:
    """1 / the sum of the squared shares: how many equally common values the spread is worth."""
    n = sum(counts.values())
    return n * n / sum(c * c for c in counts.values())


@dataclass
class StepAnswers:
    """One step's scored episodes as the alarm reads them."""
    answers: Counter  # final answer -> episodes
    golds: Counter | None  # gold answer -> episodes (None: some task carries no `answer`)
    one_each: bool  # every group held one distinct final answer
    reward: float  # the episodes' reward sum
    episodes: int

    @classmethod
    def of(cls, results: list[RolloutResult]) -> "StepAnswers | None":
        scored = [r for r in results if not r.failed]
        if not scored:
            return None
        golds = [r.trajectory.task.get("answer") for r in scored]
        return cls(Counter(final_answer(r) for r in scored),
                   None if any(g is None for g in golds) else Counter(str(g).strip() for g in golds),
                   all(len(set(g)) == 1 for g in group_answers(scored)), sum(r.reward for r in scored), len(scored))


class CollapseAlarm:
    """Fed each step's episodes; says once when the last `steps` steps, each with a reward mean below 1, either held
    one distinct final answer in every group with one answer more than half of their episodes (a constant answer;
    without that last condition a policy that answers each task consistently, if not always right, would read as
    collapsed), or spread their final answers over at most half as many effective answers as the golds of the same
    episodes (a few fixed guesses). steps = 0: never."""

    def __init__(self, steps: int):
        self.steps = steps
        self.window: deque[StepAnswers] = deque(maxlen=max(steps, 1))
        self.said = False

    def feed(self, results: list[RolloutResult], step: int) -> str | None:
        """The warning when step `step` completes a collapsed window (once a run), else None."""
        if not self.steps or self.said:
            return None
        seen = StepAnswers.of(results)
        if seen is None or seen.reward >= seen.episodes:  # nothing scored, or every episode solved
            self.window.clear()
            return None
        self.window.append(seen)
        if len(self.window) < self.steps:
            return None
        warning = self.constant(step) or self.narrow(step)
        self.said = warning is not None
        return warning

    def pooled(self) -> tuple[Counter, int, float]:
        """The window's final answers, episodes and reward mean."""
        n = sum(s.episodes for s in self.window)
        return sum((s.answers for s in self.window), Counter()), n, sum(s.reward for s in self.window) / n

    def constant(self, step: int) -> str | None:
        answers, n, mean = self.pooled()
        (answer, count), = answers.most_common(1)
        if not all(s.one_each for s in self.window) or count * 2 <= n:
            return None
        return (f"[collapse] step {step}: warning: the last {self.steps} steps' groups each held one distinct final "
                f"answer (reward mean {mean:.2f} < 1); the most common, {shown(answer)!r}, is {count / n:.2f} of their "
                f"{n} episodes: the policy may have collapsed to a constant answer (docs/metrics.md)")

    def narrow(self, step: int) -> str | None:
        if any(s.golds is None for s in self.window):
            return None
        answers, n, mean = self.pooled()
        spread, gold_spread = effective_count(answers), effective_count(sum((s.golds for s in self.window), Counter()))
        if spread * 2 > gold_spread:
            return None
        top = ", ".join(f"{shown(a)!r} {c / n:.2f}" for a, c in answers.most_common(3))
        return (f"[collapse] step {step}: warning: the last {self.steps} steps' final answers spread over "
                f"{spread:.1f} effective answers where their tasks' golds spread over {gold_spread:.1f} (reward mean "
                f"{mean:.2f} < 1); the most common of their {n} episodes: {top}: the policy's answers may not follow "
                "the question (docs/metrics.md)")


def shown(answer: str) -> str:
    return answer if len(answer) <= 80 else answer[:80] + "..."
