"""GeminiClient and GeminiPolicy against a local stub of the `generateContent` endpoint."""

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nanorllm.faultsuite.in_flight import InFlight
from nanorllm.policy.gemini import (GeminiClient, GeminiError, GeminiPolicy, is_gemini_spec,
                                 policy_from_spec)
from nanorllm.policy.base import SamplingParams
from tests.helpers import wait_until

API_KEY = "test-key-5ecr3t-do-not-leak"
MODEL = "gemini-test-model"


def ok_reply(text: str, finish_reason: str = "STOP") -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                            "finishReason": finish_reason}]}


class StubGemini:
    """Scriptable fake endpoint that records every request and how many were in flight at once (`flight`, exact;
    a test that sets its `hold_until` n sees n requests open together before any is answered).

    `handler(request) -> (status, body, headers, delay_s)` decides each reply; `body` is a dict
    (sent as JSON) or a str.
    """

    def __init__(self):
        self.requests: list[dict] = []
        self.handler: Callable[[dict], tuple] = lambda request: (200, ok_reply("ok"), {}, 0.0)
        self.flight = InFlight()
        self.lock = threading.Lock()
        self.release = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                request = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": json.loads(raw)}
                with stub.lock:
                    stub.requests.append(request)
                stub.flight.enter()
                try:
                    stub.flight.hold()
                    status, body, headers, delay = stub.handler(request)
                    if delay:
                        stub.release.wait(delay)
                finally:
                    stub.flight.leave()
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (timeout tests)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    server = StubGemini()
    yield server
    server.close()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(stub, sleeps) -> GeminiClient:
    return GeminiClient(MODEL, api_key=API_KEY, base_url=stub.url, timeout_s=5.0, max_retries=3,
                        backoff_s=0.5, sleep=sleeps.append)


def test_normal_call_maps_request_and_reply(stub, client):
    stub.handler = lambda request: (200, {"candidates": [{
        "content": {"role": "model", "parts": [{"text": "The answer "}, {"text": "is 4."}]},
        "finishReason": "STOP"}]}, {}, 0.0)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Let me think."},
        {"role": "user", "content": "Go on."},
    ]
    text, finish = client.generate(messages, max_output_tokens=77, temperature=0.7, top_p=0.9)

    assert (text, finish) == ("The answer is 4.", "STOP")
    assert len(stub.requests) == 1
    request = stub.requests[0]
    assert request["path"] == f"/v1beta/models/{MODEL}:generateContent"
    assert API_KEY not in request["path"]
    assert request["headers"]["x-goog-api-key"] == API_KEY
    body = request["body"]
    assert body["systemInstruction"] == {"parts": [{"text": "You are terse.\n\nAnswer in one line."}]}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "What is 2+2?"}]},
        {"role": "model", "parts": [{"text": "Let me think."}]},
        {"role": "user", "parts": [{"text": "Go on."}]},
    ]
    assert body["generationConfig"] == {"maxOutputTokens": 77, "temperature": 0.7, "topP": 0.9}


def test_base_url_from_environment(stub, monkeypatch):
    monkeypatch.setenv("GEMINI_BASE_URL", stub.url)
    monkeypatch.setenv("GEMINI_API_KEY", API_KEY)
    text, _ = GeminiClient(MODEL).generate([{"role": "user", "content": "hi"}], max_output_tokens=8,
                                           temperature=1.0, top_p=1.0)
    assert text == "ok"
    assert stub.requests[0]["headers"]["x-goog-api-key"] == API_KEY
    assert "systemInstruction" not in stub.requests[0]["body"]


def test_429_is_retried_honouring_retry_after(stub, client, sleeps):
    replies = iter([(429, {"error": {"code": 429, "message": "slow down"}}, {"Retry-After": "2"}, 0.0),
                    (200, ok_reply("done"), {}, 0.0)])
    stub.handler = lambda request: next(replies)
    text, finish = client.generate([{"role": "user", "content": "x"}], max_output_tokens=8,
                                   temperature=1.0, top_p=1.0)
    assert (text, finish) == ("done", "STOP")
    assert len(stub.requests) == 2
    assert sleeps == [2.0]


def test_500_past_max_retries_fails_after_all_attempts(stub, client, sleeps):
    stub.handler = lambda request: (500, {"error": {"code": 500, "message": "backend exploded"}}, {}, 0.0)
    with pytest.raises(GeminiError) as info:
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert len(stub.requests) == client.max_retries + 1 == 4
    assert sleeps == [0.5, 1.0, 2.0]
    assert info.value.status == 500
    assert "4 attempts" in str(info.value) and "backend exploded" in str(info.value)


def test_backoff_is_capped(stub, sleeps):
    client = GeminiClient(MODEL, api_key=API_KEY, base_url=stub.url, max_retries=2, backoff_s=20.0,
                          sleep=sleeps.append)
    stub.handler = lambda request: (503, "unavailable", {"Retry-After": "120"}, 0.0)
    with pytest.raises(GeminiError):
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert sleeps == [30.0, 30.0]


def test_400_fails_at_once_without_leaking_key(stub, client, sleeps):
    stub.handler = lambda request: (400, {"error": {
        "code": 400, "message": f"API key not valid. Please pass a valid API key. ({API_KEY})",
        "status": "INVALID_ARGUMENT"}}, {}, 0.0)
    with pytest.raises(GeminiError) as info:
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    message = str(info.value)
    assert info.value.status == 400
    assert "400" in message and "API key not valid" in message
    assert API_KEY not in message and API_KEY not in repr(info.value)
    assert len(stub.requests) == 1
    assert sleeps == []


def test_error_without_json_body_uses_truncated_raw_body(stub, client):
    stub.handler = lambda request: (404, "<html>" + "x" * 2000 + "</html>", {}, 0.0)
    with pytest.raises(GeminiError) as info:
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert info.value.status == 404
    assert "<html>" in str(info.value) and len(str(info.value)) < 700


def test_slow_response_times_out_and_is_retried(stub, sleeps):
    client = GeminiClient(MODEL, api_key=API_KEY, base_url=stub.url, timeout_s=0.3, max_retries=1,
                          sleep=sleeps.append)
    stub.handler = lambda request: (200, ok_reply("too late"), {}, 600)  # no reply before the stub is closed
    start = time.monotonic()
    with pytest.raises(GeminiError) as info:
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert 0.6 <= time.monotonic() - start < 60  # two attempts, each cut at its timeout, not at a reply
    assert wait_until(lambda: len(stub.requests) == 2)  # the stub reads a request its client gave up on late
    assert sleeps == [1.0]
    assert info.value.status is None
    assert "2 attempts" in str(info.value) and "timed out after 0.3s" in str(info.value)


def test_connection_refused_is_retried(sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = GeminiClient(MODEL, api_key=API_KEY, base_url=f"http://127.0.0.1:{port}", timeout_s=1.0,
                          max_retries=2, backoff_s=0.1, sleep=sleeps.append)
    with pytest.raises(GeminiError) as info:
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert sleeps == [0.1, 0.2]
    assert "3 attempts" in str(info.value) and "connection" in str(info.value)


def test_blocked_prompt_names_block_reason(stub, client):
    stub.handler = lambda request: (200, {"promptFeedback": {"blockReason": "SAFETY"}}, {}, 0.0)
    with pytest.raises(GeminiError, match="SAFETY"):
        client.generate([{"role": "user", "content": "x"}], max_output_tokens=8, temperature=1.0,
                        top_p=1.0)
    assert len(stub.requests) == 1


def test_policy_marks_max_tokens_as_truncated_and_greedy_sends_zero_temperature(stub, client):
    stub.handler = lambda request: (200, ok_reply("cut off mid", "MAX_TOKENS"), {}, 0.0)
    policy = GeminiPolicy(MODEL, client=client)
    [generation] = policy.generate([[{"role": "user", "content": "long story"}]], [[]],
                                   SamplingParams(max_new_tokens=5, temperature=0.8, greedy=True))
    assert generation.text == "cut off mid"
    assert generation.truncated is True
    assert generation.response_ids == [] and generation.logprobs == []
    config = stub.requests[0]["body"]["generationConfig"]
    assert config["temperature"] == 0.0 and config["maxOutputTokens"] == 5

    stub.handler = lambda request: (200, ok_reply("fine"), {}, 0.0)
    [generation] = policy.generate([[{"role": "user", "content": "short"}]], [[]], SamplingParams())
    assert generation.truncated is False
    assert policy.first_prompt_ids([{"role": "user", "content": "a"}]) == []
    assert policy.next_prompt_ids([], [], {"role": "user", "content": "b"}) == []


def test_policy_generate_is_concurrent_bounded_and_ordered(stub):
    def echo(request):
        last = request["body"]["contents"][-1]["parts"][0]["text"]
        return 200, ok_reply(f"echo {last}"), {}, 0.08

    stub.handler = echo
    stub.flight.hold_until = 4  # no reply until 4 are open at once
    policy = GeminiPolicy(MODEL, concurrency=4, api_key=API_KEY, base_url=stub.url)
    conversations = [[{"role": "system", "content": "sys"}, {"role": "user", "content": f"q{i}"}]
                     for i in range(12)]
    generations = policy.generate(conversations, [[] for _ in conversations], SamplingParams())
    assert [g.text for g in generations] == [f"echo q{i}" for i in range(12)]
    assert len(stub.requests) == 12
    assert stub.flight.most == 4  # concurrent, and bounded


def test_policy_raises_on_failed_request(stub, client):
    stub.handler = lambda request: (403, {"error": {"message": "permission denied"}}, {}, 0.0)
    policy = GeminiPolicy(MODEL, client=client)
    with pytest.raises(GeminiError, match="permission denied"):
        policy.generate([[{"role": "user", "content": "x"}]], [[]], SamplingParams())


def test_missing_api_key(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(GeminiError, match="GEMINI_API_KEY"):
        GeminiClient(MODEL)
    with pytest.raises(GeminiError, match="GEMINI_API_KEY"):
        policy_from_spec("gemini:gemini-2.5-flash")


def test_policy_from_spec(monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", API_KEY)
    assert is_gemini_spec("gemini:gemini-2.5-flash")
    assert not is_gemini_spec("Qwen/Qwen2.5-0.5B-Instruct")
    policy = policy_from_spec("gemini:gemini-2.5-flash", concurrency=3)
    assert isinstance(policy, GeminiPolicy)
    assert policy.client.model == "gemini-2.5-flash" and policy.concurrency == 3
    with pytest.raises(ValueError, match="no model name"):
        policy_from_spec("gemini:")
    with pytest.raises(ValueError, match="gemini:<model-name>"):
        policy_from_spec("openai:gpt-4o")


def test_eval_script_runs_the_self_refine_loop_against_the_api(stub, monkeypatch, capsys):
    """First answer is always wrong, the retry is right: success 1.0, first-turn 0.0, 2 turns each."""
    import re

    from nanorllm.trainer.eval_model import EvalConfig, evaluate_model

    def solver(request):
        contents = request["body"]["contents"]
        question = next(c["parts"][0]["text"] for c in reversed(contents) if c["parts"][0]["text"].startswith("What"))
        total = sum(int(x) for x in re.findall(r"\d+", question))
        retry = contents[-1]["parts"][0]["text"].startswith("Your answer is incorrect")
        return 200, ok_reply(f"\\boxed{{{total if retry else total + 1}}}"), {}, 0.05

    stub.handler = solver
    stub.flight.hold_until = 4
    monkeypatch.setenv("GEMINI_API_KEY", API_KEY)
    monkeypatch.setenv("GEMINI_BASE_URL", stub.url)
    result = evaluate_model(EvalConfig(model="gemini:test-model", tasks="arith:digits=1,terms=3,count=12,seed=4",
                                       api_concurrency=4))
    assert result == {"spec": "arith:digits=1,terms=3,count=12,seed=4", "success_rate": 1.0, "first_turn_success": 0.0,
                      "mean_reward": 1.0, "mean_turns": 2.0, "n": 12, "failed": 0, "grader_timeouts": 0, "first_timeout_task": None}
    assert len(stub.requests) == 24 and stub.flight.most == 4
