"""Google Gemini served over its REST API, as a policy for evaluation only.

The model runs behind `generateContent`: it sees chat messages and returns text, but no token ids
or logprobs. That is enough to play the policy in rollouts and evaluation (e.g. as a baseline next
to the model being trained), but it can never be trained: the config refuses a `gemini:` model for training.

Only the standard library is used for HTTP. The API key travels in the `x-goog-api-key` header and
is scrubbed from every error message.
"""

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException

from nanorllm.policy.base import Generation, Policy, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
SPEC_PREFIX = "gemini:"
MAX_BACKOFF_S = 30.0
_MAX_BODY_CHARS = 500


class GeminiError(RuntimeError):
    """A Gemini request that failed for good; `status` is the last HTTP status, if any."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    """One failed attempt that is worth repeating (429, 5xx, timeout, connection error)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # the HTTP-date form is not worth supporting here
    return max(seconds, 0.0)


def _error_message(body: str) -> str:
    """The API's `error.message` from an error body, else the raw body, truncated."""
    try:
        message = json.loads(body)["error"]["message"]
        if isinstance(message, str) and message:
            return message[:_MAX_BODY_CHARS]
    except (ValueError, KeyError, TypeError):
        pass
    return body[:_MAX_BODY_CHARS]


def build_request_body(messages: list[dict], *, max_output_tokens: int, temperature: float,
                       top_p: float) -> dict:
    """Map chat messages and sampling settings to a `generateContent` request body."""
    system_texts: list[str] = []
    contents: list[dict] = []
    for message in messages:
        role, text = message["role"], message["content"]
        if role == "system":
            system_texts.append(text)
        elif role in ("user", "assistant"):
            contents.append({"role": "user" if role == "user" else "model", "parts": [{"text": text}]})
        else:
            raise ValueError(f"unsupported chat role {role!r}; expected system, user or assistant")
    body: dict = {
        "contents": contents,
        "generationConfig": {"maxOutputTokens": max_output_tokens, "temperature": temperature,
                             "topP": top_p},
    }
    if system_texts:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system_texts)}]}
    return body


def parse_response(data: dict) -> tuple[str, str]:
    """(text, finish_reason) of the first candidate; a response without candidates is an error."""
    candidates = data.get("candidates") or []
    if not candidates:
        feedback = data.get("promptFeedback") or {}
        reason = feedback.get("blockReason")
        if reason:
            raise GeminiError(f"Gemini returned no candidates: prompt blocked ({reason})")
        raise GeminiError("Gemini returned no candidates")
    candidate = candidates[0]
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(part.get("text", "") for part in parts)
    return text, candidate.get("finishReason", "")


class GeminiClient:
    """Blocking client for one Gemini model's `generateContent` endpoint, with retries.

    Rate limits (429), server errors (5xx), timeouts and connection errors are retried with
    exponential backoff; any other 4xx fails at once since repeating it cannot help.
    """

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 4, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep):
        if not model:
            raise ValueError("Gemini model name must not be empty")
        api_key = api_key if api_key is not None else os.environ.get("GEMINI_API_KEY")
        if not api_key:
            raise GeminiError("no Gemini API key: set the GEMINI_API_KEY environment variable "
                              "or pass api_key=")
        self.model = model
        self._api_key = api_key
        self.base_url = (base_url or os.environ.get("GEMINI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"GeminiClient(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1beta/models/{urllib.parse.quote(self.model, safe='')}:generateContent"

    @property
    def headers(self) -> dict[str, str]:
        """A request's headers, the API key among them."""
        return {"Content-Type": "application/json", "x-goog-api-key": self._api_key}

    def generate(self, messages: list[dict], *, max_output_tokens: int, temperature: float,
                 top_p: float) -> tuple[str, str]:
        """Sample one reply to `messages`; returns (text, finish_reason), e.g. finish "MAX_TOKENS"."""
        body = build_request_body(messages, max_output_tokens=max_output_tokens,
                                  temperature=temperature, top_p=top_p)
        payload = json.dumps(body).encode("utf-8")
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            try:
                return parse_response(self._post(payload))
            except _Retryable as err:
                if attempt == attempts - 1:
                    status = f"HTTP {err.status}" if err.status is not None else "no HTTP status"
                    raise GeminiError(
                        f"Gemini request to model {self.model!r} failed after {attempts} attempts; "
                        f"last error ({status}): {self._scrub(str(err))}", status=err.status) from None
                delay = err.retry_after if err.retry_after is not None else self.backoff_s * 2 ** attempt
                delay = min(delay, MAX_BACKOFF_S)
                logger.warning("Gemini request failed (%s); retry %d/%d in %.1fs",
                               self._scrub(str(err)), attempt + 1, self.max_retries, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")

    def _post(self, payload: bytes) -> dict:
        """One HTTP attempt: the decoded JSON reply, `_Retryable`, or a final GeminiError."""
        request = urllib.request.Request(self.url, data=payload, method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            try:
                body = err.read().decode("utf-8", errors="replace")
            except (OSError, HTTPException):
                body = ""
            message = self._scrub(_error_message(body) or str(err.reason))
            if err.code == 429 or err.code >= 500:
                raise _Retryable(message, status=err.code,
                                 retry_after=_parse_retry_after(err.headers.get("Retry-After"))) from None
            raise GeminiError(f"Gemini request to model {self.model!r} failed with HTTP {err.code}: "
                              f"{message}", status=err.code) from None
        except TimeoutError as err:
            raise _Retryable(f"timed out after {self.timeout_s}s ({err})") from None
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise _Retryable(f"timed out after {self.timeout_s}s ({err.reason})") from None
            raise _Retryable(f"connection error: {err.reason}") from None
        except (OSError, HTTPException) as err:
            raise _Retryable(f"connection error: {err!r}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise GeminiError(f"Gemini returned a reply that is not JSON: "
                              f"{self._scrub(raw.decode('utf-8', errors='replace')[:_MAX_BODY_CHARS])}"
                              ) from None

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "<redacted>")


class GeminiPolicy(Policy):
    """A Gemini model as an untrainable policy: text in, text out, several requests in flight."""


    def __init__(self, model: str, *, concurrency: int = 8, client: GeminiClient | None = None,
                 **client_kwargs):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if client is not None and client_kwargs:
            raise TypeError("pass either client= or client keyword arguments, not both")
        self.model = model
        self.concurrency = concurrency
        self.client = client if client is not None else GeminiClient(model, **client_kwargs)

    def generate(self, conversations: list[list[dict]], prompt_ids: list[list[int]],
                 params: SamplingParams) -> list[Generation]:
        """One reply per conversation, in input order; `prompt_ids` are ignored.

        The first failed request raises GeminiError and requests not yet started are dropped.
        """
        if not conversations:
            return []
        temperature = 0.0 if params.greedy else params.temperature

        def one(messages: list[dict]) -> Generation:
            text, finish_reason = self.client.generate(
                messages, max_output_tokens=params.max_new_tokens, temperature=temperature,
                top_p=params.top_p)
            return Generation(text=text, truncated=finish_reason == "MAX_TOKENS")

        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations)),
                                thread_name_prefix="gemini") as pool:
            futures = [pool.submit(one, messages) for messages in conversations]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def is_gemini_spec(name: str) -> bool:
    """True for policy specs of the form "gemini:<model-name>"."""
    return name.startswith(SPEC_PREFIX)


def policy_from_spec(name: str, *, concurrency: int = 8) -> GeminiPolicy:
    """Build a GeminiPolicy from "gemini:<model-name>", e.g. "gemini:gemini-2.5-flash"."""
    if not is_gemini_spec(name):
        raise ValueError(f"not a Gemini policy spec: {name!r}; expected 'gemini:<model-name>'")
    model = name[len(SPEC_PREFIX):].strip()
    if not model:
        raise ValueError(f"Gemini policy spec {name!r} has no model name; expected "
                         f"'gemini:<model-name>', e.g. 'gemini:gemini-2.5-flash'")
    return GeminiPolicy(model, concurrency=concurrency)
