"""A model behind an OpenAI-compatible `/chat/completions` (vLLM, SGLang, `launch/serve.py`, a hosted API), as a
policy that plays and is never trained: a game's `--opponent http://host:port/v1` (rollout/games.py).

It sees chat messages and returns text, no token ids or logprobs (an API policy, policy/base.py). The model name is
the URL's fragment (`http://host:8000/v1#Qwen2.5-7B-Instruct`), else the first the server lists at `/models`. A key
in OPENAI_API_KEY is sent as the bearer token. A request to this machine bypasses the proxy variables
(utils/net.py). One call's conversations are requested at once, a thread each (at most `MAX_CONCURRENT`); a request
that fails (after one retry) raises `EndpointError` naming the URL, which ends that call's games as env errors.
Only the standard library is used for HTTP.
"""

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from nanorllm.policy.base import Generation, Policy, SamplingParams
from nanorllm.utils.net import is_local

URL_PREFIXES = ("http://", "https://")
MAX_CONCURRENT = 32
TIMEOUT_S = 120.0


class EndpointError(RuntimeError):
    """A request to the endpoint failed for good."""


def is_endpoint(spec: str) -> bool:
    return spec.startswith(URL_PREFIXES)


class ChatEndpointPolicy(Policy):
    def __init__(self, spec: str, *, timeout_s: float = TIMEOUT_S):
        self.base, _, self.model = spec.partition("#")
        self.base = self.base.rstrip("/")
        self.timeout_s = timeout_s
        handlers = [urllib.request.ProxyHandler({})] if is_local(self.base) else []
        self.opener = urllib.request.build_opener(*handlers)
        if not self.model:
            self.model = self._request("/models", None)["data"][0]["id"]

    def generate(self, conversations: list[list[dict]], prompt_ids: list[list[int]],
                 params: SamplingParams) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_CONCURRENT, len(conversations)))) as pool:
            return list(pool.map(lambda messages: self._complete(messages, params), conversations))

    def _complete(self, messages: list[dict], params: SamplingParams) -> Generation:
        body = {"model": self.model, "messages": messages, "max_tokens": params.max_new_tokens,
                "temperature": 0.0 if params.greedy else params.temperature}
        choice = self._request("/chat/completions", body)["choices"][0]
        return Generation(text=choice["message"].get("content") or "", truncated=choice.get("finish_reason") == "length")

    def _request(self, path: str, body: dict | None) -> dict:
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        data = None if body is None else json.dumps(body).encode()
        error = None
        for _ in range(2):
            request = urllib.request.Request(self.base + path, data=data, headers=headers)
            try:
                with self.opener.open(request, timeout=self.timeout_s) as reply:
                    return json.loads(reply.read())
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                error = e
        raise EndpointError(f"{self.base}{path}: {type(error).__name__}: {error}")
