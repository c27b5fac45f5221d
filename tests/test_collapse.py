"""A policy that collapses says so: `rollout/distinct_answers` counts each group's distinct final answers."""

from helpers import episode
from nanorllm.trainer.collapse import distinct_answers, final_answer
from nanorllm.trainer.metrics import rollout_metrics


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
