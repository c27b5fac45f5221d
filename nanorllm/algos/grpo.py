"""GRPO-lite: the advantage of an episode is its reward relative to the other episodes of its group.

A group is every episode sampled for one task in one round (RolloutResult.group_id, which defaults
to the task_id). By default (turn_credit="episode") every turn of an episode gets the episode's
advantage: in a wrong -> right episode the wrong first answer is rewarded like a first-try success.
turn_credit="turn" scores each turn by its return, its own reward (the env's per-turn reward: 1 for
the correct answer) plus gamma x the next turn's return, and normalises among the group's turns with
the same index (all first turns together, all second turns together).
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
                      eps: float = 1e-6, turn_credit: str = "episode",
                      turn_gamma: float = 1.0) -> dict[str, list[RolloutResult]]:
    """Write (r - mean) [/ (std + eps)] into every StepSample of every episode; returns `groups`.

    A constant-reward group gets advantage exactly 0, never NaN, whatever eps is.
    std is the population std of the group (a group of one has std 0 and advantage 0).
    With turn_credit="turn", r is a turn's return and the group is the group's turns of one index.
    """
    if turn_credit not in ("episode", "turn"):
        raise ValueError(f"turn_credit must be 'episode' or 'turn', got {turn_credit!r}")
    for results in groups.values():
        if turn_credit == "episode":
            _normalise([(r.reward, r.step_samples) for r in results], normalize_std, eps)
            continue
        by_turn: dict[int, list] = defaultdict(list)
        for r in results:
            for s, ret in zip(r.step_samples, turn_returns(r, turn_gamma)):
                by_turn[s.turn].append((ret, [s]))
        for items in by_turn.values():
            _normalise(items, normalize_std, eps)
    return groups


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
