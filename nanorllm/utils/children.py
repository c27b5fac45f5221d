"""How a run starts its worker and learner-rank processes: forked from a fork server that imported torch,
transformers and the worker's code once.

A spawned process starts a fresh interpreter and imports torch and transformers again: ~4 CPU-seconds
each on a small CPU box, paid again for every worker restart. The `forkserver` start method pays it
once per run: the server, a fresh process that has run no work and holds no CUDA state (importing
torch touches no device; tests/test_children.py checks that PRELOAD calls no torch.cuda function),
imports `PRELOAD`, and every child is a fork of it, as a DataLoader worker is a fork of a process
that imported torch. A child does its own device work, so nothing CUDA crosses a fork.

A child of the server is not a child of the process that started it, and it starts with the
server's environment and standard streams, not the caller's now. `process` carries what spawn gave
it: the caller's environment and its stdout/stderr as they are at the start (a run's log file, a
test's captured output), so a child sees what a spawned one would. Its parent's death still reaches
it: utils/lifeline.py watches the caller, not the server.
"""

import contextlib
import ctypes
import multiprocessing as mp
import os
import sys
import tempfile
from multiprocessing import forkserver, reduction

PR_SET_NAME = 15
PRELOAD = ["nanorllm.pipeline.worker", "nanorllm.run.ranks",  # torch, transformers, the policy, the follower loop
           "nanorllm.utils.server_exit"]
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path holds 108 with its closing NUL)
SOCKET_TAIL = len("/pymp-12345678/listener-12345678")  # where multiprocessing puts the server's socket under TMPDIR


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def socket_folder_problem() -> str | None:
    """Why the server could not listen under this process's temporary folder (TMPDIR), or None."""
    need = len(os.fsencode(tempfile.gettempdir())) + SOCKET_TAIL
    if need > SOCKET_PATH_MAX:
        return (f"TMPDIR: {tempfile.gettempdir()!r} is too long for the fork server of the run's workers and "
                f"learner ranks: its socket path would be {need} bytes, a Unix socket's holds {SOCKET_PATH_MAX}; "
                "set TMPDIR to a shorter folder (e.g. /tmp)")
    return None


def start_server() -> None:
    """Start the fork server now: its imports (seconds) then overlap what the caller does before its first child."""
    _context()
    forkserver.ensure_running()


def process(target, *, args: tuple, name: str) -> mp.Process:
    """A daemon process (not started) that runs target(*args) in the caller's environment and streams."""
    return _context().Process(target=_run, name=name, daemon=True, args=(dict(os.environ), _Streams(), target, args))


def _run(environ: dict, streams: "_Streams", target, args: tuple):
    _name(mp.current_process().name)
    os.environ.clear()
    os.environ.update(environ)
    for fd, dup in ((1, streams.stdout), (2, streams.stderr)):
        os.dup2(dup, fd)
        os.close(dup)
    return target(*args)


def _name(name: str) -> None:
    """The process's name as `ps` and `top` show it (Linux: its first 15 characters)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15])


class _Streams:
    """The caller's fds 1 and 2, sent to the child when it starts (pickled as duplicates it can open)."""

    def __reduce__(self):
        return _received, (reduction.DupFd(1), reduction.DupFd(2))


def _received(stdout, stderr) -> "_Streams":
    streams = _Streams.__new__(_Streams)
    streams.stdout, streams.stderr = stdout.detach(), stderr.detach()
    return streams
