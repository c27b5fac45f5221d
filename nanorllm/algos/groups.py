"""Groups: every episode sampled for one task in one round, the unit an advantage compares within.

A group is keyed by RolloutResult.group_id (which defaults to the task_id) and, for a game's episodes, the seat
played (`seat1/<group_id>`): a game's first and second player face different odds, so each is compared with its
own seat's episodes (rollout/games.py). Here: grouping, taking out
the failed episodes (RolloutResult.failed: the env raised in them, or a reward source could not score them),
and the flat list of samples the update trains on. Whether a group carries a signal at all is the
advantages' test (algos/advantages.py carries_signal).
"""

from collections import defaultdict
from collections.abc import Collection

from nanorllm.core.types import RolloutResult, StepSample


def group_by_task_id(results: list[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Group episodes by group_id (or task_id when no group_id was set) and seat, keeping arrival order."""
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        groups[group_key(r)].append(r)
    return dict(groups)


def group_key(r: RolloutResult) -> str:
    """`<group_id>`, or `seat<k>/<group_id>` for a game's seat k: the task-stream position stays last (a
    mini-batch is chosen by it, trainer/step.py mini_batch_of)."""
    key = r.group_id or r.task_id
    return key if r.seat is None else f"seat{r.seat}/{key}"


def drop_failed(results: list[RolloutResult], min_group_size: int = 2) -> tuple[list[RolloutResult], int, int]:
    """(episodes to train on, groups trained short, groups dropped): a failed episode (an env error, or a
    reward score that could not be computed: never a 0) says nothing about the policy, so it leaves its
    group, whose advantage is then computed over the rest; a group left with fewer than `min_group_size`
    episodes (--min-group-size) has too little to compare and is dropped whole."""
    kept, short, dropped = [], 0, 0
    for group in group_by_task_id(results).values():
        clean = [r for r in group if not r.failed]
        if len(clean) == len(group):
            kept += group
        elif len(clean) >= min_group_size:
            kept += clean
            short += 1
        else:
            dropped += 1
    return kept, short, dropped


def flatten_step_samples(groups: dict[str, list[RolloutResult]], *, drop_zero_std: bool = False,
                         silent: Collection[str] | None = None) -> list[StepSample]:
    """All StepSamples of all groups, episodes kept contiguous and in turn order.

    drop_zero_std skips the groups that carry no learning signal: they would only dilute a token-mean loss.
    Those are `silent` (algos/advantages.py silent_groups, as the step decided them) or, without it, the
    groups whose samples all got advantage 0, which compute_advantage gives the silent ones.
    """
    samples = []
    for g, results in groups.items():
        if drop_zero_std and (g in silent if silent is not None else
                              all(s.advantage == 0 for r in results for s in r.step_samples)):
            continue
        for r in results:
            samples.extend(r.step_samples)
    return samples
