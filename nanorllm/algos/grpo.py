"""GRPO-lite: the advantage of an episode is its reward relative to the other episodes of its group.

A group is every episode sampled for one task in one round (RolloutResult.group_id, which defaults
to the task_id). By default (turn_credit="episode") every turn of an episode gets the episode's
advantage: in a wrong -> right episode the wrong first answer is rewarded like a first-try success.
turn_credit="turn" scores each turn by its return, its own reward (the env's per-turn reward: 1 for
the correct answer) plus gamma x the next turn's return, and normalises among the group's turns with
the same index (all first turns together, all second turns together).

Three estimators (`estimator`) of the baseline a reward is compared with:
- grpo: the group mean, optionally divided by the group std (the default);
- rloo: the mean of the *other* episodes of the group (leave-one-out, unbiased: an episode's own
  reward is not in its baseline), i.e. n/(n-1) x (r - mean); no std;
- reinforce++: the group mean, then (a - m) / (s + eps) with m, s the mean and std of the centred
  rewards over every episode of the step's groups with signal (REINFORCE++'s batch normalisation).
  With learner ranks the step's m and s are summed over the ranks (`batch_stats`). A constant group
  keeps advantage 0 under every estimator.
`reward_of` overrides the reward an episode is scored by (DAPO's overlong shaping, `overlong_penalty`).
"""

from collections import defaultdict
from typing import Callable

from nanorllm.core.types import RolloutResult, StepSample

ESTIMATORS = ("grpo", "rloo", "reinforce++")


def group_by_task_id(results: list[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Group episodes by group_id (or task_id when no group_id was set), keeping arrival order."""
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        groups[r.group_id or r.task_id].append(r)
    return dict(groups)


def compute_advantage(groups: dict[str, list[RolloutResult]], *, normalize_std: bool = True,
                      eps: float = 1e-6, turn_credit: str = "episode", turn_gamma: float = 1.0,
                      estimator: str = "grpo", reward_of: Callable[[RolloutResult], float] | None = None,
                      batch_stats: Callable[[dict[str, float]], dict[str, float]] | None = None,
                      ) -> dict[str, list[RolloutResult]]:
    """Write the estimator's advantage (grpo: (r - mean) [/ (std + eps)]) into every StepSample of every
    episode; returns `groups`.

    A constant-reward group gets advantage exactly 0, never NaN, whatever eps is.
    std is the population std of the group (a group of one has std 0 and advantage 0).
    With turn_credit="turn", r is a turn's return and the group is the group's turns of one index.
    `batch_stats` (reinforce++) sums {"n", "sum", "sq"} over the learner ranks (default: this rank's alone).
    """
    if turn_credit not in ("episode", "turn"):
        raise ValueError(f"turn_credit must be 'episode' or 'turn', got {turn_credit!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if estimator == "reinforce++" and turn_credit == "turn":
        raise ValueError("reinforce++ normalises over the whole step's episodes; turn credit compares turns of one index")
    sets = []  # comparison sets: [(reward, samples that get its advantage)]
    for results in groups.values():
        if turn_credit == "episode":
            sets.append([(reward_of(r) if reward_of else r.reward, r.step_samples) for r in results])
            continue
        by_turn: dict[int, list] = defaultdict(list)
        for r in results:
            for s, ret in zip(r.step_samples, turn_returns(r, turn_gamma)):
                by_turn[s.turn].append((ret, [s]))
        sets += by_turn.values()
    if estimator == "grpo":
        for items in sets:
            _normalise(items, normalize_std, eps)
        return groups
    centred = [_leave_one_out(items) if estimator == "rloo" else _centred(items) for items in sets]
    if estimator == "reinforce++":
        values = [a for items in centred for a, _, const in items if not const]
        stats = {"n": float(len(values)), "sum": sum(values), "sq": sum(a * a for a in values)}
        stats = batch_stats(stats) if batch_stats else stats
        n = max(stats["n"], 1.0)
        m = stats["sum"] / n
        s = max(stats["sq"] / n - m * m, 0.0) ** 0.5
        centred = [[((a - m) / (s + eps) if not const else 0.0, samples, const) for a, samples, const in items]
                   for items in centred]
    for items in centred:
        for a, samples, _ in items:
            for smp in samples:
                smp.advantage = a
    return groups


def _centred(items: list[tuple[float, list[StepSample]]]) -> list[tuple[float, list[StepSample], bool]]:
    """(r - the set's mean, samples, constant) per item; a constant set gets exactly 0."""
    constant = len({x for x, _ in items}) <= 1
    mean = sum(x for x, _ in items) / max(len(items), 1)
    return [(0.0 if constant else x - mean, samples, constant) for x, samples in items]


def _leave_one_out(items: list[tuple[float, list[StepSample]]]) -> list[tuple[float, list[StepSample], bool]]:
    """(r - the mean of the set's other rewards, samples, constant) per item; a set of one or a constant set: 0."""
    constant = len({x for x, _ in items}) <= 1
    total, n = sum(x for x, _ in items), len(items)
    return [(0.0 if constant else x - (total - x) / (n - 1), samples, constant) for x, samples in items]


def overlong_penalty(result: RolloutResult, *, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment, summed over the episode's turns (<= 0): a response of length n
    loses penalty x (n - (max_new_tokens - buffer)) / buffer once it enters the last `buffer` tokens."""
    if buffer <= 0:
        return 0.0
    start = max_new_tokens - buffer
    return -penalty * sum(max(len(s.response_ids) - start, 0) / buffer for s in result.step_samples)


def turn_returns(result: RolloutResult, gamma: float) -> list[float]:
    """Per step sample: its turn's reward + gamma x the next turn's return. Without a recorded
    Trajectory step for a turn, the episode's final reward counts at its last turn."""
    steps = result.trajectory.steps
    n = len(result.step_samples)
    rewards = [steps[s.turn].reward if s.turn < len(steps) else (result.reward if i == n - 1 else 0.0)
               for i, s in enumerate(result.step_samples)]
    out, ret = [], 0.0
    for r in reversed(rewards):
        ret = r + gamma * ret
        out.append(ret)
    return out[::-1]


def _normalise(items: list[tuple[float, list[StepSample]]], normalize_std: bool, eps: float) -> None:
    """items: (reward, samples that get its advantage) for one comparison set."""
    rewards = [x for x, _ in items]
    mean = sum(rewards) / len(rewards)
    std = (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5
    constant = len(set(rewards)) <= 1  # exact test: a float mean can differ from r by 1e-17
    for x, samples in items:
        adv = 0.0 if constant else x - mean
        if normalize_std and not constant:
            adv = adv / (std + eps)
        for s in samples:
            s.advantage = adv


def drop_env_errors(results: list[RolloutResult]) -> tuple[list[RolloutResult], int, int]:
    """(episodes to train on, groups trained short, groups dropped): an episode the env raised in
    (reason "error") says nothing about the policy, so it leaves its group; a group left with fewer
    than 2 episodes has nothing to compare and is dropped whole."""
    kept, short, dropped = [], 0, 0
    for group in group_by_task_id(results).values():
        clean = [r for r in group if r.trajectory.termination_reason != "error"]
        if len(clean) == len(group):
            kept += group
        elif len(clean) >= 2:
            kept += clean
            short += 1
        else:
            dropped += 1
    return kept, short, dropped


def is_zero_std(results: list[RolloutResult]) -> bool:
    return len({r.reward for r in results}) <= 1


def flatten_step_samples(groups: dict[str, list[RolloutResult]], *,
                         drop_zero_std: bool = False) -> list[StepSample]:
    """All StepSamples of all groups, episodes kept contiguous and in turn order.

    drop_zero_std skips groups whose samples all got advantage 0 (with episode credit: the episodes
    all got the same reward): they carry no learning signal and would only dilute a token-mean loss.
    Count them with `is_zero_std`. Call it after compute_advantage.
    """
    samples = []
    for results in groups.values():
        if drop_zero_std and all(s.advantage == 0 for r in results for s in r.step_samples):
            continue
        for r in results:
            samples.extend(r.step_samples)
    return samples
