"""A user's code (tools, reward functions, the files that hold them) ends only its own episode, never the run.

Tools run in a helper process (envs/tool_host.py): one that exits, dies, spins or holds the GIL answers an error
text and the next call gets a fresh process; arguments of another type than the schema's are refused; a tools
file or a reward function that exits at import is refused in one line naming the file; a reward function that
exits fails its scores. The real runs (slow) are the fault suite's user-code rows (nanorllm/faultsuite/suite.py).
"""

import os
import signal
import textwrap
import threading
import time

import pytest

from nanorllm.faultsuite.suite import (MISBEHAVING_CODE, reward_exits, tool_exits, tool_floods, tool_holds_the_gil,
                                  tool_spins)
from nanorllm.config import ConfigError, parse_config
from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.math_env import MathSelfRefine
from nanorllm.utils.modules import EnvSpecError
from nanorllm.envs.registry import EnvSpec, load_bundle, load_env
from nanorllm.envs.scored import RewardBundle
from nanorllm.rewards.functions import load_reward_functions
from nanorllm.utils.timed import CallExited, call_with_limit
from nanorllm.envs.tool_host import MAX_RESULT_CHARS, ToolHost
from nanorllm.envs.tools import ToolBundle, load_tools
from nanorllm.policy.base import Generation, SamplingParams
from nanorllm.policy.tool_calls import ToolCall, check_call
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run.lifecycle import main
from nanorllm.trainer.metrics import rollout_metrics
from tests.procs import run_train
from tests.runs import TINY_ARGS
from tests.test_tools import call

TASK = {"task_id": "t", "question": "What is 2 + 3?", "answer": "5"}
OWN_TOOLS = textwrap.dedent('''
    import os


    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first
            b: the second
        """
        return a * b


    def where() -> int:
        """The process id that runs the tool."""
        return os.getpid()


    def interrupt() -> str:
        """Raises KeyboardInterrupt."""
        raise KeyboardInterrupt


    def die() -> str:
        """Ends its process."""
        os._exit(7)
''')


@pytest.fixture
def tools_spec(tmp_path) -> str:
    """The fault suite's misbehaving tools (exits, floods, spins, holds) and a few of this file's."""
    path = tmp_path / "user_tools.py"
    path.write_text(MISBEHAVING_CODE + OWN_TOOLS)
    return f"{path}:multiply,where,interrupt,die,exits,floods,spins,holds"


def _results(spec: str, response: str, timeout_s: float = 5.0) -> tuple[list[str], dict]:
    env = ToolBundle(load_env("math"), load_tools(spec), timeout_s=timeout_s, max_calls=8).make_env()
    env.reset(TASK)
    _, _, _, info = env.step(response)
    return [r["content"] for r in info["tool_results"]], info


# ---- tools in their own process -----------------------------------------------------------------------

def test_a_tool_runs_in_a_process_of_its_own(tools_spec):
    [pid], _ = _results(tools_spec, call("where"))
    assert int(pid) != os.getpid()


def test_a_tool_that_exits_interrupts_or_ends_its_process_answers_an_error_and_the_next_call_runs(tools_spec):
    got, info = _results(tools_spec, call("exits") + call("interrupt") + call("die") + call("multiply", a=6, b=7))
    assert got[0] == "Error: exits raised SystemExit: 2"
    assert got[1] == "Error: interrupt raised KeyboardInterrupt: "
    assert got[2] == "Error: the tool die ended its process (exit code 7)"
    assert got[3] == "42" and info["tool_errors"] == 3


@pytest.mark.parametrize("name", ["spins", "holds"])
def test_a_tool_that_spins_or_holds_the_gil_is_killed_at_its_timeout_and_the_caller_runs_meanwhile(tools_spec, name):
    host = ToolHost(tools_spec)
    ticks, stop = [], threading.Event()
    ticker = threading.Thread(target=lambda: [ticks.append(1) for _ in iter(lambda: stop.wait(0.01), True)])
    ticker.start()
    try:
        assert host.call("multiply", {"a": 1, "b": 2}, 30.0) == ("2", True)  # started: the timeout is the call's
        pid = host._proc.pid
        ticks.clear()
        t0 = time.monotonic()
        text, ok = host.call(name, {}, 1.0)
        took = time.monotonic() - t0
    finally:
        stop.set()
        ticker.join()
        host.close()
    assert (text, ok) == (f"Error: the tool {name} did not return within 1 s", False)
    assert took < 10  # the process is killed at the limit; in a thread `hold` would run for minutes
    assert ticks  # this process's threads ran while the tool held its own GIL
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, not abandoned


def test_a_helper_killed_from_outside_between_calls_is_replaced_at_the_next_call(tools_spec):
    host = ToolHost(tools_spec)
    try:
        assert host.call("multiply", {"a": 2, "b": 3}, 30.0) == ("6", True)
        first = host._proc.pid
        os.kill(first, signal.SIGKILL)
        host._proc.wait()
        assert host.call("multiply", {"a": 2, "b": 4}, 30.0) == ("8", True)
        assert host._proc.pid != first
    finally:
        host.close()


def test_a_tool_that_floods_gets_its_result_cut_and_its_prints_kept_out_of_the_reply(tools_spec):
    [text], info = _results(tools_spec, call("floods"))
    assert text == "y" * MAX_RESULT_CHARS and info["tool_errors"] == 0


def test_arguments_of_another_type_than_the_schemas_are_refused_not_coerced(tools_spec):
    got, info = _results(tools_spec, call("multiply", a="3", b=4) + call("multiply", a=True, b=4)
                         + call("multiply", a=3, b=4))
    assert got[0] == ("Error: the call to 'multiply' has argument(s) of the wrong type: a must be an integer, "
                      "got '3'")  # not "3333"
    assert "a must be an integer, got True" in got[1]
    assert got[2] == "12" and info["tool_errors"] == 2


@pytest.mark.parametrize("json_type, value, ok", [("number", 3, True), ("number", 2.5, True), ("number", True, False),
                                                  ("integer", 3.0, False), (["integer", "null"], None, True),
                                                  (["integer", "null"], "3", False), ("boolean", 1, False),
                                                  ("array", [1], True), ("string", 3, False), ("custom", 3, True)])
def test_an_arguments_type_is_read_off_its_schema(json_type, value, ok):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": json_type}}, "required": ["x"]}}}
    why = check_call(ToolCall("f", {"x": value}, ""), [tool])
    assert (why is None) == ok, why


# ---- the row's bound (rollout/row_bound.py) ----------------------------------------------------------

class FloodingEnv:
    """Answers every reply with 10 MB of text."""

    def __init__(self, *, max_turns):
        pass

    def reset(self, task):
        return task["question"]

    def step(self, response):
        return "z" * (10 << 20), 0.0, False, {}


class Flooding(MathSelfRefine):
    env_class = FloodingEnv

    def make_env(self):
        return FloodingEnv(max_turns=self.settings.max_turns)


class Replies:
    """The tiny policy's prompts, tokenizer and context, with replies that end (EOS) after `text`: a model that
    answers in time, as the tiny random one never does (generated turn by turn)."""

    def __init__(self, policy, text: str):
        self.policy, self.text = policy, text
        self.model, self.tokenizer = policy.model, policy.tokenizer
        self.first_prompt_ids, self.next_prompt_ids = policy.first_prompt_ids, policy.next_prompt_ids

    def seed(self, seed: int) -> None:
        pass

    def generate(self, conversations, prompt_ids, params) -> list[Generation]:
        ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [Generation(text=self.text, response_ids=ids, logprobs=[-0.5] * len(ids), truncated=False)
                for _ in conversations]


def _rows(results) -> list[int]:
    return [len(s.prompt_ids) + len(s.response_ids) for r in results for s in r.step_samples]


def test_an_env_turn_past_the_rows_bound_ends_its_episode_counted_and_no_row_passes_the_context(tiny_policy):
    engine = RolloutEngine(Replies(tiny_policy, "\\boxed{1}"), sampling=SamplingParams(max_new_tokens=64),
                           env=Flooding(EpisodeSettings(max_turns=3)))
    results = engine.run([TASK], num_samples=3, seed=0).results
    context = tiny_policy.model.config.max_position_embeddings
    assert [r.trajectory.termination_reason for r in results] == ["truncated"] * 3
    assert [r.trajectory.num_turns for r in results] == [1] * 3  # the turn was refused, not served
    assert rollout_metrics(results)["rollout/context_overflows"] == 3
    assert max(_rows(results)) <= context


def test_a_tool_result_past_the_rows_room_is_cut_to_fit_counted_and_the_episode_goes_on(tiny_policy, tools_spec):
    floods = tools_spec.rsplit(":", 1)[0] + ":floods"
    bundle = load_bundle(EnvSpec(env="math", tools=floods, max_tool_calls=1, settings=EpisodeSettings(max_turns=1)))
    engine = RolloutEngine(Replies(tiny_policy, call("floods")), sampling=SamplingParams(max_new_tokens=64), env=bundle)
    results = engine.run([TASK], num_samples=2, seed=0).results
    m = rollout_metrics(results, env=bundle)
    assert (m["rollout/tool_results_truncated"], m["rollout/context_overflows"]) == (2, 0)
    assert [r.trajectory.num_turns for r in results] == [2, 2]  # the cut result was read, then the answer
    assert max(_rows(results)) <= tiny_policy.model.config.max_position_embeddings
    cut = results[0].trajectory.steps[0].info["tool_results"][0]["content"]
    assert cut.startswith("yyy") and cut.endswith("more characters than the row holds]")


@pytest.mark.parametrize("field", ["tool_timeout_s", "reward_timeout_s"])
def test_a_call_limit_past_a_day_is_refused_naming_the_field(field):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError) as e:
        parse_config([flag, "1e300"])
    assert e.value.problems == [f"{field}: must be at most 86400 s (a day), got 1e+300"]
    assert getattr(parse_config([flag, "86400"]), field) == 86400


# ---- at import ------------------------------------------------------------------------------------------

def test_a_tools_list_naming_a_missing_function_names_it(tmp_path):
    path = tmp_path / "listed.py"
    path.write_text(OWN_TOOLS + '\nTOOLS = ["multiply", "missing_fn"]\n')
    with pytest.raises(EnvSpecError, match=r"has no function 'missing_fn'"):
        load_tools(str(path))


@pytest.mark.parametrize("flag, spec", [("--tools", "exits_at_import.py:f"), ("--reward", "exits_at_import.py:f")])
def test_a_file_that_exits_at_import_is_refused_in_one_line_naming_it(tmp_path, capsys, flag, spec):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(5)\n")
    with pytest.raises(EnvSpecError, match=r"importing .*exits_at_import.py called sys.exit\(5\)"):
        load_tools(str(tmp_path / "exits_at_import.py"))
    rc = main([*TINY_ARGS, flag, str(tmp_path / spec), "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "exits_at_import.py called sys.exit(5)" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("raises, said", [("import sys\nsys.exit(5)", "called sys.exit(5)"),
                                          ("raise KeyboardInterrupt", "raised KeyboardInterrupt")])
@pytest.mark.parametrize("spec", ["ends_at_import.py:f", "ends_at_import.py"])
def test_a_tools_file_that_exits_or_interrupts_at_import_is_refused_by_the_launcher_in_one_line(tmp_path, raises,
                                                                                                said, spec):
    (tmp_path / "ends_at_import.py").write_text(raises + "\n")
    rc, out, _ = run_train(["--tools", str(tmp_path / spec)], tmp_path / "runs")
    assert rc == 2 and f"ends_at_import.py {said}" in out
    assert "Traceback" not in out
    assert not (tmp_path / "runs").exists()


# ---- reward functions ------------------------------------------------------------------------------------

def test_a_user_function_that_exits_comes_back_as_an_exception_the_caller_catches():
    with pytest.raises(CallExited, match=r"reward:f raised SystemExit\(3\)"):
        call_with_limit(lambda: exit(3), 5.0, "reward:f")


def test_a_reward_function_that_exits_fails_its_scores_and_the_process_goes_on(tmp_path, capsys):
    path = tmp_path / "exiting_rewards.py"
    path.write_text("import sys\n\ndef leaves(completions, **kw):\n    sys.exit(2)\n")
    task = {"task_id": "t1", "question": "q", "answer": "1"}
    steps = [Step(observation="q", model_response="\\boxed{1}")]
    batch = [RolloutResult(trajectory=Trajectory(task_id="t1", steps=steps, task=task), step_samples=[
        StepSample(task_id="t1", episode_id="e", turn=0, prompt_ids=[1], response_ids=[2], rollout_logprobs=[0.0])])]
    RewardBundle(MathSelfRefine(EpisodeSettings()), load_reward_functions((f"{path}:leaves",))).score_batch(batch)
    assert batch[0].trajectory.termination_reason == "reward_failed"
    assert "raised SystemExit(2)" in capsys.readouterr().err


# ---- in real runs: the fault suite's user-code rows ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("fault", [tool_exits, tool_floods, tool_spins, tool_holds_the_gil, reward_exits])
def test_a_run_whose_user_code_misbehaves_finishes_with_those_calls_counted(tmp_path, fault):
    [o] = fault(tmp_path)
    assert o.ok, f"{o.notes}\n{o.output[-3000:]}"
