"""A process's state in words, for the errors that name a dead or stopped worker or learner rank."""

import signal
from pathlib import Path


def is_stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP, a debugger): it is alive but runs nothing."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def exit_reason(code: int | None) -> str:
    """A process's exit code in words: 'killed by SIGKILL', 'exit code 1'."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
