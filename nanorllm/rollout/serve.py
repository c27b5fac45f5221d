"""A frozen model behind an OpenAI-compatible `/v1/chat/completions`, for serving it as a --judge.

`launch/serve.py --model NAME --port P` runs this. The training endpoint (rollout/endpoint.py) cannot be
reused whole: it serves per-episode URLs under a run's bearer token, and its requests are turns of agent
episodes that the AgentRunner's in-flight loop joins to a training decode batch, with the run's sampling
settings and turn limits. What is shared is the HTTP side's schema: `parse_request` (the same refusals, as
400s naming the field), `error_body`, and the agent runner's `completion_body`, so the `openai` client reads
this server's replies as it reads the training endpoint's.

Requests that arrive together are decoded together: one thread takes every request queued, groups them by
their max_tokens (capped by `max_new_tokens`) and makes one greedy `policy.generate` call per group (a judge
runs at temperature 0; a request's temperature is not honoured: this server always decodes greedily).
`stop` strings cut the text returned. No tools: a request with `tools` is a 400.
"""

import asyncio
import queue
import threading
from collections import defaultdict
from concurrent.futures import Future

from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.agent_runner import completion_body
from nanorllm.rollout.endpoint import MAX_BODY_BYTES, RequestError, error_body, parse_request

MAX_BATCH = 64  # requests decoded in one generate call


class FrozenServer:
    """`policy` served on host:port until `close`; `port` is the one bound (0 asks for a free one)."""

    def __init__(self, policy, *, model_name: str, max_new_tokens: int = 512, host: str = "127.0.0.1",
                 port: int = 0):
        from aiohttp import web  # the `agents` extra

        self.web, self.policy, self.model_name, self.max_new_tokens = web, policy, model_name, max_new_tokens
        self.queue: queue.Queue = queue.Queue()
        self.served = 0
        self.loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, host, port).start())
        self.host, self.port = host, self.runner.addresses[0][1]
        self.threads = [threading.Thread(target=self.loop.run_forever, name="serve-http", daemon=True),
                        threading.Thread(target=self._decode, name="serve-decode", daemon=True)]
        for t in self.threads:
            t.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def _models(self, request):
        return self.web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "nanorllm"}]})

    async def _chat(self, request):
        web = self.web
        try:
            body = await request.json()
            req = parse_request(body, episode="", temperature=None, top_p=1.0)
            if req.tools:
                raise RequestError(400, "tools: a frozen model served as a judge takes no tools", "tools")
        except RequestError as e:
            return web.json_response(error_body(str(e), e.param), status=e.status)
        except (TypeError, ValueError, AttributeError) as e:  # not JSON, or a field of the wrong type
            return web.json_response(error_body(f"malformed request: {type(e).__name__}: {e}"), status=400)
        done: Future = Future()
        self.queue.put((req, done))
        try:
            out = await asyncio.wrap_future(done)
        except Exception as e:  # the model failed on this batch: the client may retry
            return web.json_response(error_body(f"generation failed: {type(e).__name__}: {e}", kind="server_error"),
                                     status=500)
        return web.json_response(out)

    def _decode(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            by_length = defaultdict(list)
            for req, done in batch:
                by_length[min(req.max_tokens or self.max_new_tokens, self.max_new_tokens)].append((req, done))
            for max_tokens, group in by_length.items():
                try:
                    self._answer(group, SamplingParams(max_new_tokens=max_tokens, greedy=True))
                except Exception as e:  # noqa: BLE001  (each request gets a 500, the server goes on)
                    for _, done in group:
                        done.done() or done.set_exception(e)

    def _answer(self, group: list, params: SamplingParams) -> None:
        conversations = [req.messages for req, _ in group]
        prompts = [self.policy.first_prompt_ids(m) for m in conversations]
        for (req, done), prompt, gen in zip(group, prompts, self.policy.generate(conversations, prompts, params)):
            text = gen.text
            for s in req.stop:
                text = text.split(s, 1)[0]
            body = completion_body(req.model or self.model_name, text, [], "length" if gen.truncated else "stop",
                                   len(prompt), gen.response_ids, gen.logprobs, self.policy, req.logprobs)
            self.served += 1  # before the reply wakes its client, which may stop the server at once
            done.set_result(body)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
