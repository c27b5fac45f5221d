"""What users bring (their config file, their env, their tasks, their model folder), wrong in every way a
review found: each mistake is one clear line (exit 2, nothing written) or ends only the episode it struck,
and a run that trained nothing never says done. Real runs of launch/train.py on the tiny model."""

import json
import math
import subprocess
import sys
import textwrap

import pytest

from nanorllm.config import load_config_file, parse_config
from nanorllm.envs.base import EnvBundle, EpisodeSettings
from nanorllm.envs.registry import EnvSpecError, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.evaluate import evaluate
from nanorllm.run.lifecycle import main
from tests import forked
from tests.helpers import ScriptedPolicy
from tests.procs import HANG_S, ROOT, child_env, read_scalars, run_train
from tests.runs import TINY_ARGS


def _env_file(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("from nanorllm.envs.base import EnvBundle\n" + textwrap.dedent(body))
    return f"{path}:{name.capitalize()}"


def _train_script(args: list[str], timeout: float = HANG_S) -> subprocess.CompletedProcess:
    return forked.run([sys.executable, str(ROOT / "launch" / "train.py"), *args], capture_output=True, text=True,
                      timeout=timeout, env=child_env())


# ---- 1: config files are typed like flags ---------------------------------------------------------

@pytest.mark.slow
def test_a_yaml_file_with_wrong_types_is_refused_naming_field_file_and_line_all_at_once(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-5\ntasks_per_step: 2.5\nserial: maybe\nmax_stepz: 3\nmax_turns: 0\nrun_name: 2024\n"
                    "model: tiny-random\nlr: 2e-5\n")
    proc = _train_script(["--config", str(path), "--output-dir", str(tmp_path / "out")])
    assert proc.returncode == 2, proc.stderr
    for line in [f"tasks_per_step: expected an integer, got 2.5 (float) ({path}:2)",
                 f"serial: expected true or false, got 'maybe' (str) ({path}:3)",
                 f"max_stepz: unknown field (did you mean max_steps?) ({path}:4)",
                 f"max_turns: must be >= 1, got 0 ({path}:5)",
                 f"run_name: expected text, got 2024 (int)",
                 f"lr: given twice (lines 1 and 8) in {path}"]:
        assert line in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "6 problem(s)" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_numbers_a_file_writes_as_text_are_read_like_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-5\nmax_steps: '7'\nlimit: null\nis_band: [0.25, 3]\nserial: true\nenv_arg: {x: [1, 2]}\n")
    values = load_config_file(str(path)).values
    assert values == {"lr": 1e-5, "max_steps": 7, "limit": None, "is_band": (0.25, 3.0), "serial": True,
                      "env_arg": ("x=[1, 2]",)}
    assert isinstance(values["lr"], float) and isinstance(values["max_steps"], int)


@pytest.mark.parametrize("content, line", [("lr: [1, 2\nmax_steps: 3\n", "invalid YAML"),
                                           (None, "cannot read it (FileNotFoundError")])
def test_a_missing_or_broken_config_file_is_one_line_and_exit_2(tmp_path, capsys, content, line):
    path = tmp_path / "broken.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["--config", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err and str(path) in err
    assert not (tmp_path / "out").exists()


# ---- 2: non-finite rewards, runs that trained nothing ---------------------------------------------

class InfEnv:
    """Reward inf for the task 'bad', 1.0 otherwise."""

    def __init__(self, *, max_turns: int):
        pass

    def reset(self, task):
        self.task = task
        return task["question"]

    def step(self, response):
        return None, math.inf if self.task["task_id"] == "bad" else 1.0, True, {}


class Inf(EnvBundle):
    env_class = InfEnv


def test_a_non_finite_reward_ends_only_its_episode_and_eval_leaves_it_out_counted(capsys):
    tasks = [{"task_id": "bad", "question": "q"}, {"task_id": "good", "question": "q"}]
    policy = ScriptedPolicy(lambda call, row, messages: "x")
    engine = RolloutEngine(policy, sampling=SamplingParams(), env=Inf(EpisodeSettings()))
    results = engine.run(tasks, num_samples=2).results
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "correct", "correct"]
    assert [r.reward for r in results] == [0.0, 0.0, 1.0, 1.0]
    err = capsys.readouterr().err
    assert err.count("reward: expected a finite number, got inf (float)") == 1 and "task bad" in err
    res = evaluate(policy, tasks, sampling=SamplingParams(), env=Inf(EpisodeSettings()))
    assert (res["success_rate"], res["n"], res["failed"]) == (1.0, 1, 1)  # not a 0 averaged in


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_run_on_nan_rewards_fails_instead_of_reporting_done(tmp_path, mode):
    env = _env_file(tmp_path, "nanny", """
        class NanEnv:
            def __init__(self, *, max_turns): pass
            def reset(self, task): return task["question"]
            def step(self, response): return None, float("nan"), True, {}
        class Nanny(EnvBundle):
            env_class = NanEnv
            default_tasks, default_eval_tasks = "arith:count=40,seed=1", "arith:count=8,seed=2"
    """)
    rc, out, _ = run_train([*mode, "--env", env, "--max-steps", "4", "--run-name", "n"], tmp_path / "runs")
    assert rc == 1, out
    assert "[failed] 3 of 3 updates trained nothing (0 skipped for a non-finite loss or gradient, 3 with every " \
           "group dropped for env errors or failed reward scores" in out  # stopped once more than half of the 4 could no longer train
    # printed once per process: the serial run's, or the learner's (held-out eval) and the worker's
    assert out.count("reward: expected a finite number, got nan (float)") == (1 if mode == ["--serial"] else 2)
    assert "[done]" not in out and not (tmp_path / "runs" / "n" / "final_model").exists()
    assert "after" not in json.loads((tmp_path / "runs" / "n" / "eval.json").read_text())
    scalars = read_scalars(tmp_path / "runs" / "n")
    assert [v for _, v in scalars["rollout/env_errors"]] == [8, 8, 8]
    assert [v for _, v in scalars["train/env_error_steps_total"]] == [1, 2, 3]


# ---- 4: every protocol violation ends only its episode ------------------------------------------------

BAD_STEPS = [((None, None, True, {}), "reward: expected a number, got None (NoneType)"),
             ((None, "1", True, {}), "reward: expected a number, got '1' (str)"),
             ((None, 1.0, True, None), "info: expected a dict, got None (NoneType)"),
             ((7, 1.0, False, {}), "observation: expected text or None, got 7 (int)"),
             ((None, 1.0, "false", {}), "done: expected True or False, got 'false' (str)"),
             ((None, 1.0, True), "env.step's result: expected a tuple (observation, reward, done, info)"),
             ((None, 1.0, True, {"reason": 3}), "info['reason']: expected text, got 3 (int)")]


@pytest.mark.parametrize("bad, message", BAD_STEPS)
def test_a_step_result_off_the_protocol_ends_only_its_episode_naming_field_and_type(capsys, bad, message):
    class Env:
        def __init__(self, *, max_turns):
            pass

        def reset(self, task):
            self.id = task["task_id"]
            return task["question"]

        def step(self, response):
            return bad if self.id == "bad" else ("again", 0.0, False, {})

    bundle = type("B", (EnvBundle,), {"env_class": Env})(EpisodeSettings(max_turns=2))
    engine = RolloutEngine(ScriptedPolicy(lambda call, row, messages: "x"), sampling=SamplingParams(), env=bundle)
    results = engine.run([{"task_id": "bad", "question": "q"}, {"task_id": "ok", "question": "q"}],
                         num_samples=2).results
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "max_turns", "max_turns"]
    assert message in results[0].trajectory.steps[-1].info["error"]
    assert capsys.readouterr().err.count(message) <= 1  # once per field and type in a process


@pytest.mark.parametrize("observation, message", [(42, "observation: expected text or a dict with a 'question' "
                                                        "text, got 42 (int)"),
                                                  ({"q": "x"}, "observation['question']: expected text, got None")])
def test_a_reset_result_off_the_protocol_ends_only_its_episode(capsys, observation, message):
    class Env:
        def __init__(self, *, max_turns):
            pass

        def reset(self, task):
            return observation if task["task_id"] == "bad" else task["question"]

        def step(self, response):
            return None, 1.0, True, {}

    bundle = type("B", (EnvBundle,), {"env_class": Env})(EpisodeSettings())
    engine = RolloutEngine(ScriptedPolicy(lambda call, row, messages: "x"), sampling=SamplingParams(), env=bundle)
    results = engine.run([{"task_id": "bad", "question": "q"}, {"task_id": "ok", "question": "q"}]).results
    assert [r.trajectory.termination_reason for r in results] == ["error", "correct"]
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_an_env_that_breaks_the_protocol_for_some_tasks_trains_on_the_others(tmp_path):
    env = _env_file(tmp_path, "sloppy", """
        class SloppyEnv:
            def __init__(self, *, max_turns): pass
            def reset(self, task):
                self.odd = int(task["task_id"][-1]) % 2
                return task["question"]
            def step(self, response):
                if self.odd:
                    return None, "1", "false", None  # text where numbers and bools belong
                return None, float(len(response) % 2), True, {}
        class Sloppy(EnvBundle):
            env_class = SloppyEnv
            default_tasks, default_eval_tasks = "arith:count=40,seed=1", "arith:count=8,seed=2"
    """)
    rc, out, _ = run_train(["--serial", "--env", env, "--max-steps", "2", "--run-name", "s", "--no-save-model",
                            "--no-drop-zero-std-groups"], tmp_path / "runs")
    assert rc == 0, out
    assert out.count("returned what the env protocol (envs/base.py) does not allow: reward: expected a number, "
                     "got '1' (str)") == 1
    assert "Traceback" not in out and "[done]" in out
    errors = [v for _, v in read_scalars(tmp_path / "runs" / "s")["rollout/env_errors"]]
    assert len(errors) == 2 and all(0 < e < 8 for e in errors)


# ---- 7, 8: bad input is exit 2 and one line, before anything is written --------------------------------

@pytest.mark.parametrize("body, line", [
    ("return None", "load_tasks must return a list of task dicts, got null"),
    ("return (dict(task_id=str(i), question='q') for i in range(3))",
     "load_tasks must return a list of task dicts, got generator"),
    ("raise KeyError('no such split')", "load_tasks raised KeyError: 'no such split'")])
def test_a_task_loader_that_returns_no_list_or_raises_is_bad_input(tmp_path, capsys, body, line):
    env = _env_file(tmp_path, "loader", f"""
        class E:
            def __init__(self, *, max_turns): pass
            def reset(self, task): return task["question"]
            def step(self, response): return None, 0.0, True, {{}}
        class Loader(EnvBundle):
            env_class = E
            default_tasks = "rows"
            def load_tasks(self, spec, *, limit=None):
                {body}
    """)
    assert main([*TINY_ARGS, "--serial", "--env", env, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_every_training_task_held_out_is_bad_input(tmp_path, capsys):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_id": "a", "question": "1+1?", "answer": "2"}) + "\n")
    assert main([*TINY_ARGS, "--serial", "--tasks", str(tasks), "--eval-tasks", str(tasks),
                 "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no training tasks left after removing the 1 that are also held out" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", "a/../../b", ".", ""])
def test_a_run_name_outside_the_output_dir_is_refused(tmp_path, capsys, name):
    assert main([*TINY_ARGS, "--serial", "--output-dir", str(tmp_path / "out" / "runs"), "--run-name", name]) == 2
    assert "run_name: must be one or more plain folder names under --output-dir" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_output_dir_that_cannot_be_created_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main([*TINY_ARGS, "--serial", "--output-dir", str(tmp_path / "file" / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"output_dir: '{tmp_path / 'file' / 'runs'}' cannot be created: {tmp_path / 'file'} is not a folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_a_run_name_with_folders_stays_under_the_output_dir():
    assert parse_config(["--run-name", "sweep/lr-1e-5"]).run_name == "sweep/lr-1e-5"


def test_a_model_folder_that_needs_its_own_code_is_refused_without_running_it(tmp_path, capsys):
    from nanorllm.policy.models import tiny_tokenizer

    model = tmp_path / "foreign"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "mystery", "auto_map": {"AutoConfig": "modeling_mystery.MysteryConfig",
                                              "AutoModelForCausalLM": "modeling_mystery.MysteryForCausalLM"}}))
    (model / "modeling_mystery.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    tiny_tokenizer().save_pretrained(str(model))
    args = [*TINY_ARGS, "--serial", "--output-dir", str(tmp_path / "out"), "--model", str(model)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"model: cannot load '{model}'" in err and "custom code" in err
    assert not (tmp_path / "ran").exists()


# ---- 9: --env-arg is typed by its default, lists and dicts included -----------------------------------

class Options(EnvBundle):
    env_class = InfEnv
    args = {"words": ["a"], "pair": (1, 2), "weights": {"x": 1.0}, "scale": 1.0, "name": "n"}

    def make_env(self):
        return InfEnv(max_turns=1)


def test_env_args_parse_json_or_comma_lists_and_refuse_what_does_not_fit(monkeypatch):
    import nanorllm.envs.registry as registry

    monkeypatch.setitem(registry.BUILTIN_ENVS, "options", f"{__name__}:Options")
    env = load_env("options", env_args=["words=abc,de", "pair=[3, 4]", 'weights={"y": 2}', "scale=0.5"])
    assert env.options == {"words": ["abc", "de"], "pair": (3, 4), "weights": {"y": 2}, "scale": 0.5, "name": "n"}
    assert load_env("options", env_args=["words=abc"]).options["words"] == ["abc"]  # not ['a', 'b', 'c']
    for arg, why in [("scale=nan", "expected a finite number"), ("scale=inf", "expected a finite number"),
                     ("weights=y", "expected a dict as JSON"), ("pair=[1", "expected a tuple as JSON"),
                     ("words={}", "expected a list, got JSON dict"), ("pair=1,x", "expected an int")]:
        with pytest.raises(EnvSpecError, match=why):
            load_env("options", env_args=[arg])


def test_a_non_finite_env_arg_stops_the_run_with_exit_2(capsys):
    assert main(["--env", "calc", "--env-arg", "max_chars=nan", "--serial"]) == 2
    assert "--env-arg max_chars=nan: expected an int" in capsys.readouterr().err


# ---- 10: a crash inside the env is reported in the phase the worker was in -------------------------

@pytest.mark.slow
def test_a_worker_that_exits_inside_the_env_is_reported_as_grading(tmp_path):
    env = _env_file(tmp_path, "quitter", """
        import multiprocessing, sys
        class QuitEnv:
            def __init__(self, *, max_turns): pass
            def reset(self, task): return task["question"]
            def step(self, response):
                if multiprocessing.current_process().name.startswith("nanorllm-worker"):
                    sys.exit(3)
                return None, 0.0, True, {}
        class Quitter(EnvBundle):
            env_class = QuitEnv
            default_tasks, default_eval_tasks = "arith:count=40,seed=1", "arith:count=8,seed=2"
    """)
    rc, out, _ = run_train(["--num-workers", "1", "--env", env, "--max-steps", "1", "--run-name", "q",
                            "--max-restarts-per-worker", "0"], tmp_path / "runs")
    assert rc == 1, out
    assert "worker 0 on cpu died" in out and f"while grading (job 0.0, task " in out and f"in the env {env}" in out


# ---- 6: prompts longer than the model reads are measured at load --------------------------------------

def _tasks_with_a_long_question(tmp_path, chars: int):
    path = tmp_path / "tasks.jsonl"
    rows = [{"task_id": "long", "question": "What is " + "1 + " * (chars // 4) + "1?", "answer": "1"}]
    rows += [{"task_id": f"t{i}", "question": f"{i} + 1?", "answer": str(i + 1)} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("chars, extra, tokens", [(4_000_000, [], "more than "),
                                                   (3000, ["--max-prompt-tokens", "500"], "")])
def test_a_task_whose_prompt_does_not_fit_is_refused_at_start_naming_it(tmp_path, capsys, chars, extra, tokens):
    tasks = _tasks_with_a_long_question(tmp_path, chars)
    out = tmp_path / "out"
    assert main([*TINY_ARGS, "--serial", "--tasks", str(tasks), "--output-dir", str(out), "--run-name", "r",
                 *extra]) == 2
    err = capsys.readouterr().err
    limit = extra[1] if extra else "1904"  # tiny-random's 2048 less 2 turns of 8 tokens and one feedback's 128
    assert f"training task 'long': its prompt holds {tokens}" in err and f"tokens, more than {limit} " in err
    assert "--drop-long-prompts" in err and "Traceback" not in err
    assert not out.exists()  # the run folder, and the --output-dir made to hold it, went with the refusal


@pytest.mark.slow
def test_drop_long_prompts_leaves_them_out_counted_and_trains(tmp_path):
    tasks = _tasks_with_a_long_question(tmp_path, 3000)
    rc, out, _ = run_train(["--serial", "--tasks", str(tasks), "--eval-tasks", "", "--max-prompt-tokens", "500",
                            "--drop-long-prompts", "--max-steps", "1", "--run-name", "d", "--no-save-model"],
                           tmp_path / "runs")
    assert rc == 0, out
    assert "[tasks] left out 1 training task(s) whose prompt is longer than 500 tokens (--drop-long-prompts; first: " \
           "long, " in out
    assert "train tasks 6 " in out


def test_the_prompt_limit_cannot_change_on_resume():
    from nanorllm.trainer.fingerprint import fixed_changes

    saved = {"model": "tiny-random", "dtype": "float32", "max_prompt_tokens": None, "drop_long_prompts": True}
    now = {**saved, "max_prompt_tokens": 500, "drop_long_prompts": False}
    assert [line.split(":")[0] for line in fixed_changes(saved, now)] == ["max_prompt_tokens", "drop_long_prompts"]
    assert fixed_changes({"model": "tiny-random", "dtype": "float32"}, now) == []  # a checkpoint from before them


def test_a_json_config_file_names_lines_too(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{\n  "max_steps": 3,\n  "lr": "fast",\n  "serial": 1\n}\n')
    problems = load_config_file(str(path)).problems
    assert problems == [f"lr: expected a number, got 'fast' (str) ({path}:3)",
                        f"serial: expected true or false, got 1 (int) ({path}:4)"]
