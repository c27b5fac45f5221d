"""A training run in a subprocess, as a user starts it (`python launch/train.py ...`), watched line by line.

Every process of the run inherits a unique token in its environment (NANORLLM_TEST_TOKEN), so what it
leaves running can be found afterwards (faultsuite/proc_scan.py), and PYTHONPATH names the folder this package
was imported from, so the run executes the same code as the harness that started it.
"""

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nanorllm
from nanorllm.faultsuite.proc_scan import worker_pids

ROOT = Path(nanorllm.__file__).resolve().parent.parent  # the checkout: launch/ lies beside the package
TRAIN_SCRIPT = ROOT / "launch" / "train.py"
TASKS_PER_STEP, SAMPLES = 4, 2
SUITE_ARGS = ["--model", "tiny-random", "--max-new-tokens", "8", "--tasks-per-step", str(TASKS_PER_STEP),
              "--num-samples-per-task", str(SAMPLES), "--eval-limit", "4", "--threads", "1"]
PIPELINE = ["--num-workers", "2", "--rollout-dump-size", "100000"]


def child_env(token: str | None = None, fault: str | None = None) -> dict[str, str]:
    """The environment of a run started here: the token, unbuffered output, this package, the fault if any."""
    env = {**os.environ, "NANORLLM_TEST_TOKEN": token or uuid.uuid4().hex, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("NANORLLM_FAULT", None)
    if fault:
        env["NANORLLM_FAULT"] = fault
    return env


def train_command(args: list[str], out_dir: Path, *, base: list[str] = SUITE_ARGS) -> list[str]:
    """launch/train.py with `base` (the suite's tiny run) and then `args`, its runs under `out_dir`."""
    return [sys.executable, str(TRAIN_SCRIPT), *base, "--output-dir", str(out_dir), *args]


class TrainProcess:
    """launch/train.py in a subprocess; every line it prints is kept with the time it appeared."""

    popen = subprocess.Popen  # a fresh interpreter, as a user starts it; the test suite forks (tests/forked.py)

    def __init__(self, args: list[str], out_dir: Path, *, fault: str | None = None, token: str | None = None,
                 env: dict[str, str] | None = None):
        self.token = token or uuid.uuid4().hex
        self.t0 = time.monotonic()
        self.proc = self.popen(train_command(args, out_dir), env=child_env(self.token, fault) | (env or {}),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def seen(self, needle: str, after: float = 0.0) -> float | None:
        """When a line containing `needle` appeared (at or after `after`), or None."""
        return next((t for t, line in list(self.lines) if t >= after and needle in line), None)

    def wait_for(self, needle: str, timeout: float = 600, after: float = 0.0) -> float:
        """When the line containing `needle` appeared: waits for it or for the run's end, whichever comes
        first; `timeout` is only the net under a run that hangs (a busy machine is slow, not hung)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.seen(needle, after)
            if t is not None:
                return t
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        self.proc.kill()  # a run that never got there is not left running (its children die with it)
        self.wait()
        raise AssertionError(f"{needle!r} not seen; output:\n{self.output()}")

    def output(self) -> str:
        return "".join(line for _, line in list(self.lines))

    def workers(self) -> list[int]:
        return worker_pids(self.proc.pid)

    def rank_pid(self, rank: int) -> int:
        """A learner rank's pid, from the run's "[ranks] ... rank R on <host> <device> pid N" line."""
        line = self.output().split("[ranks] ", 1)[1].splitlines()[0]
        return int(line.split(f"rank {rank} on ", 1)[1].split(" pid ", 1)[1].split()[0].rstrip(","))

    def signal(self, sig: int) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def wait(self, timeout: float = 900) -> int:
        """The exit code; past `timeout` (the net under a hang, not a guess at a run's length) it is killed."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.reader.join(timeout=10)
        return rc
