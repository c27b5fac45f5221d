"""A policy that collapses says so: `rollout/distinct_answers` counts each group's distinct final answers, and
`CollapseAlarm` warns once when every group held one answer for --collapse-alarm-steps steps with a reward mean
below 1; real tiny runs on an env whose answer is a constant warn (serial and pipeline), and one whose answers
vary does not."""

from collections import Counter
from pathlib import Path

import pytest

from helpers import episode
from nanorllm.trainer.collapse import CollapseAlarm, distinct_answers, effective_count, final_answer
from nanorllm.trainer.metrics import rollout_metrics
from tests.procs import read_scalars, run_train
from tests.runs import train_in_process

ANSWERS = f"{Path(__file__).parent / 'answer_env.py'}:Answers"


def constant_step(reward: float = 0.5) -> list:
    """Two groups of one answer each: task a answers 42 four times, task b 7 twice."""
    return [episode("a", "42", reward) for _ in range(4)] + [episode("b", "7", reward) for _ in range(2)]


def test_distinct_answers_is_the_mean_over_groups_and_leaves_failed_episodes_out():
    results = [episode("a", x) for x in "aabc"] + [episode("b", "x") for _ in range(4)]
    results.append(episode("b", "z", reason="error"))  # an env error: says nothing about the policy
    assert distinct_answers(results) == 2.0
    assert rollout_metrics(results)["rollout/distinct_answers"] == 2.0
    assert distinct_answers([episode("a", "y", reason="reward_failed")]) is None
    assert "rollout/distinct_answers" not in rollout_metrics([episode("a", "y", reason="error")])


def test_the_final_answer_is_the_graded_action_else_the_response_stripped():
    assert final_answer(episode("a", "42", response="so \\boxed{42}")) == "42"
    assert final_answer(episode("a", None, response="  the answer is 4\n")) == "the answer is 4"
    assert distinct_answers([episode("a", None, response="4 "), episode("a", None, response=" 4")]) == 1.0
    assert distinct_answers([episode("a", [1, 2]), episode("a", [1, 2]), episode("a", 3)]) == 2.0  # an agent's JSON


def test_the_alarm_warns_once_after_its_steps_of_one_answer_a_group_naming_the_answer_and_its_share():
    alarm = CollapseAlarm(3)
    assert [alarm.feed(constant_step(), step) for step in (1, 2)] == [None, None]
    warning = alarm.feed(constant_step(), 3)
    assert warning == ("[collapse] step 3: warning: the last 3 steps' groups each held one distinct final answer "
                       "(reward mean 0.50 < 1); the most common, '42', is 0.67 of their 18 episodes: the policy may "
                       "have collapsed to a constant answer (docs/metrics.md)")
    assert [alarm.feed(constant_step(), step) for step in range(4, 10)] == [None] * 6  # never twice


def test_a_group_of_two_answers_restarts_the_count_and_a_full_reward_is_no_collapse():
    alarm = CollapseAlarm(2)
    mixed = constant_step() + [episode("c", "1"), episode("c", "2")]
    assert [alarm.feed(s, i) for i, s in enumerate([constant_step(), mixed, constant_step()])] == [None] * 3
    assert alarm.feed(constant_step(), 4).startswith("[collapse] step 4: warning: the last 2 steps'")
    solved = CollapseAlarm(2)
    assert [solved.feed(constant_step(reward=1.0), step) for step in range(5)] == [None] * 5
    assert [CollapseAlarm(0).feed(constant_step(), step) for step in range(5)] == [None] * 5  # 0: off


def test_a_policy_that_answers_each_task_its_own_way_is_not_a_constant_answer():
    """Every group holds one answer, but each task its own: consistent, not collapsed (no answer is most episodes)."""
    per_task = [episode(task, answer, 0.5) for task, answer in zip("abc", ("42", "7", "9")) for _ in range(4)]
    alarm = CollapseAlarm(2)
    assert [alarm.feed(per_task, step) for step in range(5)] == [None] * 5
    assert alarm.feed(constant_step(), 5) is None and alarm.feed(constant_step(), 6) is not None  # 42: 8 of 12 then


def graded(task_id: str, answer: str, gold: str, reward: float) -> object:
    """An episode of a task whose gold answer is `gold`."""
    result = episode(task_id, answer, reward)
    result.trajectory.task = {"task_id": task_id, "answer": gold}
    return result


def two_guesses_step(golds: str = "12345678") -> list:
    """Eight tasks of golds 1..8, four episodes each: the policy answers 1 or 2 whatever the question (two
    distinct answers in a group, so the one-answer rule does not see it); right only where the gold is 1 or 2."""
    return [graded(f"t{g}", guess, g, float(guess == g)) for g in golds for guess in "1122"]


def test_the_effective_count_is_one_over_the_squared_shares():
    assert effective_count(Counter("aaaa")) == 1.0 and effective_count(Counter("abcd")) == 4.0
    assert effective_count(Counter("aaab")) == pytest.approx(1.6)  # 16 / (9 + 1)


def test_a_policy_of_two_guesses_whatever_the_question_warns_with_the_spread_of_its_answers_and_the_golds():
    alarm = CollapseAlarm(3)
    assert [alarm.feed(two_guesses_step(), step) for step in (1, 2)] == [None, None]
    assert alarm.feed(two_guesses_step(), 3) == (
        "[collapse] step 3: warning: the last 3 steps' final answers spread over 2.0 effective answers where their "
        "tasks' golds spread over 8.0 (reward mean 0.12 < 1); the most common of their 96 episodes: '1' 0.50, "
        "'2' 0.50: the policy's answers may not follow the question (docs/metrics.md)")
    assert alarm.feed(two_guesses_step(), 4) is None  # once


def test_answers_that_follow_the_golds_are_no_collapse_even_when_the_golds_are_few():
    """A policy half right whose wrong answers vary, and a yes/no task answered yes and no: neither warns."""
    half = [graded(f"t{g}", a, g, float(a == g)) for g in "12345678" for a in (g, g, str(int(g) + 10), str(int(g) + 20))]
    yes_no = [graded(f"t{i}", a, g, float(a == g)) for i, g in enumerate(["yes", "no"] * 4) for a in ("yes", "no")]
    for step_results in (half, yes_no):
        alarm = CollapseAlarm(2)
        assert [alarm.feed(step_results, step) for step in range(5)] == [None] * 5
    alarm = CollapseAlarm(2)  # but yes whatever the question is a constant answer
    only_yes = [graded(f"t{i}", "yes", g, float(g == "yes")) for i, g in enumerate(["yes", "no"] * 4) for _ in "ab"]
    assert alarm.feed(only_yes, 1) is None
    assert alarm.feed(only_yes, 2).startswith("[collapse] step 2: warning: the last 2 steps' groups each held one")


def test_a_solved_step_or_tasks_without_golds_restart_or_skip_the_step_wide_rule():
    alarm = CollapseAlarm(2)
    solved = [graded(f"t{g}", g, g, 1.0) for g in "12" for _ in range(4)]
    steps = [two_guesses_step(), solved, two_guesses_step()]
    assert [alarm.feed(s, i) for i, s in enumerate(steps)] == [None] * 3
    assert alarm.feed(two_guesses_step(), 3) is not None
    no_golds = CollapseAlarm(2)  # the same answers, no `answer` in the tasks: only the one-answer rule applies
    plain = [episode(f"t{g}", guess, 0.1) for g in "12345678" for guess in "1122"]
    assert [no_golds.feed(plain, step) for step in range(4)] == [None] * 4


# ---- real runs ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_serial_run_whose_answer_is_constant_warns_once_and_one_whose_answers_vary_does_not(tmp_path):
    flags = ["--env", ANSWERS, "--collapse-alarm-steps", "2", "--max-steps", "3", "--no-save-model"]
    out = train_in_process(tmp_path, "constant", [*flags, "--env-arg", "answer=42"])
    assert out.count("[collapse]") == 1
    assert ("[collapse] step 2: warning: the last 2 steps' groups each held one distinct final answer (reward mean "
            "0.50 < 1); the most common, '42', is 1.00 of their ") in out
    assert [v for _, v in read_scalars(tmp_path / "constant")["rollout/distinct_answers"]] == [1.0, 1.0, 1.0]
    out = train_in_process(tmp_path, "varied", flags)  # the tiny random model's responses are the answers
    assert "[collapse]" not in out and "step 3/3" in out
    assert all(v > 1 for _, v in read_scalars(tmp_path / "varied")["rollout/distinct_answers"])


@pytest.mark.slow
def test_a_serial_run_of_two_guesses_whatever_the_math_question_warns_with_the_golds_spread(tmp_path):
    out = train_in_process(tmp_path, "two", ["--env", ANSWERS, "--env-arg", "answer=1|2", "--collapse-alarm-steps",
                                             "2", "--max-steps", "3", "--no-save-model"])
    assert out.count("[collapse]") == 1 and "[collapse] step 2: warning: the last 2 steps' final answers spread over" in out
    assert "effective answers where their tasks' golds spread over" in out
    assert any(v > 1 for _, v in read_scalars(tmp_path / "two")["rollout/distinct_answers"])  # not one a group


@pytest.mark.slow
def test_the_pipelines_learner_warns_as_the_serial_loop_does(tmp_path):
    rc, out, _ = run_train(["--num-workers", "1", "--env", ANSWERS, "--env-arg", "answer=42", "--collapse-alarm-steps",
                            "2", "--max-steps", "2", "--run-name", "p", "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert out.count("[collapse] step 2: warning: the last 2 steps' groups each held one distinct final answer") == 1
