"""--tools functions run in a helper process of their own, where a timeout can end them.

A thread cannot be stopped: a tool stuck in a loop keeps its thread, and its share of the CPU, for the rest of
the run (abandoned threads pile up step after step), and a tool that holds the GIL (a long C call) freezes every
thread of the process, the hang detection's included, however short its timeout. So the tools run in a child
process that speaks JSON lines, one call at a time, as the grader's math-verify helper does (envs/symbolic.py):
past the call's limit the child is killed (SIGKILL) and the next call starts a fresh one.

What a tool raises, SystemExit and KeyboardInterrupt included, comes back as its error text; a child that dies
(os._exit, out of memory) is an error result too, and is replaced. A tool's prints go to the run's stderr, never
into the protocol. A result's text comes back cut at `MAX_RESULT_CHARS` characters (the --agent endpoint's body
cap): a tool that returns 10 MB sends back what no row could hold anyway; the row's own bound is the engine's
(rollout/engine.py). One child per spec and process (a rollout worker, the serial trainer), started on the first
call, dying with its parent.

Run as a module (`python -m nanorllm.envs.tool_host PARENT_PID SPEC`), this file is the child: it imports only
the tools' file.
"""

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Callable

from nanorllm.utils.modules import EnvSpecError, _import_module, import_spec
from nanorllm.envs.symbolic import serve_parent, stop_helper
from nanorllm.utils.procs import exit_reason

MAX_RESULT_CHARS = 1 << 20  # as rollout/endpoint.py's MAX_BODY_BYTES: more than any row holds
START_TIMEOUT_S = 120.0  # importing a tools file that imports a large library, on a loaded machine
BEAT_S = 0.05  # how often a wait says it is alive (`progress`)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the child imports this package


def tool_functions(spec: str) -> list:
    """The functions a --tools spec names, in order: where:fn1,fn2, or where alone (its TOOLS list: functions or
    their names). EnvSpecError naming the spec and the missing name when one is not there."""
    if ":" in spec:
        module, where, names = import_spec(spec, "path/to/tools.py:fn1,fn2 or module.path:fn1,fn2")
        names = [n.strip() for n in names.split(",")]
    else:
        try:
            module = _import_module(spec, spec)
        except EnvSpecError:
            raise
        except Exception as e:
            raise EnvSpecError(f"{spec!r}: cannot import it: {type(e).__name__}: {e}") from e
        where, names = spec, getattr(module, "TOOLS", None)
        if not isinstance(names, (list, tuple)) or not names:
            raise EnvSpecError(f"{spec!r}: it has no TOOLS list of functions; name them (path/to/tools.py:fn1,fn2)")
    fns = []
    for name in names:
        fn = getattr(module, name, None) if isinstance(name, str) else name
        if not name or fn is None:
            raise EnvSpecError(f"{spec!r}: {where!r} has no function {name!r}")
        fns.append(fn)
    return fns


def result_text(value) -> str:
    """A tool's return value as the text of its `tool` message: text as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def run_call(fns: dict[str, Callable], name: str, arguments: dict) -> tuple[str, bool]:
    """(the result's text, whether the tool returned) of one call, in this process; what the tool raised,
    BaseException included (sys.exit, KeyboardInterrupt), is its error text."""
    try:
        return result_text(fns[name](**arguments)), True
    except BaseException as e:  # noqa: BLE001  (the user's code ends only its call)
        return f"Error: {name} raised {type(e).__name__}: {e}", False


class ToolHost:
    """The child process running one --tools spec's functions; `call` waits at most its limit."""

    def __init__(self, spec: str):
        self.spec = spec
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one call at a time: two engines of a process may share the helper

    def call(self, name: str, arguments: dict, timeout_s: float,
             progress: Callable[[], None] = lambda: None) -> tuple[str, bool]:
        """(the result's text, whether the tool returned); an error text when it raised, ran past `timeout_s`
        (the child is killed) or ended its process. `progress()` is called while it runs."""
        with self._lock:
            return self._call(name, arguments, timeout_s, progress)

    def _call(self, name: str, arguments: dict, timeout_s: float, progress) -> tuple[str, bool]:
        try:
            proc = self._child(progress)
        except RuntimeError as e:
            return f"Error: the tool {name} could not run: {e}", False
        try:
            proc.stdin.write(json.dumps({"name": name, "arguments": arguments}) + "\n")
            proc.stdin.flush()
            line = self._line(proc, timeout_s, progress)
        except BrokenPipeError:  # the helper died between calls (killed from outside)
            line = ""
        if line is None:
            self.close()
            return f"Error: the tool {name} did not return within {timeout_s:g} s", False
        if not line:
            code = proc.wait()
            self.close()
            return f"Error: the tool {name} ended its process ({exit_reason(code)})", False
        reply = json.loads(line)
        return reply["text"], reply["ok"]

    def _line(self, proc: subprocess.Popen, timeout_s: float, progress) -> str | None:
        """The child's next line ('' when it died), or None past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if select.select([proc.stdout], [], [], min(BEAT_S, left))[0]:
                return proc.stdout.readline()
            progress()

    def _child(self, progress) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._proc = subprocess.Popen([sys.executable, "-m", "nanorllm.envs.tool_host", str(os.getpid()), self.spec],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                                              ROOT, os.environ.get("PYTHONPATH"))))})
            line = self._line(self._proc, START_TIMEOUT_S, progress)
            if line is None or line.strip() != "ready":
                self.close()
                why = f"no answer in {START_TIMEOUT_S:.0f} s" if line is None else "it exited: see the [tools] line"
                raise RuntimeError(f"the tools helper process for {self.spec} did not start ({why})")
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            stop_helper(self._proc)
            self._proc = None


_HOSTS: dict[str, ToolHost] = {}


def host(spec: str) -> ToolHost:
    """This process's helper for `spec` (one per spec and process)."""
    if spec not in _HOSTS:
        _HOSTS[spec] = ToolHost(spec)
    return _HOSTS[spec]


def _serve(parent_pid: int, spec: str) -> None:
    """The child: one JSON {"name", "arguments"} a line in, one JSON {"text", "ok"} a line out."""
    serve_parent(parent_pid)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a tool's prints go to the run's stderr, not into the replies
    sys.stdout = sys.stderr
    try:
        fns = {getattr(fn, "__name__", ""): fn for fn in tool_functions(spec)}
    except BaseException as e:  # noqa: BLE001  (the run refused the file at start; say why and stop)
        print(f"[tools] {spec}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    replies.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        text, ok = run_call(fns, request["name"], request["arguments"])
        replies.write(json.dumps({"text": text[:MAX_RESULT_CHARS], "ok": ok}) + "\n")


if __name__ == "__main__":
    sys.set_int_max_str_digits(0)  # a tool that returns a long integer: the result's cut bounds it
    _serve(int(sys.argv[1]), sys.argv[2])
