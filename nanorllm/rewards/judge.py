"""An LLM judge as a reward source: a model behind an API scores each episode's last response by a rubric.

    --judge http://127.0.0.1:8000/v1 --judge-model policy --judge-rubric rubric.md [--judge-mode group]
    --judge gemini:gemini-2.5-flash --judge-rubric rubric.md

The judge is any OpenAI-compatible chat endpoint (POST .../chat/completions; an API key, sent as a Bearer token,
from the environment variable --judge-api-key-env names, none by default) or a Gemini model (generateContent, in
policy/gemini.py's request and reply shapes). `single` mode sends one request per episode; `group` mode one per
group (the episodes of one group_id), RULER's shape, so the judge ranks the responses against each other
(rewards/rubric.py has the request text and the reply formats: the judge echoes a nonce drawn for each request
with its verdict, so no text of the policy's can set or void a score).

Requests run `concurrency` at a time, as coroutines on the process's network loop (utils/aio.py, httpx). Each
attempt has a whole-request deadline, `timeout_s` from connecting to the reply's last byte: a judge that sends
one byte a second is cut at it (a per-read timeout would wait forever), and the cut closes the connection, so
nothing is left reading after the run. A reply past MAX_REPLY_BYTES is no reply. A judge on this machine (any of
its addresses: 0.0.0.0, localhost, ..., utils/net.py) is reached without the proxy variables (HTTP_PROXY, ...): a
cluster's proxy cannot reach it, and must not read its key.

A 5xx, a 429, a deadline or a connection error is retried with exponential backoff, `retries` times. A score that
still could not be had is NaN, the reward sources' mark of a failed score (never a 0: a judge that is down says
nothing about the policy): for an episode in single mode, for every episode of the group in group mode. A reply
that arrives but holds no usable score (no SCORE line, out of range, wrong count, too large) is NaN at once: the
judge runs at temperature 0, so asking again would most likely get the same reply. Any other 4xx (a wrong model
name, a wrong key) is not retried either. Each failure prints one line, once per kind and process.
"""

import asyncio
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from typing import Literal

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult
from nanorllm.rewards.rubric import (Rubric, RubricError, ScoreError, clip, group_messages, load_rubric, new_nonce,
                                     parse_group_scores, parse_score, single_messages)
from nanorllm.rewards.sources import register_reward_source
from nanorllm.utils.aio import client_loop
from nanorllm.utils.net import is_local

GEMINI_PREFIX = "gemini:"
BACKOFF_S = 0.5  # the first retry's wait; doubles each time
MAX_BACKOFF_S = 8.0
PROGRESS_EVERY_S = 1.0  # how often a call waiting on its requests says it is alive (the hang detection hears it)
STALL_GRACE_S = 1.0  # an attempt this long past its deadline was not ended by it: the call stops saying it is alive
MAX_REPLY_BYTES = 1 << 20  # a reply is a few KB; a larger one is no reply (a flood must not fill the worker)
_reported: set[tuple] = set()


@dataclass
class JudgeSettings:
    """An LLM judge as one more reward source (docs/rewards.md, nanorllm/rewards/judge.py); `launch/eval.py` takes
    the same fields."""

    judge: str | None = None
    """The judge: an OpenAI-compatible base URL (http://host:port/v1; launch/serve.py serves a frozen model as one)
    or gemini:<model> (needs GEMINI_API_KEY). It scores each episode's last response in [0, 1], weighted by
    --judge-weight, like a --reward function; without --env the run is single-turn (--env single)."""
    judge_model: str = "default"
    """The model name an OpenAI-compatible judge is asked for."""
    judge_api_key_env: str | None = None
    """The environment variable holding the judge's API key (None: no key)."""
    judge_rubric: str | None = None
    """A text/markdown rubric file: free text, its first line (or a --- front matter) 'score: LOW-HIGH' (default
    0-10). None: a short built-in rubric (correct, complete, concise)."""
    judge_mode: Literal["single", "group"] = "single"
    """'single': one request per episode, the reply's last 'SCORE[<nonce>]: <number>' line (the request's nonce);
    'group': one request per group, a {"nonce": ..., "scores": [...]} reply in [0, 1], all or none (OpenPipe's
    RULER)."""
    judge_weight: float = 1.0
    """The judge's weight in the reward sources' weighted sum."""
    judge_concurrency: int = 8
    """Judge requests in flight at once (per process)."""
    judge_retries: int = 2
    """Retries of a request that timed out, could not connect or got a 5xx/429, with exponential backoff; after
    them its score is failed (NaN), never 0."""
    judge_timeout_s: float = 60.0
    """Deadline (seconds) of one judge request, from connecting to the reply's last byte (not per read)."""
    judge_max_tokens: int = 512
    """Longest judge reply (it runs at temperature 0)."""


@dataclass(frozen=True)
class JudgeSpec:
    """The judge's settings, as data: they travel to a spawned worker, which builds the same judge."""

    target: str  # an OpenAI-compatible base URL, or gemini:<model>
    rubric: str | None = None  # the rubric file; None: a short built-in rubric (helpful, correct, concise)
    model: str = "default"  # the model name an OpenAI-compatible server is asked for
    api_key_env: str | None = None  # the environment variable holding its API key
    mode: str = "single"  # "single" (one request per episode) or "group" (one per group)
    concurrency: int = 8
    retries: int = 2
    timeout_s: float = 60.0  # each attempt's deadline, from connecting to the reply's last byte
    max_tokens: int = 512
    weight: float = 1.0
    backoff_s: float = BACKOFF_S


def judge_spec(settings: JudgeSettings) -> JudgeSpec | None:
    """The LLM judge the judge_* settings name; None without --judge."""
    if not settings.judge:
        return None
    return JudgeSpec(target=settings.judge, rubric=settings.judge_rubric, model=settings.judge_model,
                     api_key_env=settings.judge_api_key_env, mode=settings.judge_mode,
                     concurrency=settings.judge_concurrency, retries=settings.judge_retries,
                     timeout_s=settings.judge_timeout_s, max_tokens=settings.judge_max_tokens,
                     weight=settings.judge_weight)


DEFAULT_RUBRIC = Rubric(text="A good response answers the prompt correctly, completely and concisely; a wrong, "
                             "off-topic or empty response gets the lowest score.")


class JudgeUnavailable(Exception):
    """A request that failed for good (after its retries, or at once for a 4xx other than 429)."""


class _Retryable(Exception):
    """One failed attempt worth repeating: a 5xx, 429, timeout or connection error."""


class OpenAIChat:
    """The request and reply shapes of an OpenAI-compatible /chat/completions."""

    def __init__(self, spec: JudgeSpec):
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        self.spec, self.url = spec, spec.target.rstrip("/") + "/chat/completions"
        self.headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})

    def body(self, messages: list[dict]) -> dict:
        return {"model": self.spec.model, "messages": messages, "temperature": 0.0, "max_tokens": self.spec.max_tokens}

    def text(self, data: object) -> str:
        try:
            return data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise ScoreError(f"the reply is not a chat completion: {data!r:.120}") from None


class GeminiChat:
    """The request and reply shapes of Gemini's generateContent (policy/gemini.py; its key from GEMINI_API_KEY)."""

    def __init__(self, spec: JudgeSpec):
        from nanorllm.policy.gemini import GeminiClient

        client = GeminiClient(spec.target[len(GEMINI_PREFIX):].strip())
        self.spec, self.url, self.headers = spec, client.url, client.headers

    def body(self, messages: list[dict]) -> dict:
        from nanorllm.policy.gemini import build_request_body

        return build_request_body(messages, max_output_tokens=self.spec.max_tokens, temperature=0.0, top_p=1.0)

    def text(self, data: object) -> str:
        from nanorllm.policy.gemini import GeminiError, parse_response

        try:
            return parse_response(data)[0]
        except (GeminiError, AttributeError) as e:
            raise ScoreError(f"the reply is not a Gemini response: {e}") from None


def prompt_text(task: dict) -> str:
    """An episode's prompt as the judge reads it: the question, or a conversation's messages as `role: text`."""
    question = task.get("question", "")
    if isinstance(question, list):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in question)
    return str(question)


def response_text(result: RolloutResult) -> str:
    steps = result.trajectory.steps
    return steps[-1].model_response if steps else ""


class Judge:
    """A reward source (rewards/functions.py RewardSources): one score in [0, 1] per episode, NaN where it failed."""

    name = "judge"

    def __init__(self, spec: JudgeSpec, *, chat: Callable[[list[dict]], Awaitable[str]] | None = None):
        self.spec, self.weight, self.settings = spec.target, spec.weight, spec
        self.rubric = load_rubric(spec.rubric) if spec.rubric else DEFAULT_RUBRIC
        self.api = GeminiChat(spec) if spec.target.startswith(GEMINI_PREFIX) else OpenAIChat(spec)
        self.chat = chat or self._post  # one attempt: the reply's text
        self.client = None  # the httpx client, made on the network loop by the first request
        self.started: dict[object, float] = {}  # each attempt in flight: when it started
        # called every PROGRESS_EVERY_S while requests are in flight (RewardSources sets it to the hang detection's
        # watch): each attempt ends at its deadline, so waiting on them is progress, and a judge slower than
        # --worker-timeout-s fails its scores instead of getting its worker killed as hung; an attempt its
        # deadline did not end is not, so the beat stops and the hang detection sees it
        self.progress: Callable[[], None] = lambda: None

    def __call__(self, results: list[RolloutResult], env_name: str) -> list[float]:
        if self.settings.mode == "group":
            groups = list(group_by_task_id(results).values())
            at = {id(r): i for i, r in enumerate(results)}
            scored = self._map(self._score_group, groups)
            out = [math.nan] * len(results)
            for group, scores in zip(groups, scored):
                for r, s in zip(group, scores):
                    out[at[id(r)]] = s
            return out
        return self._map(self._score_one, results)

    def missing_columns(self, columns: set[str]) -> list[str]:
        """The judge reads only the question, which every task has (RewardSources.check_tasks asks each source)."""
        return []

    def stalled(self) -> bool:
        """Whether an attempt in flight is past its deadline by STALL_GRACE_S (its deadline did not end it)."""
        oldest = min(tuple(self.started.values()), default=None)
        return oldest is not None and time.monotonic() - oldest > self.settings.timeout_s + STALL_GRACE_S

    def _map(self, fn, items: list) -> list:
        """`fn` of each item, `concurrency` at a time on the network loop, beating `progress` while none stalled."""
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def gated(item):
            async with gate:
                return await fn(item)

        futures = [asyncio.run_coroutine_threadsafe(gated(item), client_loop()) for item in items]
        try:
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
                if not self.stalled():
                    self.progress()
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()  # an interrupted call leaves no request running

    async def _score_one(self, r: RolloutResult) -> float:
        nonce = new_nonce()
        messages = single_messages(self.rubric, prompt_text(r.trajectory.task), response_text(r), nonce)
        return (await self._ask(messages, lambda reply: parse_score(reply, self.rubric, nonce), 1))[0]

    async def _score_group(self, group: list[RolloutResult]) -> list[float]:
        nonce = new_nonce()
        messages = group_messages(self.rubric, prompt_text(group[0].trajectory.task),
                                  [response_text(r) for r in group], nonce)
        return await self._ask(messages, lambda reply: parse_group_scores(reply, len(group), nonce), len(group))

    async def _ask(self, messages: list[dict], read: Callable[[str], float | list[float]], n: int) -> list[float]:
        """`read` of the judge's reply, as a list of n scores; n NaNs when no usable reply came."""
        for attempt in range(self.settings.retries + 1):
            try:
                got = read(await self._attempt(messages))
                return got if isinstance(got, list) else [got]
            except _Retryable as e:
                if attempt == self.settings.retries:
                    _report(("down", type(e).__name__), f"[judge] {self.spec}: no reply after "
                            f"{self.settings.retries + 1} attempts ({e}); its scores are failed (NaN)")
                    break
                await asyncio.sleep(min(self.settings.backoff_s * 2 ** attempt, MAX_BACKOFF_S))
            except (JudgeUnavailable, ScoreError) as e:
                _report((type(e).__name__, str(e)[:40]), f"[judge] {self.spec}: {e}; that score is failed (NaN)")
                break
        return [math.nan] * n

    async def _attempt(self, messages: list[dict]) -> str:
        """One request under the whole-request deadline, cancelled (its connection closed) at it."""
        key = object()
        self.started[key] = time.monotonic()
        try:
            return await asyncio.wait_for(self.chat(messages), self.settings.timeout_s)
        except TimeoutError:
            raise _Retryable(f"no whole reply within --judge-timeout-s {self.settings.timeout_s:g} s") from None
        finally:
            del self.started[key]

    async def _post(self, messages: list[dict]) -> str:
        """The reply's text; _Retryable, JudgeUnavailable or ScoreError."""
        import httpx  # the `agents` extra: only a run with --judge needs it

        if self.client is None:  # no proxy for a judge on this machine: it could not reach it, and would read the key
            self.client = httpx.AsyncClient(timeout=None, trust_env=not is_local(self.api.url))
        try:
            async with self.client.stream("POST", self.api.url, json=self.api.body(messages),
                                          headers=self.api.headers) as reply:
                data = await _read_capped(reply)
        except httpx.TransportError as e:  # refused, reset, a broken reply
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        if reply.status_code == 429 or reply.status_code >= 500:
            raise _Retryable(f"HTTP {reply.status_code}: {_text(data)}")
        if reply.status_code >= 400:
            raise JudgeUnavailable(f"HTTP {reply.status_code}: {_text(data)}")
        try:
            parsed = json.loads(data)
        except ValueError:
            raise ScoreError(f"the reply is not JSON: {_text(data)}") from None
        return self.api.text(parsed)


async def _read_capped(reply) -> bytes:
    """The body of an httpx streamed reply; ScoreError once it passes MAX_REPLY_BYTES."""
    data = bytearray()
    async for chunk in reply.aiter_bytes():
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise ScoreError(f"a reply of more than {MAX_REPLY_BYTES} bytes (MAX_REPLY_BYTES)")
    return bytes(data)


def judge_world_problems(spec: JudgeSpec) -> list[str]:
    """The --judge's rubric file reads and parses, its client is installed and the API key it names is set."""
    p = []
    if spec.rubric is not None:
        try:
            load_rubric(spec.rubric)
        except RubricError as e:
            p.append(f"judge_rubric: {e}")
    if spec.target.startswith(GEMINI_PREFIX) and not os.environ.get("GEMINI_API_KEY"):
        p.append("judge: a gemini: judge needs the GEMINI_API_KEY environment variable")
    if importlib.util.find_spec("httpx") is None:
        p.append("judge: the judge's client needs httpx (pip install -e .[agents])")
    if spec.api_key_env and not os.environ.get(spec.api_key_env):
        p.append(f"judge_api_key_env: the environment variable {spec.api_key_env} is not set")
    return p


register_reward_source("judge", JudgeSpec, lambda spec: [Judge(spec)], judge_world_problems,
                       names=lambda spec: [spec.target], settings=JudgeSettings, from_settings=judge_spec)


def _text(data: bytes) -> str:
    return clip(data[:400].decode("utf-8", "replace"))


def _report(key: tuple, line: str) -> None:
    """`line` on stderr, once per key and process."""
    if key not in _reported:
        _reported.add(key)
        print(line + " (printed once)", file=sys.stderr, flush=True)
