"""Bring your own environment: --env specs, their refusal, env faults, rewards at any step, and the
example of docs/environments.md trained from a file outside the package, serial and in the pipeline."""

import json
import textwrap

import pytest

from helpers import ScriptedPolicy, doc_example
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP
from nanorllm.run.lifecycle import main
from nanorllm.algos.advantages import turn_returns
from nanorllm.algos.groups import drop_failed
from nanorllm.config import ConfigError, parse_config
from nanorllm.envs.base import EnvBundle, EpisodeSettings
from nanorllm.envs.math_env import DEFAULT_EVAL_TASKS, DEFAULT_TASKS
from nanorllm.config.specs import task_specs
from nanorllm.envs.registry import EnvSpecError, load_env
from nanorllm.run.world import world_problems
from nanorllm.pipeline.heartbeat import Heartbeat
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.eval_model import EvalConfig, evaluate_model
from tests.procs import ROOT, read_rollouts, read_scalars, run_train

DOC = ROOT / "docs" / "environments.md"


@pytest.fixture
def rhyme_file(tmp_path):
    """The 'Write your own environment' example of the docs, as a user would save it."""
    return doc_example(DOC, "## Write your own environment", tmp_path / "rhyme_env.py", max_lines=50)


def _module(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("from nanorllm.envs.base import EnvBundle\n" + textwrap.dedent(body))
    return str(path)


# ---- finding and refusing envs -------------------------------------------------------------------

def test_an_env_in_a_file_loads_by_path_with_typed_options(rhyme_file):
    env = load_env(f"{rhyme_file}:Rhymes", EpisodeSettings(max_turns=3), ["min_length=4"])
    assert (env.name, env.options) == ("rhymes", {"min_length": 4})
    tasks = env.load_tasks(env.default_tasks)
    held = env.load_tasks(env.default_eval_tasks)
    assert len(tasks) == 18 and len(held) == 6 and not {t["word"] for t in tasks} & {t["word"] for t in held}
    e = env.make_env()
    assert e.reset(held[0]).startswith("Say one word") and e.max_turns == 3 and e.min_length == 4


def test_builtin_names_and_module_paths_name_the_same_bundle():
    assert type(load_env("calc")) is type(load_env("nanorllm.envs.calc_env:CalculatorTool"))
    assert load_env().name == "math"


@pytest.mark.parametrize("spec, reason", [
    ("no.such.module:Env", "cannot import 'no.such.module': ModuleNotFoundError"),
    ("nanorllm.envs.calc_env:Nope", "has no 'Nope'"),
    ("nanorllm.envs.calc_env:CalcEnv", "is not an EnvBundle subclass"),
    ("calc_env_without_colon", "expected module.path:Name"),
    ("/no/such/file.py:Env", "not found")])
def test_a_bad_spec_is_refused_with_its_reason(spec, reason):
    with pytest.raises(EnvSpecError) as err:
        load_env(spec)
    assert repr(spec) in str(err.value) and reason in str(err.value)


def test_a_module_that_raises_and_a_class_missing_a_method_are_refused(tmp_path):
    broken = _module(tmp_path, "broken", "raise RuntimeError('half-written module')\n")
    with pytest.raises(EnvSpecError, match="RuntimeError: half-written module"):
        load_env(f"{broken}:Env")
    lame = _module(tmp_path, "lame", """
        class NoStep:
            def reset(self, task): return task["question"]
        class Lame(EnvBundle):
            env_class = NoStep
    """)
    with pytest.raises(EnvSpecError, match="Lame is missing NoStep.step"):
        load_env(f"{lame}:Lame")


def test_unknown_or_mistyped_env_args_list_the_valid_ones():
    with pytest.raises(EnvSpecError, match=r"unknown --env-arg 'max_char' \(valid: max_chars=100\)"):
        load_env("calc", env_args=["max_char=5"])
    with pytest.raises(EnvSpecError, match="expected an int"):
        load_env("calc", env_args=["max_chars=lots"])
    with pytest.raises(EnvSpecError, match="not key=value"):
        load_env("calc", env_args=["max_chars"])


def test_train_refuses_a_bad_env_before_any_model_loads(monkeypatch, capsys):
    def no_model(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("nanorllm.policy.hf_causal.HFCausalPolicy.from_name", no_model)
    assert main(["--env", "no.such.module:Env", "--serial"]) == 2
    assert "env: 'no.such.module:Env': cannot import" in capsys.readouterr().err
    assert main(["--env", "calc", "--env-arg", "colour=red", "--serial"]) == 2
    assert "unknown --env-arg 'colour' (valid: max_chars=100)" in capsys.readouterr().err


def test_env_and_its_args_come_from_a_config_file_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("env: calc\nenv_arg: {max_chars: 50}\n")
    cfg = parse_config(["--config", str(path)])
    assert (cfg.env, cfg.env_arg) == ("calc", ("max_chars=50",))
    cfg = parse_config(["--env", "calc", "--env-arg", "max_chars=7"])
    assert cfg.env_arg == ("max_chars=7",)


# ---- env faults and rewards ------------------------------------------------------------------------

class FlakyEnv:
    """Raises on a response containing BOOM; rewards 0.5 for 'half', 1.0 for 'done' (which ends it)."""

    def __init__(self, *, max_turns: int):
        self.max_turns = max_turns

    def reset(self, task):
        return task["question"]

    def step(self, response):
        if "BOOM" in response:
            raise ZeroDivisionError("the env divided by zero")
        if response == "done":
            return None, 1.0, True, {}
        return "go on", 0.5 if response == "half" else 0.0, False, {}


class Flaky(EnvBundle):
    env_class = FlakyEnv


def test_an_env_error_ends_only_its_episode_is_printed_once_and_leaves_its_group(capsys):
    tasks = [{"task_id": "a", "question": "qa"}, {"task_id": "b", "question": "qb"}]
    script = [["BOOM", "done", "done", "BOOM", "BOOM", "done"], ["done"]]
    engine = RolloutEngine(ScriptedPolicy(script), sampling=SamplingParams(), env=Flaky(EpisodeSettings(max_turns=3)))
    results = engine.run(tasks, num_samples=3).results
    reasons = [r.trajectory.termination_reason for r in results]
    assert reasons == ["error", "correct", "correct", "error", "error", "correct"]
    assert "the env divided by zero" in results[0].trajectory.steps[-1].info["error"]
    assert capsys.readouterr().err.count("ZeroDivisionError: the env divided by zero") == 1
    kept, short, dropped = drop_failed(results)
    assert (len(kept), short, dropped) == (2, 1, 1)  # group a trains on its 2 others; b has 1 left: dropped
    assert {r.trajectory.task_id for r in kept} == {"a"}


def test_rewards_at_any_step_are_kept_per_step_and_summed_for_the_episode():
    script = [["half"], ["nothing"], ["done"]]
    engine = RolloutEngine(ScriptedPolicy(script), sampling=SamplingParams(), env=Flaky(EpisodeSettings(max_turns=3)))
    (r,) = engine.run([{"task_id": "a", "question": "q"}]).results
    assert [s.reward for s in r.trajectory.steps] == [0.5, 0.0, 1.0]
    assert r.reward == 1.5 and all(s.reward == 1.5 for s in r.step_samples)
    assert r.trajectory.steps[1].observation == "go on"
    assert turn_returns(r, gamma=0.5) == [0.5 + 0.5 * (0.0 + 0.5 * 1.0), 0.5, 1.0]


def test_the_engine_ends_an_env_that_never_says_done_at_the_turn_limit():
    engine = RolloutEngine(ScriptedPolicy(lambda c, r, m: "again"), sampling=SamplingParams(),
                           env=Flaky(EpisodeSettings(max_turns=2)))
    (r,) = engine.run([{"task_id": "a", "question": "q"}]).results
    assert (len(r.step_samples), r.trajectory.termination_reason, r.trajectory.terminated) == (2, "max_turns", False)


def test_a_worker_stuck_in_the_env_is_described_with_the_env_name():
    hb = Heartbeat(1, env_name="./slow.py:Slow")
    hb.doing(0, "grading", "3.0", 1)
    assert hb.describe(0, {"3.0": ["t0", "t1"]}) == "grading (job 3.0, task t1) in the env ./slow.py:Slow"


# ---- training on an env from a file outside the package ------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_the_doc_example_trains_two_steps_from_a_file(tmp_path, rhyme_file, mode):
    rc, out, _ = run_train([*mode, "--env", f"{rhyme_file}:Rhymes", "--env-arg", "min_length=2", "--max-steps", "2",
                            "--run-name", "r", "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert "[env] rhymes" in out and "min_length=2" in out and "step 2/2" in out
    episodes = read_rollouts(tmp_path / "runs" / "r")
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES and all(e["task_id"].startswith("rhyme-") for e in episodes)
    assert [v for _, v in read_scalars(tmp_path / "runs" / "r")["rollout/env_errors"]] == [0, 0]
    saved = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())
    assert (saved["tasks"], saved["eval_tasks"]) == ("rhymes:train", "rhymes:eval")  # what it trained on


def test_task_fields_left_unset_are_the_envs_own_and_given_ones_win(rhyme_file, tmp_path):
    spec = f"{rhyme_file}:Rhymes"
    cfg = parse_config(["--env", spec])
    assert (cfg.tasks, cfg.eval_tasks) == (None, None)
    assert task_specs(cfg) == ("rhymes:train", "rhymes:eval")
    assert task_specs(parse_config(["--env", spec, "--tasks", "rhymes:eval"])) == (  # a share of the given tasks
        "rhymes:eval", "holdout:frac=0.1,seed=0:rhymes:eval")
    assert task_specs(parse_config(["--env", spec, "--tasks", "rhymes:eval", "--eval-tasks", ""])) == (
        "rhymes:eval", "")
    assert task_specs(parse_config([])) == (DEFAULT_TASKS, DEFAULT_EVAL_TASKS)  # math's own
    bare = _module(tmp_path, "bare", """
        class BareEnv:
            def __init__(self, *, max_turns): pass
            def reset(self, task): return task["question"]
            def step(self, response): return None, 0.0, True, {}
        class Bare(EnvBundle):
            env_class = BareEnv
    """) + ":Bare"
    with pytest.raises(ConfigError, match=r"tasks: the env .*bare.py:Bare' has no default tasks .*give --tasks"):
        parse_config(["--env", bare], world=world_problems)
    assert task_specs(parse_config(["--env", bare, "--tasks", "arith:count=4"])) == (
        "arith:count=4", "holdout:frac=0.1,seed=0:arith:count=4")


def test_eval_without_tasks_evaluates_the_envs_own_held_out_set(rhyme_file):
    out = evaluate_model(EvalConfig(env=f"{rhyme_file}:Rhymes", model="tiny-random", max_new_tokens=4))
    assert out["n"] == 6  # the example's held-out words


@pytest.mark.slow
def test_a_worker_hanging_in_the_env_is_reported_with_the_env_name(tmp_path):
    spec = _module(tmp_path, "hang", """
        import multiprocessing, time
        class HangEnv:
            def __init__(self, *, max_turns): pass
            def reset(self, task):
                while multiprocessing.current_process().name.startswith("nanorllm-worker"):
                    time.sleep(1)  # hangs in a worker only: the learner's eval before training goes through
                return task["question"]
            def step(self, response): return None, 0.0, True, {}
        class Hang(EnvBundle):
            env_class = HangEnv
    """) + ":Hang"
    rc, out, _ = run_train(["--num-workers", "1", "--env", spec, "--tasks", "arith:count=40,seed=1",
                            "--max-steps", "1", "--run-name", "h",
                            "--worker-timeout-s", "4", "--max-restarts-per-worker", "0"], tmp_path / "runs")
    assert rc == 1, out
    assert "hung" in out and f"in the env {spec}" in out
