"""The plan-against-the-run bench (nanorllm/bench/memory.py) finds the processes it measures."""

import subprocess
import time

from nanorllm.bench.memory import descendants, vm_hwm


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


def test_descendants_reach_a_grandchild_as_the_workers_under_their_fork_server_are():
    # a launcher (sh) whose child (sh) starts the grandchild (sleep), as the workers' fork server starts the workers
    launcher = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30; :' & wait"])
    try:
        deadline = time.monotonic() + 20
        while len(found := descendants(launcher.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(found) == 2
        child, grandchild = sorted(found, key=lambda pid: parent_of(pid) != launcher.pid)
        assert parent_of(child) == launcher.pid and parent_of(grandchild) == child
        assert descendants(grandchild) == [] and vm_hwm(grandchild) > 0
    finally:
        for pid in descendants(launcher.pid):
            subprocess.run(["kill", str(pid)], check=False)
        launcher.kill()
        launcher.wait()
