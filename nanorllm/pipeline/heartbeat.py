"""Heartbeat: each worker's progress, which the learner reads without a lock.

One shared int64 row per worker: [beats, activity, step, part, task]. The worker bumps `beats`
whenever it makes progress (each model forward pass, each poll for a job or for weights, each look
at a running answer check) and writes what it is doing: generating and grading are told apart,
and while grading, `task` is the index of the task in the job, so a hang report names the task. The learner notes, on its own clock, when each count last moved: a worker whose count
stands still longer than the timeout is hung (SIGSTOP, a deadlock, a stuck device), whatever it
claims to be doing. No clock is shared between processes, and a torn read of a row costs at most a
stale activity in a report. While a --reward function scores a job's episodes the activity names
it ("reward function <spec>").
"""

import time

import torch

ACTIVITIES = ["starting", "waiting for a job", "waiting for weights", "loading weights", "generating",
              "grading", "waiting to hand a result to the learner", "stopping", "capturing decode graphs",
              "reward function"]
REWARD = "reward function"  # "reward function <spec>": the row's task column holds the function's index
BEATS, ACTIVITY, STEP, PART, TASK = range(5)


class Heartbeat:
    """Made by the learner for `n` workers and pickled to them; worker `wid` writes row `wid`."""

    def __init__(self, n: int, env_name: str = "", reward_names: tuple[str, ...] = ()):
        self.env_name = env_name  # named in a report of a worker stuck in the env's reset or step
        self.reward_names = tuple(reward_names)  # the --reward specs, named in a report of one that stands still
        self.board = torch.zeros(n, 5, dtype=torch.int64).share_memory_()
        self._seen: dict[int, tuple[int, float]] = {}  # learner side: wid -> (beats, when they last moved)
        self.__setstate__(self.__getstate__())

    def __getstate__(self) -> dict:
        return {"board": self.board, "_seen": {}, "env_name": self.env_name, "reward_names": self.reward_names}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rows = self.board.numpy()  # a view: writes go straight to shared memory

    # ---- worker side ---------------------------------------------------------------------------
    def beat(self, wid: int) -> None:
        self._rows[wid, BEATS] += 1

    def doing(self, wid: int, activity: str, job_id: str | None = None, task: int = -1) -> None:
        step, part = (int(x) for x in job_id.split(".")) if job_id else (-1, -1)
        if activity.startswith(REWARD + " "):  # the function stands in the task column
            name = activity[len(REWARD) + 1:]
            activity, task = REWARD, self.reward_names.index(name) if name in self.reward_names else -1
        self._rows[wid, STEP], self._rows[wid, PART], self._rows[wid, TASK] = step, part, task
        self._rows[wid, ACTIVITY] = ACTIVITIES.index(activity)
        self.beat(wid)

    # ---- learner side --------------------------------------------------------------------------
    def reset(self, wid: int) -> None:
        """A new process in slot `wid`: its silence counts from now."""
        self._rows[wid] = 0
        self._seen[wid] = (0, time.monotonic())

    def silence(self, wid: int) -> float:
        """Seconds since worker `wid` last made progress, as far as the learner has seen."""
        beats, now = int(self._rows[wid, BEATS]), time.monotonic()
        last, since = self._seen.get(wid, (None, now))
        if beats != last:
            self._seen[wid] = (beats, now)
            return 0.0
        return now - since

    def describe(self, wid: int, task_ids: dict[str, list[str]] | None = None) -> str:
        """What worker `wid` last said it was doing; `task_ids` (job id -> its tasks' ids) names the task."""
        row = [int(x) for x in self._rows[wid]]
        what = ACTIVITIES[row[ACTIVITY]]
        where = f" in the env {self.env_name}" if what == "grading" and self.env_name else ""  # its reset or step
        if what == REWARD:
            if 0 <= row[TASK] < len(self.reward_names):
                what = f"{REWARD} {self.reward_names[row[TASK]]}"
            row[TASK] = -1  # the function scores the whole job, no one task
        if row[STEP] < 0:
            return what + where
        job = f"{row[STEP]}.{row[PART]}"
        ids = (task_ids or {}).get(job, [])
        task = f", task {ids[row[TASK]]}" if 0 <= row[TASK] < len(ids) else ""
        return f"{what} (job {job}{task}){where}"
