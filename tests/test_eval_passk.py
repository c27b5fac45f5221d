"""pass@k and mean@n beside greedy success, several held-out sets, in training and in launch/eval.py."""

import json

import pandas as pd
import pytest
import torch

import nanorllm.envs.math_env as math_env
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.grader import Verdict
from nanorllm.envs.registry import load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run import evaluation
from nanorllm.run.lifecycle import main
from nanorllm.trainer.evaluate import default_ks, evaluate_sampled, pass_at_k
from tests.procs import read_scalars
from tests.runs import TINY_ARGS


@pytest.fixture
def length_rule_grader(monkeypatch):
    monkeypatch.setattr(math_env, "judge", lambda response, gold, **kw: Verdict(sum(map(ord, response)) % 2 == 0, "x"))


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert default_ks(1) == (1,) and default_ks(4) == (1, 2, 4) and default_ks(6) == (1, 2, 4, 6)


def test_sampled_eval_counts_each_tasks_own_samples_and_leaves_the_sampling_stream_as_it_was(length_rule_grader):
    policy = HFCausalPolicy.from_name("tiny-random")
    env = load_env("math", EpisodeSettings(max_turns=1))
    tasks = [{"task_id": f"t{i}", "question": f"{i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    before = policy.generator.get_state()
    out = evaluate_sampled(policy, tasks, sampling=sampling, env=env, samples=4, seed=3)
    assert torch.equal(policy.generator.get_state(), before)
    results = RolloutEngine(policy, sampling=sampling, env=env).run(tasks, num_samples=4, seed=3).results
    passed = [sum(r.reward > 0 for r in results if r.trajectory.task_id == t["task_id"]) for t in tasks]
    assert 0 < sum(passed) < 24  # some samples pass, some fail: the estimator has something to count
    assert out == pytest.approx({"pass@1": sum(passed) / 24, "pass@2": sum(pass_at_k(4, c, 2) for c in passed) / 6,
                                 "pass@4": sum(c > 0 for c in passed) / 6, "mean@4": sum(passed) / 24,
                                 "sampled_failed": 0})


@pytest.mark.parametrize("flags, expected", [
    (["--eval-samples", "0"], "eval_samples: must be >= 1 or unset (greedy only), got 0"),
    (["--eval-samples", "2", "--eval-k", "1", "4"], "eval_k: each k must be in 1..2 (--eval-samples), got [4]"),
    (["--eval-k", "2"], "eval_k: [2] needs --eval-samples n >= its largest k"),
    (["--eval-set", "Bad Name=arith"], "eval_set: 'Bad Name=arith' is not name=spec"),
    (["--eval-temperature", "0"], "eval_temperature: must be > 0, got 0.0"),
])
def test_bad_eval_flags_are_refused_at_start_naming_the_field(tmp_path, capsys, flags, expected):
    assert main([*TINY_ARGS, "--serial", *flags, "--output-dir", str(tmp_path / "out")]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_eval_set_that_does_not_load_is_refused_at_start_naming_the_file(tmp_path, capsys):
    missing = tmp_path / "nope.parquet"
    assert main([*TINY_ARGS, "--serial", "--eval-set", f"x={missing}", "--output-dir", str(tmp_path / "out")]) == 2
    assert f"{missing}: file not found" in capsys.readouterr().err


def math_parquet(path, n=8):
    pd.DataFrame({"problem": [f"What is {i} + {i}?" for i in range(n)],
                  "solution": [f"It is \\boxed{{{2 * i}}}" for i in range(n)]}).to_parquet(path)
    return path


@pytest.mark.slow
def test_launch_eval_prints_pass_at_4_on_a_parquet_file_one_row_per_set(tmp_path, length_rule_grader, capsys):
    path = math_parquet(tmp_path / "math.parquet")
    rc = evaluation.main(["--model", "tiny-random", "--tasks", str(path), "--task-fields",
                           "question=problem,answer=solution", "--eval-samples", "4", "--max-turns", "1",
                           "--max-new-tokens", "6", "--eval-set", "arith=arith:count=5,seed=1"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["set"], r["spec"], r["n"]) for r in rows] == [(str(path), str(path), 8), ("arith", "arith:count=5,seed=1", 5)]
    for r in rows:
        assert 0 <= r["pass@1"] <= r["pass@2"] <= r["pass@4"] <= 1 and r["mean@4"] == pytest.approx(r["pass@1"])
    assert 0 < rows[0]["pass@4"]  # about half the samples pass the length rule


@pytest.mark.slow
def test_training_logs_pass_at_k_for_every_set_and_keeps_them_in_eval_json(tmp_path, length_rule_grader):
    path = math_parquet(tmp_path / "math.parquet", 12)
    assert main([*TINY_ARGS, "--serial", "--tasks", str(path), "--task-fields", "question=problem,answer=solution",
                 "--eval-tasks", "arith:count=4,seed=7", "--eval-set", "pq=" + str(path), "--eval-samples", "2",
                 "--max-steps", "2", "--eval-every", "1", "--output-dir", str(tmp_path), "--run-name", "e"]) == 0
    scalars = read_scalars(tmp_path / "e")
    for tag in ["eval/success_rate", "eval/pass@1", "eval/pass@2", "eval/mean@2", "eval/pq/success_rate",
                "eval/pq/pass@2", "eval/pq/mean@2"]:
        assert [s for s, _ in scalars[tag]] == [0, 1, 2], tag
    summary = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert set(summary["before"]["sets"]) == {"pq"} and summary["after"]["sets"]["pq"]["n"] == 4  # --eval-limit 4
    assert "pass@2" in summary["after"] and "gain" in summary


def test_launch_eval_refuses_bad_eval_flags_before_the_model_loads(capsys, tmp_path):
    path = math_parquet(tmp_path / "math.parquet")
    assert evaluation.main(["--model", "no-such-model", "--eval-samples", "2", "--eval-k", "4"]) == 2
    assert "eval_k: each k must be in 1..2 (--eval-samples), got [4]" in capsys.readouterr().err
    assert evaluation.main(["--model", "no-such-model", "--tasks", str(path), "--task-fields", "question=nope"]) == 2
    assert "column 'nope' (--task-fields question=nope) not found" in capsys.readouterr().err


@pytest.mark.slow
def test_launch_eval_gives_pass_at_k_on_an_adapters_envs(monkeypatch, capsys):
    """launch/eval.py --env reasoning-gym:... and --env textarena:...: greedy and sampled rows on their own task
    specs (the rg score replaced by a length rule, so that some samples pass and some fail)."""
    import nanorllm.envs.reasoning_gym as rg_env

    monkeypatch.setattr(rg_env, "extract", lambda response, answer_format: response)
    monkeypatch.setattr(rg_env, "score", lambda task, answer: float(len(answer) % 2))

    for env, tasks, turns in [("reasoning-gym:basic_arithmetic", "rg:basic_arithmetic,size=6,seed=3", "1"),
                              ("textarena:GuessTheNumber-v0", "ta:count=3,seed=5", "3")]:
        rc = evaluation.main(["--model", "tiny-random", "--env", env, "--tasks", tasks, "--eval-samples", "4",
                               "--max-turns", turns, "--max-new-tokens", "6"])
        assert rc == 0, env
        (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert row["n"] == int(tasks.split("size=" if "size=" in tasks else "count=")[1].split(",")[0]), env
        assert 0 <= row["pass@1"] <= row["pass@2"] <= row["pass@4"] <= 1 and row["mean@4"] == pytest.approx(row["pass@1"])
        if env.startswith("reasoning-gym"):
            assert 0 < row["pass@1"] < 1 and row["pass@4"] > row["pass@1"]  # the length rule passes some samples
