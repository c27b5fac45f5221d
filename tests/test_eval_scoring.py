"""Held-out numbers are computed on the data they name: an episode whose score failed is left out of every rate and
counted beside it (greedy, pass@k, mean@n, launch/eval.py), and a user's own --tasks without --eval-tasks are
evaluated on a seeded share of themselves, never on another env's set."""

import json
import math
import textwrap

import pytest

from nanorllm.config import parse_config
from nanorllm.config.specs import env_spec
from nanorllm.datasets.holdout import held_out, parse_holdout
from nanorllm.envs.registry import load_bundle
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.run import evaluation
from nanorllm.run.assembly import assemble
from nanorllm.run.lifecycle import main
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model, with_run_settings
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled
from tests.runs import TINY_ARGS

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


def test_held_out_counts_each_reward_sources_failed_scores_over_every_episode(rewards, task_file):
    env = single_turn_bundle(rewards)
    out = evaluate(HFCausalPolicy.from_name("tiny-random"), env.load_tasks(task_file),
                   sampling=SamplingParams(max_new_tokens=2), env=env)
    assert (out["failed"], out["reward/failed/fails_on_odd"], out["reward/fails_on_odd"]) == (3, 3, 1.0)


def test_pass_at_k_and_mean_at_n_count_each_tasks_scored_samples_only(rewards, task_file):
    env = single_turn_bundle(rewards)
    policy = HFCausalPolicy.from_name("tiny-random")
    sampling = SamplingParams(max_new_tokens=2, temperature=1.0)
    out = evaluate_sampled(policy, env.load_tasks(task_file), sampling=sampling, env=env, samples=2)
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


def strict_json(line: str):
    """The JSON of `line`, refusing NaN and Infinity, which JSON has no word for."""
    return json.loads(line, parse_constant=lambda word: pytest.fail(f"{word} is not JSON: {line}"))


NOT_SCORED = "no episode was scored (2 not scored: the env raised or a reward source failed)"


def test_launch_eval_writes_a_rate_over_no_scored_episode_as_null_and_says_why(rewards, tmp_path, capsys):
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"Say {i}."}) + "\n" for i in (1, 3)))
    assert evaluation.main(["--model", "tiny-random", "--env", "single", "--reward", rewards, "--tasks", str(path),
                            "--max-new-tokens", "2", "--eval-samples", "2"]) == 0
    (row,) = [strict_json(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["success_rate"], row["mean_reward"], row["pass@1"], row["mean@2"], row["n"]) == (None,) * 4 + (0,)
    assert row["why_null"]["success_rate"] == NOT_SCORED
    assert row["why_null"]["pass@1"] == "no task had 1 scored samples (4 sampled episodes not scored)"
    assert row["reward/failed/fails_on_odd"] == 2


def rows(n: int) -> list[dict]:
    return [{"task_id": f"u{i}", "question": f"Say {i}."} for i in range(n)]


def test_a_held_out_share_depends_on_each_tasks_id_alone_and_is_never_empty():
    chosen = {r["task_id"] for r in held_out(rows(400), 0.1, 0)}
    assert 25 <= len(chosen) <= 55  # about a tenth
    assert {r["task_id"] for r in held_out(rows(400)[::-1], 0.1, 0)} == chosen  # order does not matter
    assert {r["task_id"] for r in held_out(rows(200), 0.1, 0)} == {t for t in chosen if int(t[1:]) < 200}  # growth
    assert {r["task_id"] for r in held_out(rows(400), 0.1, 1)} != chosen  # the seed does
    assert len(held_out(rows(3), 0.1, 0)) == 1


@pytest.mark.parametrize("spec", ["holdout:frac=1.5:x.jsonl", "holdout:frac=0.1", "holdout:size=3:x.jsonl"])
def test_a_bad_holdout_spec_names_its_form(spec):
    with pytest.raises(ValueError, match="expected holdout:frac=F,seed=S:SPEC"):
        parse_holdout(spec)


def users_file(tmp_path, n: int = 40) -> str:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    return str(path)


def test_a_users_own_tasks_without_eval_tasks_are_evaluated_on_a_share_of_themselves_left_out_of_training(
        rewards, tmp_path):
    path = users_file(tmp_path)
    parts = assemble(parse_config(["--env", "single", "--reward", rewards, "--tasks", path, "--model", "tiny-random"]))
    held = {t["task_id"] for t in parts.eval_tasks}
    assert parts.cfg.eval_tasks == f"holdout:frac=0.1,seed=0:{path}"  # what config.json records
    assert held == {r["task_id"] for r in held_out(rows(40), 0.1, 0)} and held  # the user's tasks, not arith:...
    assert not held & {t["task_id"] for t in parts.train_tasks} and len(parts.train_tasks) == 40 - len(held)
    assert parts.dropped_heldout == len(held)


@pytest.mark.parametrize("own_tasks", [False, True])
def test_the_training_set_is_the_same_whatever_eval_limit_and_leaves_out_the_whole_held_out_set(own_tasks, rewards,
                                                                                                 tmp_path):
    args = ["--env", "single", "--reward", rewards, "--tasks", users_file(tmp_path, 200)] if own_tasks else []
    whole, *limited = [assemble(parse_config([*args, "--model", "tiny-random", *limit]))
                       for limit in ([], ["--eval-limit", "2"], ["--eval-limit", "7"])]
    held = [t["task_id"] for t in whole.eval_tasks]
    trained = [t["task_id"] for t in whole.train_tasks]
    assert held and not set(held) & set(trained)
    for parts, n in zip(limited, (2, 7)):
        assert [t["task_id"] for t in parts.train_tasks] == trained and parts.dropped_heldout == whole.dropped_heldout
        assert [t["task_id"] for t in parts.eval_tasks] == held[:n]


@pytest.mark.slow
def test_a_reward_run_on_its_own_tasks_reports_held_out_success_on_them_and_launch_eval_agrees(tmp_path,
                                                                                                monkeypatch):
    path, scorer = users_file(tmp_path), tmp_path / "always.py"
    scorer.write_text("def always(completions, **kw):\n    return [1.0] * len(completions)\n")
    out = tmp_path / "runs"
    assert main([*TINY_ARGS, "--serial", "--env", "single", "--reward", f"{scorer}:always", "--tasks", path,
                 "--eval-limit", "100", "--max-steps", "1", "--output-dir", str(out), "--run-name", "r"]) == 0
    held = held_out(rows(40), 0.1, 0)
    summary = json.loads((out / "r" / "eval.json").read_text())
    assert (summary["after"]["n"], summary["after"]["failed"], summary["after"]["success_rate"]) == (len(held), 0, 1.0)
    trained = {json.loads(line)["task_id"] for line in (out / "r" / "rollouts.jsonl").read_text().splitlines()}
    assert trained and not trained & {t["task_id"] for t in held}
    result = evaluate_model(with_run_settings(EvalConfig(model=str(out / "r" / "final_model")), set())[0])
    assert (result["n"], result["success_rate"]) == (len(held), 1.0)  # the same held-out tasks


@pytest.mark.slow
def test_a_run_whose_held_out_scores_all_fail_counts_them_and_writes_eval_json_with_nulls_and_why(rewards, tmp_path,
                                                                                                   capsys):
    even, odd = tmp_path / "even.jsonl", tmp_path / "odd.jsonl"
    for path, ids in ((even, (0, 2, 4, 6)), (odd, (1, 3))):
        path.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"Say {i}."}) + "\n" for i in ids))
    out = tmp_path / "runs"
    assert main([*TINY_ARGS, "--serial", "--env", "single", "--reward", rewards, "--tasks", str(even),
                 "--eval-tasks", str(odd), "--max-steps", "1", "--report-to", "jsonl", "--no-save-model",
                 "--output-dir", str(out), "--run-name", "r"]) == 0
    summary = strict_json((out / "r" / "eval.json").read_text())
    for when in ("before", "after"):
        assert (summary[when]["success_rate"], summary[when]["n"], summary[when]["failed"]) == (None, 0, 2)
        assert summary[when]["why_null"]["success_rate"] == NOT_SCORED
    assert summary["gain"] is None and summary["why_null"]["gain"] == "no success_rate before or after: no episode " \
                                                                      "was scored"
    rows = [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/reward/failed/fails_on_odd"] for r in rows if "eval/failed" in r] == [2, 2]
    assert "held-out success n/a -> n/a (n/a) on 0 tasks (2 failed to score, left out)" in capsys.readouterr().out
