"""`python script.py ARGS` started as a fork of a warm interpreter: the harness's way to run a launcher many
times without paying its imports each time.

A launcher in a fresh interpreter spends ~4 CPU-seconds importing torch and transformers before its first
line of work; a test suite that starts a hundred of them spends minutes on that alone. Here one server
process per caller imports `PRELOAD` once, and every run is a fork of it that then does what the
interpreter would do with the command: the caller's environment (os.environ, so every process the run
execs inherits it, and TMPDIR for tempfile), working directory, argv, sys.path[0] and PYTHONPATH's folders
on sys.path, its stdin/stdout/stderr, `-u`, then the script as `__main__`, and at its end the
interpreter's exit (non-daemon threads joined, atexit handlers run, streams flushed; an uncaught exception
printed, exit 1; SystemExit's code; KeyboardInterrupt as death by SIGINT).

What a fork cannot give, so what a test that needs it must get from `subprocess` instead:
- what a module read from the environment at import (the server's import, not the run's); a fresh
  PYTHONHASHSEED or numpy seed; the imports themselves (a test that counts what a launcher imports);
- the run's own /proc/PID/environ and cmdline (the server's; the processes the run starts show the run's);
- a memory peak of its own (the fork starts with the server's pages counted).

`Popen` and `run` take subprocess's arguments for `[sys.executable, ["-u"], script.py | -m module, *args]`.
The run is not the caller's child: its exit code comes from the server, which reaps it.
"""

import atexit
import gc
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

PRELOAD = ["torch", "transformers", "nanorllm.run.lifecycle", "nanorllm.run.sft_program", "nanorllm.run.evaluation",
           "nanorllm.pipeline.worker", "transformers.models.llama.modeling_llama", "tensorboard", "tqdm"]
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
MAX_REQUEST = 1 << 22
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The server's environment: this process's when it first imported this module, not a test's that happens to
# start the server later (what the preloaded modules read at import must not depend on which test came first).
SERVER_ENV = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}


# ---- the caller's side -----------------------------------------------------------------------------------
class _Server:
    """The warm interpreter this process forks runs from, started on first use; it exits when this process
    closes its end of the channel (at exit, however it dies)."""

    def __init__(self):
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a request is one message
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forked", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=DEVNULL, stdout=DEVNULL,
                                     stderr=subprocess.PIPE, env=SERVER_ENV, cwd=PACKAGE_ROOT)
        theirs.close()
        self.lock = threading.Lock()
        ready = self.channel.recv(MAX_REQUEST)
        if ready != b"ready":
            raise RuntimeError(f"the fork server did not start: {self.proc.stderr.read().decode()[-4000:]}")
        self.proc.stderr.close()

    def start(self, request: dict, fds: list[int]) -> socket.socket:
        """Fork a run: returns the socket its pid and then its exit code arrive on."""
        ours, theirs = socket.socketpair()
        with self.lock:
            socket.send_fds(self.channel, [json.dumps(request).encode()], [theirs.fileno(), *fds])
        theirs.close()
        return ours


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


def _request(args: list[str]) -> dict:
    """The part of the command line this runs: the script or module and its argv; anything else is refused."""
    if not args or args[0] != sys.executable:
        raise ValueError(f"forked runs start {sys.executable}, not {args[:1]}")
    rest, unbuffered = list(args[1:]), False
    if rest[:1] == ["-u"]:
        rest, unbuffered = rest[1:], True
    if rest[:1] == ["-m"] and len(rest) > 1:
        return {"module": rest[1], "argv": rest[1:], "unbuffered": unbuffered}
    if rest and rest[0].endswith(".py"):
        return {"script": os.path.abspath(rest[0]), "argv": rest, "unbuffered": unbuffered}
    raise ValueError(f"forked runs take a script.py or -m module (and -u), not {rest[:2]}")


class Popen:
    """subprocess.Popen's interface for a forked run (stdin: None or DEVNULL; stdout/stderr: None, PIPE,
    DEVNULL, STDOUT for stderr, a file object or an fd)."""

    def __init__(self, args, *, stdin=None, stdout=None, stderr=None, env=None, cwd=None, text=None,
                 universal_newlines=None, encoding=None, errors=None, start_new_session=False):
        self.args, self.returncode = args, None
        request = _request(list(map(str, args)))
        request |= {"env": dict(os.environ if env is None else env), "cwd": os.path.abspath(cwd or os.getcwd()),
                    "new_session": bool(start_new_session)}
        if not os.path.isdir(request["cwd"]):
            raise FileNotFoundError(2, "No such file or directory", request["cwd"])  # as subprocess says it
        text = bool(text or universal_newlines or encoding or errors)
        fds, close = self._streams(stdin, stdout, stderr, text, encoding, errors)
        try:
            self._report = _the_server().start(request, fds)
        finally:
            for fd in close:
                os.close(fd)
        self._received = b""
        self.pid = int(self._recv_line())
        self._readers: list[threading.Thread] = []
        self._read: dict[str, list] = {}

    def _streams(self, stdin, stdout, stderr, text, encoding, errors) -> tuple[list[int], list[int]]:
        """The run's fds 0, 1 and 2 as this process holds them, and those of them to close once they are sent;
        sets self.stdout/self.stderr for PIPE."""
        if stdin not in (None, DEVNULL):
            raise ValueError("forked runs take stdin=None or DEVNULL")
        self.stdin, self.stdout, self.stderr = None, None, None
        fds, close = [0], []
        if stdin == DEVNULL:
            fds[0] = os.open(os.devnull, os.O_RDONLY)
            close.append(fds[0])
        for k, want in ((1, stdout), (2, stderr)):
            if k == 2 and want == STDOUT:
                fds.append(fds[1])
            elif want == PIPE:
                r, w = os.pipe()
                fds.append(w)
                close.append(w)
                stream = io.open(r, "r", encoding=encoding, errors=errors) if text else io.open(r, "rb")
                setattr(self, "stdout" if k == 1 else "stderr", stream)
            elif want == DEVNULL:
                fds.append(os.open(os.devnull, os.O_WRONLY))
                close.append(fds[-1])
            else:  # None: this process's own; or a file or fd
                fds.append(k if want is None else want if isinstance(want, int) else want.fileno())
        return fds, close

    def _recv_line(self, timeout: float | None = None) -> str | None:
        """The next line of the run's report (its pid, then its exit code), or None if none came in `timeout`."""
        self._report.settimeout(timeout)
        try:
            while b"\n" not in self._received:
                chunk = self._report.recv(64)
                if not chunk:
                    raise RuntimeError("the fork server closed a run's report without its exit code")
                self._received += chunk
        except (TimeoutError, BlockingIOError):
            return None
        line, self._received = self._received.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._recv_line(timeout=timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line)
            self._report.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # a reaped pid may already be another process's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None):
        if input is not None:
            raise ValueError("forked runs have no stdin to write to")
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._readers:
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    self._read[name] = []
                    thread = threading.Thread(target=lambda s=stream, into=self._read[name]: into.append(s.read()),
                                              daemon=True)
                    thread.start()
                    self._readers.append(thread)
        for thread in self._readers:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                stream.close()
        return tuple(self._read[name][0] if name in self._read else None for name in ("stdout", "stderr"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def run(args, *, capture_output: bool = False, timeout: float | None = None, check: bool = False, **kw):
    """subprocess.run for a forked run."""
    if capture_output:
        kw |= {"stdout": PIPE, "stderr": PIPE}
    proc = Popen(args, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ---- the server's side -----------------------------------------------------------------------------------
def serve(channel: socket.socket) -> None:
    """Import PRELOAD, say ready, then fork a run per request until the caller closes the channel."""
    site_path = [p for p in sys.path[1:] if p != PACKAGE_ROOT]  # what every interpreter starts with
    for name in PRELOAD:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the imports' objects stay shared with every fork, never touched by its collector
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of every exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the caller's runs is theirs to see
    reports: dict[int, socket.socket] = {}
    events = selectors.DefaultSelector()
    events.register(channel, selectors.EVENT_READ)
    events.register(wake_r, selectors.EVENT_READ)
    channel.sendall(b"ready")
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)  # the caller stopped reading the server's stderr; a run's streams are its own
    os.close(quiet)
    while True:
        for key, _ in events.select():
            if key.fileobj is channel:
                msg, fds, _flags, _addr = socket.recv_fds(channel, MAX_REQUEST, 8)
                if not msg:
                    return  # the caller is gone
                report = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    try:
                        ours = [channel.fileno(), wake_r, wake_w, *(s.fileno() for s in reports.values())]
                        _child(json.loads(msg), fds[1:], site_path, keep=report, close=ours)
                    except BaseException:
                        traceback.print_exc()  # on the run's stderr once it has one
                    finally:
                        os._exit(1)  # a fork never returns into this loop, whatever went wrong in it
                for fd in fds[1:]:
                    os.close(fd)
                reports[pid] = report
                report.sendall(f"{pid}\n".encode())
            else:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
        _reap(reports)


def _reap(reports: dict[int, socket.socket]) -> None:
    while reports:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        report = reports.pop(pid, None)
        if report is not None:
            try:
                report.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the caller let go of this run
            report.close()


def _child(request: dict, fds: list[int], site_path: list[str], *, keep: socket.socket, close: list[int]) -> None:
    """In the fork: become `python [-u] script args` and never return."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them
    keep.close()
    for fd in close:
        os.close(fd)
    if request["new_session"]:
        os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read from the run's TMPDIR again, not the server's cached answer
    os.chdir(request["cwd"])
    if request["unbuffered"] or os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    sys.argv = list(request["argv"])
    first = os.path.dirname(request["script"]) if "script" in request else os.getcwd()
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = list(dict.fromkeys([first, *pythonpath, *site_path]))  # as the run's own interpreter would start
    os._exit(_as_main(request))


def _as_main(request: dict) -> int:
    code = 0
    try:
        if "module" in request:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    return _interpreter_exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _interpreter_exit(code: int) -> int:
    """What the interpreter does after the script: joins non-daemon threads, runs atexit handlers, flushes."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # death by a signal, as the interpreter dies of an uncaught KeyboardInterrupt
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
