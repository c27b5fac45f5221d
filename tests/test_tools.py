"""--tools: Python functions as tools for any env (envs/tools.py), rendered by the chat template or the fallback
Hermes block (policy/chat_render.py).

Schemas and refusals, what the model gets back for each kind of bad call (a tool that raises, hangs, gets bad
arguments, a call that does not parse, one past --max-tool-calls), parallel calls in order, token-exact tool
turns, a scripted episode through the engine with its metrics, and real tiny-random runs (slow): serial and
pipeline, and the warning a run that never calls a tool prints once.
"""

import json
import shlex
from pathlib import Path

import pytest

from helpers import ScriptedPolicy, episode
from nanorllm.config import ConfigError, parse_config
from nanorllm.envs.registry import EnvSpec, EnvSpecError, load_bundle, load_env
from nanorllm.envs.tools import ToolBundle, load_tools
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.chat_render import FALLBACK_LABEL, reads_tools, tool_format
from nanorllm.policy.models import SMOLLM2, cache_dir
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run.lifecycle import main
from nanorllm.run.world import world_problems
from nanorllm.trainer.metrics import rollout_metrics
from tests.procs import HANG_S, ROOT, read_scalars, run_train, start_train
from tests.runs import TINY_ARGS

TASK = {"task_id": "t", "question": "What is 2 + 3?", "answer": "5"}
TOOLS_PY = '''
import time

def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b

def boom(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise ValueError("it broke on " + x)

def hang(x: str) -> str:
    """Never returns.

    Args:
        x: anything
    """
    time.sleep(3600)

def nohint(x):
    """No type hints.

    Args:
        x: a thing
    """

TOOLS = [add, "boom"]
'''


def call(name, **args) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


@pytest.fixture
def tools_file(tmp_path) -> Path:
    path = tmp_path / "tools.py"
    path.write_text(TOOLS_PY)
    return path


def _bundle(tools_file, names="add,boom,hang", **kw) -> ToolBundle:
    return ToolBundle(load_env("math"), load_tools(f"{tools_file}:{names}"), **kw)


def _step(bundle, response):
    env = bundle.make_env()
    env.reset(TASK)
    return env.step(response)


# ---- schemas and refusals -------------------------------------------------------------------------

def test_a_spec_names_functions_or_a_file_whose_TOOLS_list_holds_them(tools_file):
    assert [t.name for t in load_tools(f"{tools_file}:add,hang")] == ["add", "hang"]
    tools = load_tools(str(tools_file))
    assert [t.name for t in tools] == ["add", "boom"]
    assert tools[0].schema["function"]["parameters"]["required"] == ["a", "b"]


def test_a_function_without_type_hints_is_refused_at_start_naming_it(tools_file, tmp_path, capsys):
    with pytest.raises(EnvSpecError, match=r"nohint cannot be a tool: .*missing a type hint"):
        load_tools(f"{tools_file}:add,nohint")
    with pytest.raises(EnvSpecError, match=r"has no function 'absent'"):
        load_tools(f"{tools_file}:absent")
    with pytest.raises(ConfigError, match=r"tools: .*nohint cannot be a tool"):
        parse_config(["--tools", f"{tools_file}:nohint"], world=world_problems)
    rc = main([*TINY_ARGS, "--tools", f"{tools_file}:nohint", "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "nohint cannot be a tool" in err
    assert not (tmp_path / "runs").exists()


def test_the_tool_fields_are_checked(tools_file):
    with pytest.raises(ConfigError) as e:
        parse_config(["--tools", f"{tools_file}:add", "--max-tool-calls", "0", "--tool-timeout-s", "0",
                      "--tool-alarm-steps", "-1"])
    assert {p.split(":")[0] for p in e.value.problems} >= {"max_tool_calls", "tool_timeout_s", "tool_alarm_steps"}
    with pytest.raises(ConfigError, match=r"tools: --tools gives an --env's episodes tools"):
        parse_config(["--tools", f"{tools_file}:add", "--agent", f"{tools_file}:add", "--tasks", "calc:count=2"])


# ---- what the model gets back --------------------------------------------------------------------

def test_parallel_calls_all_run_in_the_order_written_as_tool_messages(tools_file):
    bundle = _bundle(tools_file)
    obs, reward, done, info = _step(bundle, "Let me. " + call("add", a=2, b=3) + call("add", a=10, b=-1))
    assert (reward, done) == (0.0, False)
    assert info["tool_results"] == [{"name": "add", "content": "5"}, {"name": "add", "content": "9"}]
    assert obs == "5\n9" and info["tool_errors"] == info["tool_parse_failures"] == 0
    agent = bundle.make_agent()
    agent.reset(TASK, TASK["question"])
    agent.update_from_model("calls")
    agent.update_from_env(obs, reward, done, info)
    assert agent.messages[-2:] == [{"role": "tool", "name": "add", "content": "5"},
                                   {"role": "tool", "name": "add", "content": "9"}]


def test_a_tool_that_raises_or_hangs_or_gets_bad_arguments_answers_an_error_and_is_counted(tools_file):
    bundle = _bundle(tools_file, timeout_s=2.0, max_calls=8)  # the hang's wait: room for each other call on a busy box
    _, _, done, info = _step(bundle, call("boom", x="y") + call("hang", x="y") + call("add", a=1)
                             + call("add", a=1, b=2, c=3) + call("nope") + "<tool_call>{oops</tool_call>")
    got = [r["content"] for r in info["tool_results"]]
    assert not done and len(got) == 6
    assert got[0] == "Error: boom raised ValueError: it broke on y"
    assert got[1] == "Error: the tool hang did not return within 2 s"
    assert "lacks its required argument(s): b" in got[2]
    assert got[3].startswith("Error: add raised TypeError") and "'c'" in got[3]
    assert "no tool named 'nope'" in got[4] and "not valid JSON" in got[5]
    assert (info["tool_errors"], info["tool_parse_failures"]) == (5, 1)


def test_calls_past_the_limit_are_refused_then_a_reply_goes_to_the_env(tools_file):
    bundle = _bundle(tools_file, max_calls=2)
    assert bundle.settings.max_turns == load_env("math").settings.max_turns + 2
    env = bundle.make_env()
    env.reset(TASK)
    _, _, _, info = env.step(call("add", a=1, b=1) + call("add", a=1, b=2) + call("add", a=1, b=3))
    assert [r["content"] for r in info["tool_results"]][:2] == ["2", "3"]
    assert "limit of 2 tool calls" in info["tool_results"][2]["content"] and info["tool_errors"] == 1
    _, reward, done, info = env.step(call("add", a=2, b=3) + " \\boxed{5}")  # past the limit: the env's answer
    assert (reward, done) == (1.0, True)


# ---- rendering -------------------------------------------------------------------------------------

def test_the_fallback_hermes_block_and_tool_responses_for_a_template_without_tools(tiny_policy, tools_file):
    tok = tiny_policy.tokenizer
    assert not reads_tools(tok) and tool_format(tok) == ("hermes", FALLBACK_LABEL)
    schemas = [t.schema for t in load_tools(f"{tools_file}:add")]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    text = tok.decode(tiny_policy.first_prompt_ids(msgs, schemas))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(schemas[0])}\n</tools>" in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>' in text
    whole = tok.decode(tiny_policy.first_prompt_ids(
        [*msgs, {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
         {"role": "tool", "name": "add", "content": "5"}, {"role": "tool", "name": "add", "content": "6"}], schemas))
    assert whole.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
                          "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
                          "<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.skipif(not (cache_dir() / SMOLLM2 / "tokenizer_config.json").exists(),
                    reason="the default model has not been converted here")
def test_the_default_models_template_gets_the_fallback_block():
    from transformers import AutoTokenizer

    from nanorllm.policy.chat_render import prompt_ids

    tok = AutoTokenizer.from_pretrained(cache_dir() / SMOLLM2)
    assert tool_format(tok) == ("hermes", FALLBACK_LABEL)
    schema = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    text = tok.decode(prompt_ids(tok, [{"role": "user", "content": "hi"}], [schema]))
    assert text.startswith("<|im_start|>system\n# Tools\n") and "You are a helpful AI assistant" not in text
    assert json.dumps(schema) in text and text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_a_tool_turn_extends_the_row_token_for_token_as_the_whole_history_renders(tiny_policy, tools_file):
    bundle = _bundle(tools_file)
    bundle.use_tokenizer(tiny_policy.tokenizer)
    agent, env = bundle.make_agent(), bundle.make_env()
    agent.reset(TASK, env.reset(TASK))
    prompt = tiny_policy.first_prompt_ids(agent.messages, agent.tools)
    response = "Let me. " + call("add", a=2, b=3) + call("boom", x="z")
    ids = tiny_policy.tokenizer(response, add_special_tokens=False)["input_ids"] + [tiny_policy.tokenizer.eos_token_id]
    agent.update_from_model(response)
    n = len(agent.messages)
    agent.update_from_env(*env.step(response))
    nxt = tiny_policy.next_prompt_ids(prompt, ids, agent.messages[n:], agent.tools)
    assert nxt[:len(prompt) + len(ids)] == prompt + ids
    assert nxt == tiny_policy.first_prompt_ids(agent.messages, agent.tools)  # the same tokens as rendered whole


# ---- through the engine ----------------------------------------------------------------------------

def test_an_episode_calls_a_tool_then_answers_and_the_step_counts_it(tools_file):
    script = [[call("add", a=2, b=3), "<tool_call>{broken</tool_call>"],
              ["So \\boxed{5}.", "\\boxed{4}"], ["-", "\\boxed{5}"]]
    bundle = load_bundle(EnvSpec(env="math", tools=f"{tools_file}:add", settings=load_env("math").settings))
    engine = RolloutEngine(ScriptedPolicy(script), sampling=SamplingParams(max_new_tokens=8), env=bundle)
    results = engine.run([TASK], num_samples=2).results
    assert [r.reward for r in results] == [1.0, 0.0]  # \\boxed{4} is wrong, and the math env ends it at max turns
    first = results[0].trajectory.steps
    assert first[0].feedback == "5" and first[1].observation == "5" and len(first) == 2
    m = rollout_metrics(results, env=bundle)
    assert m["rollout/tool_calls_per_episode"] == m["rollout/episodes_with_tool_call"] == 0.5
    assert (m["rollout/tool_parse_failures"], m["rollout/tool_errors"]) == (1, 0)


def test_the_calculator_tool_has_a_schema_answers_and_its_tasks_load_under_the_math_env():
    [tool] = load_tools("nanorllm/envs/calc_tool.py:calc")
    assert tool.schema["function"]["parameters"]["required"] == ["expression"]
    assert tool.fn("37 * 52 - 64") == "1860"
    bundle = load_bundle(EnvSpec(env="nanorllm.envs.calc_tool:CalcTasks", tools="nanorllm/envs/calc_tool.py:calc"))
    tasks = bundle.load_tasks("calc:count=3,seed=1")
    assert len(tasks) == 3 and all(t["task_id"].startswith("calc-") for t in tasks)
    obs, _, done, _ = _step(bundle, call("calc", expression="2 * (3 + 4)"))
    assert (obs, done) == ("14", False)


def test_the_zero_call_warning_points_to_the_warm_start_only_when_no_response_holds_a_call(tiny_policy, tools_file,
                                                                                            capsys):
    """A model that writes no call in any format needs teaching (the warm start); one that writes calls the run's
    parser does not read needs another --tool-parser."""
    from nanorllm.trainer.monitors import Monitors

    def warning(response: str) -> str:
        cfg = parse_config(["--tools", f"{tools_file}:add", "--tool-alarm-steps", "1"])
        monitors = Monitors(cfg, tokenizer=tiny_policy.tokenizer, start_step=0, totals={}, say=print)
        monitors.watch([episode("a", None, response=response)], {"rollout/tool_calls_per_episode": 0.0}, 1)
        return capsys.readouterr().out

    plain = warning("The answer is 4.")
    assert plain.startswith("[tools] warning: the first 1 steps parsed no tool call") and "docs/warm-start.md" in plain
    mistral = warning('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert "set --tool-parser (docs/tools.md)" in mistral and "warm-start" not in mistral


# ---- real runs -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_tiny_run_with_tools_trains_two_steps_serially_and_in_the_pipeline_and_warns_once(
        tmp_path, tools_file, mode):
    """tiny-random never writes a call: its runs show the scalars at 0 and the warning, once."""
    rc, out, _ = run_train([*mode, "--tools", f"{tools_file}:add,boom", "--tool-alarm-steps", "1",
                            "--max-steps", "2", "--run-name", "r", "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert "step 2/2" in out
    assert out.count("[tools] warning: the first 1 steps parsed no tool call (parser hermes, tools rendered by "
                     "the fallback Hermes block); a response: ") == 1
    scalars = read_scalars(tmp_path / "runs" / "r")
    for name in ("rollout/tool_calls_per_episode", "rollout/episodes_with_tool_call", "rollout/tool_parse_failures",
                 "rollout/tool_errors"):
        assert [v for _, v in scalars[name]] == [0, 0]
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0]


@pytest.mark.slow
def test_the_first_command_of_the_tools_doc_runs_and_a_run_shorter_than_the_alarm_warns_at_its_end(tmp_path):
    """The doc's command as written (on the tiny model, 2 steps): it trains; the zero-call warning, due at step 3
    (--tool-alarm-steps' default), comes at the run's end instead of never."""
    doc = (ROOT / "docs" / "tools.md").read_text().split("## Python functions as tools", 1)[1]
    command = next(line.strip() for line in doc.splitlines() if line.strip().startswith("python launch/train.py"))
    proc, _ = start_train([*shlex.split(command)[2:], "--max-steps", "2", "--eval-limit", "2", "--run-name", "r",
                           "--no-save-model"], tmp_path / "runs", cwd=ROOT)
    out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out
    assert out.count("[tools] warning: the first 2 steps parsed no tool call") == 1
    assert out.index("step 2/2") < out.index("[tools] warning")


def test_calc_tasks_teach_the_calc_call_only_when_calc_is_among_the_tools(tools_file):
    def system(tools: str) -> str:
        agent = load_bundle(EnvSpec(env="nanorllm.envs.calc_tool:CalcTasks", tools=tools)).make_agent()
        agent.reset(TASK, TASK["question"])
        return json.dumps(agent.messages)

    with_calc = system("nanorllm/envs/calc_tool.py:calc")
    assert "call calc with one arithmetic expression" in with_calc and "12 * 34 + 5" in with_calc
    others = system(f"{tools_file}:add")
    assert "calc" not in others.replace('"calc-', "") and "12 * 34 + 5" not in others
    assert "with tools" in others
