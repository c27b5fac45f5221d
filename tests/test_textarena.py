"""`--env textarena:GAME-ID`: a single-player TextArena game as a multi-turn episode (two-player games:
tests/test_selfplay.py), its seeds as tasks, the
refusals at start, a game that raises, and 2 training steps on GuessTheNumber, serial and in the pipeline."""

import re

import pytest

textarena = pytest.importorskip("textarena")

from helpers import ScriptedPolicy  # noqa: E402
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP  # noqa: E402
from nanorllm.envs.base import EpisodeSettings  # noqa: E402
from nanorllm.envs.registry import EnvSpecError, load_env  # noqa: E402
from nanorllm.envs.textarena import innermost, start_game  # noqa: E402
from nanorllm.policy.base import SamplingParams  # noqa: E402
from nanorllm.rollout.engine import RolloutEngine  # noqa: E402
from nanorllm.run.lifecycle import main  # noqa: E402
from nanorllm.trainer.metrics import rollout_metrics  # noqa: E402
from tests.procs import read_rollouts, read_scalars, run_train  # noqa: E402
from tests.runs import TINY_ARGS  # noqa: E402

GAME = "textarena:GuessTheNumber-v0"


def _target(seed: int) -> int:
    game, _ = start_game("GuessTheNumber-v0", seed)
    return innermost(game).game_number


def _bisect(call, row, messages):
    """Plays GuessTheNumber (1..20) by halving the interval the game's hints leave."""
    low, high = 1, 20
    for m in messages:
        if m["role"] == "assistant":
            guess = int(re.search(r"\[(\d+)\]", m["content"]).group(1))
        elif m["content"] == "The target number is higher.":
            low = guess + 1
        elif m["content"] == "The target number is lower.":
            high = guess - 1
    return f"My guess: [{(low + high) // 2}]"


@pytest.fixture
def raising_game():
    """A registered single-player game whose move BOOM raises inside the game."""
    class Boom(textarena.Env):
        def reset(self, num_players, seed=None):
            self.state = textarena.SinglePlayerState(num_players=num_players, seed=seed, max_turns=5)
            self.state.reset(game_state={}, player_prompt_function=lambda **kw: "Say anything.")

        def step(self, action):
            if "BOOM" in action:
                raise KeyError("the game lost its board")
            self.state.add_observation(message="go on", observation_type=textarena.ObservationType.GAME_MESSAGE)
            return self.state.step()

    registry = textarena.envs.registration.ENV_REGISTRY
    textarena.register("NanoBoom-v0", entry_point=Boom)
    yield "textarena:NanoBoom-v0"
    del registry["NanoBoom-v0"]


def test_a_scripted_episode_reaches_the_games_reward_and_its_observations_are_the_user_turns():
    env = load_env(GAME, EpisodeSettings(max_turns=10))
    task = env.load_tasks("ta:count=1,seed=7")[0]
    target = _target(7)
    game = env.make_env()
    opening = game.reset(task)
    assert "Guess The Number" in opening and "[GAME]" not in opening
    wrong = 1 if target != 1 else 2
    obs, reward, done, info = game.step(f"[{wrong}]")
    assert (obs, reward, done, info) == ("The target number is higher." if wrong < target else
                                         "The target number is lower.", 0.0, False, {"turn": 1, "invalid_move": False})
    obs, reward, done, info = game.step(f"I say [{target}]")
    assert (obs, reward, done, info["reason"], info["game_done"], info["success"]) == (None, 1.0, True, "game_over",
                                                                                       True, True)
    assert "Congratulations" in info["game_reason"] and game.closed


def test_an_invalid_move_is_the_games_feedback_then_its_penalty_not_a_crash():
    env = load_env(GAME, EpisodeSettings(max_turns=10)).make_env()
    env.reset({"task_id": "t", "seed": 3})
    obs, reward, done, info = env.step("no idea")
    assert (reward, done, info["invalid_move"]) == (0.0, False, True) and "invalid move" in obs
    obs, reward, done, info = env.step("still no idea")  # the game allows one error in a row
    assert (obs, reward, done, info["reason"], info["invalid_move"]) == (None, 0.0, True, "invalid_move", True)


def test_the_engine_plays_whole_games_and_the_turn_limit_closes_an_unfinished_one():
    env = load_env(GAME, EpisodeSettings(max_turns=6))
    tasks = env.load_tasks("ta:count=3,seed=11")
    (a, b, c) = RolloutEngine(ScriptedPolicy(_bisect), sampling=SamplingParams(), env=env).run(tasks).results
    for r in (a, b, c):  # halving 1..20 finds any number within 5 guesses
        assert (r.reward, r.trajectory.termination_reason, r.succeeded) == (1.0, "game_over", True)
        assert r.trajectory.steps[0].observation.startswith("You are Player 0")
    short = load_env(GAME, EpisodeSettings(max_turns=1)).make_env()
    short.reset({"task_id": "t", "seed": 1})  # target 5: the first bisection guess, 10, misses
    obs, reward, done, info = short.step("[10]")
    assert (obs, reward, done, info["reason"], info["game_done"], short.closed, info["success"]) == (
        None, 0.0, True, "max_turns", False, True, False)
    m = env.metrics([a, b, c])
    assert m["textarena/games_finished"] == 1.0 and m["textarena/invalid_moves_per_episode"] == 0.0
    assert m["textarena/turns_per_episode"] == sum(r.trajectory.num_turns for r in (a, b, c)) / 3
    assert m["textarena/won"] == 1.0


def test_a_game_ended_by_its_own_turn_limit_gives_a_partial_reward_that_is_no_win_and_no_success():
    seed = next(s for s in range(100) if _target(s) == 20)  # guessing 1, 2, ... 11 never finds it
    env = load_env(GAME, EpisodeSettings(max_turns=12))  # the game's max_turns=10 lets an 11th guess
    (r,) = RolloutEngine(ScriptedPolicy(lambda call, row, messages: f"[{call + 1}]"), sampling=SamplingParams(),
                         env=env).run([{"task_id": "t", "seed": seed}]).results
    assert r.trajectory.termination_reason == "game_over" and r.trajectory.num_turns == 11
    assert r.reward == pytest.approx(1 - 9 / 19)  # the game's share for the last guess's distance
    m = env.metrics([r])
    assert (m["textarena/games_finished"], m["textarena/won"]) == (1.0, 0.0)
    assert not r.succeeded and rollout_metrics([r], env=env)["success_rate"] == 0.0  # a reward, but no win


def test_starting_a_game_leaves_the_trainers_random_stream_as_it_was():
    import random

    random.seed(5)
    expected = [random.random() for _ in range(3)]
    random.seed(5)
    load_env(GAME).make_env().reset({"task_id": "t", "seed": 0})  # textarena seeds the global stream
    assert [random.random() for _ in range(3)] == expected


def test_an_unknown_game_names_the_closest_registered_ids():
    with pytest.raises(EnvSpecError) as err:
        load_env("textarena:GuessTheNumbr-v0")
    msg = str(err.value)
    assert "no TextArena game 'GuessTheNumbr-v0'" in msg and "closest: GuessTheNumber-v0" in msg and "\n" not in msg


def test_a_game_for_two_players_loads_as_a_game_of_two_seats_and_one_for_one_as_one():
    assert (load_env("textarena:TicTacToe-v0").seats, load_env(GAME).seats) == (2, 1)  # tests/test_selfplay.py plays it


def test_training_and_held_out_seeds_never_overlap():
    env = load_env(GAME)
    train, held = env.load_tasks(env.default_tasks), env.load_tasks(env.default_eval_tasks)
    assert (len(train), len(held)) == (2000, 200)
    assert not {t["seed"] for t in train} & {t["seed"] for t in held}
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in held}
    assert not {t["question"] for t in train} & {t["question"] for t in held}  # so no training task is dropped
    assert [t["seed"] for t in env.load_tasks("ta:count=3,seed=5")] == [5, 6, 7]
    for bad in ["ta:count=0", "ta:seed=x", "ta:colour=1", "arith:count=3"]:
        with pytest.raises(ValueError, match="ta"):
            env.load_tasks(bad)


def test_a_game_that_raises_ends_its_episode_as_an_env_error_and_is_closed(raising_game):
    env = load_env(raising_game, EpisodeSettings(max_turns=3))
    tasks = env.load_tasks("ta:count=1,seed=0")
    ok, boom = RolloutEngine(ScriptedPolicy([["fine", "BOOM"], ["more"], ["done"]]), sampling=SamplingParams(),
                             env=env).run(tasks, num_samples=2).results
    assert boom.trajectory.termination_reason == "error"
    assert "the game lost its board" in boom.trajectory.steps[-1].info["error"]
    assert ok.trajectory.termination_reason == "max_turns" and ok.trajectory.num_turns == 3
    game = env.make_env()
    game.reset(tasks[0])
    with pytest.raises(KeyError):
        game.step("BOOM")
    assert game.closed


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_guess_the_number_trains_two_steps(tmp_path, mode):
    rc, out, _ = run_train([*mode, "--env", GAME, "--max-turns", "3", "--max-steps", "2", "--run-name", "g",
                            "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert "[env] textarena:GuessTheNumber-v0" in out and "step 2/2" in out
    run = tmp_path / "runs" / "g"
    assert (run / "config.json").exists() and (run / "rollouts.jsonl").exists()
    episodes = read_rollouts(run)
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES
    assert all(e["task_id"].startswith("GuessTheNumber-v0-seed") for e in episodes)
    scalars = read_scalars(run)
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0]
    assert all(1 <= v <= 3 for _, v in scalars["textarena/turns_per_episode"])


@pytest.mark.parametrize("turns, new, taken, left", [("11", "32", 1632, 416), ("20", "64", 3712, -1664)])
def test_turns_that_leave_no_room_for_the_prompt_are_refused_naming_the_flags_that_shrink_them(tmp_path, capsys, turns,
                                                                                               new, taken, left):
    """The docs' GuessTheNumber rule (11 turns of 32 tokens) on tiny-random (a byte tokenizer, 2,048 tokens of
    context): 11 x 32 new tokens and 10 feedback turns of ~128 leave 416 tokens, less than the game's opening; 20
    turns of 64 leave less than none."""
    out = tmp_path / "runs"
    assert main([*TINY_ARGS, "--serial", "--env", "textarena:GuessTheNumber-v0", "--max-turns", turns,
                 "--max-new-tokens", new, "--output-dir", str(out), "--run-name", "r"]) == 2
    err = capsys.readouterr().err
    assert f"take {taken} of the model's 2048-token context, leaving {left} for the first prompt" in err
    assert "lower --max-turns or --max-new-tokens" in err and "--drop-long-prompts" not in err
    assert not out.exists()  # nothing written: the run folder the refusal stopped in is gone
