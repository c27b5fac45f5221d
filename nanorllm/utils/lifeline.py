"""A child process exits by itself as soon as its parent is gone, however the parent died.

An orphaned worker keeps its device memory (and on GPUs makes the next run's workers fail to
start), so a worker must not depend on the parent's cleanup, which a SIGKILL or the OOM killer
skips. Two mechanisms, because each covers what the other cannot:

- Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills the child the moment the parent
  exits. Immediate, but Linux only.
- a daemon thread that waits for the parent's end: portable, and it works while the main thread
  sits inside a long C call (a generate, a weight copy) where no Python-level check could run. A
  multiprocessing child waits on its parent's sentinel (a pipe the parent holds open), which is the
  caller's even when the child was forked from a fork server (utils/children.py), whose death
  alone the kernel's signal follows; another child checks every `poll_s` that its parent's pid is
  still its parent.

When the workers are gone the multiprocessing resource tracker, the other helper process of a
run, sees end-of-file on its pipe and exits too.
"""

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, *, poll_s: float = 0.5) -> None:
    """Call first thing in a child: from now on it exits as soon as its parent is gone (a multiprocessing
    child at once, another within `poll_s`)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the watch thread still covers it
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive() or parent is None and os.getppid() != parent_pid:
        os._exit(1)  # died before prctl took effect

    def watch() -> None:
        if parent is not None:
            wait([parent.sentinel])  # ready once the parent is gone
        while parent is None and os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
