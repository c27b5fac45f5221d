"""One event loop a process runs its network clients on, on a daemon thread of its own.

A client call that must end at a deadline (an OpenEnv session's step, an LLM judge's whole request) runs as a
coroutine here: cancelling it at the deadline closes its connection, which a blocking socket read cannot promise,
and the loop's thread is a daemon, so a server that never answers cannot keep the process alive at exit.
"""

import asyncio
import threading

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def client_loop() -> asyncio.AbstractEventLoop:
    """The process's clients' event loop, started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="network-clients", daemon=True).start()
        return _loop
