import pytest

from nanorllm.agents.math_agent import DEFAULT_EXAMPLE, DEFAULT_SYSTEM_PROMPT, MathAgent
from nanorllm.envs.grader import extract_boxed, grade
from nanorllm.envs.math_env import NO_BOX_FEEDBACK, RETRY_FEEDBACK, MathEnv

TASK = {"task_id": "t1", "question": "What is 3 + 4?", "answer": "7"}


# ---- grader ---------------------------------------------------------------------------------

def test_last_box_wins():
    text = "First \\boxed{3}, no wait, \\boxed{7}."
    assert grade(text, "7") == (True, "7")
    assert grade(text, "3") == (False, "7")


def test_nested_braces_fraction_equals_decimal():
    assert extract_boxed("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert grade("\\boxed{\\frac{1}{2}}", "0.5") == (True, "\\frac{1}{2}")
    assert grade("\\boxed{\\frac{1}{3}}", "0.5")[0] is False


def test_negative_numbers():
    assert grade("\\boxed{-3}", "-3") == (True, "-3")
    assert grade("\\boxed{-3}", "3") == (False, "-3")
    assert grade("\\boxed{3}", "-3") == (False, "3")


def test_thousands_separator():
    assert grade("\\boxed{1,000}", "1000") == (True, "1,000")
    assert grade("\\boxed{1,000}", "1") == (False, "1,000")


def test_decimal_point_zero_equals_integer():
    assert grade("\\boxed{5.0}", "5") == (True, "5.0")
    assert grade("\\boxed{5.1}", "5") == (False, "5.1")


def test_empty_box_is_wrong():
    assert grade("\\boxed{}", "0") == (False, "")
    assert grade("\\boxed{   }", "") == (False, "")


def test_no_box_is_wrong_and_extracts_none():
    assert grade("The answer is 7.", "7") == (False, None)


def test_unclosed_box():
    assert extract_boxed("\\boxed{7") is None
    assert grade("\\boxed{7", "7") == (False, None)
    assert grade("\\boxed{5} then \\boxed{7", "5") == (True, "5")


def test_huge_boxed_answer_is_rejected_without_a_symbolic_check(no_symbolic_check):
    correct, extracted = grade("\\boxed{" + "1+" * 4999 + "1}", "5000")
    assert correct is False
    assert len(extracted) == 9999


# ---- env ------------------------------------------------------------------------------------

def test_env_reset_returns_question():
    env = MathEnv(max_turns=2)
    assert env.reset(TASK) == {"question": "What is 3 + 4?"}


def test_env_correct_ends_with_reward_one():
    env = MathEnv(max_turns=3)
    env.reset(TASK)
    feedback, reward, done, info = env.step("\\boxed{7}")
    assert (feedback, reward, done) == (None, 1.0, True)
    assert info == {"extracted": "7", "correct": True, "turn": 1}


def test_env_wrong_with_turns_left_gives_feedback():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    feedback, reward, done, info = env.step("\\boxed{8}")
    assert (feedback, reward, done) == (RETRY_FEEDBACK, 0.0, False)
    assert info["extracted"] == "8"


def test_env_no_box_with_turns_left_asks_for_box():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    feedback, reward, done, _ = env.step("seven")
    assert (feedback, reward, done) == (NO_BOX_FEEDBACK, 0.0, False)


def test_env_wrong_on_last_turn_ends_with_zero():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    assert env.step("\\boxed{8}")[2] is False
    feedback, reward, done, info = env.step("\\boxed{9}")
    assert (feedback, reward, done) == (None, 0.0, True)
    assert info["turn"] == 2


def test_env_correct_on_second_turn():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    env.step("\\boxed{8}")
    assert env.step("\\boxed{7}")[:3] == (None, 1.0, True)


def test_env_single_turn():
    env = MathEnv(max_turns=1)
    env.reset(TASK)
    assert env.step("\\boxed{8}")[:3] == (None, 0.0, True)
    env.reset(TASK)
    assert env.step("\\boxed{7}")[:3] == (None, 1.0, True)


def test_env_reset_restarts_turn_count():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    env.step("\\boxed{8}")
    env.reset(TASK)
    assert env.step("\\boxed{8}")[2] is False


@pytest.mark.parametrize("max_turns", [0, -1])
def test_env_rejects_max_turns_below_one(max_turns):
    with pytest.raises(ValueError, match="max_turns"):
        MathEnv(max_turns=max_turns)


# ---- agent ----------------------------------------------------------------------------------

def test_agent_messages_with_example():
    agent = MathAgent()
    agent.reset(TASK, {"question": TASK["question"]})
    assert agent.messages == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": DEFAULT_EXAMPLE[0]},
        {"role": "assistant", "content": DEFAULT_EXAMPLE[1]},
        {"role": "user", "content": "What is 3 + 4?"},
    ]


def test_agent_messages_without_example():
    agent = MathAgent(system_prompt="Be brief.", example=None)
    agent.reset(TASK, {"question": TASK["question"]})
    assert agent.messages == [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "What is 3 + 4?"}]
    assert all(DEFAULT_EXAMPLE[1] != m["content"] for m in agent.messages)


def test_agent_records_turns_in_trajectory():
    env, agent = MathEnv(max_turns=2), MathAgent()
    agent.reset(TASK, env.reset(TASK))
    agent.update_from_model("I think \\boxed{8}")
    agent.update_from_env(*env.step("I think \\boxed{8}"))
    agent.update_from_model("Fixed: \\boxed{7}")
    agent.update_from_env(*env.step("Fixed: \\boxed{7}"))
    traj = agent.trajectory
    assert traj.task_id == "t1" and traj.num_turns == 2
    s0, s1 = traj.steps
    assert (s0.observation, s0.model_response, s0.action) == (TASK["question"], "I think \\boxed{8}", "8")
    assert (s0.reward, s0.done, s0.feedback) == (0.0, False, RETRY_FEEDBACK)
    assert (s1.observation, s1.model_response, s1.action) == (RETRY_FEEDBACK, "Fixed: \\boxed{7}", "7")
    assert (s1.reward, s1.done, s1.feedback) == (1.0, True, None)
    assert agent.messages[-3:] == [{"role": "assistant", "content": "I think \\boxed{8}"},
                                   {"role": "user", "content": RETRY_FEEDBACK},
                                   {"role": "assistant", "content": "Fixed: \\boxed{7}"}]


def test_agent_rewards_come_only_from_env_and_finish():
    agent = MathAgent(example=None)
    agent.reset(TASK, {"question": TASK["question"]})
    agent.update_from_model("\\boxed{7}")
    assert agent.trajectory.steps[-1].reward == 0.0
    agent.update_from_env(None, 0.25, True, {"extracted": "7"})
    assert agent.trajectory.steps[-1].reward == 0.25
    assert agent.trajectory.final_reward == 0.0
    traj = agent.finish(0.25, terminated=True, reason="correct")
    assert (traj.final_reward, traj.terminated, traj.termination_reason) == (0.25, True, "correct")
    assert [s.reward for s in traj.steps] == [0.25]


def test_only_real_thousands_separators_are_dropped():
    from nanorllm.envs.grader import grade

    assert grade("\\boxed{12,345}", "12345")[0]
    assert grade("\\boxed{-1,000.5}", "-1000.5")[0]
    assert not grade("\\boxed{1,2}", "12")[0]
    assert not grade("\\boxed{12,34}", "1234")[0]
