"""One owner per run folder: an exclusive `flock` on `<run>/.lock`, held for the run's lifetime.

Two processes on one folder (a `--resume` while the original still runs) would write the same
rollouts.jsonl.tmp, delete each other's checkpoints and interleave their event files. The kernel
drops the lock when its holder exits however it dies (SIGKILL included), so a stale lock never
blocks a resume. The file holds the owner's pid, to name it to the process that is refused.
"""

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class RunFolderInUse(FileExistsError):
    """Another live process owns the run folder."""


class RunLock:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock at once or raise RunFolderInUse naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderInUse(f"{self.path.parent} is in use by another run (pid {holder}); stop it first, "
                                 "or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None
