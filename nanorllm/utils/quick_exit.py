"""How a launcher ends once everything is saved, closed and joined: at once, without the interpreter's teardown.

Tearing down torch and transformers takes seconds on a loaded machine (a stop must fit a container's 10 s
grace), and it would free a lost learner rank's process group, whose threads wait for the interpreter lock
the teardown holds (ranks/group.py). The fork server cleans up after itself (utils/server_exit.py)."""

import os
import sys


def exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
