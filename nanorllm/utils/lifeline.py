"""A child process exits by itself as soon as its parent is gone, however the parent died.

An orphaned worker keeps its device memory (and on GPUs makes the next run's workers fail to
start), so a worker must not depend on the parent's cleanup, which a SIGKILL or the OOM killer
skips. Two mechanisms, because each covers what the other cannot:

- Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills the child the moment the parent
  exits. Immediate, but Linux only.
- a daemon thread that checks every `poll_s` whether the parent's pid is still our parent:
  portable, and it works while the main thread sits inside a long C call (a generate, a weight
  copy) where no Python-level check could run.

When the workers are gone the multiprocessing resource tracker, the other helper process of a
run, sees end-of-file on its pipe and exits too.
"""

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def _parent_gone(parent_pid: int) -> bool:
    return os.getppid() != parent_pid


def die_with_parent(parent_pid: int, *, poll_s: float = 0.5) -> None:
    """Call first thing in a child: from now on it exits within `poll_s` of its parent's death."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the watch thread still covers it
    if _parent_gone(parent_pid):  # died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while not _parent_gone(parent_pid):
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
