"""TaskStream: the order in which training tasks are handed out, as a resumable position.

Epoch e is the task list shuffled with seed (seed, e); position p is the p-th task drawn overall.
Every draw gets a unique group_id `<task_id>@<p>`, so the same task drawn twice (a later epoch) forms
two groups, and a checkpoint only needs `position` to continue without repeating a task. `origin` is
the position where this task list's epoch 0 began (not 0 after a resume accepted a new task list),
so positions, and group ids, stay unique across the change. `--task-sampler signal` draws from a
subclass, datasets/sampler.py's SignalSampler, with the same positions and group ids.
"""

import random


class TaskStream:
    def __init__(self, tasks: list[dict], *, seed: int = 0, position: int = 0, origin: int = 0):
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks = tasks
        self.seed = seed
        self.position = position
        self.origin = origin
        self._epoch, self._order = -1, []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, n: int, *, avoid: frozenset[str] | set[str] = frozenset()) -> list[tuple[dict, str]]:
        """The next n (task, group_id) pairs. `avoid` (task ids a step has already) is the signal sampler's: the
        uniform order keeps its order."""
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position - self.origin, len(self.tasks))
            task = self.tasks[self._order_for(epoch)[i]]
            out.append((task, f"{task['task_id']}@{self.position}"))
            self.position += 1
        return out

    def state(self) -> dict:
        """What a checkpoint keeps of the order beside its position: nothing (the signal sampler: its estimates)."""
        return {}

    def load_state(self, state: dict) -> None:
        pass
