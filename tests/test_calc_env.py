"""The calculator tool env: the safe parser, the turn rules, the task generator and its metrics."""

import pytest

from helpers import ScriptedPolicy
from nanorllm.core.types import RolloutResult, Step, Trajectory
from nanorllm.datasets.calc_tasks import make_calc_tasks, parse_calc_spec
from nanorllm.datasets.tasks import remove_overlap
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.calc_env import NO_ANSWER, CalcEnv
from nanorllm.envs.calculator import CalcError, calculate
from nanorllm.envs.registry import load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine

TASK = {"task_id": "c1", "question": "What is 37 * 52 - 64?", "answer": "1860"}


# ---- the calculator ------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, value", [
    ("37 * 52 - 64", "1860"), ("2 + 3 * 4", "14"), ("(2 + 3) * 4", "20"), ("-5 + 2", "-3"),
    ("7 / 2", "3.5"), ("1 / 3", "0.333333"), ("12 × 3 =", "36"), ("6 \\times 7", "42"), ("0.1 + 0.2", "0.3"),
    ("10 - 4 - 3", "3"), ("84 / 4", "21")])
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr, reason", [
    ("__import__('os').system('true')", "only numbers"), ("abs(-3)", "only numbers"), ("x * 2", "only numbers"),
    ("2 ** 10", "only numbers"), ("7 % 3", "only numbers"), ("'a' * 3", "only numbers"), ("[1, 2]", "only numbers"),
    ("1 / 0", "division by zero"), ("", "empty"), ("2 +", "cannot read"), ("9" * 101, "longer than 100"),
    ("99999999 * 99999999", "too large"), ("-" * 90 + "1", "too long"), ("+".join(["1"] * 50), "too long"),
    ("True + 1", "only numbers")])
def test_calculator_refuses_with_a_reason(expr, reason):
    with pytest.raises(CalcError) as err:
        calculate(expr)
    assert reason in str(err.value)


def test_calculator_bounds_its_input_before_parsing():
    with pytest.raises(CalcError, match="longer than 20"):
        calculate("1+" * 5000 + "1", max_chars=20)


# ---- the env's turn rules ------------------------------------------------------------------------

def test_a_calc_block_is_a_tool_call_whose_result_is_the_next_observation():
    env = CalcEnv(max_turns=3)
    assert env.reset(TASK) == TASK["question"]
    obs, reward, done, info = env.step("Let me compute.\n```calc\n37 * 52 - 64\n```\nThe answer is \\boxed{5}")
    assert (obs, reward, done) == ("Result: 1860", 0.0, False)
    assert (info["tool_call"], info["tool_error"]) == ("37 * 52 - 64", False)
    obs, reward, done, info = env.step("The answer is \\boxed{1860}.")
    assert (obs, reward, done, info["reason"], info["action"]) == (None, 1.0, True, "correct", "1860")


def test_an_unclosed_block_at_the_end_still_calls_the_tool():
    env = CalcEnv(max_turns=3)
    env.reset(TASK)
    assert env.step("```calc\n37*52")[0] == "Result: 1924"


def test_a_bad_expression_returns_the_tool_error_as_observation():
    env = CalcEnv(max_turns=3)
    env.reset(TASK)
    obs, reward, done, info = env.step("```calc\nimport os\n```")
    assert obs.startswith("Calculator error: cannot read") and (reward, done, info["tool_error"]) == (0.0, False, True)


def test_a_wrong_final_answer_ends_the_episode_with_zero():
    env = CalcEnv(max_turns=3)
    env.reset(TASK)
    obs, reward, done, info = env.step("\\boxed{1859} and then ```calc\n1+1\n```")
    assert (obs, reward, done, info["reason"], info["tool_call"]) == (None, 0.0, True, "wrong", None)


def test_neither_form_gets_a_reminder_and_the_turn_limit_ends_it():
    env = CalcEnv(max_turns=2)
    env.reset(TASK)
    assert env.step("I am thinking.")[:3] == (NO_ANSWER, 0.0, False)
    obs, reward, done, info = env.step("```calc\n1 + 1\n```")
    assert (obs, reward, done, info["reason"]) == (None, 0.0, True, "max_turns")


# ---- tasks ---------------------------------------------------------------------------------------

def test_tasks_are_deterministic_two_digit_products_with_exact_answers():
    tasks = make_calc_tasks(count=300, seed=4)
    assert tasks == make_calc_tasks(count=300, seed=4) and tasks != make_calc_tasks(count=300, seed=5)
    for t in tasks:
        expr = t["question"][len("What is "):-1]
        operands = [int(x) for x in expr.split() if x.isdigit()]
        assert 3 <= len(operands) <= 4 and all(10 <= x <= 99 for x in operands)
        assert "*" in expr
        assert calculate(expr) == t["answer"]  # the calculator and the generator agree
    assert len({t["task_id"] for t in tasks}) == 300


def test_held_out_tasks_are_disjoint_from_training():
    env = load_env("calc")
    train, heldout = env.load_tasks(env.default_tasks), env.load_tasks(env.default_eval_tasks)
    kept, dropped = remove_overlap(train, heldout)
    assert (len(train), len(heldout)) == (2000, 200)
    assert not {t["question"] for t in kept} & {t["question"] for t in heldout}
    assert dropped == len({t["question"] for t in train} & {t["question"] for t in heldout})


def test_calc_spec_errors_name_the_item():
    assert parse_calc_spec("calc:count=5,terms=4")["terms"] == 4
    for bad in ["calc:colour=3", "calc:count=x", "arith:count=3", "calc:count=0"]:
        with pytest.raises(ValueError, match="calc spec"):
            parse_calc_spec(bad)


# ---- through the engine, and the metrics ---------------------------------------------------------

def test_an_episode_calls_the_tool_then_answers_in_one_engine_run():
    env = load_env("calc", EpisodeSettings(max_turns=3))
    script = [["```calc\n37 * 52 - 64\n```", "\\boxed{7}"], ["The answer is \\boxed{1860}."]]
    policy = ScriptedPolicy(script)
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=8), env=env)
    ok, wrong = engine.run([TASK], num_samples=2).results
    assert policy.batch_sizes == [2, 1]
    assert (ok.reward, ok.trajectory.termination_reason, len(ok.step_samples)) == (1.0, "correct", 2)
    assert ok.trajectory.steps[1].observation == "Result: 1860"
    assert policy.prompts[1][0][:len(policy.prompts[0][0])] == policy.prompts[0][0]  # the next turn extends the first
    assert (wrong.reward, wrong.trajectory.termination_reason) == (0.0, "wrong")
    m = env.metrics([ok, wrong])
    assert m == {"tool/calls_per_episode": 0.5, "tool/errors_per_episode": 0.0, "tool/episodes_with_call": 0.5,
                 "tool/success_with_call": 1.0, "tool/success_without_call": 0.0}


def test_metrics_count_tool_errors_and_leave_out_an_empty_category():
    steps = [Step(observation="q", info={"tool_call": "x", "tool_error": True}),
             Step(observation="Calculator error", info={"tool_call": "1+1", "tool_error": False})]
    r = RolloutResult(trajectory=Trajectory(task_id="t", steps=steps, final_reward=1.0), step_samples=[])
    m = load_env("calc").metrics([r])
    assert (m["tool/calls_per_episode"], m["tool/errors_per_episode"], m["tool/success_with_call"]) == (2, 1, 1.0)
    assert "tool/success_without_call" not in m
