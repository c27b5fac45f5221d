"""Held-out numbers are computed on the data they name: an episode whose score failed is left out of every rate and
counted beside it (greedy, pass@k, mean@n, launch/eval.py), and a user's own --tasks without --eval-tasks are
evaluated on a seeded share of themselves, never on another env's set."""

import json
import math
import textwrap

import pytest

from nanorllm.config import parse_config
from nanorllm.config.specs import env_spec
from nanorllm.envs.registry import load_bundle
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled

REWARDS = textwrap.dedent('''
    import math

    def fails_on_odd(completions, task_id, **kw):  # 1.0 where it scores; no score at all for the odd tasks
        return [math.nan if int(t[1:]) % 2 else 1.0 for t in task_id]
''')


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return f"{path}:fails_on_odd"


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"Say {i}."}) + "\n" for i in range(6)))
    return str(path)


def single_turn_bundle(rewards: str):
    return load_bundle(env_spec(parse_config(["--env", "single", "--reward", rewards, "--model", "tiny-random"])))


def test_held_out_success_is_over_the_scored_episodes_and_the_failed_ones_are_counted(rewards, task_file):
    env = single_turn_bundle(rewards)
    tasks = env.load_tasks(task_file)
    policy = HFCausalPolicy.from_name("tiny-random")
    out = evaluate(policy, tasks, sampling=SamplingParams(max_new_tokens=2), env=env)
    assert (out["success_rate"], out["mean_reward"], out["n"], out["failed"]) == (1.0, 1.0, 3, 3)  # not 0.5


def test_pass_at_k_and_mean_at_n_count_each_tasks_scored_samples_only(rewards, task_file):
    env = single_turn_bundle(rewards)
    policy = HFCausalPolicy.from_name("tiny-random")
    out = evaluate_sampled(policy, env.load_tasks(task_file), sampling=SamplingParams(max_new_tokens=2, temperature=1.0),
                           env=env, samples=2)
    assert out == {"pass@1": 1.0, "pass@2": 1.0, "mean@2": 1.0, "sampled_failed": 6}


def test_every_rate_is_nan_when_no_episode_was_scored(rewards, tmp_path):
    env = single_turn_bundle(rewards)
    tasks = [{"task_id": "t1", "question": "Say 1."}, {"task_id": "t3", "question": "Say 3."}]
    out = evaluate(HFCausalPolicy.from_name("tiny-random"), tasks, sampling=SamplingParams(max_new_tokens=2), env=env)
    assert math.isnan(out["success_rate"]) and (out["n"], out["failed"]) == (0, 2)


def test_launch_eval_reports_the_failed_scores_beside_a_success_rate_over_the_scored_ones(rewards, task_file):
    cfg = EvalConfig(model="tiny-random", env="single", reward=(rewards,), tasks=task_file, max_new_tokens=2,
                     eval_samples=2)
    out = evaluate_model(cfg)
    assert (out["success_rate"], out["n"], out["failed"]) == (1.0, 3, 3)
    assert (out["pass@2"], out["mean@2"], out["sampled_failed"]) == (1.0, 1.0, 6)
