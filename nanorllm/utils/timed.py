"""A user's function called under a wall-clock limit, abandoned past it.

The call runs on a daemon thread of its own and is waited on for the limit: a function that never
returns cannot stop the caller, and its thread cannot hold up the process's exit. What it raises is
handed to the caller; a SystemExit or KeyboardInterrupt it raises comes as `CallExited`, an Exception,
so the caller's `except Exception` ends only that call (a Ctrl-C of the run itself arrives in the
caller's thread and still stops it). Used for --reward functions (rewards/functions.py); --tools
functions run in a process of their own (envs/tool_host.py).
"""

import threading


class CallTimeout(TimeoutError):
    """The call did not return within its limit; it is left running, abandoned."""


class CallExited(RuntimeError):
    """The function raised SystemExit or KeyboardInterrupt (sys.exit inside a user's function)."""


def call_with_limit(fn, timeout_s: float, name: str, *args, **kwargs):
    """fn(*args, **kwargs)'s value, or what it raised; CallTimeout past `timeout_s` seconds."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (handed to the caller, which decides)
            box["error"] = e

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CallTimeout(f"{name} did not return within {timeout_s:g} s")
    error = box.get("error")
    if error is not None and not isinstance(error, Exception):
        raise CallExited(f"{name} raised {type(error).__name__}({error})") from error
    if error is not None:
        raise error
    return box["value"]
