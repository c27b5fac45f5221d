"""A stub LLM judge: an OpenAI-compatible /v1/chat/completions on 127.0.0.1, for the judge's tests and the fault
suite's `judge_dies` (nanorllm/faultsuite/suite.py)."""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nanorllm.faultsuite.in_flight import InFlight


def reply_body(text: str) -> dict:
    """A chat completion whose one choice says `text`."""
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def nonce_of(body: dict) -> str:
    """The nonce a request (OpenAI's shape or Gemini's) asks the judge to echo with its verdict."""
    system = (body["messages"][0]["content"] if "messages" in body
              else body["systemInstruction"]["parts"][0]["text"])
    found = re.search(r'SCORE\[(\w+)\]|"nonce": "(\w+)"', system)
    return found.group(1) or found.group(2)


def length_score(body: dict) -> tuple[int, object]:
    """A judge that likes even-length responses: SCORE 8 for them, 2 for the others (a group: 0.8 / 0.2)."""
    user, nonce = body["messages"][-1]["content"], nonce_of(body)
    responses = re.split(r"\n## Response \d+\n", user)[1:] or [user.split("## Response\n", 1)[1]]
    if "## Response 1" in user:
        scores = [0.8 if len(r.strip()) % 2 == 0 else 0.2 for r in responses]
        return 200, reply_body(json.dumps({"nonce": nonce, "scores": scores}))
    return 200, reply_body(f"Fine.\nSCORE[{nonce}]: {8 if len(responses[0]) % 2 == 0 else 2}")


def lying_score(body: dict) -> tuple[int, object]:
    """A judge that lies about half the prompts (odd-length questions): `1e5` or `7.5.3` on its score line, no
    plain number, failed; for the others its verdict, 2, is followed by the response quoted: 0.2."""
    user, nonce = body["messages"][-1]["content"], nonce_of(body)
    question = user.split("## Prompt\n", 1)[1].split("\n\n## Response", 1)[0]
    if len(question) % 2:
        return 200, reply_body(f"Superb.\nSCORE[{nonce}]: {'1e5' if len(question) % 4 == 1 else '7.5.3'}")
    return 200, reply_body(f"Weak.\nSCORE[{nonce}]: 2\n\nThe response, quoted:\n> " + user.split("## Response\n", 1)[1])


class StubJudge:
    """Answers each request by `answer(body) -> (status, body)` (a str body is sent as is), after `delay_s` (cut
    short by `close`). It counts requests and the most in flight at once (faultsuite/in_flight.py: exact; with
    `hold_until` n every request waits until n were open together). With `die_after` it goes away once it answered
    that many: a request past them is cut unanswered and the socket closes (connections refused) at `closed_at`
    (time.monotonic()). With `drip_s` it sends the body one byte every `drip_s` seconds (a judge that never times
    out per read); `hung_up` counts the clients that left before its last byte."""

    def __init__(self, answer=length_score, *, delay_s: float = 0.0, die_after: int | None = None,
                 drip_s: float | None = None, hold_until: int | None = None):
        self.answer, self.delay_s, self.die_after, self.drip_s = answer, delay_s, die_after, drip_s
        self.flight = InFlight(hold_until)
        self.hung_up = self.requests = 0
        self.first_at: float | None = None  # when the first request came (time.monotonic())
        self.keys: set[str] = set()  # the Authorization headers it was sent
        self.lock = threading.Lock()
        self.closed_at: float | None = None
        self.released = threading.Event()  # set by close: a delay or a drip under way ends
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                if not stub.arrive(self.headers.get("Authorization", "")):
                    return  # past die_after: cut unanswered, as a refused connection fails
                try:
                    try:
                        status, data = stub.respond(self.rfile.read(int(self.headers["Content-Length"])))
                    finally:
                        stub.flight.leave()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    stub.send(self.wfile, data)
                except (BrokenPipeError, ConnectionResetError):
                    with stub.lock:
                        stub.hung_up += 1  # the client gave up (its deadline)
                finally:
                    if stub.die_after is not None and stub.requests >= stub.die_after:
                        threading.Thread(target=stub.close, daemon=True).start()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def max_in_flight(self) -> int:
        return self.flight.most

    def arrive(self, key: str) -> bool:
        """Count a request in; False for one past `die_after`, which is neither counted nor answered."""
        with self.lock:
            if self.die_after is not None and self.requests >= self.die_after:
                return False
            self.first_at = self.first_at or time.monotonic()
            self.keys.add(key)
            self.requests += 1
        self.flight.enter()
        return True

    def respond(self, raw: bytes) -> tuple[int, bytes]:
        """A request's reply (status, body), once it is held and delayed."""
        self.flight.hold()
        self.released.wait(self.delay_s)
        status, out = self.answer(json.loads(raw))
        return status, out.encode() if isinstance(out, str) else json.dumps(out).encode()

    def send(self, out, data: bytes) -> None:
        if self.drip_s is None:
            out.write(data)
            return
        for i in range(len(data)):
            out.write(data[i:i + 1])
            out.flush()
            self.released.wait(self.drip_s)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed_at = time.monotonic()
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
