"""ChatEndpoint: an OpenAI-compatible HTTP endpoint in front of the running decode batch.

An agent written against the `openai` client runs unchanged during training: its requests come
here, and the engine's loop (rollout/agent_runner.py) takes them between decode steps, exactly
where an env's next turn would join. This file only speaks HTTP: it checks the bearer token and
the request's fields, hands a parsed `ChatRequest` to the engine's queue and waits for the reply
the engine hands back. Sampling, prompts and token ids are the runner's.

- aiohttp serves on 127.0.0.1 on a free port, in a thread of its own with its own event loop; the
  agents' coroutines run on that loop too (`submit`). The loop outlives anything its callbacks raise,
  `SystemExit` included (an agent's argparse calls sys.exit): it runs again until `close`.
- Each episode has its own base URL, `http://127.0.0.1:PORT/ep/<episode key>/v1`, so a request says
  which episode it extends; the key is random per episode (`secrets`, 128 bits: no episode can guess
  another's), the bearer token per endpoint, compared in constant time. A request without the token:
  401. One for an episode that is not running (the run stopped, the episode ended or timed out): 503.
- What the OpenAI schema has and this endpoint cannot honour is a 400 naming the field: streaming,
  `n > 1`, sampling settings other than the run's (training samples at the run's temperature: the
  learner scores that distribution), a non-finite number, more messages than `Limits.messages`, and
  any field it does not know; a body over `MAX_BODY_BYTES` is a 413. Every refusal is a JSON body in
  OpenAI's error shape and is counted per episode (`refused`).
- Every request is answered: one still waiting when its episode ends or the rollout stops (however it
  stops, an engine error included) gets a 503 then.
"""

import asyncio
import hmac
import json
import math
import queue
import secrets
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

SUPPORTED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "tools",
             "tool_choice", "logprobs", "top_logprobs", "n", "stream", "parallel_tool_calls", "user"}


MAX_BODY_BYTES = 1 << 20  # a request body larger than this is refused with a 413
TICK_S = 0.05  # the loop counts `ticks` this often while it turns: the hang detection's proof that it runs


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; the token and turn bounds an episode must keep are the runner's."""

    messages: int = 64  # messages in one request


class RequestError(ValueError):
    """A request the endpoint refuses: the HTTP status, the message and the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


@dataclass(eq=False)  # compared and hashed by identity: the endpoint keeps the ones not answered in a set
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


def _number(given: dict, key: str) -> float | None:
    """A sampling setting: None when unset, else a finite int or float (not a bool, not text)."""
    if key not in given:
        return None
    value = given[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"{key}: expected a finite number, got {value!r}", key)
    return float(value)


def parse_request(body, *, episode: str, temperature: float | None, top_p: float,
                  limits: Limits = Limits()) -> ChatRequest:
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
    asked_t, asked_p = _number(given, "temperature"), _number(given, "top_p")
    if temperature is not None and asked_t is not None and abs(asked_t - temperature) > 1e-6:
        raise RequestError(400, f"temperature: training samples at the run's temperature {temperature}; got "
                                f"{given['temperature']} (leave it unset or pass the run's)", "temperature")
    if asked_p is not None and asked_p != top_p:
        raise RequestError(400, f"top_p: the run samples with top_p={top_p}; got {given['top_p']}", "top_p")
    choice = given.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise RequestError(400, f"tool_choice: only 'auto' or 'none' (no constrained decoding), got {choice!r}",
                           "tool_choice")
    tools = given.get("tools") if choice == "auto" else None
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "tools: expected a list of tool definitions", "tools")
    max_tokens = given.get("max_completion_tokens", given.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestError(400, f"max_tokens: expected an integer >= 1, got {max_tokens!r}", "max_tokens")
    stop = given.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop: expected a string or a list of non-empty strings", "stop")
    if isinstance(given.get("messages"), list) and len(given["messages"]) > limits.messages:
        raise RequestError(400, f"messages: at most {limits.messages} messages in one request, got "
                                f"{len(given['messages'])}", "messages")
    return ChatRequest(episode=episode, messages=normalize_messages(given.get("messages")), tools=tools or None,
                       max_tokens=max_tokens, stop=stop, logprobs=bool(given.get("logprobs")),
                       model=str(given.get("model", "")), received_at=time.perf_counter())


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class ChatEndpoint:
    """The HTTP server and the event loop the agents run on; `requests` is the engine's queue.

    The engine calls `open_episodes(keys, ...)` before a rollout and `close_episodes()` after it;
    between, requests to those keys are parsed and queued, any other gets a 503."""

    def __init__(self, *, model_name: str = "policy"):
        from aiohttp import web  # the `agents` extra: only an --agent run needs it

        self.web = web
        self.model_name = model_name
        self.token = secrets.token_urlsafe(24)
        self.requests: queue.Queue = queue.Queue()  # ChatRequest, or ("done", key, outcome) from an agent
        self.live: set[str] = set()
        self.pending: dict[str, set[ChatRequest]] = {}  # per episode key: its requests not answered yet
        self.refused: Counter = Counter()  # per episode key: requests refused with a 4xx
        self.lock = threading.Lock()  # live, pending and refused: the loop's thread and the engine's
        self.temperature: float | None = None
        self.top_p = 1.0
        self.limits = Limits()
        self.loop_errors = 0  # exceptions that reached the event loop itself (an agent's task that exited)
        self.ticks = 0  # counted by the loop while it turns (an async agent that blocks it stops the count)
        self._closing = False
        self.loop = asyncio.new_event_loop()
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
            app = self.web.Application(middlewares=[self._auth], client_max_size=MAX_BODY_BYTES)
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
        self._ticker = self.loop.create_task(self._tick())
        started.set()
        while not self._closing:
            try:
                self.loop.run_forever()
            except BaseException:  # a task's SystemExit / KeyboardInterrupt: that task holds it, the loop goes on
                self.loop_errors += 1
                print(f"[agent] the endpoint's event loop caught (and goes on):\n{traceback.format_exc(limit=-4)}",
                      file=sys.stderr, flush=True)

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(TICK_S)

    @property
    def _auth(self):
        web = self.web
        expected = f"Bearer {self.token}".encode()

        @web.middleware
        async def auth(request, handler):
            if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
                return web.json_response(error_body("missing or wrong bearer token", kind="authentication_error"),
                                         status=401)
            return await handler(request)

        return auth

    async def _models(self, request):
        return self.web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "nanorllm"}]})

    def _refuse(self, key: str, status: int, message: str, param: str | None = None,
                kind: str = "invalid_request_error"):
        with self.lock:
            if key in self.live:
                self.refused[key] += 1
        return self.web.json_response(error_body(message, param, kind), status=status)

    async def _chat(self, request):
        web, key = self.web, request.match_info["episode"]
        if key not in self.live:
            return web.json_response(error_body("no rollout is running for this episode (the run stopped, or "
                                                 "the episode ended)", kind="service_unavailable"), status=503)
        try:
            body = await request.json()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(key, 413, f"the request body is larger than {MAX_BODY_BYTES} bytes",
                                kind="request_too_large")
        except ValueError:
            return self._refuse(key, 400, "the body is not JSON")
        try:
            req = parse_request(body, episode=key, temperature=self.temperature, top_p=self.top_p, limits=self.limits)
        except RequestError as e:
            return self._refuse(key, e.status, str(e), e.param)
        except (TypeError, ValueError, AttributeError) as e:  # a field of the wrong type
            return self._refuse(key, 400, f"malformed request: {type(e).__name__}: {e}")
        done = self.loop.create_future()

        def reply(status: int, out: dict) -> None:  # called from the engine's thread (or this one)
            with self.lock:
                self.pending.get(key, set()).discard(req)
                if 400 <= status < 500 and key in self.live:
                    self.refused[key] += 1
            self.loop.call_soon_threadsafe(lambda: done.done() or done.set_result((status, out)))

        req.reply = reply
        with self.lock:
            if key not in self.live:  # the episode ended while the body was read
                return web.json_response(error_body("this episode ended", kind="service_unavailable"), status=503)
            self.pending.setdefault(key, set()).add(req)
        self.requests.put(req)
        status, out = await done
        return web.json_response(out, status=status)

    # ---- the engine's side ---------------------------------------------------------------------
    def base_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/ep/{key}/v1"

    def open_episodes(self, keys: list[str], *, temperature: float | None, top_p: float,
                      limits: Limits = Limits()) -> None:
        self.temperature, self.top_p, self.limits = temperature, top_p, limits
        with self.lock:
            self.live = set(keys)

    def _unanswered(self, keys) -> list[ChatRequest]:
        with self.lock:
            out = [r for k in keys for r in self.pending.pop(k, ())]
            self.live -= set(keys)
        return out

    def end_episode(self, key: str) -> int:
        """The episode is over: its later requests, and any it still waits on, get a 503. Returns the
        number of its requests refused with a 4xx."""
        for req in self._unanswered([key]):
            req.answer(503, error_body("this episode ended", kind="service_unavailable"))
        with self.lock:
            return self.refused.pop(key, 0)

    def close_episodes(self) -> None:
        """The rollout is over, however it ended: every request not answered yet gets a 503, and so do later ones."""
        for req in self._unanswered(list(self.live | set(self.pending))):
            req.answer(503, error_body("the rollout stopped", kind="service_unavailable"))
        with self.lock:
            self.live, self.pending = set(), {}
            self.refused.clear()
        while True:  # what is queued belongs to this rollout (a late agent's "done" is dropped by the next)
            try:
                self.requests.get_nowait()
            except queue.Empty:
                return

    def submit(self, coro):
        """Run a coroutine on the endpoint's loop; a concurrent.futures.Future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> None:
        self._closing = True
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._ticker.cancel)
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
