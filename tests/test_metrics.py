"""Step metrics: decode efficiency from engine timings, and success as the env defines it (a step's info
`success`, else reward > 0) in training's scalars, held-out success and pass@k."""

import pytest

from helpers import ScriptedPolicy, episode
from nanorllm.core.types import Step
from nanorllm.envs.base import EnvBundle, EnvProtocolError, check_step
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled
from nanorllm.trainer.metrics import decode_metrics, rollout_metrics


def test_decode_metrics_sum_every_job_of_a_step():
    jobs = [{"decode_rows": 30, "tokens_kept": 38, "prefills": 8}, {"decode_rows": 10, "tokens_kept": 10, "prefills": 4}]
    assert decode_metrics(jobs) == {"perf/decode_useful_frac": 36 / 40, "perf/graphs": 0.0}  # no decode_steps: eager
    assert decode_metrics([{"gen_tokens": 5}]) == {}  # a policy without a decode batch reports nothing


# ---- success -----------------------------------------------------------------------------------------

def test_an_envs_success_overrides_reward_above_zero_and_without_it_reward_decides():
    results = [episode("a", "1", 1.0, info={"success": False}), episode("a", "1", 1.0, info={"success": False}),
               episode("b", "2", 0.0, info={"success": True}), episode("b", "2", 0.3)]
    assert [r.succeeded for r in results] == [False, False, True, True]
    m = rollout_metrics(results)
    assert m["success_rate"] == 0.5 and m["success_rate/first_turn"] == 0.5 and m["reward/mean"] == 0.575
    assert (m["groups/solve_none"], m["groups/solve_all"]) == (0.5, 0.5)  # group a rewarded 1 yet unsolved


def test_the_last_step_that_says_success_decides_and_the_first_turn_reads_its_own():
    r = episode("a", "1", 1.0)
    r.trajectory.steps = [Step("q", reward=0.0, info={"success": True}), Step("again", reward=1.0, info={})]
    assert r.succeeded and r.first_turn_succeeded  # the first step's word stands, its reward 0 aside
    r.trajectory.steps[1].info = {"success": False}
    assert not r.succeeded and r.first_turn_succeeded


def test_a_success_that_is_not_a_bool_breaks_the_env_protocol():
    assert check_step((None, 1.0, True, {"success": True}))[3] == {"success": True}
    with pytest.raises(EnvProtocolError, match=r"info\['success'\]: expected True or False, got 'false'"):
        check_step((None, 1.0, True, {"success": "false"}))


class WinsOnlyEnv:
    """Rewards every reply 1, but only 'win' succeeds."""

    def __init__(self, *, max_turns):
        pass

    def reset(self, task):
        return task["question"]

    def step(self, response):
        return None, 1.0, True, {"success": response == "win"}


class WinsOnly(EnvBundle):
    env_class = WinsOnlyEnv


def test_held_out_success_and_pass_at_k_count_the_envs_success_not_its_reward():
    tasks = [{"task_id": f"t{i}", "question": f"q{i}"} for i in range(3)]
    greedy = evaluate(ScriptedPolicy([["win", "lose", "lose"]]), tasks, sampling=SamplingParams(), env=WinsOnly())
    assert (greedy["success_rate"], greedy["first_turn_success"], greedy["mean_reward"]) == (pytest.approx(1 / 3),
                                                                                           pytest.approx(1 / 3), 1.0)
    sampled = evaluate_sampled(ScriptedPolicy(lambda call, row, messages: "win" if row == 0 else "lose"), tasks,
                               sampling=SamplingParams(), env=WinsOnly(), samples=2)
    assert sampled == pytest.approx({"pass@1": 1 / 6, "pass@2": 1 / 3, "mean@2": 1 / 6, "sampled_failed": 0})
