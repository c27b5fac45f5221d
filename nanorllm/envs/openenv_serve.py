"""An OpenEnv `Environment` class served for the run on 127.0.0.1 (`--env openenv:module.path:Class`): OpenEnv's
own FastAPI app (`create_fastapi_app`) under uvicorn, in a daemon thread of the process that plays the episodes.

Each process serves its own (the serial loop's, each pipeline worker, the learner's evaluation), on a port the
OS picks, started the first time that process needs it and stopped when it exits (or by `stop_servers`). Every
episode is one WebSocket session of that server, with an instance of the class of its own: OpenEnv serves more
than one session at a time only for a class that declares `SUPPORTS_CONCURRENT_SESSIONS = True`, and a run plays
many episodes at once, so the adapter refuses a class that does not (envs/openenv.py). A thread, not a process:
the class is the one this process imported (a file path spec too), and the server goes when the process goes.
uvicorn logs only what is critical: OpenEnv's endpoint logs a traceback whenever a client closes its session first
(each episode's end), and an env's own errors reach the episode as an error response, reported by the engine.
"""

import atexit
import socket
import threading
import time

MAX_SESSIONS = 4096  # sessions one server holds at once: more episodes than any call of the engine opens
START_TIMEOUT_S = 60.0


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 at a free port, in a daemon thread; `url` is its address."""

    def __init__(self, app, name: str = "openenv-server"):
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server for {name} did not start on {self.url}")
            time.sleep(0.01)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listening socket and every session (uvicorn's shutdown), then join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


_servers: dict[str, Served] = {}  # this process's servers, by the spec of the class they serve
_lock = threading.Lock()


def serve_environment(key: str, env_cls, action_cls, observation_cls) -> Served:
    """This process's server of `env_cls` (started on the first call for `key`, again if it stopped)."""
    from openenv.core.env_server import create_fastapi_app

    with _lock:
        served = _servers.get(key)
        if served is None or not served.running:
            app = create_fastapi_app(env_cls, action_cls, observation_cls, max_concurrent_envs=MAX_SESSIONS)
            served = _servers[key] = Served(app, name=f"openenv-server {key}")
        return served


def stop_servers() -> None:
    """Stop every server this process started (at exit, or when a test is done with them)."""
    with _lock:
        for served in _servers.values():
            served.stop()
        _servers.clear()


atexit.register(stop_servers)
