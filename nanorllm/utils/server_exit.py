"""Imported only by the fork server (utils/children.py PRELOAD): once the run is gone, the server exits
without the interpreter's teardown of torch and transformers (a second on a small CPU box, during which it
still holds the run's output open). Its children inherit the hook but never run it: they exit through
os._exit, and the hook checks it is in the server."""

import atexit
import os

_SERVER = os.getpid()


def _exit_now() -> None:
    if os.getpid() == _SERVER:
        os._exit(0)


atexit.register(_exit_now)
