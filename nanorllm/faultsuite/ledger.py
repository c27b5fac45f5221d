"""What a finished or killed run left behind: groups trained, lost or doubled, checkpoints, processes, /dev/shm."""

import json
import time
from collections import Counter
from pathlib import Path

from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP
from nanorllm.faultsuite.proc_scan import processes_with_token, shm_entries, shm_held


def read_rollouts(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "rollouts.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def position(group_id: str) -> int:
    return int(group_id.rsplit("@", 1)[1])


def account(counts: Counter, steps: int) -> tuple[int, int]:
    """(lost, doubled) given episodes per group_id and the number of steps trained."""
    per_position = Counter()
    for gid, n in counts.items():
        per_position[position(gid)] += n
    lost = sum(1 for p in range(steps * TASKS_PER_STEP) if per_position[p] < SAMPLES)
    doubled = sum(1 for n in per_position.values() if n > SAMPLES)
    return lost, doubled


def groups_of(run_dir: Path) -> tuple[int, int, int]:
    """(lost, doubled, last trained step) from rollouts.jsonl."""
    recs = read_rollouts(run_dir)
    steps = max((r["step"] for r in recs), default=0)
    return (*account(Counter(r["group_id"] for r in recs), steps), steps)


def leftovers(token: str, shm_before: set[str], wait_s: float = 60.0) -> tuple[int, int, float]:
    """(processes left, /dev/shm entries left, when the last process was gone: time.monotonic()).

    /dev/shm entries carry no owner, so an entry counts only if it is still there after `wait_s` and no
    live process holds it: another program's short-lived semaphore, or the segments of a run going on
    beside this one (a parallel test), are not this run's leftovers; this run's own processes are gone
    by then, or counted as left. `wait_s` is a net, not a guess at how soon they go: on a loaded machine a run's
    children took more than 10 s to exit after it."""
    t0 = time.monotonic()
    while processes_with_token(token) and time.monotonic() - t0 < wait_s:
        time.sleep(0.05)
    gone = time.monotonic()
    while new_shm(shm_before) and time.monotonic() - t0 < wait_s:
        time.sleep(0.1)
    return len(processes_with_token(token)), len(new_shm(shm_before)), gone


def new_shm(shm_before: set[str]) -> set[str]:
    """/dev/shm entries that were not there before and that no live process holds."""
    return shm_entries() - shm_before - shm_held()
