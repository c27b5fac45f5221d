"""A failed score is not a zero: whichever reward source could not score an episode (it raised, timed out, gave nan
or inf), that episode leaves its group, which trains on the rest or is dropped below --min-group-size, and is
counted per source in reward/failed/<name>; past --max-skipped-frac the run stops."""

import json
import math
import textwrap

import pytest

from nanorllm.algos.advantages import compute_advantage
from nanorllm.algos.groups import drop_failed, group_by_task_id
from nanorllm.config import parse_config
from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.math_env import MathSelfRefine
from nanorllm.envs.scored import RewardBundle
from nanorllm.rewards.functions import load_reward_functions
from nanorllm.run.lifecycle import main
from nanorllm.trainer.metrics import rollout_metrics
from tests.procs import read_scalars
from tests.runs import TINY_ARGS

SOURCES = textwrap.dedent('''
    import math, time

    def by_length(completions, **kw):
        return [float(len(c)) for c in completions]

    def nan_for_b(completions, task_id, **kw):  # no finite score for task b's second episode
        return [math.inf if (t, c) == ("b", "r1") else 1.0 for t, c in zip(task_id, completions)]

    def raises(completions, **kw):
        raise ConnectionError("the grader is down")

    def sleepy(completions, **kw):  # returns long after the tests' limit
        time.sleep(3600)
        return [1.0] * len(completions)

    calls = [0]

    def half_fail(completions, **kw):  # call 1: nan for every other episode; call 2: raises; then scores
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("the judge is down")
        return [math.nan if calls[0] == 1 and i % 2 else float(sum(map(ord, c)) % 2) for i, c in enumerate(completions)]

    def always_raises(completions, **kw):
        raise RuntimeError("never scores")
''')


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.py"
    path.write_text(SOURCES)
    return str(path)


def group(task_id: str, responses: list[str]) -> list[RolloutResult]:
    out = []
    for k, text in enumerate(responses):
        task = {"task_id": task_id, "question": f"q{task_id}", "answer": "1"}
        traj = Trajectory(task_id=task_id, task=task, termination_reason="max_turns",
                          steps=[Step(observation="q", model_response=text)])
        out.append(RolloutResult(trajectory=traj, group_id=task_id, step_samples=[StepSample(
            task_id=task_id, episode_id=f"{task_id}#{k}", turn=0, prompt_ids=[1], response_ids=[7],
            rollout_logprobs=[0.0])]))
    return out


def bundle(sources, names, timeout_s=30.0):
    return RewardBundle(MathSelfRefine(EpisodeSettings()),
                        load_reward_functions(tuple(f"{sources}:{n}" for n in names), timeout_s=timeout_s), "replace")


def test_a_group_with_one_failed_episode_trains_on_the_other_three_its_advantage_over_three(sources):
    batch = group("a", ["x", "xx", "xxx", "xxxx"]) + group("b", ["r0", "r1", "r2", "r3"])
    bundle(sources, ["by_length", "nan_for_b"]).score_batch(batch)
    failed = batch[5]
    assert failed.trajectory.termination_reason == "reward_failed"
    assert failed.trajectory.steps[-1].info["reward_failed"] == ["nan_for_b"]
    kept, short, dropped = drop_failed(batch)
    assert (len(kept), short, dropped) == (7, 1, 0)
    compute_advantage(group_by_task_id(kept))
    rewards = [3.0, 3.0, 3.0]  # b's three: len("rN") + 1.0 each, a constant group: advantage 0
    assert [r.reward for r in kept[4:]] == rewards and all(r.step_samples[0].advantage == 0.0 for r in kept[4:])
    a = [r.step_samples[0].advantage for r in kept[:4]]  # a's rewards 2, 3, 4, 5: mean 3.5, population std
    std = math.sqrt(sum((x - 3.5) ** 2 for x in (2, 3, 4, 5)) / 4)
    assert a == pytest.approx([(x - 3.5) / (std + 1e-6) for x in (2, 3, 4, 5)])
    kept_b = [r for r in kept if r.task_id == "b"]
    for r, reward in zip(kept_b, (1.0, 0.0, 2.0)):  # other rewards: centred and scaled over three, not four
        r.trajectory.final_reward = reward
    compute_advantage(group_by_task_id(kept_b))
    assert [r.step_samples[0].advantage for r in kept_b] == pytest.approx([0.0, -1.2247, 1.2247], abs=1e-3)


def test_a_group_with_three_failed_of_four_is_dropped_and_min_group_size_raises_the_bar():
    batch = group("a", ["1", "2", "3", "4"]) + group("b", ["1", "2", "3", "4"])
    for r in batch[:3]:
        r.trajectory.termination_reason = "reward_failed"
    batch[4].trajectory.termination_reason = "reward_failed"
    batch[5].trajectory.termination_reason = "error"  # an env error and a failed score: both failed
    kept, short, dropped = drop_failed(batch)
    assert (kept, short, dropped) == (batch[6:], 1, 1)
    assert drop_failed(batch, min_group_size=3) == ([], 0, 2)


def test_min_group_size_is_a_flag_checked_to_be_at_least_two_and_at_most_the_group():
    assert parse_config(["--min-group-size", "3"]).min_group_size == 3
    for bad, why in [("1", "must be >= 2"), ("9", r"is more than num_samples_per_task \(8\)")]:
        with pytest.raises(Exception, match=why):
            parse_config(["--min-group-size", bad])


@pytest.mark.parametrize("name, failed", [("raises", 8), ("nan_for_b", 1), ("sleepy", 8)])
def test_each_way_a_function_fails_marks_its_episodes_and_counts_them_in_the_steps_scalars(sources, name, failed,
                                                                                          capsys):
    batch = group("a", ["r0", "r1", "r2", "r3"]) + group("b", ["r0", "r1", "r2", "r3"])
    b = bundle(sources, [name, "by_length"])
    b.sources.functions[0].timeout_s = 0.2  # the failing one's; by_length keeps 30 s for the rest on a busy box
    b.score_batch(batch)
    lost = [r for r in batch if r.trajectory.termination_reason == "reward_failed"]
    assert len(lost) == failed and all(r.trajectory.steps[-1].info["reward_failed"] == [name] for r in lost)
    assert all("reward/by_length" not in r.trajectory.steps[-1].info for r in lost)  # the next source skipped them
    m = rollout_metrics(batch, env=b)
    assert m[f"reward/failed/{name}"] == failed and m["reward/failed/by_length"] == 0
    assert m["episode/termination/reward_failed"] == failed / 8
    assert m["rollout/env_errors"] == 0  # the env's own failures only
    assert f"reward/failed/{name}" in capsys.readouterr().err


def test_a_reward_model_that_fails_marks_the_batch_or_the_episode(tmp_path):
    from nanorllm.rewards.model import RewardModel

    class Broken(RewardModel):
        def raw_scores(self, pairs):
            if pairs[0][1] == "down":
                raise RuntimeError("CUDA error: device-side assert")
            return [math.nan if r == "bad" else 1.0 for _, r in pairs]

    down = group("a", ["down", "x"])
    b = RewardBundle(MathSelfRefine(EpisodeSettings()), [Broken(path="rm")], "replace")
    b.score_batch(down)
    assert [r.trajectory.steps[-1].info.get("reward_failed") for r in down] == [["model"], ["model"]]
    some = group("a", ["ok", "bad", "ok"])
    b.score_batch(some)
    assert [r.trajectory.termination_reason for r in some] == ["max_turns", "reward_failed", "max_turns"]
    assert rollout_metrics(down + some, env=b)["reward/failed/model"] == 3


@pytest.mark.slow
def test_a_run_whose_function_fails_half_its_calls_finishes_and_counts_every_failure(sources, tmp_path):
    assert main([*TINY_ARGS, "--serial", "--reward", f"{sources}:half_fail", "--max-steps", "3", "--eval-tasks", "",
                 "--num-samples-per-task", "4",
                 "--lr", "1e-3", "--no-drop-zero-std-groups", "--output-dir", str(tmp_path), "--run-name", "h"]) == 0
    scalars = read_scalars(tmp_path / "h")
    assert [v for _, v in scalars["reward/failed/half_fail"]] == [8, 16, 0]  # 4 tasks x 4 samples a step
    assert [v for _, v in scalars["rollout/groups_short"]] == [4, 0, 0]  # each trained on its 2 scored episodes
    assert [v for _, v in scalars["rollout/groups_dropped"]] == [0, 4, 0]
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0, 0]
    assert [v for _, v in scalars["train/env_error_steps_total"]] == [0, 1, 1]
    assert [v for _, v in scalars["train/samples"]][0] == 8
    dumped = [json.loads(x) for x in (tmp_path / "h" / "rollouts.jsonl").read_text().splitlines()]
    marked = [d for d in dumped if d.get("reward_failed")]
    assert len(marked) == 24 and all(d["termination_reason"] == "reward_failed" for d in marked)


@pytest.mark.slow
def test_a_run_whose_scores_all_fail_stops_past_max_skipped_frac(sources, tmp_path, capsys):
    rc = main([*TINY_ARGS, "--serial", "--reward", f"{sources}:always_raises", "--max-steps", "3", "--eval-tasks", "",
               "--max-skipped-frac", "0.3", "--output-dir", str(tmp_path), "--run-name", "s"])
    assert rc == 1
    assert "updates trained nothing" in capsys.readouterr().err
