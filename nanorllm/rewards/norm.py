"""How a learned score is put on a scale before it joins the reward (--reward-model-norm).

A reward model's raw score has no fixed scale: its mean drifts with the prompt set and its spread with how it was
fitted. `group` z-scores it within the episode's group (the GRPO advantage then sees only the ranking inside the
group, as it would anyway, but added to an env reward the two no longer differ in scale); `running` z-scores it by
a running mean and standard deviation (Welford) of every score the process has seen, itself included. Failed
scores (nan) are left out of the statistics and stay nan.
"""

import math

EPS = 1e-6


def group_norm(values: list[float], groups: list[str]) -> list[float]:
    """Each value minus its group's mean, over its group's standard deviation (population; + EPS); a group of one
    value, or of equal values, gives 0."""
    members: dict[str, list[float]] = {}
    for v, g in zip(values, groups):
        if math.isfinite(v):
            members.setdefault(g, []).append(v)
    stats = {g: mean_std(vs) for g, vs in members.items()}
    return [v if not math.isfinite(v) else (v - stats[g][0]) / (stats[g][1] + EPS) for v, g in zip(values, groups)]


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class RunningNorm:
    """Welford's running mean and variance over every finite value seen so far (in this process only: each
    process that scores keeps its own, and a resumed run starts it afresh)."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: list[float]) -> None:
        for v in values:
            if math.isfinite(v):
                self.count += 1
                delta = v - self.mean
                self.mean += delta / self.count
                self.m2 += delta * (v - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    def __call__(self, values: list[float]) -> list[float]:
        """`values` added to the statistics, then each z-scored by them."""
        self.update(values)
        return [(v - self.mean) / (self.std + EPS) if math.isfinite(v) else v for v in values]


def normalise(kind: str, values: list[float], groups: list[str], running: RunningNorm) -> list[float]:
    """--reward-model-norm `kind` (none, group, running) applied to one call's raw scores."""
    if kind == "group":
        return group_norm(values, groups)
    if kind == "running":
        return running(values)
    return list(values)
