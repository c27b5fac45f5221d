"""An LLM judge as a reward source: a model behind an API scores each episode's last response by a rubric.

    --judge http://127.0.0.1:8000/v1 --judge-model policy --judge-rubric rubric.md [--judge-mode group]
    --judge gemini:gemini-2.5-flash --judge-rubric rubric.md

The judge is any OpenAI-compatible chat endpoint (the `openai` client, the `agents` extra; an API key from
the environment variable --judge-api-key-env names, none by default) or a Gemini model (policy/gemini.py's
client). `single` mode sends one request per episode; `group` mode one per group (the episodes of one
group_id), RULER's shape, so the judge ranks the responses against each other (rewards/rubric.py has the
request text and the reply formats).

Requests run `concurrency` at a time, each with a timeout; a 5xx, a 429, a timeout or a connection error is
retried with exponential backoff, `retries` times. A score that still could not be had is NaN, the reward
sources' mark of a failed score (never a 0: a judge that is down says nothing about the policy): for an
episode in single mode, for every episode of the group in group mode. A reply that arrives but holds no
usable score (no SCORE line, out of range, wrong count) is NaN at once: the judge runs at temperature 0, so
asking again would most likely get the same reply. Any other 4xx (a wrong model name, a wrong key) is not
retried either. Each failure prints one line, once per kind and process.
"""

import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from nanorllm.algos.groups import group_by_task_id
from nanorllm.core.types import RolloutResult
from nanorllm.rewards.rubric import (Rubric, ScoreError, group_messages, load_rubric, parse_group_scores,
                                     parse_score, single_messages)

GEMINI_PREFIX = "gemini:"
BACKOFF_S = 0.5  # the first retry's wait; doubles each time
MAX_BACKOFF_S = 8.0
PROGRESS_EVERY_S = 1.0  # how often a call waiting on its requests says it is alive (the hang detection hears it)
_reported: set[tuple] = set()


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
    timeout_s: float = 60.0
    max_tokens: int = 512
    weight: float = 1.0
    backoff_s: float = BACKOFF_S


DEFAULT_RUBRIC = Rubric(text="A good response answers the prompt correctly, completely and concisely; a wrong, "
                             "off-topic or empty response gets the lowest score.")


class JudgeUnavailable(Exception):
    """A request that failed for good (after its retries, or at once for a 4xx other than 429)."""


class _Retryable(Exception):
    """One failed attempt worth repeating: a 5xx, 429, timeout or connection error."""


class OpenAIChat:
    """One chat completion at a time per call, from an OpenAI-compatible server; thread-safe."""

    def __init__(self, spec: JudgeSpec):
        import openai  # the `agents` extra: only a run with --judge URL needs it

        self.openai, self.spec = openai, spec
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        self.client = openai.OpenAI(base_url=spec.target, api_key=key or "none", timeout=spec.timeout_s,
                                    max_retries=0)

    def __call__(self, messages: list[dict]) -> str:
        o = self.openai
        try:
            reply = self.client.chat.completions.create(model=self.spec.model, messages=messages, temperature=0.0,
                                                        max_tokens=self.spec.max_tokens)
        except (o.APIConnectionError, o.InternalServerError, o.RateLimitError) as e:  # timeouts are connection errors
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        except o.APIStatusError as e:
            if e.status_code >= 500:
                raise _Retryable(f"HTTP {e.status_code}: {e}") from None
            raise JudgeUnavailable(f"HTTP {e.status_code}: {e}") from None
        except (o.APIError, ValueError) as e:  # a body that is not a chat completion (or not JSON)
            raise ScoreError(f"the reply is not a chat completion ({type(e).__name__}: {e})") from None
        if not getattr(reply, "choices", None):
            raise ScoreError(f"a reply with no choices: {reply!r:.120}")
        return reply.choices[0].message.content or ""


class GeminiChat:
    """The Gemini client (policy/gemini.py), which retries on its own."""

    def __init__(self, spec: JudgeSpec):
        from nanorllm.policy.gemini import GeminiClient

        self.spec = spec
        self.client = GeminiClient(spec.target[len(GEMINI_PREFIX):].strip(), timeout_s=spec.timeout_s,
                                   max_retries=spec.retries, backoff_s=spec.backoff_s)

    def __call__(self, messages: list[dict]) -> str:
        from nanorllm.policy.gemini import GeminiError

        try:
            return self.client.generate(messages, max_output_tokens=self.spec.max_tokens, temperature=0.0,
                                        top_p=1.0)[0]
        except GeminiError as e:
            raise JudgeUnavailable(str(e)) from None


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

    def __init__(self, spec: JudgeSpec, *, chat: Callable[[list[dict]], str] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.spec, self.weight, self.sleep = spec.target, spec.weight, sleep
        self.settings = spec
        self.rubric = load_rubric(spec.rubric) if spec.rubric else DEFAULT_RUBRIC
        self.chat = chat or (GeminiChat(spec) if spec.target.startswith(GEMINI_PREFIX) else OpenAIChat(spec))
        # called at least every PROGRESS_EVERY_S while requests are in flight (RewardSources sets it to the hang
        # detection's watch): each request is bounded by its timeout and retries, so waiting on them is progress,
        # and a judge slower than --worker-timeout-s fails its scores instead of getting its worker killed as hung
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

    def _map(self, fn, items: list) -> list:
        with ThreadPoolExecutor(max_workers=max(1, min(self.settings.concurrency, len(items))),
                                thread_name_prefix="judge") as pool:
            futures = [pool.submit(fn, item) for item in items]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
                self.progress()
            return [f.result() for f in futures]

    def _score_one(self, r: RolloutResult) -> float:
        messages = single_messages(self.rubric, prompt_text(r.trajectory.task), response_text(r))
        return self._ask(messages, lambda reply: parse_score(reply, self.rubric), 1)[0]

    def _score_group(self, group: list[RolloutResult]) -> list[float]:
        messages = group_messages(self.rubric, prompt_text(group[0].trajectory.task), [response_text(r) for r in group])
        return self._ask(messages, lambda reply: parse_group_scores(reply, len(group)), len(group))

    def _ask(self, messages: list[dict], read: Callable[[str], float | list[float]], n: int) -> list[float]:
        """`read` of the judge's reply, as a list of n scores; n NaNs when no usable reply came."""
        for attempt in range(self.settings.retries + 1):
            try:
                got = read(self.chat(messages))
                return got if isinstance(got, list) else [got]
            except _Retryable as e:
                if attempt == self.settings.retries:
                    _report(("down", type(e).__name__), f"[judge] {self.spec}: no reply after "
                            f"{self.settings.retries + 1} attempts ({e}); its scores are failed (NaN)")
                    break
                self.sleep(min(self.settings.backoff_s * 2 ** attempt, MAX_BACKOFF_S))
            except (JudgeUnavailable, ScoreError) as e:
                _report((type(e).__name__, str(e)[:40]), f"[judge] {self.spec}: {e}; that score is failed (NaN)")
                break
        return [math.nan] * n


def _report(key: tuple, line: str) -> None:
    """`line` on stderr, once per key and process."""
    if key not in _reported:
        _reported.add(key)
        print(line + " (printed once)", file=sys.stderr, flush=True)
