"""--agent faults: each class injected into real episodes (the endpoint serving the tiny model) and, where a
run must survive it, into a real training run.

Proxy variables, rewards the env protocol refuses, an engine error mid-batch, an agent that exits or hangs
past the batch's rows, requests past an episode's bounds, episodes that try each other's URLs, stop strings
on long replies, and what an agent returns beside its reward.
"""

import math
import threading
import time

import numpy as np
import pytest

from nanorllm.faultsuite.proxy_trap import ProxyTrap
from nanorllm.faultsuite.suite import agent_engine_error, agent_exits, agent_hangs
from nanorllm.envs.agent_fn import check_agent_result
from nanorllm.envs.base import EnvProtocolError, EpisodeSettings
from nanorllm.envs.registry import load_agent
from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.rollout.agent_runner import cut_response, episode_limits
from nanorllm.rollout.endpoint import Limits, RequestError, parse_request, ChatRequest
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import rollout_metrics
from nanorllm.utils import faults
from nanorllm.utils.logger import RunLogger
from tests import forked
from tests.procs import child_env, read_rollouts, read_scalars, train_command

TASKS = [{"task_id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.7)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def agents(tmp_path):
    """Misbehaving agents, in a file as a user would write them; `seen` records what they met."""
    path = tmp_path / "bad_agents.py"
    path.write_text('''
import asyncio, json, sys, threading, time, urllib.error, urllib.request
import numpy as np
import openai

seen = []
CALLS, LOCK = __import__("itertools").count(), threading.Lock()
HI = [{"role": "user", "content": "hi"}]

def status(client, **kw):
    try:
        client.chat.completions.create(model="m", messages=kw.pop("messages", HI), **kw)
        return 200, None
    except openai.APIStatusError as e:
        return e.status_code, e.body

def raw(client, data):
    """POST a body the openai client would not send; (status, the JSON error body)."""
    req = urllib.request.Request(str(client.base_url) + "chat/completions", method="POST", data=data,
                                 headers={"Authorization": f"Bearer {client.api_key}"})
    try:
        urllib.request.urlopen(req, timeout=30)
        return 200, None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

def ask(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    seen.append((task["task_id"], str(client.base_url)))
    return {"reward": 1.0 if task["task_id"] == "t0" else 0.0, "tool_calls": 3, "note": {"steps": [1, 2]}}

def bad_reward(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    return {"t0": float("nan"), "t1": float("inf"), "t2": "1"}.get(task["task_id"], 0.5)

def bad_action(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    return {"reward": 0.0, "action": {"t0": {1, 2}, "t1": np.int64(3)}.get(task["task_id"], "ok")}

def bad_action_some(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    with LOCK:
        n = next(CALLS)
    return {"reward": 0.0, "action": {1, 2} if n % 4 == 0 else "ok"}

def exits(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    if task["task_id"] == "t1":
        sys.exit(2)
    return 0.0

async def exits_async(task, client):
    await client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    if task["task_id"] == "t1":
        async def quit():
            raise SystemExit(2)
        await asyncio.gather(asyncio.ensure_future(quit()))  # raised in a task of its own: it reaches the loop
    if task["task_id"] == "t2":
        raise KeyboardInterrupt
    return 0.0

STUCK = threading.Event()

def stuck(task, client):
    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    STUCK.wait()  # never set: stuck past any timeout
    return 0.0

async def heard(n):
    """Await until the hang detection has beaten n more times (the test appends "beat" to `seen`)."""
    until = seen.count("beat") + n
    while seen.count("beat") < until:
        await asyncio.sleep(0.01)

async def blocks(task, client):
    await client.chat.completions.create(model="m", messages=HI, max_tokens=2)
    await heard(3)  # the loop turns: beats before the block, however fast the request came back
    seen.append("blocking")
    time.sleep(3.0)  # a sync call in an async agent: the endpoint's loop stands still, no timeout can fire
    seen.append("unblocked")
    await heard(3)  # the loop turns again
    return 0.0

async def leaves_one_queued(task, client):
    asks = [asyncio.ensure_future(client.chat.completions.create(model="m", messages=HI, max_tokens=2))
            for _ in range(2)]  # the second waits for the first: one completion of an episode at a time
    await asyncio.wait(asks, return_when=asyncio.FIRST_COMPLETED)
    seen.extend(a for a in asks if not a.done())
    return 0.0

def waits_then_reports(task, client):
    seen.append(("asked", task["task_id"]))
    code = status(client, messages=HI)[0]
    seen.append(("answered", task["task_id"], code))
    return 0.0

def abuses(task, client):
    out = {}
    long = [{"role": "user", "content": "x" * 3000}]  # the byte tokenizer: 3,000 tokens, past a 2,048 context
    out["long"] = status(client, messages=long)
    out["many"] = status(client, messages=HI * 300)
    out["nan"] = raw(client, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    out["true"] = status(client, extra_body={"max_tokens": True})
    out["big"] = raw(client, b'{"messages": [{"role": "user", "content": "' + b"y" * (1 << 20) + b'"}]}')
    out["turns"] = [status(client, max_tokens=1)[0] for _ in range(3)]
    seen.append(out)
    return 0.0

def intrudes(task, client):
    base = str(client.base_url)
    guessed = base.rsplit("/ep/", 1)[0] + "/ep/00000000-0-1/v1"  # another episode's URL as keys used to read
    other = openai.OpenAI(base_url=guessed, api_key=client.api_key, max_retries=0)
    seen.append(("intrude", status(other)[0]))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}], max_tokens=2)
    return 0.0
''')
    return path


def _engine(policy, spec, **kw):
    return RolloutEngine(policy, sampling=SAMPLING, env=load_agent(spec, **kw), max_batch_episodes=16)


def _seen(spec):
    return load_agent(spec).fn.__globals__["seen"]


def _run(policy, spec, tasks=TASKS, num_samples=1, **kw):
    engine = _engine(policy, spec, **kw)
    try:
        return engine.run(tasks, num_samples=num_samples).results
    finally:
        engine.close()


# ---- 1. proxies -------------------------------------------------------------------------------------

def test_proxy_variables_neither_break_agent_episodes_nor_see_their_requests(tiny_policy, agents, monkeypatch):
    trap = ProxyTrap()
    try:
        for k, v in trap.env().items():
            monkeypatch.setenv(k, v)
        for k in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(k, raising=False)
        results = _run(tiny_policy, f"{agents}:ask")
    finally:
        trap.close()
    assert rollout_metrics(results)["rollout/env_errors"] == 0 and [r.reward for r in results] == [1.0, 0, 0, 0]
    assert trap.connections == 0  # the run's token never went to the proxy


@pytest.mark.slow
def test_a_run_with_proxy_variables_set_trains_its_agent_and_sends_the_proxy_nothing(tmp_path, agents):
    trap = ProxyTrap()
    env = {k: v for k, v in child_env().items() if k.lower() != "no_proxy"} | trap.env()
    try:
        proc = forked.run(train_command(["--serial", "--agent", f"{agents}:ask", "--tasks", "calc:count=8,seed=1",
                                         "--eval-tasks", "", "--max-steps", "2", "--run-name", "r"],
                                        tmp_path / "runs"), env=env, capture_output=True, text=True, timeout=300)
    finally:
        trap.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [v for _, v in read_scalars(tmp_path / "runs" / "r")["rollout/env_errors"]] == [0, 0]
    assert trap.connections == 0


# ---- 2. rewards ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, field", [(float("nan"), "reward: expected a finite number"),
                                          (float("inf"), "reward: expected a finite number"),
                                          ("1", "reward: expected a number"), (True, "reward: expected a number"),
                                          ({"note": 1}, "reward: expected a number, got None"),
                                          ({"reward": 1.0, "reason": 3}, "info['reason']: expected text"),
                                          ({"reward": 1.0, "success": "yes"}, "info['success']: expected True or False"),
                                          ({"reward": 1.0, "action": {1, 2}}, "the returned 'action'"),
                                          ({"reward": 1.0, "action": np.int64(3)}, "the returned 'action'")])
def test_what_an_agent_returns_is_checked_like_an_env_step_naming_the_field(value, field):
    with pytest.raises(EnvProtocolError, match=field.replace("[", r"\[").replace("]", r"\]")):
        check_agent_result(value)
    assert check_agent_result({"reward": np.float32(0.5), "action": [1]}) == (0.5, {"action": [1]})
    assert check_agent_result(1) == (1.0, {})


def test_a_nan_inf_or_text_reward_ends_only_that_episode_as_an_env_error(tiny_policy, agents, capsys):
    results = _run(tiny_policy, f"{agents}:bad_reward")
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "error", "correct"]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 0.5] and all(math.isfinite(r.reward) for r in results)
    assert "reward: expected a finite number, got nan (float)" in results[0].trajectory.steps[-1].info["error"]
    assert "agent protocol" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_whose_agent_returns_nan_in_some_episodes_trains_on_the_rest(tmp_path):
    agent = tmp_path / "nan_agent.py"
    agent.write_text('''
import itertools
calls = itertools.count()
def solve(task, client):
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    return float("nan") if next(calls) % 4 == 0 else float(len(reply.choices[0].message.content) % 2)
''')
    proc = forked.run(train_command(["--serial", "--agent", f"{agent}:solve", "--tasks", "calc:count=8,seed=1",
                                     "--eval-tasks", "", "--max-steps", "2", "--run-name", "r"], tmp_path / "runs"),
                      env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2/2" in proc.stdout
    scalars = read_scalars(tmp_path / "runs" / "r")
    assert [v for _, v in scalars["rollout/env_errors"]] == [2, 2]  # 1 in 4 of 8 episodes a step
    assert all(math.isfinite(v) for _, v in scalars["loss/policy"])


# ---- 3. an engine error mid-batch ----------------------------------------------------------------------

def test_an_engine_error_answers_every_waiting_request_and_the_next_call_is_not_its_heir(tiny_policy, agents,
                                                                                       monkeypatch):
    spec = f"{agents}:waits_then_reports"
    engine = _engine(tiny_policy, spec, timeout_s=120.0)
    seen = _seen(spec)
    monkeypatch.setenv("NANORLLM_FAULT", "agent_engine_error")
    monkeypatch.setattr(faults, "_agent_steps", [0])
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="injected fault: agent_engine_error"):
            engine.run(TASKS, num_samples=2)
        while sum(s[0] == "answered" for s in seen) < sum(s[0] == "asked" for s in seen):  # each request answered
            assert time.monotonic() - t0 < 60, seen
            time.sleep(0.05)
        assert {s[2] for s in seen if s[0] == "answered"} <= {200, 503}
        assert time.monotonic() - t0 < 60  # not the 120 s agent timeout: no request was left waiting
        results = engine.run(TASKS, num_samples=2).results  # the next call: the first call's late returns dropped
    finally:
        engine.close()
    assert [r.trajectory.termination_reason for r in results] == ["wrong"] * 8


@pytest.mark.slow
def test_an_engine_error_mid_batch_fails_one_job_per_worker_and_the_run_finishes(tmp_path):
    [o] = agent_engine_error(tmp_path)
    assert o.ok, f"{o.notes}\n{o.output[-3000:]}"
    assert "injected fault: agent_engine_error" in o.output


def test_a_request_still_queued_when_its_episode_ends_is_answered_with_a_503(tiny_policy, agents):
    spec = f"{agents}:leaves_one_queued"
    engine = _engine(tiny_policy, spec)
    try:
        results = engine.run(TASKS[:1], num_samples=1).results
        [queued] = _seen(spec)
        t0 = time.monotonic()
        while not queued.done():  # answered by the endpoint, not left to the client's timeout
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
    finally:
        engine.close()
    assert results[0].trajectory.termination_reason == "wrong"
    assert queued.exception().status_code == 503


# ---- 4. an agent that exits or hangs ---------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["exits", "exits_async"])
def test_an_agent_that_exits_ends_its_episode_as_an_env_error_and_the_endpoint_goes_on(tiny_policy, agents, fn):
    engine = _engine(tiny_policy, f"{agents}:{fn}")
    try:
        first = engine.run(TASKS[:3], num_samples=1).results
        again = engine.run(TASKS[:1], num_samples=1).results  # the same endpoint, its loop still running
        assert engine.agents.endpoint.alive()
    finally:
        engine.close()
    want = ["wrong", "error", "wrong"] if fn == "exits" else ["wrong", "error", "error"]
    assert [r.trajectory.termination_reason for r in first] == want
    assert "SystemExit" in first[1].trajectory.steps[-1].info["error"]
    assert [r.trajectory.termination_reason for r in again] == ["wrong"]


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_stuck_sync_agents_hold_no_slot_later_episodes_run_and_their_threads_do_not_block_exit(tiny_policy, agents):
    engine = _engine(tiny_policy, f"{agents}:stuck", timeout_s=2.0)
    engine.max_batch_episodes = 2  # fewer rows than stuck agents
    try:
        stuck = engine.run(TASKS, num_samples=2).results
        engine.env.fn = load_agent(f"{agents}:ask").fn  # the same endpoint, every earlier thread still stuck
        later = engine.run(TASKS, num_samples=2).results
    finally:
        engine.close()
    assert rollout_metrics(stuck)["rollout/agent_timeouts"] == 8
    assert rollout_metrics(later)["rollout/env_errors"] == 0
    threads = [t for t in threading.enumerate() if t.name == "nanorllm-agent"]
    assert len(threads) >= 8 and all(t.daemon for t in threads)  # Python does not wait for them at exit


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_the_hang_detection_hears_the_endpoint_loop_turn_not_the_engine_polling_it(tiny_policy, agents):
    spec = f"{agents}:blocks"
    engine, seen = _engine(tiny_policy, spec), _seen(spec)
    engine.watch = lambda activity, i: seen.append("beat")
    try:
        [result] = engine.run(TASKS[:1], num_samples=1).results
    finally:
        engine.close()
    assert result.trajectory.termination_reason == "wrong"  # the agent heard 3 beats before the block and after
    blocked = seen[seen.index("blocking"):seen.index("unblocked")]
    # the engine polls ~60 times in those 3 s; at most one beat, for a turn the loop made just before the block
    assert blocked.count("beat") <= 1


@pytest.mark.slow
def test_a_run_whose_agent_calls_sys_exit_finishes_with_those_episodes_counted(tmp_path):
    [o] = agent_exits(tmp_path)
    assert o.ok, f"{o.notes}\n{o.output[-3000:]}"


@pytest.mark.slow
def test_a_run_whose_sync_agent_hangs_past_the_batch_rows_finishes_and_exits(tmp_path):
    [o] = agent_hangs(tmp_path)
    assert o.ok, f"{o.notes}\n{o.output[-3000:]}"


# ---- 5. bounds -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, param", [({"temperature": float("nan")}, "temperature"),
                                         ({"top_p": "1"}, "top_p"), ({"max_tokens": True}, "max_tokens"),
                                         ({"messages": HI * 9}, "messages")])
def test_a_request_with_a_non_finite_mistyped_or_too_long_field_is_a_400_naming_it(body, param):
    with pytest.raises(RequestError) as e:
        parse_request({"messages": HI, **body}, episode="e", temperature=None, top_p=1.0, limits=Limits(messages=8))
    assert (e.value.status, e.value.param) == (400, param)


def test_requests_past_the_context_the_messages_the_turns_or_the_body_limit_are_refused_and_counted(
        tiny_policy, agents):
    spec = f"{agents}:abuses"
    results = _run(tiny_policy, spec, tasks=TASKS[:1], settings=EpisodeSettings(max_turns=2))
    out = _seen(spec)[-1]
    status, body = out["long"]
    assert status == 400 and "limit of 2048 tokens" in body["message"] and body["param"] == "messages"
    assert out["many"][0] == 400 and "at most 24 messages" in out["many"][1]["message"]  # 16 + 4 x 2 turns
    assert out["nan"][0] == 400 and out["nan"][1]["error"]["param"] == "temperature" and out["true"][0] == 400
    status, body = out["big"]
    assert status == 413 and body["error"]["type"] == "request_too_large"
    assert out["turns"] == [200, 200, 400]  # --max-turns 2: two completions per episode
    assert results[0].trajectory.num_turns == 2
    assert load_agent(spec).metrics(results) == {"rollout/agent_refused_requests": 6}


# ---- 6. episodes cannot reach each other ------------------------------------------------------------------

def test_episode_keys_are_unguessable_and_a_guessed_url_reaches_no_episode(tiny_policy, agents):
    spec = f"{agents}:intrudes"
    results = _run(tiny_policy, spec, num_samples=2)
    assert {s[1] for s in _seen(spec) if s[0] == "intrude"} == {503}
    for r in results:  # each row starts with its own question
        q = r.trajectory.task["question"]
        assert q in tiny_policy.tokenizer.decode(r.step_samples[0].prompt_ids)
    spec = f"{agents}:ask"
    _run(tiny_policy, spec, num_samples=2)
    keys = [url.rsplit("/ep/", 1)[1].split("/")[0] for _, url in _seen(spec) if isinstance(url, str)]
    assert len(set(keys)) == 8 and all(len(k) >= 22 for k in keys)  # 128 random bits each
    assert len({k[:4] for k in keys}) > 1  # no shared run prefix


# ---- 7. stop strings ---------------------------------------------------------------------------------------

def test_stop_strings_on_a_long_reply_cost_a_few_decodes_and_cut_where_a_stop_first_appears(tiny_policy):
    tok, decodes = tiny_policy.tokenizer, [0]

    class Counting:
        def decode(self, ids, **kw):
            decodes[0] += 1
            return tok.decode(ids, **kw)

    policy = type("P", (), {"tokenizer": Counting()})()
    text = "ab " * 1300 + "END tail"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 3900
    gen = Generation(text=text, response_ids=ids, logprobs=[-0.5] * len(ids))
    stops = [f"stop{i}" for i in range(50)] + ["END"]
    cut, lps, out, reason = cut_response(policy, gen, ChatRequest(episode="e", messages=[], stop=stops))
    assert decodes[0] <= 2 + math.ceil(math.log2(len(ids)))  # not one per prefix and stop string
    assert (out, reason) == ("ab " * 1300, "stop") and tok.decode(cut) == "ab " * 1300 + "END"
    assert len(lps) == len(cut)


# ---- 8. what an agent returns --------------------------------------------------------------------------------

def test_what_an_agent_returns_is_kept_whole_beside_the_endpoints_own_step_info(tiny_policy, agents, tmp_path):
    results = _run(tiny_policy, f"{agents}:ask")
    last = results[0].trajectory.steps[-1]
    assert last.info["returned"] == {"tool_calls": 3, "note": {"steps": [1, 2]}}
    assert last.info["finish_reason"] in ("stop", "length")  # the endpoint's own keys stay
    logger = RunLogger(tmp_path, report_to=())
    logger.episodes(results, 1, log_text=False)
    assert read_rollouts(tmp_path)[0]["returned"] == {"tool_calls": 3, "note": {"steps": [1, 2]}}


def test_a_non_json_action_is_an_env_error_and_a_failed_dump_leaves_no_temporary_file(tiny_policy, agents,
                                                                                       tmp_path):
    results = _run(tiny_policy, f"{agents}:bad_action")
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "wrong", "wrong"]
    assert "the returned 'action'" in results[0].trajectory.steps[-1].info["error"]
    logger = RunLogger(tmp_path, report_to=())
    logger.episodes(results, 1, log_text=False)
    assert len(read_rollouts(tmp_path)) == 4
    results[2].trajectory.steps[-1].action = {1, 2}  # what no check stops: the dump refuses it whole
    with pytest.raises(TypeError):
        logger.episodes(results, 2, log_text=False)
    assert len(read_rollouts(tmp_path)) == 4 and not list(tmp_path.glob("*.tmp"))


@pytest.mark.slow
def test_a_run_whose_agent_returns_a_set_as_its_action_finishes_and_writes_its_dump(tmp_path, agents):
    proc = forked.run(train_command(["--serial", "--agent", f"{agents}:bad_action_some", "--tasks",
                                     "calc:count=8,seed=1", "--eval-tasks", "", "--max-steps", "2",
                                     "--run-name", "r"], tmp_path / "runs"),
                      env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "runs" / "r"
    assert len(read_rollouts(run)) == 16 and not list(run.glob("*.tmp"))
    assert [v for _, v in read_scalars(run)["rollout/env_errors"]] == [2, 2]
    assert all(e["returned"] == {"action": "ok"} for e in read_rollouts(run) if e["termination_reason"] != "error")


def test_the_row_limit_the_plan_sizes_is_the_one_the_endpoint_enforces(tiny_policy, agents):
    """EpisodeSettings.max_row_tokens (from --max-prompt-tokens) caps an agent's rows below the context: a
    request past it is a 400 the agent sees (this one raises on it: an env error, counted), as past the context."""
    assert episode_limits(tiny_policy, 2).tokens == tiny_policy.model.config.max_position_embeddings
    assert episode_limits(tiny_policy, 2, 40).tokens == 40
    results = _run(tiny_policy, f"{agents}:ask", tasks=TASKS[:1], settings=EpisodeSettings(max_turns=2, max_row_tokens=8))
    [r] = results
    assert r.trajectory.termination_reason == "error" and "limit of 8 tokens" in r.trajectory.steps[-1].info["error"]
    assert rollout_metrics(results)["rollout/env_errors"] == 1
