"""`--env openenv:...`: OpenEnv environments through OpenEnv's own client, a class served in-process, its seeds as
tasks, the refusals at start, servers that are slow, die or answer garbage, and 2 training steps serial and in the
pipeline, and launch/eval.py on it."""

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from helpers import ScriptedPolicy  # noqa: E402
from nanorllm.faultsuite.proxy_trap import ProxyTrap  # noqa: E402
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP  # noqa: E402
from nanorllm.envs.base import EpisodeSettings  # noqa: E402
from nanorllm.envs.openenv_serve import Served, serve_environment, stop_servers  # noqa: E402
from nanorllm.envs.registry import EnvSpecError, load_env  # noqa: E402
from nanorllm.policy.base import SamplingParams  # noqa: E402
from nanorllm.rollout.engine import RolloutEngine  # noqa: E402
from tests import forked  # noqa: E402
from tests.procs import ROOT, child_env, read_rollouts, read_scalars, run_train  # noqa: E402

HERE = Path(__file__).resolve().parent
GUESS = f"openenv:{HERE / 'openenv_example.py'}:GuessEnv"
FAULTS = HERE / "openenv_faults.py"
ENVS = "tests.openenv_envs"  # imported when a test loads one: collecting this file imports no OpenEnv server code


def _target(seed: int) -> int:
    from tests.openenv_example import GuessEnv

    env = GuessEnv()
    env.reset(seed=seed)
    return env.target


def _bisect(call, row, messages):
    low, high = 1, 10
    for m in messages:
        if m["role"] == "assistant":
            guess = int(re.findall(r"\d+", m["content"])[-1])
        elif "higher" in m["content"]:
            low = guess + 1
        elif "lower" in m["content"]:
            high = guess - 1
    return f"I guess {(low + high) // 2}"


class NotAnEnv:
    pass


@pytest.fixture(autouse=True)
def _servers_stopped():
    yield
    stop_servers()


def test_a_scripted_episode_gets_the_envs_observations_reward_and_done():
    env = load_env(GUESS, EpisodeSettings(max_turns=5))
    assert (env.action_field, env.observation_field) == ("guess", "text")
    task = env.load_tasks("openenv:count=1,seed=7")[0]
    target = _target(7)
    episode = env.make_env()
    assert episode.reset(task) == "I am thinking of a number from 1 to 10. Reply with your guess."
    wrong = 1 if target != 1 else 2
    obs, reward, done, info = episode.step(f"maybe {wrong}")
    assert (obs, reward, done) == (f"{wrong} is wrong: the number is {'higher' if wrong < target else 'lower'}.",
                                   0.0, False)
    assert info == {"turn": 1, "env_reward": 0.0, "env_done": False}
    obs, reward, done, info = episode.step(f"it is {target}")
    assert (obs, reward, done, info["reason"], info["env_done"]) == (None, 1.0, True, "done", True)
    assert episode.client is None  # the session is closed


def test_the_engine_plays_whole_episodes_and_the_turn_limit_ends_an_unfinished_one():
    env = load_env(GUESS, EpisodeSettings(max_turns=4))
    tasks = env.load_tasks("openenv:count=3,seed=11")
    results = RolloutEngine(ScriptedPolicy(_bisect), sampling=SamplingParams(), env=env).run(tasks).results
    for r in results:  # halving 1..10 finds any number within 4 guesses
        assert (r.reward, r.trajectory.termination_reason) == (1.0, "done")
        assert r.trajectory.steps[0].observation.startswith("I am thinking")
    assert env.metrics(results)["openenv/episodes_done"] == 1.0
    short = load_env(GUESS, EpisodeSettings(max_turns=1))
    wrong = [s for s in range(50) if _target(s) != 5][0]
    (r,) = RolloutEngine(ScriptedPolicy([["5"]]), sampling=SamplingParams(), env=short).run(
        short.load_tasks(f"openenv:count=1,seed={wrong}")).results
    assert (r.reward, r.trajectory.termination_reason, r.trajectory.num_turns) == (0.0, "max_turns", 1)
    assert short.metrics([r]) == {"openenv/turns_per_episode": 1.0, "openenv/episodes_done": 0.0}


def test_the_reset_gets_the_tasks_seed_and_training_and_held_out_seeds_never_overlap():
    env = load_env(GUESS)
    train, held = env.load_tasks(env.default_tasks), env.load_tasks(env.default_eval_tasks)
    assert (len(train), len(held)) == (2000, 200)
    assert not {t["seed"] for t in train} & {t["seed"] for t in held}
    assert not {t["question"] for t in train} & {t["question"] for t in held}  # so no training task is dropped
    tasks = env.load_tasks("openenv:count=12,seed=3")
    assert [t["seed"] for t in tasks[:3]] == [3, 4, 5]
    # the server's env draws its number from the seed the reset sent: the same seed, the same number
    answers = [RolloutEngine(ScriptedPolicy(lambda c, r, m, t=_target(t["seed"]): str(t)), sampling=SamplingParams(),
                             env=env).run([t]).results[0].reward for t in tasks]
    assert answers == [1.0] * 12 and len({_target(t["seed"]) for t in tasks}) > 1
    for bad in ["openenv:count=0", "openenv:seed=x", "openenv:colour=1", "ta:count=3"]:
        with pytest.raises(ValueError, match="openenv"):
            env.load_tasks(bad)


def test_rewards_sum_over_steps_or_count_the_last_and_the_only_text_field_is_the_observation():
    spec = f"openenv:{ENVS}:EchoEnv"
    for mode, first, total in [("sum", 0.5, 1.0), ("last", 0.0, 0.5)]:
        env = load_env(spec, EpisodeSettings(max_turns=3), [f"reward={mode}"])
        assert (env.action_field, env.observation_field, env.opening) == ("message", "echoed", "seed 0")
        (r,) = RolloutEngine(ScriptedPolicy([["hello"], ["bye"]]), sampling=SamplingParams(), env=env).run(
            env.load_tasks("openenv:count=1,seed=4")).results
        assert [s.reward for s in r.trajectory.steps] == [first, 0.5] and r.reward == total
        assert [s.info["env_reward"] for s in r.trajectory.steps] == [0.5, 0.5]
        assert r.trajectory.steps[0].observation == "seed 4" and r.trajectory.steps[1].observation == "hello"
    env = load_env(spec, EpisodeSettings(max_turns=3), ["observation_field=echoed"])
    assert env.observation_field == "echoed"


def test_an_action_with_two_text_fields_takes_the_one_named():
    spec = f"openenv:{ENVS}:TwoFieldEnv"
    with pytest.raises(EnvSpecError, match=r"the Action has 2 text fields \(left, right\); name the one"):
        load_env(spec)
    env = load_env(spec, env_args=["action_field=left"])
    (r,) = RolloutEngine(ScriptedPolicy([["hi"]]), sampling=SamplingParams(), env=env).run(
        env.load_tasks("openenv:count=1")).results
    assert (r.reward, r.trajectory.termination_reason) == (1.0, "done")
    with pytest.raises(EnvSpecError, match="the Action also requires left"):
        load_env(spec, env_args=["action_field=right"])


@pytest.mark.parametrize("spec, args, message", [
    ("openenv:no.such.module:Env", [], "cannot import 'no.such.module'"),
    (f"openenv:{__name__}:Missing", [], f"{__name__!r} has no 'Missing'"),
    (f"openenv:{__name__}:NotAnEnv", [], "NotAnEnv is not an OpenEnv Environment"),
    ("openenv:openenv.core.env_server:Environment", [], "Environment does not implement reset, state, step"),
    (f"openenv:{ENVS}:LonelyEnv", [], "LonelyEnv.SUPPORTS_CONCURRENT_SESSIONS is False"),
    ("openenv:ftp://127.0.0.1:21", [], "an OpenEnv server's URL is http://HOST:PORT"),
    ("openenv:ws://127.0.0.1:8000", [], "an OpenEnv server's URL is http://HOST:PORT"),
    ("openenv:", [], "expected openenv:TARGET"),
    (GUESS, ["action_field=nope"], "--env-arg action_field=nope: the Action has no text field 'nope' (its text "
                                   "fields: guess)"),
    (GUESS, ["observation_field=nope"], "the observation has no text field 'nope'"),
    (GUESS, ["reward=mean"], "reward='mean': expected one of sum, last"),
    (GUESS, ["reset.seed=3"], "reset.seed: each task's seed is its own (tasks openenv:count=N,seed=S)"),
])
def test_a_bad_spec_or_option_is_refused_in_one_line(spec, args, message):
    with pytest.raises(EnvSpecError) as err:
        load_env(spec, env_args=args)
    assert message in str(err.value) and "\n" not in str(err.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_down_at_start_is_refused_and_nothing_is_written(tmp_path, capsys):
    from nanorllm.run.lifecycle import main

    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(EnvSpecError, match=f"the OpenEnv server at {url} does not answer GET /schema within "
                                           "--env-timeout-s 2 s: ConnectionError"):
        load_env(f"openenv:{url}", EpisodeSettings(env_timeout_s=2))
    assert main(["--env", f"openenv:{url}", "--serial", "--output-dir", str(tmp_path / "runs")]) == 2
    assert f"env: 'openenv:{url}': the OpenEnv server at {url} does not answer" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["--env", GUESS, "--env-timeout-s", "0", "--serial"]) == 2
    assert "env_timeout_s: must be > 0, got 0.0" in capsys.readouterr().err


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_step_past_the_timeout_ends_only_that_episode_as_an_env_error(capsys, monkeypatch):
    env = load_env(f"openenv:{FAULTS}:SlowGuessEnv", EpisodeSettings(max_turns=2, env_timeout_s=0.3))
    slow_env, before = env.env_cls, env.env_cls.slow_steps
    monkeypatch.setattr(slow_env, "slow_s", 120)  # the slow step returns once released (a net: 120 s)
    monkeypatch.setattr(slow_env, "released", threading.Event())
    tasks = env.load_tasks("openenv:count=2,seed=0")  # seed 0 is slow, seed 1 is not
    try:
        slow, fine = RolloutEngine(ScriptedPolicy([["3", "3"], ["4", "4"]]), sampling=SamplingParams(),
                                   env=env).run(tasks).results
        assert slow_env.slow_steps == before  # the episodes ended while the slow step still ran: not waited for
    finally:
        slow_env.released.set()
    assert slow.trajectory.termination_reason == "error"
    assert "did not answer step 1 within --env-timeout-s 0.3 s" in slow.trajectory.steps[-1].info["error"]
    assert fine.trajectory.termination_reason in ("done", "max_turns") and fine.trajectory.num_turns >= 1
    assert "env.step raised on task openenv-seed0" in capsys.readouterr().err


def test_a_server_that_stops_mid_episode_ends_its_episodes_as_env_errors_and_the_next_call_serves_again():
    env = load_env(GUESS, EpisodeSettings(max_turns=3, env_timeout_s=5))
    tasks = env.load_tasks("openenv:count=2,seed=0")
    episodes = [env.make_env() for _ in tasks]
    for e, t in zip(episodes, tasks):
        e.reset(t)
    served = serve_environment(env.name, env.env_cls, env.action_cls, env.observation_cls)
    served.stop()
    assert not served.running
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", served.port)) != 0  # nothing listens there any more
    for e in episodes:
        with pytest.raises(Exception):
            e.step("5")
        assert e.client is None
    (r,) = RolloutEngine(ScriptedPolicy(_bisect), sampling=SamplingParams(), env=env).run(tasks[:1]).results
    assert r.trajectory.termination_reason in ("done", "max_turns")  # a fresh server for the next episodes


def test_a_server_on_this_machine_is_reached_without_the_proxy_variables_by_any_of_its_addresses(monkeypatch):
    trap = ProxyTrap()  # every proxy variable points at it, and no NO_PROXY exception: a cluster's setting
    try:
        for k, v in trap.env().items():
            monkeypatch.setenv(k, v)
        env = load_env(GUESS, EpisodeSettings(max_turns=4))  # served on 127.0.0.1: OpenEnv's own bypass is overridden
        served = serve_environment(env.name, env.env_cls, env.action_cls, env.observation_cls)
        by_any_address = load_env(f"openenv:http://0.0.0.0:{served.port}", EpisodeSettings(max_turns=4))
        for bundle in (env, by_any_address):
            results = RolloutEngine(ScriptedPolicy(_bisect), sampling=SamplingParams(), env=bundle).run(
                bundle.load_tasks("openenv:count=2,seed=5")).results
            assert [r.reward for r in results] == [1.0, 1.0]
        assert trap.connections == 0
    finally:
        trap.close()


def _garbage_app():
    """An app with OpenEnv's /schema whose WebSocket answers each step with what the step's text asks for."""
    from fastapi import FastAPI, WebSocket

    from tests.openenv_envs import EchoAction

    app = FastAPI()
    schema = {"action": EchoAction.model_json_schema(), "observation": {"properties": {"text": {"type": "string"}}}}
    replies = {"notjson": "{garbage", "string": {"observation": "just text", "reward": 1, "done": False},
               "reward": {"observation": {"text": "x"}, "reward": "lots", "done": False},
               "nan": {"observation": {"text": "x"}, "reward": float("nan"), "done": True},
               "done": {"observation": {"text": "x"}, "reward": 0, "done": "no"},
               "notext": {"observation": {"other": 1}, "reward": 0, "done": False},
               "fine": {"observation": {"text": "go on"}, "reward": 1, "done": True}}

    @app.get("/schema")
    def get_schema():
        return schema

    @app.websocket("/ws")
    async def ws(socket: WebSocket):
        await socket.accept()
        while True:
            message = json.loads(await socket.receive_text())
            if message["type"] == "close":
                break
            if message["type"] == "reset":
                await socket.send_text(json.dumps({"type": "observation", "data": {"observation": {"text": "hi"}}}))
                continue
            reply = replies.get(message["data"]["message"])
            if reply is None:
                await socket.send_text(json.dumps({"type": "error", "data": {"message": "boom", "code": "X"}}))
            elif isinstance(reply, str):
                await socket.send_text(reply)
            else:
                await socket.send_text(json.dumps({"type": "observation", "data": reply}))
        await socket.close()

    return app


def test_a_server_that_answers_garbage_ends_those_episodes_as_env_errors():
    served = Served(_garbage_app(), name="garbage")
    try:
        env = load_env(f"openenv:{served.url}", EpisodeSettings(max_turns=2, env_timeout_s=5))
        assert (env.action_field, env.observation_field, env.opening) == ("message", "text", "hi")
        kinds = ["notjson", "string", "reward", "nan", "done", "notext", "error", "fine"]
        tasks = env.load_tasks(f"openenv:count={len(kinds)}")
        results = RolloutEngine(ScriptedPolicy([kinds]), sampling=SamplingParams(), env=env).run(tasks).results
        reasons = {k: r.trajectory.termination_reason for k, r in zip(kinds, results)}
        assert reasons == {**{k: "error" for k in kinds[:-1]}, "fine": "done"}
        errors = {k: r.trajectory.steps[-1].info["error"] for k, r in zip(kinds, results) if k != "fine"}
        assert "JSONDecodeError" in errors["notjson"]
        assert "observation: expected an OpenEnv observation (a JSON object), got 'just text'" in errors["string"]
        assert "reward: expected a finite number or null, got 'lots'" in errors["reward"]
        assert "done: expected true or false, got 'no'" in errors["done"]
        assert "observation['text']: expected text, got None" in errors["notext"]
        assert "Server error: boom" in errors["error"]
    finally:
        served.stop()


# ---- real runs: launch/train.py and launch/eval.py in subprocesses ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_guess_the_number_trains_two_steps(tmp_path, mode):
    rc, out, _ = run_train([*mode, "--env", GUESS, "--max-turns", "3", "--max-steps", "2", "--run-name", "g",
                            "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert f"[env] {GUESS}" in out and "step 2/2" in out
    run = tmp_path / "runs" / "g"
    episodes = read_rollouts(run)
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES
    assert all(e["task_id"].startswith("openenv-seed") for e in episodes)
    scalars = read_scalars(run)
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0]
    assert all(1 <= v <= 3 for _, v in scalars["openenv/turns_per_episode"])


@pytest.mark.slow
@pytest.mark.parametrize("env_class, timeout", [("SlowGuessEnv", "0.5"), ("TextlessGuessEnv", "30")])
def test_a_slow_or_malformed_env_in_a_real_run_is_counted_in_env_errors_and_the_run_finishes(tmp_path, env_class,
                                                                                            timeout):
    rc, out, _ = run_train(["--serial", "--env", f"openenv:{FAULTS}:{env_class}", "--env-timeout-s", timeout,
                            "--max-turns", "2", "--max-steps", "2", "--run-name", "f", "--no-save-model",
                            "--tasks", "openenv:count=40,seed=0"], tmp_path / "runs")
    assert rc == 0, out
    errors = [v for _, v in read_scalars(tmp_path / "runs" / "f")["rollout/env_errors"]]
    assert len(errors) == 2 and sum(errors) > 0, out
    assert "did not answer step 1 within --env-timeout-s 0.5 s" in out if env_class == "SlowGuessEnv" else \
        "observation['text']: expected text, got None" in out


@pytest.mark.slow
def test_launch_eval_gives_pass_at_k_on_an_openenv_env():
    proc = forked.run([sys.executable, str(ROOT / "launch" / "eval.py"), "--model", "tiny-random", "--env", GUESS,
                       "--tasks", "openenv:count=3,seed=1000000", "--eval-samples", "2", "--max-turns", "2",
                       "--max-new-tokens", "8"], env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 3 and 0 <= result["pass@2"] <= 1 and 0 <= result["mean@2"] <= 1


@pytest.mark.slow
def test_a_users_server_that_dies_mid_episode_ends_its_episodes_as_env_errors():
    port = _closed_port()
    code = ("import uvicorn; from openenv.core.env_server import create_fastapi_app; "
            "from tests.openenv_example import GuessEnv, GuessAction, GuessObservation; "
            f"uvicorn.run(create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8), "
            f"host='127.0.0.1', port={port}, log_level='critical')")
    server = subprocess.Popen([sys.executable, "-c", code], env=child_env(), cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                env = load_env(f"openenv:{url}", EpisodeSettings(max_turns=3, env_timeout_s=5))
                break
            except EnvSpecError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        tasks = env.load_tasks("openenv:count=2,seed=0")

        def kill_then_guess(call, row, messages):
            if call == 1 and row == 0:
                server.kill()
                server.wait()
            return "11"  # never right: every episode needs a second step

        results = RolloutEngine(ScriptedPolicy(kill_then_guess), sampling=SamplingParams(), env=env).run(
            tasks).results
        assert [r.trajectory.termination_reason for r in results] == ["error", "error"]
        with pytest.raises(EnvSpecError, match="does not answer"):
            load_env(f"openenv:{url}", EpisodeSettings(env_timeout_s=2))
    finally:
        server.kill()
        server.wait()


# ---- tasks through reset arguments, nan rewards, MCP environments -----------------------------------------------

def test_an_env_that_ignores_the_seed_is_warned_about_once_and_reset_arguments_give_it_its_tasks(capsys):
    blind = load_env(f"openenv:{FAULTS}:SeedBlindEnv")
    blind.load_tasks("openenv:count=20,seed=0")
    blind.load_tasks("openenv:count=5,seed=100")
    err = capsys.readouterr().err
    assert err.count("[env] warning") == 1 and "all 4 task seeds tried (0-3) open with the same observation" in err
    assert "--env-arg reset.KEY=VALUE" in err and "reset.dataset_name=NAME" in err
    env = load_env(f"openenv:{FAULTS}:SeedBlindEnv", EpisodeSettings(max_turns=1), ["reset.dataset_name=sums"])
    assert env.options["reset"] == {"dataset_name": "sums"}
    tasks = env.load_tasks("openenv:count=4,seed=0")
    assert "[env] warning" not in capsys.readouterr().err
    results = RolloutEngine(ScriptedPolicy([["1"] * 4]), sampling=SamplingParams(), env=env).run(tasks).results
    openings = [r.trajectory.steps[0].observation for r in results]
    assert len(set(openings)) == 4 and all(o.startswith("[sums] What is ") for o in openings)


def test_a_nan_reward_on_the_last_step_is_a_failed_score_not_a_zero():
    env = load_env(f"openenv:{FAULTS}:NanRewardGuessEnv", EpisodeSettings(max_turns=2))
    tasks = env.load_tasks("openenv:count=4,seed=0")  # seeds 1 and 3 score nan
    results = RolloutEngine(ScriptedPolicy([["5"] * 4]), sampling=SamplingParams(), env=env).run(tasks).results
    assert [r.trajectory.termination_reason for r in results] == ["done", "error", "done", "error"]
    assert "a number on the step that ends the episode" in results[1].trajectory.steps[-1].info["error"]
    assert [r.reward for r in results if not r.failed] == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_run_on_an_env_with_nan_rewards_trains_and_evaluates_on_the_scored_episodes_only(tmp_path, mode):
    rc, out, _ = run_train([*mode, "--env", f"openenv:{FAULTS}:NanRewardGuessEnv", "--max-steps", "2",
                            "--run-name", "n", "--no-save-model", "--tasks", "openenv:count=40,seed=0",
                            "--eval-tasks", "openenv:count=4,seed=1000000"], tmp_path / "runs")
    assert rc == 0, out
    errors = [v for _, v in read_scalars(tmp_path / "runs" / "n")["rollout/env_errors"]]
    assert len(errors) == 2 and sum(errors) > 0, out
    summary = json.loads((tmp_path / "runs" / "n" / "eval.json").read_text())
    assert (summary["after"]["success_rate"], summary["after"]["n"], summary["after"]["failed"]) == (1.0, 2, 2)
    assert "held-out success 1.000 -> 1.000 (+0.000) on 2 tasks (2 failed to score, left out)" in out


@pytest.mark.parametrize("name", ["MCPEcho", "ToolCallEnv"])
def test_an_mcp_environment_is_refused_by_name_with_advice_that_works(name):
    with pytest.raises(EnvSpecError) as err:
        load_env(f"openenv:{ENVS}:{name}")
    text = str(err.value)
    assert "an OpenEnv MCP environment (its Action is CallToolAction" in text and "\n" not in text
    assert "--tools file.py:fn" in text and "action_field" not in text  # no advice that cannot work


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_run_on_an_env_that_ignores_the_seed_warns_once_and_reset_arguments_give_it_distinct_tasks(tmp_path, mode):
    spec = f"openenv:{FAULTS}:SeedBlindEnv"
    base = [*mode, "--env", spec, "--max-turns", "1", "--max-steps", "1", "--no-save-model",
            "--tasks", "openenv:count=40,seed=0", "--eval-tasks", "openenv:count=4,seed=1000000"]
    rc, out, _ = run_train([*base, "--run-name", "blind"], tmp_path / "runs")
    assert rc == 0, out
    assert out.count("[env] warning") == 1 and f"{spec}: all 4 task seeds tried (0-3)" in out
    assert {e["turns"][0]["observation"] for e in read_rollouts(tmp_path / "runs" / "blind")} == {"What is 1 + 1?"}
    rc, out, _ = run_train([*base, "--run-name", "told", "--env-arg", "reset.dataset_name=sums"], tmp_path / "runs")
    assert rc == 0 and "[env] warning" not in out, out
    openings = {e["turns"][0]["observation"] for e in read_rollouts(tmp_path / "runs" / "told")}
    assert len(openings) == TASKS_PER_STEP and all(o.startswith("[sums] What is ") for o in openings)
