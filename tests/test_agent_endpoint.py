"""--agent: an agent written against the OpenAI client, served from the running decode batch.

The endpoint's HTTP contract (bearer token, 400s naming the field, 503 after the run), token-exact
recording (turns that extend the previous one form one row; an agent that rewrites its history trains
separate rows, counted), faults (an agent that raises, one that never returns), refusals at start, and
the example of docs/environments.md trained serially and in the pipeline and evaluated by launch/eval.py.
"""

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request

import pytest

from helpers import doc_example
from nanorllm.bench.agents import AgentBenchConfig, run_agent_bench
from nanorllm.config import ConfigError, parse_config
from nanorllm.run.world import world_problems
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import EnvSpecError, load_agent
from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.rollout.agent_runner import cut_response, parse_tool_calls
from nanorllm.rollout.endpoint import ChatRequest
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run.lifecycle import main
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.metrics import rollout_metrics
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP
from tests import forked
from tests.procs import HANG_S, ROOT, child_env, read_rollouts, read_scalars, run_train
from tests.runs import TINY_ARGS

DOC = ROOT / "docs" / "environments.md"
TASKS = [{"task_id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.7)


@pytest.fixture
def agent_file(tmp_path):
    """Agents of these tests, in a file as a user would write them; `seen` records what each request got."""
    path = tmp_path / "agents.py"
    path.write_text('''
import asyncio, time
import openai

seen = []

def extends(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    replies = []
    for _ in range(3):
        r = client.chat.completions.create(model="anything", messages=messages, logprobs=True)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "Once more."}]
        replies.append(r)
    seen.append((task["task_id"], replies))
    return {"reward": float(task["task_id"] in ("t0", "t2")), "reason": "scripted"}

async def rewrites(task, client):
    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    edited = [{"role": "user", "content": "Forget that. " + task["question"]},
              {"role": "assistant", "content": r.choices[0].message.content + " (edited)"},
              {"role": "user", "content": "Again."}]
    await client.chat.completions.create(model="m", messages=edited)
    return 1.0 if task["task_id"] == "t1" else 0.0

def raises(task, client):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    if task["task_id"] == "t1":
        raise RuntimeError("the agent broke")
    return 0.0

async def hangs(task, client):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    if task["task_id"] == "t0":
        await asyncio.sleep(3600)
    return 0.0

def no_completion(task, client):
    return 1.0

def says_success(task, client):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}], max_tokens=1)
    return {"reward": 1.0, "success": task["task_id"] == "t0"}

def wrong_signature(task):
    return 0.0

def probe(task, client):
    seen.append(client)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    return 0.0
''')
    return path


def _engine(policy, spec, **kw):
    return RolloutEngine(policy, sampling=SAMPLING, env=load_agent(spec, **kw), max_batch_episodes=16)


def _module(spec):
    return load_agent(spec).fn.__globals__


# ---- token in, token out --------------------------------------------------------------------------

def test_an_agent_that_extends_its_history_trains_one_row_of_exactly_the_sampled_tokens(tiny_policy, agent_file):
    engine = _engine(tiny_policy, f"{agent_file}:extends", settings=EpisodeSettings(max_turns=3))  # 3 requests
    try:
        out = engine.run(TASKS, num_samples=2)
    finally:
        engine.close()
    results = out.results
    assert [r.reward for r in results] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert {r.trajectory.termination_reason for r in results} == {"scripted"}
    seen = _module(f"{agent_file}:extends")["seen"]
    for r in results:
        assert len(r.step_samples) == 3 and r.trajectory.num_turns == 3
        for prev, s in zip(r.step_samples, r.step_samples[1:]):  # each prompt extends prompt + sampled response
            assert s.prompt_ids[:len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
        batch = collate_train_batch(r.step_samples, pad_id=tiny_policy.pad_id)
        assert batch["input_ids"].shape[0] == 1  # one row for the whole episode

    # what each client was told is what is trained on: the same logprobs, token counts and text
    def told(replies):
        return [([t.logprob for t in x.choices[0].logprobs.content], x.usage.prompt_tokens,
                 x.usage.completion_tokens, x.choices[0].message.content) for x in replies]

    def trained(r):
        return [(s.rollout_logprobs, len(s.prompt_ids), len(s.response_ids),
                 tiny_policy.tokenizer.decode(s.response_ids, skip_special_tokens=True)) for s in r.step_samples]

    assert sorted(map(repr, (told(rs) for _, rs in seen))) == sorted(map(repr, (trained(r) for r in results)))
    m = rollout_metrics(results)
    assert m["rollout/prefix_breaks"] == 0 and m["rollout/env_errors"] == 0
    assert out.timings["gen_tokens"] == sum(len(s.response_ids) for r in results for s in r.step_samples)
    assert out.timings["reused_tokens"] > 0  # later turns prefilled only their new tokens
    # 8 agents at once: their requests shared the decode steps
    assert out.timings["decode_rows"] / out.timings["decode_steps"] > 2


def test_an_agent_that_rewrites_its_history_trains_separate_rows_and_is_counted(tiny_policy, agent_file):
    engine = _engine(tiny_policy, f"{agent_file}:rewrites")
    try:
        results = engine.run(TASKS, num_samples=2).results
    finally:
        engine.close()
    assert [r.reward for r in results] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    for r in results:
        first, second = r.step_samples
        assert second.prompt_ids[:len(first.prompt_ids) + len(first.response_ids)] != first.prompt_ids + first.response_ids
        assert "Forget that." in tiny_policy.tokenizer.decode(second.prompt_ids)  # rendered whole from its messages
        assert collate_train_batch(r.step_samples, pad_id=tiny_policy.pad_id)["input_ids"].shape[0] == 2
    assert rollout_metrics(results)["rollout/prefix_breaks"] == len(results)


def test_stop_and_max_tokens_cut_the_sampled_ids_where_the_text_is_cut(tiny_policy):
    tok = tiny_policy.tokenizer
    ids = tok("abc STOP def", add_special_tokens=False)["input_ids"]
    gen = Generation(text="abc STOP def", response_ids=ids, logprobs=[-0.1 * i for i in range(len(ids))])
    cut, lps, text, reason = cut_response(tiny_policy, gen, ChatRequest(episode="e", messages=[], stop=["STOP"]))
    assert (text, reason) == ("abc ", "stop") and tok.decode(cut) == "abc STOP" and lps == gen.logprobs[:len(cut)]
    cut, lps, text, reason = cut_response(tiny_policy, gen, ChatRequest(episode="e", messages=[], max_tokens=2))
    assert (cut, text, reason) == (ids[:2], "ab", "length")


def test_tool_calls_are_parsed_from_the_hermes_format_and_tools_reach_a_template_that_renders_them(
        tiny_policy_factory, agent_file):
    content, calls = parse_tool_calls('Let me. <tool_call>{"name": "calc", "arguments": {"x": "1+2"}}</tool_call>')
    assert content == "Let me." and calls[0]["function"] == {"name": "calc", "arguments": '{"x": "1+2"}'}
    assert parse_tool_calls("no call here") == ("no call here", [])
    policy = tiny_policy_factory()
    policy.tokenizer.chat_template = (  # the byte tokenizer's ChatML, with the tools written into a system turn
        "{% if tools %}{{ '<|im_start|>system\nTools: ' }}{% for t in tools %}{{ t['function']['name'] }}"
        "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}" + policy.tokenizer.chat_template)
    agent_file.write_text(agent_file.read_text() + '''
def with_tools(task, client):
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    return 0.0
''')
    engine = _engine(policy, f"{agent_file}:with_tools")
    try:
        results = engine.run(TASKS[:1], num_samples=1).results
    finally:
        engine.close()
    assert "Tools: multiply" in policy.tokenizer.decode(results[0].step_samples[0].prompt_ids)


def test_the_endpoint_returns_tool_calls_to_the_openai_client_through_the_fallback_block(
        tiny_policy, agent_file, monkeypatch):
    """The tiny template (SmolLM2's ChatML) reads no tools: they are rendered in the Hermes block, and a reply's
    <tool_call> blocks come back as OpenAI tool_calls (the model's text scripted: a random model writes none)."""
    import nanorllm.rollout.agent_runner as runner
    import openai

    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    real = runner.cut_response
    monkeypatch.setattr(runner, "cut_response", lambda *a: (*real(*a)[:2], "Sure. " + call, "stop"))
    agent_file.write_text(agent_file.read_text() + '''
def fallback_tools(task, client):
    tools = [{"type": "function", "function": {"name": "multiply", "description": "a times b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "6 * 7?"}], tools=tools)
    seen.append(r)
    return 0.0
''')
    engine = _engine(tiny_policy, f"{agent_file}:fallback_tools")
    try:
        results = engine.run(TASKS[:1], num_samples=1).results
    finally:
        engine.close()
    reply = _module(f"{agent_file}:fallback_tools")["seen"][-1]
    assert isinstance(reply, openai.types.chat.ChatCompletion)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    [tc] = choice.message.tool_calls
    assert tc.type == "function" and tc.function.name == "multiply" and json.loads(tc.function.arguments) == {"a": 6, "b": 7}
    prompt = tiny_policy.tokenizer.decode(results[0].step_samples[0].prompt_ids)
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "multiply"' in prompt


# ---- the HTTP contract ----------------------------------------------------------------------------

def test_the_endpoint_refuses_what_it_cannot_serve_naming_the_field_and_401s_without_the_token(tiny_policy, agent_file):
    import openai
    agent_file.write_text(agent_file.read_text() + '''
import json, urllib.request, urllib.error
def contract(task, client):
    out = {}
    def status(**kw):
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **kw)
            return 200, None
        except openai.APIStatusError as e:
            return e.status_code, (e.body or {}).get("param")
    out["n"] = status(n=2)
    out["stream"] = status(stream=True)
    out["temperature"] = status(temperature=1.3)
    out["unknown"] = status(extra_body={"frequency_penalty": 0.5})
    out["tools"] = status(tools=[{"type": "function", "function": {"name": "f"}}])
    out["bad_type"] = status(extra_body={"max_tokens": "many"})
    out["ok"] = status(temperature=0.7, max_completion_tokens=2)
    out["models"] = [m.id for m in client.models.list()]
    req = urllib.request.Request(str(client.base_url) + "chat/completions", method="POST",
                                 data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        out["no_token"] = e.code
    out["host"] = client.base_url.host
    seen.append(out)
    seen.append(client)
    return 0.0
''')
    engine = _engine(tiny_policy, f"{agent_file}:contract")
    try:
        engine.run(TASKS[:1], num_samples=1)
        seen = _module(f"{agent_file}:contract")["seen"]
        out, client = seen[-2], seen[-1]
        assert out["n"] == (400, "n") and out["stream"] == (400, "stream")
        assert out["temperature"] == (400, "temperature") and out["unknown"] == (400, "frequency_penalty")
        assert out["tools"] == (200, None)  # the tiny template renders no tools: the fallback block does
        assert out["bad_type"] == (400, "max_tokens") and out["ok"] == (200, None)
        assert out["models"] == ["policy"] and out["no_token"] == 401 and out["host"] == "127.0.0.1"
        # the run is over: the same client now gets a clean 503
        late = openai.OpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            late.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 503
    finally:
        engine.close()


def test_32_agents_share_the_decode_steps_and_sample_what_the_same_env_episodes_sample(tmp_path):
    """launch/bench.py agents at a tiny size: the agent and the --env calc episodes are the same tokens."""
    out = tmp_path / "agents.json"
    assert run_agent_bench(AgentBenchConfig(model="tiny-random", episodes=32, max_new_tokens=8, repeats=1,
                                            json=str(out))) == 0
    figures = json.loads(out.read_text())["figures"]
    assert figures["same_tokens"] and figures["agent"]["requests"] == figures["env"]["requests"] >= 32
    # shared: one decode step serves many agents' rows (one a step if they were served one by one); how many
    # join each step depends on how fast the agents' requests arrive, so on the load (15.1 on a busy 2-core box)
    assert figures["agent"]["rows_per_decode_step"] > 8


# ---- faults -----------------------------------------------------------------------------------------

def test_an_agent_that_raises_ends_only_its_episode_as_an_env_error_printed_once(tiny_policy, agent_file, capsys):
    engine = _engine(tiny_policy, f"{agent_file}:raises")
    try:
        results = engine.run(TASKS[:2], num_samples=2).results
    finally:
        engine.close()
    assert [r.trajectory.termination_reason for r in results] == ["wrong", "wrong", "error", "error"]
    assert "RuntimeError: the agent broke" in results[2].trajectory.steps[-1].info["error"]
    assert capsys.readouterr().err.count("RuntimeError: the agent broke") == 1  # two episodes, one print
    assert rollout_metrics(results)["rollout/env_errors"] == 2


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_an_agent_that_never_returns_is_ended_at_the_timeout_and_counted(tiny_policy, agent_file):
    engine = _engine(tiny_policy, f"{agent_file}:hangs", timeout_s=6.0)  # room for t1 on a loaded machine
    t0 = time.perf_counter()
    try:
        results = engine.run(TASKS[:2], num_samples=1).results
    finally:
        engine.close()
    assert time.perf_counter() - t0 < 60
    assert [r.trajectory.termination_reason for r in results] == ["error", "wrong"]
    m = rollout_metrics(results)
    assert m["rollout/agent_timeouts"] == 1 and m["rollout/env_errors"] == 1


def test_an_agent_that_never_asked_the_policy_is_an_error(tiny_policy, agent_file):
    engine = _engine(tiny_policy, f"{agent_file}:no_completion")
    try:
        results = engine.run(TASKS[:1], num_samples=1).results
    finally:
        engine.close()
    assert results[0].trajectory.termination_reason == "error" and results[0].step_samples == []


def test_an_agents_own_success_is_the_episodes_success_as_an_envs_is(tiny_policy, agent_file):
    engine = _engine(tiny_policy, f"{agent_file}:says_success")
    try:
        results = engine.run(TASKS[:2], num_samples=1).results
    finally:
        engine.close()
    assert [(r.reward, r.succeeded) for r in results] == [(1.0, True), (1.0, False)]
    assert rollout_metrics(results)["success_rate"] == 0.5


# ---- refused at start ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, reason", [("wrong_signature", r"expected fn\(task, client\), got fn\(task\)"),
                                        ("missing", r"has no 'missing'")])
def test_a_bad_agent_spec_is_refused_with_its_reason(agent_file, fn, reason):
    with pytest.raises(EnvSpecError, match=reason):
        load_agent(f"{agent_file}:{fn}")


def test_train_refuses_a_bad_agent_an_agent_with_an_env_and_an_agent_without_tasks(agent_file, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"agent: .*cannot import .*SyntaxError"):
        bad = tmp_path / "bad.py"
        bad.write_text("def solve(task, client) return 0\n")
        parse_config(["--agent", f"{bad}:solve", "--tasks", "calc:count=4"], world=world_problems)
    with pytest.raises(ConfigError, match=r"agent: --agent replaces --env"):
        parse_config(["--agent", f"{agent_file}:extends", "--env", "calc", "--tasks", "calc:count=4"])
    with pytest.raises(ConfigError, match=r"agent: --agent replaces --env"):  # even the default env, named
        parse_config(["--agent", f"{agent_file}:extends", "--env", "math", "--tasks", "calc:count=4"])
    with pytest.raises(ConfigError, match=r"tasks: an --agent run has no default tasks"):
        parse_config(["--agent", f"{agent_file}:extends"], world=world_problems)
    rc = main([*TINY_ARGS, "--agent", f"{agent_file}:wrong_signature", "--tasks", "calc:count=4",
               "--output-dir", str(tmp_path / "runs")])
    assert rc == 2 and "expected fn(task, client)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# ---- the docs' example, trained and evaluated ------------------------------------------------------------

@pytest.fixture
def calc_agent(tmp_path):
    return doc_example(DOC, "## Train the agent you already have", tmp_path / "calc_agent.py", max_lines=45)


def test_the_doc_agent_solves_a_task_when_the_model_calls_the_calculator_and_answers(calc_agent):
    """Its control flow, without a model: a client that answers from a script."""
    script = iter(["```calc\n6 * 7\n```", "So \\boxed{42}."])
    asked = []

    class Completions:
        def create(self, **kw):
            asked.append(list(kw["messages"]))
            msg = type("M", (), {"content": next(script)})
            return type("R", (), {"choices": [type("C", (), {"message": msg})]})

    client = type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})})
    out = load_agent(f"{calc_agent}:solve").fn({"task_id": "x", "question": "What is 6 * 7?", "answer": "42"}, client)
    assert out == {"reward": 1.0, "tool_calls": 1}
    assert asked[1][-1] == {"role": "user", "content": "Result: 42"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_the_doc_agent_trains_two_steps_serially_and_in_the_pipeline(tmp_path, calc_agent, mode):
    rc, out, _ = run_train([*mode, "--agent", f"{calc_agent}:solve", "--tasks", "calc:count=20,seed=1",
                            "--eval-tasks", "calc:count=4,seed=2", "--max-steps", "2", "--run-name", "r",
                            "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert "[env] agent" in out and "step 2/2" in out
    episodes = read_rollouts(tmp_path / "runs" / "r")
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES and all(e["task_id"].startswith("calc-") for e in episodes)
    scalars = read_scalars(tmp_path / "runs" / "r")
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0]
    assert [v for _, v in scalars["rollout/prefix_breaks"]] == [0, 0]


@pytest.mark.slow
def test_launch_eval_evaluates_the_doc_agent(calc_agent):
    proc = forked.run([sys.executable, str(ROOT / "launch" / "eval.py"), "--model", "tiny-random",
                       "--agent", f"{calc_agent}:solve", "--tasks", "calc:count=3,seed=2", "--max-new-tokens", "4"],
                      capture_output=True, text=True, env=child_env(), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["n"] == 3
