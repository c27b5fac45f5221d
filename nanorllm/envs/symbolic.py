"""Symbolic answer checks (math-verify) in a helper process that is killed at a hard CPU budget.

A time limit inside the grading process cannot be trusted: math-verify catches `Exception` (so a
timeout raised as one is swallowed), and sympy evaluates `9^{9^{9^9}}` inside one C call that no
Python signal handler interrupts. So the check runs in a child process that speaks JSON lines on
stdin/stdout; the parent watches the child's *CPU time* (a busy machine slows the clock, not the
budget) and SIGKILLs it past the budget, or past a wall-clock backstop of 10x the budget on a
machine so loaded the child gets almost no CPU. The next check starts a fresh child.

The child starts on the first symbolic check (numeric golds never need one) and dies with its
parent. Verdicts are cached per (answer, gold, budget): a policy repeats itself, and a gold that
times out once would time out again.

Run as a script, this file is the child (it imports only math-verify). The two ends of such a helper
(`stop_helper`, `serve_parent`) are shared with the --tools helper (envs/tool_host.py).
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Callable

WALL_BACKSTOP = 10.0  # x the CPU budget
START_TIMEOUT_S = 120.0  # importing sympy on a loaded machine
CACHE_SIZE = 4096


class SymbolicChecker:
    """One helper child per process, started lazily, replaced after a kill."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, tuple[bool, bool]] = OrderedDict()

    def check(self, predicted: str, gold: str, cpu_limit_s: float,
              progress: Callable[[], None] | None = None) -> tuple[bool, bool]:
        """(equal, timed out); `progress()` is called every 50 ms while the child works."""
        key = (predicted, gold, cpu_limit_s)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            verdict = self._ask(predicted, gold, cpu_limit_s, progress or (lambda: None))
            self._cache[key] = verdict
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return verdict

    def _ask(self, predicted: str, gold: str, cpu_limit_s: float, progress) -> tuple[bool, bool]:
        proc = self._child()
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        proc.stdin.write(json.dumps([predicted, gold]) + "\n")
        proc.stdin.flush()
        while True:
            if select.select([proc.stdout], [], [], 0.05)[0]:
                line = proc.stdout.readline()
                if not line:  # the child died by itself (out of memory, a crash): not shown equal
                    self.close()
                    return False, False
                return bool(json.loads(line)), False
            progress()
            used = _cpu_s(proc.pid)
            wall = time.monotonic() - t0
            if (used is not None and cpu0 is not None and used - cpu0 > cpu_limit_s) \
                    or wall > WALL_BACKSTOP * cpu_limit_s:
                self.close()
                return False, True

    def _child(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(os.getpid())], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, bufsize=1)
            ready, _, _ = select.select([self._proc.stdout], [], [], START_TIMEOUT_S)
            if not ready or self._proc.stdout.readline().strip() != "ready":
                self.close()
                raise RuntimeError(f"the symbolic grader helper did not start within {START_TIMEOUT_S:.0f} s")
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            stop_helper(self._proc)
            self._proc = None


def stop_helper(proc: subprocess.Popen) -> None:
    """SIGKILL a helper child (if it still runs), reap it and close its pipes (this one, envs/tool_host.py's)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


def serve_parent(parent_pid: int) -> None:
    """In a helper child: die with `parent_pid` (Linux), exit now if it is gone already, leave Ctrl-C to it."""
    import ctypes
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the process that started it
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` (Linux /proc); None elsewhere (the wall backstop then rules)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


CHECKER = SymbolicChecker()


def _serve(parent_pid: int) -> None:
    """The child: one JSON [predicted, gold] a line in, one JSON bool a line out."""
    serve_parent(parent_pid)  # dies with the grading process
    import logging
    logging.disable(logging.WARNING)  # math-verify warns that it runs without its own timeout: we are it
    from math_verify import parse, verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    extraction = [LatexExtractionConfig(), ExprExtractionConfig()]
    print("ready", flush=True)
    for line in sys.stdin:
        predicted, gold = json.loads(line)
        try:
            g = parse(f"${gold}$", extraction_config=extraction, parsing_timeout=None)
            p = parse(f"${predicted}$", extraction_config=extraction, parsing_timeout=None)
            equal = bool(g and p and verify(g, p, timeout_seconds=None))
        except Exception:  # a parser failure means "not shown to be equal"
            equal = False
        print(json.dumps(equal), flush=True)


if __name__ == "__main__":
    sys.set_int_max_str_digits(0)  # a long integer gold is data; the budget bounds the work
    _serve(int(sys.argv[1]))
