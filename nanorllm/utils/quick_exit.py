"""How a launcher ends once everything is saved, closed and joined: at once, without the interpreter's teardown.

Tearing down torch and transformers takes seconds on a loaded machine (a stop must fit a container's 10 s
grace), and it would free a lost learner rank's process group, whose threads wait for the interpreter lock
the teardown holds (ranks/group.py). What the teardown would have done that matters is done here: the
streams flushed and the fork server's socket folder deleted (utils/children.py)."""

import os
import sys

from nanorllm.utils.children import remove_socket_folder


def exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    remove_socket_folder()
    os._exit(code)
