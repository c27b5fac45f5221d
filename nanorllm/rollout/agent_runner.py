"""Episodes of an agent function (envs/agent_fn.py), served from the running decode batch.

Each episode is one call of the user's function with an OpenAI client pointed at this engine's
endpoint (rollout/endpoint.py). The loop here is the engine's in-flight loop with HTTP requests
in place of env turns: between decode steps it takes the requests that arrived, turns each into
prompt token ids, joins them to the batch, and answers each request the step its completion ends.
Up to `max_batch_episodes` agents run at once.

Token in, token out: the trainer trains on the ids it sampled, never on a re-tokenised string.
When a request's messages are the previous request's messages, then the reply this endpoint gave
(its text and tool calls, unchanged), then new messages, its prompt is the previous prompt + the
sampled response ids + only the new messages rendered by the chat template (as an env's next turn
is, policy.next_prompt_ids): the episode's turns form one training row, and the next turn
prefills only its new tokens. When the agent rewrote its history, the request is rendered whole
and starts a new row (`rollout/prefix_breaks` in trainer/metrics.py counts such turns).

A request's `tools` render as the chat template writes them, or, for a template that reads none (the
default model's), in the fallback Hermes block (policy/chat_render.py); the reply's tool calls are read
in the template's format (or --tool-parser's) and returned in OpenAI's `tool_calls`.

`stop` and a `max_tokens` below the run's `max_new_tokens` cut the sampled response after decoding
(the tokens kept run to the end of the first stop string, as the model sampled it; the text returned
stops before it); the run's `max_new_tokens` caps every completion.

Bounds (`EpisodeLimits`): an episode serves at most `max_turns` completions, a request's prompt +
max_tokens fits the row's bound (the rule env episodes keep too: rollout/row_bound.py), and a request holds at
most `MESSAGES_BASE + MESSAGES_PER_TURN x max_turns` messages; past them a 400 names the limit.

Faults, one mechanism each: what an agent raises, `BaseException` included (sys.exit), ends its episode
as an env error, and so does one still running `agent_timeout_s` after it started (marked
`agent_timeout`); a sync agent runs on a daemon thread of its own, so one stuck past its timeout holds no
pool slot and no exit. Whatever ends a `run` call (an engine error too), every request it left is
answered (503) and its agents' late returns are dropped by the next call. The hang detection hears real
progress only: a request, an agent's return, a decode step, the endpoint's loop turning (it is what ends
agents at their timeout), never this loop's own polling: an endpoint loop that an async agent blocks
(a sync call inside `async def`) stands still and is reported.
"""

import asyncio
import queue
import secrets
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field

from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory, ending
from nanorllm.envs.agent_fn import AgentBundle, check_agent_result
from nanorllm.envs.base import EnvProtocolError
from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.policy.slot_batch import new_stats
from nanorllm.rollout.endpoint import ChatEndpoint, ChatRequest, Limits, error_body
from nanorllm.rollout.row_bound import row_tokens
from nanorllm.policy.chat_render import tool_format
from nanorllm.policy.tool_calls import DEFAULT_PARSER, check_call, parse, to_openai
from nanorllm.utils.faults import agent_engine_step

IDLE_WAIT_S = 0.05  # how long the loop waits for a request when no row is decoding
MESSAGES_BASE, MESSAGES_PER_TURN = 16, 4  # a request's messages: a system prompt and examples, then each turn's
_reported: set[tuple[str, str]] = set()  # (spec, last line of the error): printed once per process


def report_agent_error(spec: str, task_id: str, text: str) -> None:
    """Print an agent's error (its traceback, or why it was ended) the first time it is seen."""
    key = (spec, text.strip().splitlines()[-1] if text.strip() else "")
    if key not in _reported:
        _reported.add(key)
        print(f"[agent] {spec}: the agent failed on task {task_id}; the episode is dropped (counted in "
              f"rollout/env_errors; this error is printed once):\n{text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class EpisodeLimits:
    """What one agent episode may hold: `turns` completions, `tokens` per row (prompt + max_tokens)."""

    turns: int
    tokens: int | None  # None: the model states no context

    @property
    def messages(self) -> int:
        return MESSAGES_BASE + MESSAGES_PER_TURN * self.turns


def episode_limits(policy, max_turns: int, max_row_tokens: int | None = None) -> EpisodeLimits:
    """`max_turns` completions; a row of at most `max_row_tokens` (EpisodeSettings) and never past the context: the
    row bound env episodes keep too (rollout/row_bound.py)."""
    return EpisodeLimits(turns=max_turns, tokens=row_tokens(policy, max_row_tokens))


@dataclass
class _AgentEpisode:
    task: dict
    episode_id: str
    group_id: str
    task_index: int
    key: str  # the URL key of its endpoint
    rng: object = None
    samples: list[StepSample] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    last: tuple | None = None  # (messages sent, the reply message, prompt ids, response ids) of its last completion
    state: object = None  # the slot state of its last completion (its KV cache, for the next turn)
    busy: bool = False  # a request of it is decoding
    queued: deque = field(default_factory=deque)  # its requests waiting for the one decoding
    future: object = None
    result: RolloutResult | None = None


def cut_response(policy, gen: Generation, req: ChatRequest) -> tuple[list[int], list[float], str, str]:
    """(ids, logprobs, text, finish_reason) of a completion after the request's max_tokens and stop."""
    ids, lps = list(gen.response_ids), list(gen.logprobs)
    reason = "length" if gen.truncated else "stop"
    if req.max_tokens is not None and len(ids) > req.max_tokens:
        ids, lps, reason = ids[:req.max_tokens], lps[:req.max_tokens], "length"
    decode = lambda t: policy.tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    text = decode(ids)
    hits = [text.find(s) for s in req.stop if s in text]
    if hits:  # the fewest ids whose text holds a stop string, by bisection: a prefix's text grows with it
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            part = decode(ids[:mid])
            lo, hi = (lo, mid) if any(s in part for s in req.stop) else (mid + 1, hi)
        ids, lps, reason = ids[:hi], lps[:hi], "stop"
        text = text[:min(hits)]
    return ids, lps, text, reason


def parse_tool_calls(text: str, parser: str = DEFAULT_PARSER) -> tuple[str, list[dict]]:
    """(content, OpenAI tool_calls) of a response in the format of `parser` (policy/tool_calls.py)."""
    content, calls, _ = parse(text, parser)
    return content, to_openai(calls)


def tool_call_errors(text: str, parser: str, tools: list) -> tuple[str, list[dict], list[str]]:
    """(content, OpenAI tool_calls, why each call that does not parse or fits no tool of `tools` cannot run)."""
    content, calls, failures = parse(text, parser)
    errors = [f.why for f in failures] + [e for e in (check_call(c, tools) for c in calls) if e]
    return content, to_openai(calls), errors


def completion_body(model: str, text: str, calls: list[dict], reason: str, n_prompt: int, ids: list[int],
                    lps: list[float], policy, with_logprobs: bool) -> dict:
    """A chat.completion object in the OpenAI schema."""
    message = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        message["tool_calls"] = calls
    logprobs = None
    if with_logprobs:
        toks = [policy.tokenizer.decode([t]) for t in ids]
        logprobs = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                for t, lp in zip(toks, lps)]}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": "tool_calls" if calls else reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(ids), "total_tokens": n_prompt + len(ids)}}


def _reply_message(body: dict) -> dict:
    """The assistant message of a reply as a later request's normalized messages carry it."""
    msg = body["choices"][0]["message"]
    out = {"role": "assistant", "content": msg["content"] or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = msg["tool_calls"]
    return out


class _HttpClients:
    """One HTTP connection pool for every episode's client (a fresh openai client builds its own, ~90 ms
    of CPU each); the async one is made on the endpoint's loop, where the async agents run. Neither reads
    the environment (trust_env=False): an HTTP_PROXY set for the cluster would route the loopback
    requests, and the run's token, through the proxy."""

    def __init__(self):
        self.sync, self.async_ = None, None

    def get_sync(self):
        import openai  # the `agents` extra

        self.sync = self.sync or openai.DefaultHttpxClient(trust_env=False)
        return self.sync

    def get_async(self):
        import openai

        self.async_ = self.async_ or openai.DefaultAsyncHttpxClient(trust_env=False)
        return self.async_


def in_daemon_thread(fn, *args) -> asyncio.Future:
    """`fn(*args)` on a daemon thread of its own; a future of the running loop for its result or whatever it
    raised (SystemExit too). A thread that never returns holds no pool slot and does not keep the process
    from exiting (a pool's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(ok: bool, value) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def target() -> None:
        try:
            ok, value = True, fn(*args)
        except BaseException as e:  # noqa: B036 -- an agent's sys.exit ends its episode, not the thread silently
            ok, value = False, e
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop closed: the run is over
            pass

    threading.Thread(target=target, name="nanorllm-agent", daemon=True).start()
    return fut


async def _call_agent(bundle: AgentBundle, task: dict, base_url: str, token: str, http: _HttpClients):
    """("ok", value) or ("error", traceback) of one agent call; whatever it raises, BaseException included,
    stays here (asyncio hands a task's SystemExit to the loop itself)."""
    import openai  # the `agents` extra

    kw = {"base_url": base_url, "api_key": token, "max_retries": 0, "timeout": bundle.timeout_s}
    try:
        if bundle.is_async:
            return "ok", await bundle.fn(task, openai.AsyncOpenAI(http_client=http.get_async(), **kw))
        client = openai.OpenAI(http_client=http.get_sync(), **kw)
        return "ok", await in_daemon_thread(bundle.fn, task, client)
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # noqa: B036
        how = f"the agent raised {type(e).__name__} (a BaseException: it ends the episode, not the run)\n" \
            if not isinstance(e, Exception) else ""
        return "error", how + traceback.format_exc(limit=-8)


async def _episode(bundle: AgentBundle, task: dict, base_url: str, token: str, key: str, out: queue.Queue,
                   http: _HttpClients):
    """Run one agent; put ("done", key, ("ok", value) | ("error", text) | ("timeout", text)) on `out`."""
    try:
        outcome = await asyncio.wait_for(_call_agent(bundle, dict(task), base_url, token, http), bundle.timeout_s)
    except asyncio.TimeoutError:
        outcome = ("timeout", f"the agent did not return within agent_timeout_s={bundle.timeout_s}")
    out.put(("done", key, outcome))


class AgentRunner:
    """The engine's loop for agent episodes; `engine` is the RolloutEngine it serves (its policy,
    batch size, heartbeat hooks)."""

    def __init__(self, engine, bundle: AgentBundle, *, shared_prefix, min_shared: int):
        """`shared_prefix(prompts)`: the engine's own rule for the prefix first prompts share (computed
        once per rollout and copied to each row that starts with it), at least `min_shared` tokens."""
        self.engine, self.bundle, self.policy = engine, bundle, engine.policy
        self.shared_prefix, self.min_shared = shared_prefix, min_shared
        self.prefix = None
        self.http = _HttpClients()
        self.endpoint = ChatEndpoint()
        settings = getattr(bundle, "settings", None)
        self.limits = episode_limits(self.policy, engine.max_turns, getattr(settings, "max_row_tokens", None))
        # the tool-call format --tool-parser names, else the one the policy's chat template writes (policy/tool_calls.py)
        self.tool_parser, _ = tool_format(self.policy.tokenizer, getattr(bundle, "tool_parser", "auto"))
        self.requests_served = 0
        self.ticks = 0  # the endpoint loop's count when the hang detection last heard of it

    def run(self, tasks: list[dict], *, num_samples: int, group_ids: list[str],
            params: SamplingParams) -> tuple[list[RolloutResult], int, float, dict]:
        """(results in task order then sample order, tokens generated, seconds, decode counters)."""
        engine, policy = self.engine, self.policy
        if not hasattr(policy, "decode_batch"):
            raise TypeError("--agent needs a local model (one with a running decode batch)")
        episodes = [_AgentEpisode(task=t, episode_id=f"{g}#{k}", group_id=g, task_index=i,
                                  key=secrets.token_urlsafe(16))  # unguessable: no episode can post into another
                    for i, (t, g) in enumerate(zip(tasks, group_ids)) for k in range(num_samples)]
        for ep, rng in zip(episodes, policy.row_generators(len(episodes))):
            ep.rng = rng
        by_key = {ep.key: ep for ep in episodes}
        self.endpoint.open_episodes(list(by_key), temperature=None if params.greedy else params.temperature,
                                    top_p=params.top_p, limits=Limits(messages=self.limits.messages))
        stats, n_generated = new_stats(), 0
        t0 = time.perf_counter()
        rows = min(engine.max_batch_episodes, len(episodes))
        waiting, starting, running = deque(), deque(episodes), 0
        try:
            with policy.decode_batch(params, stats=stats, slots=rows + 1, width=engine.slot_width(256, params)) as batch:
                self.batch, self.prefix = batch, None
                while starting or running or len(batch):
                    while starting and running < rows:  # start agents up to the batch's rows
                        ep = starting.popleft()
                        ep.future = self.endpoint.submit(_episode(self.bundle, ep.task, self.endpoint.base_url(ep.key),
                                                                  self.endpoint.token, ep.key, self.endpoint.requests,
                                                                  self.http))
                        running += 1
                    ended, arrived = self._take_events(by_key, waiting, block=not len(batch) and not waiting)
                    running -= ended
                    turned, self.ticks = self.endpoint.ticks != self.ticks, self.endpoint.ticks
                    if (ended or arrived or turned) and not len(batch) and not waiting and running:  # agents work
                        engine.watch("grading", next(e.task_index for e in episodes if e.future and e.result is None))
                    if not self.endpoint.alive():
                        raise RuntimeError("the agent endpoint's thread stopped; its agents cannot be served")
                    joining = []
                    while waiting and len(batch) + len(joining) < rows:
                        ep, req = waiting.popleft()
                        entry = self._prompt(ep, req, batch)
                        if entry is not None:
                            joining.append(entry)
                        elif ep.queued and ep.result is None:  # refused: the episode's next request may go
                            ep.busy = True
                            waiting.append((ep, ep.queued.popleft()))
                    batch.join(self._from_shared_prefix(joining, batch))
                    if not len(batch):
                        continue
                    engine.on_step()
                    agent_engine_step()
                    for (ep, req, prompt), gen, state in batch.step():
                        n_generated += len(gen.response_ids)
                        self._answer(ep, req, prompt, gen, state, batch)
                        if ep.queued and ep.result is None:
                            ep.busy = True
                            waiting.appendleft((ep, ep.queued.popleft()))
        finally:  # however the call ends: its agents stop being served, every request left is answered
            for ep in episodes:
                if ep.future is not None and ep.result is None:
                    ep.future.cancel()  # an async agent stops here; a sync one gets a 503 at its next request
            self.endpoint.close_episodes()
        return [ep.result for ep in episodes], n_generated, time.perf_counter() - t0, stats

    def _from_shared_prefix(self, joining: list[tuple], batch) -> list[tuple]:
        """Rows with no KV cache of their own start from the prompt prefix the first requests share
        (system prompt, worked example), cached once the first time two of them join together."""
        fresh = [e for e in joining if e[3] is None]
        if self.prefix is None and len(fresh) >= 2:
            shared = self.shared_prefix([e[1] for e in fresh])
            if len(shared) >= self.min_shared:
                self.prefix = batch.cache_prefix(shared)
        if self.prefix is None:
            return joining
        n, ids = len(self.prefix.token_ids), self.prefix.token_ids
        return [(key, prompt, rng, self.prefix if state is None and len(prompt) > n and prompt[:n] == ids else state)
                for key, prompt, rng, state in joining]

    def _take_events(self, by_key: dict, waiting: deque, *, block: bool) -> tuple[int, int]:
        """Move arrived requests to `waiting` and finish the agents that returned; (how many returned, how
        many requests arrived). An agent of an earlier call (one that ended in an error) is not this call's."""
        ended = arrived = 0
        try:
            item = self.endpoint.requests.get(timeout=IDLE_WAIT_S) if block else self.endpoint.requests.get_nowait()
        except queue.Empty:
            return 0, 0
        while True:
            if isinstance(item, ChatRequest):
                arrived += 1
                ep = by_key.get(item.episode)
                if ep is None or ep.result is not None:
                    item.answer(503, error_body("this episode ended", kind="service_unavailable"))
                elif ep.busy:
                    ep.queued.append(item)  # one completion of an episode at a time
                else:
                    ep.busy = True
                    waiting.append((ep, item))
            elif item[1] in by_key and by_key[item[1]].result is None:
                _, key, outcome = item
                self._finish(by_key[key], outcome)
                ended += 1
            try:
                item = self.endpoint.requests.get_nowait()
            except queue.Empty:
                return ended, arrived

    def _prompt(self, ep: _AgentEpisode, req: ChatRequest, batch):
        """(key, prompt ids, rng, state) joining the batch for this request, or None if refused (answered)."""
        if ep.result is not None:
            req.answer(503, error_body("this episode ended", kind="service_unavailable"))
            return None
        try:
            ids = None
            if ep.last is not None:
                sent, reply, prompt, response = ep.last
                n = len(sent)
                if req.messages[:n] == sent and len(req.messages) > n + 1 and req.messages[n] == reply:
                    ids = self.policy.next_prompt_ids(prompt, response, req.messages[n + 1:], req.tools)
            if ids is None:
                ids = self.policy.first_prompt_ids(req.messages, req.tools)
        except Exception as e:  # a template that refuses the conversation
            ep.busy = False
            req.answer(400, error_body(f"messages: the chat template cannot render them: {type(e).__name__}: {e}",
                                       "messages"))
            return None
        why = self._past_limits(ep, req, ids)
        if why is not None:
            ep.busy = False
            req.answer(400, error_body(why[1], why[0]))
            return None
        state, ep.state = ep.state, None
        if state is not None and not (len(ids) > len(state.token_ids) and ids[:len(state.token_ids)] == state.token_ids):
            batch.release(state)  # a rewritten history: its KV cache is no prefix of the new prompt
            state = None
        return (ep, req, ids), ids, ep.rng, state

    def _past_limits(self, ep: _AgentEpisode, req: ChatRequest, ids: list[int]) -> tuple[str, str] | None:
        """(field, why) when serving this request would take the episode past its limits (EpisodeLimits)."""
        lim = self.limits
        if len(ep.samples) >= lim.turns:
            return "messages", (f"max_turns: this episode has had its {lim.turns} completions (--max-turns); "
                                "an agent episode gets at most that many")
        max_new = self.engine.sampling.max_new_tokens
        want = min(req.max_tokens or max_new, max_new)
        if lim.tokens is not None and len(ids) + want > lim.tokens:
            return "messages", (f"messages: the prompt holds {len(ids)} tokens; with max_tokens {want} it passes the "
                                f"episode's limit of {lim.tokens} tokens (the model's context, "
                                "max_position_embeddings, or --max-prompt-tokens plus the turns' room if less)")
        return None

    def _answer(self, ep: _AgentEpisode, req: ChatRequest, prompt: list[int], gen: Generation, state,
                batch) -> None:
        ep.busy = False
        if ep.result is not None:  # the agent ended (or timed out) while this completion decoded
            batch.release(state)
            req.answer(503, error_body("this episode ended", kind="service_unavailable"))
            return
        ep.state = state
        ids, lps, text, reason = cut_response(self.policy, gen, req)
        content, calls, errors = tool_call_errors(text, self.tool_parser, req.tools) if req.tools else (text, [], [])
        body = completion_body(req.model or self.endpoint.model_name, content, calls, reason, len(prompt), ids, lps,
                               self.policy, req.logprobs)
        ep.samples.append(StepSample(
            task_id=ep.task["task_id"], episode_id=ep.episode_id, turn=len(ep.samples), prompt_ids=prompt,
            response_ids=ids, rollout_logprobs=lps, policy_version=getattr(self.policy, "version", 0),
            truncated=reason == "length"))
        last_user = next((m["content"] for m in reversed(req.messages) if m["role"] != "assistant"), "")
        ep.steps.append(Step(observation=last_user, model_response=text,
                             info={"finish_reason": body["choices"][0]["finish_reason"],
                                   **({"tool_calls": [c["function"] for c in calls]} if calls else {}),
                                   **({"tool_call_errors": errors} if errors else {})}))
        ep.last = (req.messages, _reply_message(body), prompt, ids)
        self.requests_served += 1
        req.answer(200, body)

    def _finish(self, ep: _AgentEpisode, outcome: tuple) -> None:
        """End the episode with the agent's return value, error or timeout."""
        refused = self.endpoint.end_episode(ep.key)
        if ep.state is not None:
            self.batch.release(ep.state)  # its KV cache is free for another episode
            ep.state = None
        kind, value = outcome
        traj = Trajectory(task_id=ep.task["task_id"], task=dict(ep.task), steps=ep.steps)
        reward, info = 0.0, {}
        if kind == "ok":
            try:
                reward, info = check_agent_result(value)
            except EnvProtocolError as e:  # the env protocol's check, as for an env's step
                kind, value = "error", f"the agent returned what the agent protocol (envs/agent_fn.py) does not " \
                                       f"allow: {e}"
        if kind == "ok" and not ep.samples:
            kind, value = "error", "the agent returned without asking the policy for a completion"
        if kind != "ok":
            report_agent_error(self.bundle.spec, ep.task["task_id"], value)
            if not traj.steps:
                traj.steps.append(Step(observation=ep.task.get("question", "")))
            traj.steps[-1].info.update({"error": value, **({"agent_timeout": True} if kind == "timeout" else {}),
                                        **({"refused_requests": refused} if refused else {})})
            traj.termination_reason = "error"
            ep.result = RolloutResult(trajectory=traj, step_samples=[], group_id=ep.group_id)
            return
        last = traj.steps[-1]
        last.reward, last.done = reward, True
        last.info.update({"returned": info, **({"refused_requests": refused} if refused else {})})  # beside the endpoint's own keys
        last.action = info.get("action")
        if "success" in info:  # the agent's own word on success, as an env's step info gives it
            last.info["success"] = info["success"]
        cut = self.bundle.cut_ends_truncated and ep.samples[-1].truncated  # AgentBundle.cut_ends_truncated
        traj.final_reward, traj.terminated = reward, not cut
        traj.termination_reason = str(ending(info.get("reason"), reward, cut=cut, otherwise="wrong"))
        for s in ep.samples:
            s.reward = reward
        ep.result = RolloutResult(trajectory=traj, step_samples=ep.samples, group_id=ep.group_id)

    def close(self) -> None:
        if self.http.async_ is not None:
            self.endpoint.submit(self.http.async_.aclose()).result(timeout=10)
        if self.http.sync is not None:
            self.http.sync.close()
        self.endpoint.close()
