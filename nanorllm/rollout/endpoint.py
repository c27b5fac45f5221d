"""ChatEndpoint: an OpenAI-compatible HTTP endpoint in front of the running decode batch.

An agent written against the `openai` client runs unchanged during training: its requests come
here, and the engine's loop (rollout/agent_runner.py) takes them between decode steps, exactly
where an env's next turn would join. This file only speaks HTTP: it checks the bearer token and
the request's fields, hands a parsed `ChatRequest` to the engine's queue and waits for the reply
the engine hands back. Sampling, prompts and token ids are the runner's.

- aiohttp serves on 127.0.0.1 on a free port, in a thread of its own with its own event loop; the
  agents' coroutines run on that loop too (`submit`), their sync functions in its thread pool.
- Each episode has its own base URL, `http://127.0.0.1:PORT/ep/<episode key>/v1`, so a request says
  which episode it extends; the key is per run (`secrets`), the bearer token per endpoint. A request
  without the token: 401. One for an episode that is not running (the run stopped, the episode
  ended or timed out): 503.
- What the OpenAI schema has and this endpoint cannot honour is a 400 naming the field: streaming,
  `n > 1`, sampling settings other than the run's (training samples at the run's temperature: the
  learner scores that distribution), and any field it does not know.
"""

import asyncio
import json
import queue
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

SUPPORTED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "tools",
             "tool_choice", "logprobs", "top_logprobs", "n", "stream", "parallel_tool_calls", "user"}


class RequestError(ValueError):
    """A request the endpoint refuses: the HTTP status, the message and the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


@dataclass
class ChatRequest:
    """One parsed `POST /v1/chat/completions`, as the engine takes it from the queue."""

    episode: str  # the episode key of the URL it came to
    messages: list[dict]  # normalized: role, content text, and tool_calls / tool_call_id / name when given
    tools: list[dict] | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    model: str = ""
    received_at: float = 0.0  # time.perf_counter() when the server parsed it
    reply: object = None  # set by the endpoint: reply(status, body) answers the HTTP request

    def answer(self, status: int, body: dict) -> None:
        self.reply(status, body)


def _text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(400, f"{where}[{i}]: only text content parts are supported", where)
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise RequestError(400, f"{where}: expected a string or a list of text parts", where)


def normalize_tool_calls(calls) -> list[dict]:
    """[{"id", "type": "function", "function": {"name", "arguments": JSON text}}] from a message's tool_calls."""
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        args = fn.get("arguments", "")
        out.append({"id": c.get("id", ""), "type": "function",
                    "function": {"name": fn.get("name", ""),
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def normalize_messages(messages) -> list[dict]:
    """The chat messages with only the fields a template reads, in one form (content as text), so
    the messages of two requests compare equal when they say the same."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: expected a non-empty list of chat messages", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(400, f"messages[{i}]: expected a message with a role of system, user, assistant "
                                    "or tool", "messages")
        msg = {"role": "system" if m["role"] == "developer" else m["role"],
               "content": _text(m.get("content"), f"messages[{i}].content")}
        if m.get("tool_calls"):
            msg["tool_calls"] = normalize_tool_calls(m["tool_calls"])
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def parse_request(body, *, episode: str, temperature: float | None, top_p: float) -> ChatRequest:
    """A ChatRequest from a request body; RequestError (400, naming the field) for what is not served.
    `temperature`: the run's (None: this rollout samples greedily and decides its own)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    given = {k: v for k, v in body.items() if v is not None}
    for key in given:
        if key not in SUPPORTED:
            raise RequestError(400, f"{key}: not supported by this endpoint", key)
    if given.get("stream"):
        raise RequestError(400, "stream: streaming is not supported; leave stream unset", "stream")
    if given.get("n", 1) != 1:
        raise RequestError(400, f"n: one completion per request (n=1), got {given['n']}", "n")
    if given.get("top_logprobs"):
        raise RequestError(400, "top_logprobs: not supported (logprobs=true gives each sampled token's)",
                           "top_logprobs")
    if temperature is not None and "temperature" in given and abs(float(given["temperature"]) - temperature) > 1e-6:
        raise RequestError(400, f"temperature: training samples at the run's temperature {temperature}; got "
                                f"{given['temperature']} (leave it unset or pass the run's)", "temperature")
    if "top_p" in given and float(given["top_p"]) != top_p:
        raise RequestError(400, f"top_p: the run samples with top_p={top_p}; got {given['top_p']}", "top_p")
    choice = given.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise RequestError(400, f"tool_choice: only 'auto' or 'none' (no constrained decoding), got {choice!r}",
                           "tool_choice")
    tools = given.get("tools") if choice == "auto" else None
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "tools: expected a list of tool definitions", "tools")
    max_tokens = given.get("max_completion_tokens", given.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(400, f"max_tokens: expected an integer >= 1, got {max_tokens!r}", "max_tokens")
    stop = given.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop: expected a string or a list of non-empty strings", "stop")
    return ChatRequest(episode=episode, messages=normalize_messages(given.get("messages")), tools=tools or None,
                       max_tokens=max_tokens, stop=stop, logprobs=bool(given.get("logprobs")),
                       model=str(given.get("model", "")), received_at=time.perf_counter())


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class ChatEndpoint:
    """The HTTP server and the event loop the agents run on; `requests` is the engine's queue.

    The engine calls `open_episodes(keys, sampling)` before a rollout and `close_episodes()` after it;
    between, requests to those keys are parsed and queued, any other gets a 503."""

    def __init__(self, *, model_name: str = "policy", threads: int = 64):
        from aiohttp import web  # the `agents` extra: only an --agent run needs it

        self.web = web
        self.model_name = model_name
        self.token = secrets.token_urlsafe(24)
        self.requests: queue.Queue = queue.Queue()  # ChatRequest, or ("done", key, outcome) from an agent
        self.live: set[str] = set()
        self.temperature: float | None = None
        self.top_p = 1.0
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nanorllm-agent")
        self.loop.set_default_executor(self.executor)
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), name="nanorllm-endpoint", daemon=True)
        self.thread.start()
        started.wait()
        if self.port is None:
            raise RuntimeError(f"the agent endpoint did not start: {self._error}")

    # ---- the server thread ---------------------------------------------------------------------
    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.port, self._error = None, None
        try:
            app = self.web.Application(middlewares=[self._auth])
            app.router.add_post("/ep/{episode}/v1/chat/completions", self._chat)
            app.router.add_get("/ep/{episode}/v1/models", self._models)
            app.router.add_get("/v1/models", self._models)
            self.runner = self.web.AppRunner(app, access_log=None)
            self.loop.run_until_complete(self.runner.setup())
            site = self.web.TCPSite(self.runner, "127.0.0.1", 0)  # loopback only, any free port
            self.loop.run_until_complete(site.start())
            self.port = self.runner.addresses[0][1]
        except Exception as e:  # reported by __init__
            self._error = f"{type(e).__name__}: {e}"
            started.set()
            return
        started.set()
        self.loop.run_forever()

    @property
    def _auth(self):
        web = self.web

        @web.middleware
        async def auth(request, handler):
            if request.headers.get("Authorization", "") != f"Bearer {self.token}":
                return web.json_response(error_body("missing or wrong bearer token", kind="authentication_error"),
                                         status=401)
            return await handler(request)

        return auth

    async def _models(self, request):
        return self.web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "nanorllm"}]})

    async def _chat(self, request):
        web, key = self.web, request.match_info["episode"]
        if key not in self.live:
            return web.json_response(error_body("no rollout is running for this episode (the run stopped, or "
                                                 "the episode ended)", kind="service_unavailable"), status=503)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(error_body("the body is not JSON"), status=400)
        try:
            req = parse_request(body, episode=key, temperature=self.temperature, top_p=self.top_p)
        except RequestError as e:
            return web.json_response(error_body(str(e), e.param), status=e.status)
        except (TypeError, ValueError, AttributeError) as e:  # a field of the wrong type
            return web.json_response(error_body(f"malformed request: {type(e).__name__}: {e}"), status=400)
        done = self.loop.create_future()

        def reply(status: int, out: dict) -> None:  # called from the engine's thread
            self.loop.call_soon_threadsafe(lambda: done.done() or done.set_result((status, out)))

        req.reply = reply
        self.requests.put(req)
        status, out = await done
        return web.json_response(out, status=status)

    # ---- the engine's side ---------------------------------------------------------------------
    def base_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/ep/{key}/v1"

    def open_episodes(self, keys: list[str], *, temperature: float | None, top_p: float) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.live = set(keys)

    def end_episode(self, key: str) -> None:
        self.live.discard(key)

    def close_episodes(self) -> None:
        """The rollout is over: later requests get a 503, and so do any still queued."""
        self.live = set()
        while True:
            try:
                item = self.requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, ChatRequest):
                item.answer(503, error_body("the rollout stopped", kind="service_unavailable"))

    def submit(self, coro):
        """Run a coroutine on the endpoint's loop; a concurrent.futures.Future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        self.executor.shutdown(wait=False, cancel_futures=True)
