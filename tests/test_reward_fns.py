"""--reward functions in TRL's and verl's shapes: what they are passed, how they combine with an env's reward,
what happens when they fail, and real runs (serial and with a worker) scored by them."""

import json
import math
import re
import textwrap
import time

import pytest

from nanorllm.faultsuite.process import PIPELINE
from nanorllm.config import ConfigError, parse_config
from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.math_env import MathSelfRefine
from nanorllm.envs.scored import RewardBundle
from nanorllm.rewards.functions import RewardFunctionError, load_reward_functions
from nanorllm.run.lifecycle import main
from nanorllm.run.world import world_problems
from nanorllm.trainer.watchdog import Hung
from tests.procs import read_scalars
from tests.runs import TINY_ARGS


REWARDS = textwrap.dedent('''
    seen = []

    def trl_plain(completions, answer):
        seen.append(("trl_plain", list(completions), list(answer)))
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    def trl_all(completions, prompts, completion_ids, **columns):
        seen.append(("trl_all", prompts, completion_ids, sorted(columns)))
        return [0.5] * len(completions)

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(("verl", data_source, solution_str, ground_truth, extra_info["level"]))
        return {"score": 2.0}

    def short(completions, **kw):
        return [1.0]

    def nan(completions, **kw):
        return [float("nan")] * len(completions)

    def text(completions, **kw):
        return ["one"] * len(completions)

    calls = [0]

    def flaky(completions, **kw):
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the judge is down")
        return [float(len(c) % 2) for c in completions]

    def wrong(text, gold):
        return [0.0]

    import time

    def sleepy(completions, **kw):  # returns long after any limit a test sets
        time.sleep(3600)
        return [1.0] * len(completions)

    hangs = [0]

    def hang_once(completions, **kw):  # the first call never returns; later ones score
        hangs[0] += 1
        if hangs[0] == 1:
            time.sleep(3600)
        return [float(len(c) % 2) for c in completions]
''')


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return str(path)


def episode(response: str, answer: str, env_reward: float = 0.0, reason: str = "max_turns") -> RolloutResult:
    task = {"task_id": f"t{answer}", "question": f"q{answer}", "answer": answer, "level": "easy"}
    steps = [Step(observation="q", model_response="first", reward=0.0),
             Step(observation="retry", model_response=response, reward=env_reward)]
    traj = Trajectory(task_id=task["task_id"], steps=steps, final_reward=env_reward, termination_reason=reason,
                      task=task)
    samples = [StepSample(task_id=task["task_id"], episode_id="e", turn=i, prompt_ids=[1], response_ids=[7, i],
                          rollout_logprobs=[0.0, 0.0]) for i in range(2)]
    return RolloutResult(trajectory=traj, step_samples=samples)


def bundle(rewards_file, names, mode="add", weights=()):
    fns = load_reward_functions(tuple(f"{rewards_file}:{n}" for n in names), weights)
    return RewardBundle(MathSelfRefine(EpisodeSettings()), fns, mode)


def test_trl_and_verl_functions_get_what_their_signatures_ask_for(rewards_file):
    b = bundle(rewards_file, ["trl_plain", "trl_all", "compute_score"])
    import sys
    seen = next(m for n, m in sys.modules.items() if n.startswith("nanorllm_user_env_my_rewards")).seen
    seen.clear()
    b.score_batch([episode("it is 4", "4"), episode("it is 5", "6")])
    assert seen[0] == ("trl_plain", ["it is 4", "it is 5"], ["4", "6"])
    assert seen[1] == ("trl_all", ["q4", "q6"], [[7, 1], [7, 1]], ["answer", "level", "question", "task_id"])
    assert seen[2:] == [("verl", "math", "it is 4", "4", "easy"), ("verl", "math", "it is 5", "6", "easy")]


def test_add_puts_the_weighted_sum_on_the_env_reward_and_replace_takes_its_place(rewards_file):
    added = [episode("it is 4", "4", env_reward=1.0, reason="correct"), episode("no", "6")]
    bundle(rewards_file, ["trl_plain", "trl_all"], "add", (2.0, 1.0)).score_batch(added)
    assert [r.reward for r in added] == [1.0 + 2.0 + 0.5, 0.0 + 0.0 + 0.5]
    assert [s.reward for s in added[0].step_samples] == [3.5, 3.5]  # what the advantage reads
    assert added[0].trajectory.steps[-1].info == {"reward/trl_plain": 1.0, "reward/trl_all": 0.5}
    replaced = [episode("it is 4", "4", env_reward=1.0), episode("no", "6", env_reward=1.0)]
    b = bundle(rewards_file, ["trl_plain"], "replace")
    b.score_batch(replaced)
    assert [r.reward for r in replaced] == [1.0, 0.0]
    assert b.metrics(replaced) == {"reward/trl_plain": 0.5, "reward/failed/trl_plain": 0}


def test_a_wrong_length_or_a_value_that_is_no_number_is_an_error_naming_the_function(rewards_file):
    with pytest.raises(RewardFunctionError, match=r"my_rewards.py:short: returned 1 values for a batch of 2"):
        bundle(rewards_file, ["short"]).score_batch([episode("a", "1"), episode("b", "2")])
    with pytest.raises(RewardFunctionError, match=r"my_rewards.py:text: value 0 is 'one', not a number or None"):
        bundle(rewards_file, ["text"]).score_batch([episode("a", "1")])


def test_a_non_finite_value_is_a_failed_score_for_that_episode_not_an_error(rewards_file):
    batch = [episode("a", "1")]
    bundle(rewards_file, ["nan"]).score_batch(batch)
    assert batch[0].trajectory.termination_reason == "reward_failed"
    assert batch[0].trajectory.steps[-1].info["reward_failed"] == ["nan"]


def test_a_function_that_raises_fails_the_scores_of_the_batch(rewards_file, capsys):
    batch = [episode("a", "1"), episode("b", "2")]
    bundle(rewards_file, ["flaky"]).score_batch(batch)
    assert [r.trajectory.termination_reason for r in batch] == ["reward_failed", "reward_failed"]
    assert "the judge is down" in capsys.readouterr().err


def test_a_function_past_its_timeout_fails_the_scores_of_the_batch_naming_it(rewards_file, capsys):
    fns = load_reward_functions((f"{rewards_file}:sleepy", f"{rewards_file}:trl_all"), timeout_s=0.2)
    b = RewardBundle(MathSelfRefine(EpisodeSettings()), fns)
    heard = []
    batch = [episode("a", "1"), episode("b", "2")]
    t0 = time.monotonic()
    b.score_batch(batch, watch=heard.append)
    assert 0.2 <= time.monotonic() - t0 < 60  # abandoned at the limit, not waited for
    assert [r.trajectory.termination_reason for r in batch] == ["reward_failed", "reward_failed"]
    assert heard == [f"reward function {rewards_file}:sleepy"]  # nothing left for the next function to score
    err = capsys.readouterr().err
    assert f"reward function {rewards_file}:sleepy did not return within --reward-timeout-s 0.2 s" in err
    assert "counted in reward/failed/sleepy" in err
    fast = [episode("a", "1")]
    RewardBundle(MathSelfRefine(EpisodeSettings()), load_reward_functions((f"{rewards_file}:trl_all",),
                                                                          timeout_s=30)).score_batch(fast)
    assert fast[0].reward == 0.5  # a call within the limit scores as before


def test_hang_reports_name_the_reward_function_that_is_running(rewards_file):
    from nanorllm.pipeline.heartbeat import Heartbeat
    from nanorllm.trainer.watchdog import Watchdog

    spec = f"{rewards_file}:sleepy"
    hb = Heartbeat(1, env_name="math", reward_names=(spec,))
    hb.doing(0, f"reward function {spec}", "3.0")
    assert hb.describe(0, {"3.0": ["t0", "t1"]}) == f"reward function {spec} (job 3.0)"
    hb.doing(0, "grading", "3.0", 1)
    assert hb.describe(0, {"3.0": ["t0", "t1"]}) == "grading (job 3.0, task t1) in the env math"

    class Engine:
        on_step = watch = None

    b = RewardBundle(MathSelfRefine(EpisodeSettings()), load_reward_functions((spec,), timeout_s=5))
    with pytest.raises(Hung, match=rf"serial rollout hung: .* while reward function {re.escape(spec)}$"):
        with Watchdog("serial rollout", 0.5, grace_s=10, poll_s=0.05, env_name="math") as dog:
            engine = Engine()
            dog.follow(engine, [{"task_id": "t0"}])
            b.score_batch([episode("a", "1")], watch=lambda activity: engine.watch(activity, -1))


@pytest.mark.parametrize("flags, expected", [
    (["--reward", "{f}:wrong"], "reward: '{f}:wrong': wrong(text, gold) has neither TRL's signature"),
    (["--reward", "{f}:missing"], "reward: '{f}:missing': '{f}' has no function 'missing'"),
    (["--reward", "nope.py:fn"], "not found"),
    (["--reward", "{f}:trl_plain", "--reward-weights", "1", "2"], "reward_weights: 2 weight(s) for 1 --reward"),
    (["--reward", "{f}:trl_plain", "--reward-mode", "mul"], "reward_mode: must be 'add' or 'replace', got 'mul'"),
    (["--reward", "{f}:trl_plain", "--reward-timeout-s", "0"], "reward_timeout_s: must be > 0, got 0.0"),
])
def test_bad_reward_flags_are_refused_at_start(rewards_file, tmp_path, capsys, flags, expected):
    flags = [f.replace("{f}", rewards_file) for f in flags]
    assert main([*TINY_ARGS, "--serial", *flags, "--output-dir", str(tmp_path / "out")]) == 2
    assert expected.replace("{f}", rewards_file) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_reward_functions_without_an_env_make_a_single_turn_run_and_an_env_given_stays(rewards_file):
    assert parse_config(["--reward", f"{rewards_file}:trl_plain"]).env == "single"
    assert parse_config(["--reward", f"{rewards_file}:trl_plain", "--env", "math"]).env == "math"
    assert parse_config([]).env == "math"
    with pytest.raises(ConfigError):
        parse_config(["--reward", f"{rewards_file}:wrong"], world=world_problems)


@pytest.mark.slow
def test_a_serial_run_scored_by_a_function_that_fails_once_drops_that_step_and_trains_on(rewards_file, tmp_path):
    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards_file}:flaky", "--max-steps", "3", "--eval-tasks", "",
                 "--lr", "1e-3", "--no-drop-zero-std-groups", "--output-dir", str(tmp_path), "--run-name", "f"]) == 0
    scalars = read_scalars(tmp_path / "f")
    assert scalars["reward/failed/flaky"][0] == (1, 8.0)  # 4 tasks x 2 samples of the first batch
    assert [s for s, _ in scalars["reward/flaky"]] == [2, 3]
    assert all(0 <= v <= 1 for _, v in scalars["reward/flaky"])
    assert json.loads((tmp_path / "f" / "config.json").read_text())["env"] == "single"


@pytest.mark.slow
def test_a_worker_imports_the_reward_file_and_its_scores_reach_the_learner(rewards_file, tmp_path):
    assert main([*TINY_ARGS, *PIPELINE, "--num-workers", "1", "--reward", f"{rewards_file}:trl_all",
                 "--env", "math", "--reward-mode", "replace", "--max-steps", "2", "--eval-tasks", "",
                 "--output-dir", str(tmp_path), "--run-name", "w"]) == 0
    scalars = read_scalars(tmp_path / "w")
    assert scalars["reward/trl_all"] == [(1, 0.5), (2, 0.5)]
    assert [v for _, v in scalars["reward/mean"]] == [0.5, 0.5]  # replace: the math env's 0/1 is gone
    assert not math.isnan(scalars["loss/policy"][0][1])


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]], ids=["serial", "worker"])
def test_a_run_whose_function_hangs_once_drops_that_batch_at_the_timeout_and_trains_on(rewards_file, tmp_path, mode):
    from tests.procs import processes_with_token, run_train

    rc, out, token = run_train([*mode, "--reward", f"{rewards_file}:hang_once", "--reward-timeout-s", "1",
                                "--max-steps", "2", "--eval-tasks", "", "--no-drop-zero-std-groups",
                                "--run-name", "h"], tmp_path)
    assert rc == 0, out[-3000:]
    assert f"reward function {rewards_file}:hang_once did not return within --reward-timeout-s 1 s" in out
    scalars = read_scalars(tmp_path / "h")
    assert sum(v for _, v in scalars["reward/failed/hang_once"]) == 8  # the first batch: 4 tasks x 2 samples
    assert [s for s, _ in scalars["reward/hang_once"]] == [2]  # the second batch is scored
    deadline = time.monotonic() + 60
    while processes_with_token(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with_token(token)  # the abandoned call held up no exit


# ---- the reward sources' registry ---------------------------------------------------------------------

def test_a_registered_reward_source_scores_through_the_env_assembly_with_the_built_in_ones(rewards_file, monkeypatch):
    from dataclasses import dataclass

    from nanorllm.envs.registry import EnvSpec, load_bundle
    from nanorllm.rewards import sources
    from nanorllm.rewards.functions import RewardFunctionsSpec

    import nanorllm.rewards.judge  # noqa: F401  (each source registers when its module is imported)
    import nanorllm.rewards.model  # noqa: F401

    assert {"functions", "reward_model", "judge"} <= set(sources.REWARD_SOURCES)
    monkeypatch.setattr(sources, "REWARD_SOURCES", dict(sources.REWARD_SOURCES))

    @dataclass(frozen=True)
    class LengthSpec:
        weight: float = 1.0

    class Length:
        name, spec = "length", "length"

        def __init__(self, weight):
            self.weight = weight

        def __call__(self, results, env_name):
            return [float(len(r.trajectory.steps[-1].model_response)) for r in results]

    sources.register_reward_source("length", LengthSpec, lambda spec: [Length(spec.weight)],
                                   lambda spec: [] if spec.weight else ["length: weight 0"])
    assert sources.reward_source_problems((LengthSpec(0.0), LengthSpec())) == ["length: weight 0"]
    with pytest.raises(ValueError, match="'length' .* is registered already"):
        sources.register_reward_source("length", RewardFunctionsSpec, lambda spec: [])
    spec = EnvSpec(reward_sources=(RewardFunctionsSpec(specs=(f"{rewards_file}:trl_plain",)), LengthSpec(0.5)))
    b = load_bundle(spec)
    scored = [episode("it is 4", "4"), episode("no", "6")]
    b.score_batch(scored)
    assert [r.reward for r in scored] == [1.0 + 0.5 * 7, 0.0 + 0.5 * 2]
    with pytest.raises(TypeError, match="no reward source is registered for a float"):
        load_bundle(EnvSpec(reward_sources=(1.0,)))


def test_each_source_says_what_its_scorers_are_called_for_a_hang_report():
    from nanorllm.pipeline.heartbeat import REWARD, Heartbeat
    from nanorllm.rewards.functions import RewardFunctionsSpec
    from nanorllm.rewards.judge import JudgeSpec
    from nanorllm.rewards.model import RewardModelSpec
    from nanorllm.rewards.sources import reward_source_names

    specs = (RewardFunctionsSpec(specs=("a.py:f", "b.py:g")), RewardModelSpec(path="/rm"),
             JudgeSpec(target="http://judge:8000/v1"))
    names = reward_source_names(specs)
    assert names == ["a.py:f", "b.py:g", "/rm", "http://judge:8000/v1"]  # in the order they score
    beat = Heartbeat(1, env_name="math", reward_names=tuple(names))
    beat.doing(0, f"{REWARD} http://judge:8000/v1")  # what the engine's watch hears while the judge scores
    assert beat.describe(0) == f"{REWARD} http://judge:8000/v1"


def test_a_source_with_its_own_config_group_is_read_off_any_program_that_composes_it(monkeypatch):
    from dataclasses import dataclass

    import tyro

    from nanorllm.config import TrainConfig
    from nanorllm.rewards import sources
    from nanorllm.rewards.functions import RewardFunctionsSpec
    from nanorllm.rewards.judge import JudgeSpec
    from nanorllm.trainer.eval_model import EvalConfig

    monkeypatch.setattr(sources, "REWARD_SOURCES", dict(sources.REWARD_SOURCES))

    @dataclass
    class LengthSettings:
        length_weight: float = 0.0
        """Weight of a response's length in the reward (0: off)."""

    @dataclass(frozen=True)
    class LengthSpec:
        weight: float

    sources.register_reward_source("length", LengthSpec, lambda spec: [], settings=LengthSettings,
                                   from_settings=lambda s: LengthSpec(s.length_weight) if s.length_weight else None)

    @dataclass
    class LengthConfig(TrainConfig, LengthSettings):  # the last base's fields come first
        pass

    cfg = tyro.cli(LengthConfig, args=["--length-weight", "0.5", "--reward", "f.py:g", "--judge", "http://j/v1"])
    assert [type(s) for s in sources.reward_source_specs(cfg)] == [LengthSpec, RewardFunctionsSpec, JudgeSpec]
    assert sources.reward_source_specs(cfg)[0] == LengthSpec(0.5)
    assert [type(s) for s in sources.reward_source_specs(LengthConfig(reward=("f.py:g",)))] == [RewardFunctionsSpec]
    # a program that does not compose a group names none of its source, even given a field of the same name
    assert sources.reward_source_specs(EvalConfig(judge="http://j/v1")) == (JudgeSpec(target="http://j/v1"),)
    assert sources.reward_source_specs(TrainConfig()) == ()
