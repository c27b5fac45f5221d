"""A hang detector for work the learner does itself (held-out evaluation, --serial rollouts), like the
workers' heartbeat.

The work beats `Watchdog.beat(activity, task_id)` on every decode step and every look at a
running answer check. A thread notes when the count last moved; past `timeout_s` of silence it
prints what the work was doing (generating, or grading which task) and raises `Hung` in the main
thread (a signal, so it also ends a blocking call). Code stuck inside one C call never returns
to take it: after `grace_s` more the process exits with code 1, so a hang never lasts forever.
"""

import signal
import sys
import threading
import time

from nanorllm.utils.quick_exit import exit_now


class Hung(BaseException):
    """The watched work made no progress for longer than its limit. A BaseException, so that no
    `except Exception` on the way (an episode's error handler, a parser's) can swallow it."""


class Watchdog:
    def __init__(self, what: str, timeout_s: float, *, grace_s: float = 30.0, poll_s: float = 0.5,
                 env_name: str | None = None):
        self.what, self.timeout_s, self.grace_s, self.poll_s = what, timeout_s, grace_s, poll_s
        self.env_name = env_name  # named in the report when the work stands still inside the env
        self.beats, self.activity, self.task_id = 0, "starting", None
        self.report: str | None = None
        self._done = threading.Event()

    def beat(self, activity: str | None = None, task_id: str | None = None) -> None:
        self.beats += 1
        if activity is not None:
            self.activity, self.task_id = activity, task_id

    def follow(self, engine, tasks: list[dict]) -> None:
        """Beat on every decode step of a RolloutEngine running `tasks` and around each of its env calls,
        naming the task ("grading") or none ("generating")."""
        self.beat("generating")
        engine.on_step = self.beat  # every decode step (replayed CUDA graphs run no forward hooks)
        engine.watch = lambda activity, i: self.beat(activity, tasks[i]["task_id"] if i >= 0 else None)

    def __enter__(self) -> "Watchdog":
        self._armed = threading.current_thread() is threading.main_thread()
        if self._armed:  # signal handlers only exist in the main thread
            self._previous = signal.signal(signal.SIGUSR1, self._raise)
            threading.Thread(target=self._watch, name=f"watchdog:{self.what}", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._armed:
            signal.signal(signal.SIGUSR1, self._previous)

    def _raise(self, *_) -> None:
        raise Hung(self.report)

    def _watch(self) -> None:
        seen, since = self.beats, time.monotonic()
        while not self._done.wait(self.poll_s):
            if self.beats != seen:
                seen, since = self.beats, time.monotonic()
                continue
            silent = time.monotonic() - since
            if silent > self.timeout_s:
                task = f" (task {self.task_id})" if self.task_id is not None else ""
                if self.activity == "grading" and self.env_name:
                    task += f" in the env {self.env_name}"
                self.report = (f"{self.what} hung: no progress for {silent:.1f} s (limit {self.timeout_s:.0f} s) "
                               f"while {self.activity}{task}")
                print(f"[watchdog] {self.report}", file=sys.stderr, flush=True)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                if not self._done.wait(self.grace_s):
                    print(f"[watchdog] the main thread did not return within {self.grace_s:.0f} s (stuck inside "
                          "one call); exiting with code 1", file=sys.stderr, flush=True)
                    exit_now(1)
                return
