"""Imported only by the fork server (utils/children.py PRELOAD): once the run is gone, however it ended (a
SIGKILL included), the server deletes its socket and the socket's folder (/tmp/pymp-*, which multiprocessing
deletes only at its caller's orderly exit: a launcher's os._exit or a kill skips that), then exits without the
interpreter's teardown of torch and transformers (a second on a small CPU box, during which it still holds
the run's output open). Its children inherit the hook but never run it: they exit through os._exit, and the
hook checks it is in the server."""

import atexit
import contextlib
import os
import socket
import stat

_SERVER = os.getpid()


def _listening() -> list[str]:
    """The paths of the multiprocessing sockets this process listens on (the server's, open while it imports
    this; closed again before atexit runs)."""
    paths = []
    for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            if not stat.S_ISSOCK(os.fstat(int(fd)).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # closed since the listing
        with sock:
            if sock.family == socket.AF_UNIX and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                name = sock.getsockname()
                if isinstance(name, str) and os.path.basename(name).startswith("listener-"):
                    paths.append(name)
    return paths


_SOCKETS = _listening()


def _exit_now() -> None:
    if os.getpid() == _SERVER:
        for path in _SOCKETS:
            with contextlib.suppress(OSError):
                os.unlink(path)
                os.rmdir(os.path.dirname(path))  # only if nothing else is in it
        os._exit(0)


atexit.register(_exit_now)
