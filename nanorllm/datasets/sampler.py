"""SignalSampler: a task order that spends rollouts where the learning signal is (`--task-sampler signal`).

A GRPO group whose episodes all succeed or all fail has no advantage and trains nothing; with a uniform
order most groups of a task set that the model has mostly solved (or cannot touch yet) are such groups.
This sampler keeps a pass-rate estimate per task and draws toward the tasks whose estimate is uncertain,
as prime-rl's curricula and online difficulty filtering do:

- estimate: a task's s successes in n episodes give a Beta posterior whose prior is its kind's pooled rate
  (the `kind` field, else `level`, `type`, `subject` or `dataset`; one pool without), worth PRIOR_EPISODES
  episodes, so a task seen little leans on the tasks like it.
- drawing: a task's weight is m(1 - m) of its estimate m while m lies in the band; an unseen task's m is its
  kind's pooled rate. While unseen tasks remain, each pick is one of them (uniformly) with chance `explore`,
  so a kind that looks hopeless is still explored; else, with chance `revisit`, one of the tasks outside the
  band (uniformly: solved and hopeless tasks come back rarely, in case the policy moved, at a share that does
  not grow with their number); else one by weight. A draw takes no task twice, nor one of `avoid` (the
  step's own tasks, for fill_batch's rounds), unless the tasks run out.
- determinism: the draw at stream position p uses an RNG seeded by (seed, p), so what is drawn depends only
  on the position and the estimates then. The estimates move only in `observe`, once a step is committed,
  and they are the checkpoint's `state()`: a resumed run draws what the uninterrupted one drew.

Group ids stay `<task_id>@<position>` and positions only grow, so exactly-once is TaskStream's.
"""

import random
from collections import defaultdict
from dataclasses import dataclass
from statistics import pstdev

from nanorllm.datasets.stream import TaskStream

KIND_FIELDS = ("kind", "level", "type", "subject", "dataset")  # the first one a task has names its kind
PRIOR_EPISODES = 2.0  # episodes the kind's pooled rate counts for: one group of 4 alike leaves the band


@dataclass(frozen=True)
class SamplerSpec:
    """The signal sampler's settings (config group TaskSampling)."""

    band: tuple[float, float] = (0.2, 0.8)
    explore: float = 0.25
    revisit: float = 0.05  # the chance a pick goes back to a task outside the band


def task_kind(task: dict) -> str:
    """The task's kind for pooling: its first KIND_FIELDS value, '' (one pool) without any."""
    return next((str(task[k]) for k in KIND_FIELDS if task.get(k) not in (None, "")), "")


class SignalSampler(TaskStream):
    def __init__(self, tasks: list[dict], *, spec: SamplerSpec = SamplerSpec(), seed: int = 0, position: int = 0,
                 origin: int = 0):
        super().__init__(tasks, seed=seed, position=position, origin=origin)
        self.spec = spec
        self.stats: dict[str, list[int]] = {}  # task_id -> [successes, episodes]
        self.kinds = [task_kind(t) for t in tasks]

    # ---- estimates -----------------------------------------------------------------------------
    def kind_rates(self) -> dict[str, float]:
        """Each kind's pooled pass rate over its tasks' episodes, under a uniform Beta(1, 1) prior."""
        s, n = defaultdict(int), defaultdict(int)
        for task, kind in zip(self.tasks, self.kinds):
            got = self.stats.get(task["task_id"])
            if got:
                s[kind] += got[0]
                n[kind] += got[1]
        return {kind: (s[kind] + 1) / (n[kind] + 2) for kind in set(self.kinds)}

    def estimates(self) -> list[float | None]:
        """Per task (in `tasks` order) its posterior mean pass rate, None while unseen."""
        rates, out = self.kind_rates(), []
        for task, kind in zip(self.tasks, self.kinds):
            got = self.stats.get(task["task_id"])
            out.append(None if not got else (got[0] + PRIOR_EPISODES * rates[kind]) / (got[1] + PRIOR_EPISODES))
        return out

    def in_band(self, m: float) -> bool:
        low, high = self.spec.band
        return low <= m <= high

    def weight(self, m: float) -> float:
        """A task's draw weight: m(1 - m) inside the band, 0 outside (those come back through `revisit`)."""
        return m * (1 - m) if self.in_band(m) else 0.0

    # ---- drawing -------------------------------------------------------------------------------
    def take(self, n: int, *, avoid: frozenset[str] | set[str] = frozenset()) -> list[tuple[dict, str]]:
        """The next n (task, group_id) pairs, drawn with the RNG of (seed, position)."""
        rng = random.Random(f"{self.seed}:{self.position}")
        rates, means = self.kind_rates(), self.estimates()
        weights = [self.weight(rates[kind] if m is None else m) for m, kind in zip(means, self.kinds)]
        free = [i for i, t in enumerate(self.tasks) if t["task_id"] not in avoid]
        out = []
        for _ in range(n):
            if not free:  # fewer tasks than picks: they come round again
                free = list(range(len(self.tasks)))
            i = self._pick(rng, free, [means[j] is None for j in free], [weights[j] for j in free])
            free.remove(i)
            task = self.tasks[i]
            out.append((task, f"{task['task_id']}@{self.position}"))
            self.position += 1
        return out

    def _pick(self, rng: random.Random, free: list[int], unseen: list[bool], weights: list[float]) -> int:
        """One task of `free`: with chance `explore` an unseen one, else with chance `revisit` one outside the band
        (uniformly, each), else one by weight (an unseen task's is its kind's pooled rate's); uniformly when no
        weight is positive."""
        fresh = [i for i, u in zip(free, unseen) if u]
        if fresh and rng.random() < self.spec.explore:
            return fresh[rng.randrange(len(fresh))]
        out = [i for i, w in zip(free, weights) if w <= 0]
        if out and rng.random() < self.spec.revisit:
            return out[rng.randrange(len(out))]
        if sum(weights) <= 0:
            return free[rng.randrange(len(free))]
        return rng.choices(free, weights=weights)[0]

    # ---- learning ------------------------------------------------------------------------------
    def observe(self, groups: list[tuple[str, list[bool]]]) -> dict:
        """A committed step's groups, (task_id, its episodes' successes) with failed episodes left out: the
        estimates move; returns the step's sampler/* scalars (band_share on the estimates before the step)."""
        by_id = {t["task_id"]: i for i, t in enumerate(self.tasks)}
        before = self.estimates()
        groups = [(tid, wins) for tid, wins in groups if wins]
        placed = [before[by_id[tid]] if tid in by_id else None for tid, _ in groups]
        for tid, wins in groups:
            got = self.stats.setdefault(tid, [0, 0])
            got[0] += sum(wins)
            got[1] += len(wins)
        seen = [m for m in self.estimates() if m is not None]
        return {
            "sampler/silent_share": sum(len(set(w)) == 1 for _, w in groups) / max(len(groups), 1),
            "sampler/band_share": sum(m is not None and self.in_band(m) for m in placed) / max(len(placed), 1),
            "sampler/estimate_spread": pstdev(seen) if len(seen) > 1 else 0.0,
            "sampler/seen_frac": len(seen) / len(self.tasks),
        }

    # ---- checkpoint ----------------------------------------------------------------------------
    def state(self) -> dict:
        """What a checkpoint keeps beside the stream position: {"stats": {task_id: [successes, episodes]}}."""
        return {"stats": {tid: list(v) for tid, v in sorted(self.stats.items())}}

    def load_state(self, state: dict) -> None:
        self.stats = {tid: [int(s), int(n)] for tid, (s, n) in state.get("stats", {}).items()}



def make_stream(tasks: list[dict], *, seed: int, spec: SamplerSpec | None) -> TaskStream:
    """The run's task order: the uniform TaskStream (spec None) or a SignalSampler with `spec`."""
    return TaskStream(tasks, seed=seed) if spec is None else SignalSampler(tasks, spec=spec, seed=seed)


def group_outcomes(results) -> list[tuple[str, list[bool]]]:
    """A step's episodes (RolloutResult) as `SignalSampler.observe` takes them: (task_id, its scored episodes'
    successes) per group, failed episodes left out."""
    groups: dict[str, list] = {}
    for r in results:
        groups.setdefault(r.group_id, []).append(r)
    return [(rs[0].task_id, [r.succeeded for r in rs if not r.failed]) for rs in groups.values()]
