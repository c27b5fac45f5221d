"""Two-player games (rollout/games.py): every seat an episode of its own, groups by task and seat, the role-conditioned
advantage, the opponents, invalid moves, the scalars and the refusals; on a game that is not TextArena
(tests/duel_env.py) and on TextArena's. Training runs (serial, pipeline, resume) are `slow`."""

import json
from pathlib import Path

import pytest

from helpers import ScriptedPolicy
from nanorllm.algos.advantages import compute_advantage
from nanorllm.algos.groups import group_by_task_id
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import EnvSpecError, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run.lifecycle import main
from nanorllm.trainer.evaluate import evaluate
from nanorllm.trainer.metrics import rollout_metrics, selfplay_metrics
from tests.procs import read_rollouts, read_scalars, run_train
from tests.runs import TINY_ARGS

DUEL = f"{Path(__file__).parent / 'duel_env.py'}:Duel"


def duel(max_turns: int = 5, **settings):
    return load_env(DUEL, EpisodeSettings(max_turns=max_turns, **settings))


def play(policy, tasks, *, num_samples=1, max_turns=5, opponent=None, seed=0, env=None):
    engine = RolloutEngine(policy, sampling=SamplingParams(), env=env or duel(max_turns), opponent=opponent)
    return engine.run(tasks, num_samples=num_samples, seed=seed).results


def by_seat(seat_moves: dict[int, str]):
    """A policy that answers by the seat its conversation plays (the env's first message names it)."""
    return ScriptedPolicy(lambda call, row, messages: seat_moves[int(messages[1]["content"].split()[3].rstrip("."))])


HEAP5 = {"task_id": "heap5", "heap": 5, "game": "nim"}


def test_each_seat_is_an_episode_of_its_own_with_its_own_turns_messages_and_reward():
    seat0, seat1 = play(by_seat({0: "2", 1: "1"}), [HEAP5])  # 5 -2-> 3 -1-> 2 -2-> 0: seat 0 takes the last
    assert (seat0.seat, seat1.seat) == (0, 1) and seat0.group_id == seat1.group_id == "heap5"
    assert (seat0.reward, seat1.reward) == (1.0, -1.0)
    assert [s.observation for s in seat0.trajectory.steps] == ["You are seat 0. 5 stones left. Take 1 or 2.",
                                                               "You are seat 0. 2 stones left. Take 1 or 2."]
    assert [s.observation for s in seat1.trajectory.steps] == ["You are seat 1. 3 stones left. Take 1 or 2."]
    assert [s.turn for s in seat0.step_samples] == [0, 1] and [s.turn for s in seat1.step_samples] == [0]
    assert {s.episode_id for s in seat0.step_samples} == {"heap5#0/seat0"}
    last0, last1 = seat0.trajectory.steps[-1].info, seat1.trajectory.steps[-1].info
    assert (last0["outcome"], last0["success"], last1["outcome"], last1["success"]) == ("win", True, "loss", False)
    assert last1["action"] == "1"  # a seat's last step keeps its own move, not the winner's
    assert seat0.succeeded and not seat1.succeeded
    assert seat0.trajectory.termination_reason == "game_over" and seat0.trajectory.terminated
    assert all(s.reward == r.reward for r in (seat0, seat1) for s in r.step_samples)


def test_a_seats_turns_form_one_token_row_that_extends_its_own_last_turn():
    seat0, _ = play(by_seat({0: "1", 1: "1"}), [HEAP5])
    first, second = seat0.step_samples[:2]
    assert second.prompt_ids[:len(first.prompt_ids) + len(first.response_ids)] == \
        first.prompt_ids + first.response_ids


def test_a_local_model_decodes_every_live_games_next_turn_in_one_batch(tiny_policy):
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (5, 6, 7, 8)]
    env = load_env(DUEL, EpisodeSettings(max_turns=8), ["lenient=true"])
    out = RolloutEngine(tiny_policy, sampling=SamplingParams(max_new_tokens=4), env=env).run(tasks, num_samples=2,
                                                                                            seed=1)
    results, timings = out.results, out.timings
    assert len(results) == 16 and {r.seat for r in results} == {0, 1} and not any(r.failed for r in results)
    assert all(r.reward in (1.0, -1.0) and r.reward == -partner.reward
               for r, partner in zip(results[::2], results[1::2]))  # zero-sum: one seat of each game won
    assert timings["decode_rows"] / timings["decode_steps"] > 4  # the 8 games' turns decode together
    for r in results:  # a seat's turns extend its own row, whatever the other seat did between them
        for prev, s in zip(r.step_samples, r.step_samples[1:]):
            assert s.prompt_ids[:len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
    again = RolloutEngine(tiny_policy, sampling=SamplingParams(max_new_tokens=4), env=env).run(tasks, num_samples=2,
                                                                                              seed=1).results
    assert [[s.response_ids for s in r.step_samples] for r in again] == \
        [[s.response_ids for s in r.step_samples] for r in results]  # a fixed seed plays the same games


def _two_games_that_differ():
    """heap 5, two games: the first game's first move takes 2 (seat 1 then wins), every other move takes 1 (seat 0
    wins): a group per seat, each with a win and a loss."""
    return play(ScriptedPolicy(lambda call, row, messages: "2" if (call, row) == (0, 0) else "1"), [HEAP5],
                num_samples=2)


def test_groups_are_keyed_by_task_and_seat_and_each_seat_is_compared_with_its_own():
    results = _two_games_that_differ()
    assert [(r.seat, r.reward) for r in results] == [(0, -1.0), (1, 1.0), (0, 1.0), (1, -1.0)]
    groups = compute_advantage(group_by_task_id(results), normalize_std=False)
    assert list(groups) == ["seat0/heap5", "seat1/heap5"]
    assert [[r.step_samples[0].advantage for r in g] for g in groups.values()] == [[-1.0, 1.0], [1.0, -1.0]]
    assert all(s.advantage == r.step_samples[0].advantage for g in groups.values() for r in g for s in r.step_samples)


def test_the_role_conditioned_advantage_keeps_a_running_baseline_per_game_and_seat_across_steps():
    baselines: dict[str, float] = {}
    results = _two_games_that_differ()
    compute_advantage(group_by_task_id(results), estimator="rae", role_baselines=baselines, rae_decay=0.5)
    assert baselines == {"nim/seat0": 0.0, "nim/seat1": 0.0}  # a win and a loss a seat: mean 0
    assert [r.step_samples[0].advantage for r in results] == [-1.0, 1.0, 1.0, -1.0]
    won = play(by_seat({0: "2", 1: "1"}), [HEAP5], num_samples=2)  # seat 0 wins both: a constant group
    compute_advantage(group_by_task_id(won), estimator="rae", role_baselines=baselines, rae_decay=0.5)
    assert baselines == {"nim/seat0": 0.5, "nim/seat1": -0.5}
    assert [r.step_samples[0].advantage for r in won] == [0.5, -0.5, 0.5, -0.5]  # still a signal: beat the baseline
    grpo = compute_advantage(group_by_task_id(won))
    assert all(s.advantage == 0 for g in grpo.values() for r in g for s in r.step_samples)  # grpo's: none


def test_an_invalid_move_loses_the_game_and_counts_in_the_invalid_move_rate():
    seat0, seat1 = play(by_seat({0: "1", 1: "take three"}), [HEAP5])
    assert (seat0.reward, seat1.reward) == (1.0, -1.0)
    assert seat1.trajectory.termination_reason == "invalid_move" and seat1.trajectory.steps[-1].info["invalid_move"]
    assert not seat0.trajectory.steps[-1].info.get("invalid_move")
    m = rollout_metrics([seat0, seat1])
    assert (m["selfplay/invalid_move_rate"], m["selfplay/win_rate/seat0"], m["selfplay/win_rate/seat1"],
            m["selfplay/draw_rate"]) == (0.5, 1.0, 0.0, 0.0)
    assert m["success_rate"] == 0.5  # success is a win


def test_a_seat_the_game_ended_before_it_moved_gives_no_episode_and_is_reported_unplayed_with_its_reward():
    engine = RolloutEngine(by_seat({0: "nonsense"}), sampling=SamplingParams(), env=duel())
    batch = engine.run([HEAP5], num_samples=1, seed=0)
    (seat0,) = batch.results
    assert seat0.seat == 0 and seat0.reward == -1.0
    assert batch.unplayed == [(1, 1.0, HEAP5["task_id"])]  # seat 1 won on seat 0's invalid move, without a move


def test_held_out_evaluation_counts_the_games_the_opponent_lost_before_the_policy_moved():
    """Against a frozen model that breaks the rules at once, the policy (which breaks them too) wins exactly the games
    the opponent moves first in: they have no episode, and the win rate counts them."""
    env = duel(5, eval_opponent="frozen-model")
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4, 5, 6, 7, 8)]
    res = evaluate(by_seat({0: "nonsense", 1: "nonsense"}), tasks, sampling=SamplingParams(), env=env,
                   opponent_policy=ScriptedPolicy(lambda call, row, messages: "nonsense"))
    unplayed, played = res["unplayed"], res["n"]
    assert unplayed > 0 and played > 0 and unplayed + played == 6  # the policy's seat goes turn about over tasks
    assert res["success_rate"] == pytest.approx(unplayed / 6)  # was 0: the unplayed wins were not counted
    assert res["mean_reward"] == pytest.approx((unplayed - played) / 6)
    assert (res["selfplay/win_rate/seat0"], res["selfplay/win_rate/seat1"]) == (0.0, 1.0)
    assert res["selfplay/invalid_move_rate"] == 1.0 and res["selfplay/draw_rate"] == 0.0  # over the games played
    assert "unplayed" not in evaluate(by_seat({0: "1", 1: "1"}), tasks, sampling=SamplingParams(),
                                      env=duel(5, eval_opponent="random"))


def test_the_turn_limit_ends_a_game_as_a_draw_for_every_seat():
    seat0, seat1 = play(by_seat({0: "1", 1: "1"}), [{"task_id": "h9", "heap": 9}], max_turns=2)
    assert [r.trajectory.termination_reason for r in (seat0, seat1)] == ["max_turns", "max_turns"]
    assert (seat0.reward, seat1.reward, seat0.trajectory.num_turns) == (0.0, 0.0, 2)
    assert selfplay_metrics([seat0, seat1])["selfplay/draw_rate"] == 1.0


def test_the_random_opponent_plays_legal_moves_and_the_policy_takes_each_seat_in_turn():
    tasks = [{"task_id": f"h{h}", "heap": h} for h in (6, 7)]
    results = play(by_seat({0: "1", 1: "1"}), tasks, num_samples=4, opponent="random", seed=3)
    assert len(results) == 8 and all(r.opponent == "random" for r in results)
    for task in ("h6", "h7"):
        seats = [r.seat for r in results if r.task_id == task]
        assert sorted(seats) == [0, 0, 1, 1] and seats[0] != seats[1]
    assert not any(s.info.get("invalid_move") for r in results for s in r.trajectory.steps)
    again = play(by_seat({0: "1", 1: "1"}), tasks, num_samples=4, opponent="random", seed=3)
    assert [[s.observation for s in r.trajectory.steps] for r in again] == \
        [[s.observation for s in r.trajectory.steps] for r in results]  # the opponent's moves follow the seed


def test_a_model_opponent_plays_the_other_seat_and_only_the_policys_seat_trains():
    opponent = ScriptedPolicy(lambda call, row, messages: "2")
    engine = RolloutEngine(by_seat({0: "1", 1: "1"}), sampling=SamplingParams(), env=duel(), opponent="frozen-model",
                           opponent_policy=opponent)
    results = engine.run([HEAP5, {"task_id": "heap6", "heap": 6, "game": "nim"}], num_samples=2, seed=0).results
    assert len(results) == 4 and all(r.opponent == "frozen-model" for r in results)
    for task in ("heap5", "heap6"):
        assert sorted(r.seat for r in results if r.task_id == task) == [0, 1]  # one seat a game, turn about
    for r in results:  # the opponent took 2 between the policy's turns of 1
        counts = [int(s.observation.split()[4]) for s in r.trajectory.steps]
        assert all(b == a - 3 for a, b in zip(counts, counts[1:]))
    assert opponent.batch_sizes and all(n <= 4 for n in opponent.batch_sizes)
    with pytest.raises(ValueError, match="opponent_policy"):
        RolloutEngine(opponent, sampling=SamplingParams(), env=duel(), opponent="frozen-model")


def test_a_local_model_opponent_decodes_in_a_batch_of_its_own(tiny_policy, tiny_policy_factory):
    env = load_env(DUEL, EpisodeSettings(max_turns=8), ["lenient=true"])
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (5, 6, 7, 8)]
    out = RolloutEngine(tiny_policy, sampling=SamplingParams(max_new_tokens=4), env=env, opponent="tiny-random",
                        opponent_policy=tiny_policy_factory()).run(tasks, num_samples=2, seed=1)
    assert len(out.results) == 8 and not any(r.failed for r in out.results)
    assert {r.seat for r in out.results} == {0, 1} and all(r.reward in (1.0, -1.0) for r in out.results)
    assert out.timings["gen_tokens"] == sum(len(s.response_ids) for r in out.results for s in r.step_samples)


@pytest.fixture
def served_opponent():
    """tiny-random behind an OpenAI-compatible endpoint on this machine (rollout/serve.py)."""
    pytest.importorskip("aiohttp")
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.rollout.serve import FrozenServer

    server = FrozenServer(HFCausalPolicy.from_name("tiny-random", replica=True), model_name="frozen",
                          max_new_tokens=4)
    yield server
    server.close()


def test_an_endpoint_opponent_answers_between_the_policys_decode_steps(tiny_policy, served_opponent):
    from nanorllm.policy.chat_endpoint import ChatEndpointPolicy

    env = load_env(DUEL, EpisodeSettings(max_turns=8), ["lenient=true"])
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (5, 6)]
    opponent = ChatEndpointPolicy(served_opponent.url)  # the model name: the first the server lists
    assert opponent.model == "frozen"
    results = RolloutEngine(tiny_policy, sampling=SamplingParams(max_new_tokens=4), env=env, opponent=served_opponent.url,
                            opponent_policy=opponent).run(tasks, num_samples=2, seed=1).results
    assert len(results) == 4 and not any(r.failed for r in results) and served_opponent.served > 0
    assert {r.seat for r in results} == {0, 1}


def test_an_endpoint_opponent_that_does_not_answer_ends_its_games_as_env_errors():
    import socket

    from nanorllm.policy.chat_endpoint import ChatEndpointPolicy

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1#m"
    engine = RolloutEngine(by_seat({0: "1", 1: "1"}), sampling=SamplingParams(), env=duel(), opponent=url,
                           opponent_policy=ChatEndpointPolicy(url, timeout_s=2))
    results = engine.run([HEAP5], num_samples=2, seed=0).results
    assert [r.trajectory.termination_reason for r in results] == ["error", "error"]
    assert all(r.failed for r in results) and rollout_metrics(results)["rollout/env_errors"] == 2


def test_the_memory_plan_counts_a_model_opponent_where_rollouts_run():
    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import plan_run
    from nanorllm.run.assembly import assemble
    from nanorllm.utils.devices import DeviceMap

    def plan(**kw):
        parts = assemble(TrainConfig(model="tiny-random", env=DUEL, **kw))
        parts.devices = DeviceMap(learners=["cpu"], workers=["cpu", "cpu"])
        return {p.name: [part.name for part in p.parts] for p in plan_run(parts, free={"cpu": 10**12}).processes}

    frozen = plan(opponent="tiny-random", eval_opponent="random")
    assert "opponent" not in frozen["learner"] and all("opponent" in frozen[f"worker {i}"] for i in (0, 1))
    assert not any("opponent" in names for names in plan(eval_opponent="random").values())
    assert plan()["learner"].count("eval opponent") == 1  # the base, frozen, where held-out evaluation runs
    assert not any("eval opponent" in names for names in plan(eval_opponent="self").values())


def test_the_memory_plan_of_a_game_shares_no_prompt_prefix_between_its_seats_rows():
    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import plan_run
    from nanorllm.memory.tasks import TaskShape
    from nanorllm.run.assembly import assemble

    parts = assemble(TrainConfig(model="tiny-random", env=DUEL))
    [act] = [p for p in plan_run(parts, free={"cpu": 10**12}, tasks=TaskShape(first=84, shared=71)).processes[0].parts
             if p.name == "activations"]
    assert "shared" not in act.note  # seat 0 and seat 1 are shown different rules: one pass holds both seats' rows


def test_a_seats_row_is_sized_for_the_other_seats_replies_it_is_shown(tiny_policy):
    # TextArena shows each player every message: a TicTacToe seat's rows ran to ~1,400 tokens against the 1,071 a
    # one-player episode's feedback allowance gave them, and its slots widened and the plan missed mid-run
    from nanorllm.rollout.prompt_budget import prompt_limit

    sampling = SamplingParams(max_new_tokens=64)
    game = RolloutEngine(tiny_policy, sampling=sampling, env=duel(5))
    solo = RolloutEngine(tiny_policy, sampling=sampling, env=load_env("math", EpisodeSettings(max_turns=5)))
    assert solo.slot_width(100) == -(-(100 + 5 * 64 + 4 * 128) // 64) * 64
    assert game.slot_width(100) == -(-(100 + 5 * 64 + 4 * (128 + 64)) // 64) * 64  # the other seat's 4 replies
    limits = [prompt_limit(tiny_policy, max_prompt_tokens=None, sampling=sampling, max_turns=5, seats=n)
              for n in (1, 2)]
    assert limits[0] - limits[1] == 4 * 64  # the context check leaves the first prompt that much less


def test_a_model_opponent_this_machine_cannot_read_is_refused_at_start(tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--env", DUEL, "--opponent", str(tmp_path / "no-model"),
                 "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "opponent: " in err and "is neither self, random, pool, an endpoint" in err


def test_a_game_the_env_breaks_ends_every_policy_seat_as_an_env_error(monkeypatch):
    env = duel()
    monkeypatch.setattr(env.env_class, "seat", lambda self: 7 if self.left < 5 else self.mover)  # after a move
    results = play(by_seat({0: "1", 1: "1"}), [HEAP5], env=env)
    assert [r.trajectory.termination_reason for r in results] == ["error", "error"]
    assert "env.seat(): expected a seat 0..1, got 7" in results[0].trajectory.steps[-1].info["error"]
    assert all(r.failed for r in results) and rollout_metrics(results)["rollout/env_errors"] == 2
    assert selfplay_metrics(results) == {}


def test_held_out_evaluation_plays_the_fixed_eval_opponent():
    env = duel(5, opponent="self", eval_opponent="random")
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4, 5, 6)]
    res = evaluate(by_seat({0: "1", 1: "1"}), tasks, sampling=SamplingParams(), env=env)
    assert res["n"] == 4  # one policy seat a game, not two
    assert "selfplay/win_rate/seat0" in res or "selfplay/win_rate/seat1" in res


def test_held_out_evaluation_plays_the_frozen_base_by_default_one_policy_seat_a_game(tiny_policy_factory):
    from nanorllm.config import TrainConfig
    from nanorllm.trainer.training_engine import eval_opponent_model

    env = load_env(DUEL, EpisodeSettings(max_turns=8), ["lenient=true"])  # the random model's moves count
    assert env.settings.eval_opponent == "base" and TrainConfig().eval_opponent == "base"
    policy = by_seat({0: "1", 1: "1"})
    policy.device = "cpu"
    base = eval_opponent_model(policy, TrainConfig(model="tiny-random", env=DUEL), env)
    assert base is not None and not any(p.requires_grad for p in base.model.parameters())
    assert eval_opponent_model(policy, TrainConfig(model="tiny-random", env=DUEL, eval_opponent="self"), env) is None
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4, 5, 6)]
    res = evaluate(policy, tasks, sampling=SamplingParams(max_new_tokens=4), env=env, opponent_policy=base)
    assert res["n"] + res["failed"] == 4  # one policy seat a game, the base frozen in the other
    with pytest.raises(ValueError, match="is a model or the snapshot pool: pass it as opponent_policy"):
        evaluate(policy, tasks, sampling=SamplingParams(), env=env)


def test_an_eval_opponent_this_machine_cannot_read_is_refused_at_start(tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--env", DUEL, "--eval-opponent", "./no-such-model",
                 "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "eval_opponent: './no-such-model' is neither self, random, base, an endpoint" in err


def test_launch_eval_refuses_an_eval_opponent_it_cannot_read_in_one_line(capsys, monkeypatch):
    from nanorllm.run import evaluation

    monkeypatch.setattr(evaluation, "evaluate_model", lambda cfg: pytest.fail("the model loaded"))
    assert evaluation.main(["--model", "tiny-random", "--env", DUEL, "--eval-opponent", "./no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: eval_opponent: './no-such-model' is neither self, random")


def test_sampled_evaluation_counts_a_tasks_games_by_their_seats_episodes():
    from nanorllm.trainer.evaluate import evaluate_sampled

    env = duel(5, eval_opponent="self")
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4)]
    res = evaluate_sampled(by_seat({0: "1", 1: "1"}), tasks, sampling=SamplingParams(), env=env, samples=2)
    assert res["sampled_failed"] == 0 and res["mean@2"] == 0.5  # self-play: a seat of each game wins


def test_sampled_evaluation_counts_the_games_the_opponent_lost_before_the_policy_moved_as_greedy_play_does():
    """The greedy test above, sampled: the unplayed games are samples of their tasks, won, in mean@n and pass@k."""
    from nanorllm.trainer.evaluate import evaluate_sampled

    env = duel(5, eval_opponent="frozen-model")
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4, 5, 6, 7, 8)]
    res = evaluate_sampled(by_seat({0: "nonsense", 1: "nonsense"}), tasks, sampling=SamplingParams(), env=env,
                           samples=2, opponent_policy=ScriptedPolicy(lambda call, row, messages: "nonsense"))
    # a task's 2 games: the policy seat goes turn about, so each task has one game it opened (lost on its own
    # invalid move) and one the opponent opened (lost before the policy moved: unplayed, a win); was 0.0 / 0.0
    assert (res["mean@2"], res["pass@1"], res["pass@2"], res["sampled_failed"]) == (0.5, 0.5, 1.0, 0)
    assert (res["sampled/selfplay/win_rate/seat0"], res["sampled/selfplay/win_rate/seat1"]) == (0.0, 1.0)


def test_sampled_evaluation_reports_its_games_invalid_moves_beside_the_greedy_ones():
    from nanorllm.trainer.evaluate import evaluate_sampled

    env = duel(5, eval_opponent="self")
    tasks = [{"task_id": f"h{h}", "heap": h, "game": "nim"} for h in (3, 4)]
    res = evaluate_sampled(by_seat({0: "1", 1: "take three"}), tasks, sampling=SamplingParams(), env=env, samples=2)
    # seat 1 breaks the rules at its first move in every game: half the episodes played broke one, seat 0 wins all
    assert (res["sampled/selfplay/invalid_move_rate"], res["sampled/selfplay/win_rate/seat0"],
            res["sampled/selfplay/win_rate/seat1"], res["sampled/selfplay/draw_rate"]) == (0.5, 1.0, 0.0, 0.0)


def test_an_opponent_for_a_one_player_env_is_refused_at_start_naming_the_flag(tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--opponent", "random", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--opponent random" in err and "one-player env" in err


def test_an_opponent_that_is_no_choice_and_no_model_is_refused_naming_the_choices(tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--opponent", "./frozen-model", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "opponent" in err and "random" in err and "self" in err


def test_the_random_opponent_is_refused_for_a_game_without_legal_moves():
    bundle = type("BareDuel", (type(duel()),), {"env_class": type("Bare", (), {}), "name": "bare"})
    with pytest.raises(EnvSpecError, match="--eval-opponent random: bare's env has no legal_moves"):
        bundle(EpisodeSettings(eval_opponent="random"))
    bundle(EpisodeSettings())  # held-out evaluation's default opponent, the base model, needs no move list
    with pytest.raises(EnvSpecError, match="--opponent random: bare's env"):
        bundle(EpisodeSettings(opponent="random", eval_opponent="self"))
    bundle(EpisodeSettings(eval_opponent="self"))


def test_several_learner_ranks_are_refused_with_the_role_conditioned_advantage():
    from nanorllm.config import TrainConfig
    from nanorllm.config.checks import config_problems

    problems = config_problems(TrainConfig(adv_estimator="rae", learner_devices="2", rae_decay=1.0))
    assert any(p.startswith("adv_estimator: rae keeps") for p in problems)
    assert any(p.startswith("rae_decay: must be in [0, 1)") for p in problems)


# ---- TextArena's two-player games ----------------------------------------------------------------------------

textarena = pytest.importorskip("textarena")


def test_tictactoe_plays_both_seats_and_the_game_decides_the_rewards():
    env = load_env("textarena:TicTacToe-v0", EpisodeSettings(max_turns=5))
    assert env.seats == 2
    moves = iter(["[4]", "[0]", "[3]", "[1]", "[5]"])  # O takes the middle row
    results = RolloutEngine(ScriptedPolicy(lambda call, row, messages: next(moves)), sampling=SamplingParams(),
                            env=env).run(env.load_tasks("ta:count=1,seed=3")).results
    rewards = {r.seat: r.reward for r in results}
    assert rewards == {0: 1.0, 1: -1.0}
    first = {r.seat: r.trajectory.steps[0].observation for r in results}
    assert first[0].startswith("You are Player 0") and first[1].startswith("You are Player 1")
    assert "[4]" not in results[1].trajectory.steps[0].observation.split("Available Moves:")[-1]
    assert env.metrics(results)["textarena/won"] == 0.5


def test_a_textarena_invalid_move_after_its_second_chance_loses_the_game():
    env = load_env("textarena:TicTacToe-v0", EpisodeSettings(max_turns=5))
    results = RolloutEngine(ScriptedPolicy(lambda call, row, messages: "no idea"), sampling=SamplingParams(),
                            env=env).run(env.load_tasks("ta:count=1,seed=3")).results
    (seat0,) = results  # seat 0 broke the rules twice: seat 1 never moved
    assert seat0.reward == -1.0 and seat0.trajectory.num_turns == 2
    assert seat0.trajectory.termination_reason == "invalid_move"
    assert selfplay_metrics(results)["selfplay/invalid_move_rate"] == 1.0


def test_kuhn_poker_against_the_random_opponent_lists_its_legal_moves():
    env = load_env("textarena:KuhnPoker-v0", EpisodeSettings(max_turns=8))
    game = env.make_env()
    game.reset({"task_id": "t", "seed": 1})
    assert sorted(game.legal_moves()) == ["[bet]", "[check]"]
    game.close()
    results = RolloutEngine(ScriptedPolicy(lambda call, row, messages: "[check]"), sampling=SamplingParams(), env=env,
                            opponent="random").run(env.load_tasks("ta:count=2,seed=1"), num_samples=2, seed=0).results
    assert {r.seat for r in results} == {0, 1} and all(not r.failed for r in results)


def test_a_kuhn_game_deals_its_later_rounds_from_its_seed_whatever_else_draws_from_random():
    """KuhnPoker deals every round at step time from the module-level `random`: a game's later rounds are its seed's
    alone (not moved by another game's or the trainer's draws between its moves), and the trainer's stream is left
    where it was."""
    import random

    from nanorllm.envs.textarena import innermost

    env = load_env("textarena:KuhnPoker-v0", EpisodeSettings(max_turns=8))

    def deals(disturb):
        game = env.make_env()
        game.reset({"task_id": "t", "seed": 11})
        cards, done = [], False
        while not done:
            disturb()  # another game's turn, the trainer's own draws
            _, _, done, _ = game.step("[check]")  # both check: a showdown, the next round dealt
            state = innermost(game.game).state.game_state
            cards.append((state["current_round"], state["player_cards"][0], state["player_cards"][1]))
        return cards

    alone = deals(lambda: None)
    assert len({c for c in alone if c[0] > 1}) >= 2  # later rounds were dealt: there is something to compare
    for k in range(5):  # before each game had its own stream, most of these dealt other cards in rounds 2 and 3
        random.seed(k)
        assert deals(lambda: [random.random() for _ in range(k + 1)]) == alone
    random.seed(123)
    before = random.getstate()
    deals(lambda: None)
    assert random.getstate() == before


def test_a_game_for_more_than_two_players_is_refused_in_one_line():
    with pytest.raises(EnvSpecError) as err:
        load_env("textarena:SecretMafia-v0")
    assert "for more than two players" in str(err.value) and "\n" not in str(err.value)


def test_the_random_opponent_is_refused_for_a_game_whose_moves_are_not_listed():
    with pytest.raises(EnvSpecError) as err:
        load_env("textarena:SimpleNegotiation-v0", EpisodeSettings(opponent="random"))
    assert "--opponent random" in str(err.value) and "lists no legal moves" in str(err.value)
    with pytest.raises(EnvSpecError, match="--eval-opponent random"):
        load_env("textarena:SimpleNegotiation-v0", EpisodeSettings(eval_opponent="random"))
    load_env("textarena:SimpleNegotiation-v0", EpisodeSettings(eval_opponent="self"))
    load_env("textarena:SimpleNegotiation-v0", EpisodeSettings())  # the default: the base model, frozen


# ---- training ------------------------------------------------------------------------------------------------

DUEL_RUN = ["--env", DUEL, "--env-arg", "lenient=true", "--max-turns", "4", "--max-new-tokens", "6",
            "--no-save-model"]


@pytest.mark.slow
def test_serial_and_synchronous_pipeline_play_the_same_games(tmp_path):
    common = [*DUEL_RUN, "--max-steps", "2", "--seed", "3", "--no-drop-zero-std-groups"]
    rc1, out1, _ = run_train([*common, "--serial", "--run-name", "s"], tmp_path)
    rc2, out2, _ = run_train([*common, "--num-workers", "1", "--max-policy-lag", "0", "--run-name", "p"], tmp_path)
    assert rc1 == 0 and rc2 == 0, out1 + out2
    key = lambda r: (r["group_id"], r["seat"], str(r["turns"]))  # noqa: E731
    serial, pipe = sorted(read_rollouts(tmp_path / "s"), key=key), sorted(read_rollouts(tmp_path / "p"), key=key)
    assert {r["seat"] for r in serial} == {0, 1}
    assert [(r["group_id"], r["seat"], r["final_reward"], r["advantage"], [t["response"] for t in r["turns"]])
            for r in serial] == \
           [(r["group_id"], r["seat"], r["final_reward"], r["advantage"], [t["response"] for t in r["turns"]])
            for r in pipe]
    s, p = read_scalars(tmp_path / "s"), read_scalars(tmp_path / "p")
    for tag in ["loss/policy", "selfplay/win_rate/seat0", "selfplay/win_rate/seat1", "selfplay/draw_rate",
                "selfplay/invalid_move_rate", "eval/selfplay/win_rate/seat0"]:
        assert [v for _, v in s[tag]] == pytest.approx([v for _, v in p[tag]], rel=1e-4, abs=1e-6), tag


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_frozen_model_opponent_trains_two_steps(tmp_path, mode):
    rc, out, _ = run_train([*DUEL_RUN, *mode, "--opponent", "tiny-random", "--max-steps", "2", "--run-name", "o"],
                           tmp_path)
    assert rc == 0, out
    assert "opponent" in out  # the memory plan's line
    episodes = read_rollouts(tmp_path / "o")
    assert episodes and {e["opponent"] for e in episodes} == {"tiny-random"} and {e["seat"] for e in episodes} == {0, 1}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_an_endpoint_opponent_trains_two_steps(tmp_path, mode, served_opponent):
    rc, out, _ = run_train([*DUEL_RUN, *mode, "--opponent", f"{served_opponent.url}#frozen", "--max-steps", "2",
                            "--run-name", "e"], tmp_path)
    assert rc == 0, out
    episodes = read_rollouts(tmp_path / "e")
    assert episodes and {e["seat"] for e in episodes} == {0, 1} and served_opponent.served > 0


@pytest.mark.slow
def test_the_role_baselines_are_saved_with_a_checkpoint_and_resume_from_it(tmp_path):
    common = [*DUEL_RUN, "--adv-estimator", "rae", "--save-every", "1", "--serial", "--run-name", "r"]
    rc, out, _ = run_train([*common, "--max-steps", "2"], tmp_path)
    assert rc == 0, out
    ckpts = sorted((tmp_path / "r" / "checkpoints").iterdir())
    saved = json.loads((ckpts[-1] / "trainer_state.json").read_text())["totals"]["role_baselines"]
    assert set(saved) == {"nim/seat0", "nim/seat1"} and all(-1 <= b <= 1 for b in saved.values())
    rc, out, _ = run_train(["--resume", str(tmp_path / "r"), "--max-steps", "3"], tmp_path)
    assert rc == 0 and "[resume]" in out, out
    last = json.loads((sorted((tmp_path / "r" / "checkpoints").iterdir())[-1] / "trainer_state.json").read_text())
    resumed = last["totals"]["role_baselines"]
    assert last["step"] == 3 and set(resumed) == set(saved) and resumed != saved  # moved on from the saved ones


@pytest.mark.slow
@pytest.mark.parametrize("game, extra", [("TicTacToe-v0", []), ("KuhnPoker-v0", ["--opponent", "random"]),
                                         ("SimpleNegotiation-v0", ["--eval-opponent", "self"])])
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_textarena_two_player_games_train_two_steps(tmp_path, game, extra, mode):
    rc, out, _ = run_train([*mode, "--env", f"textarena:{game}", "--max-turns", "3", "--max-steps", "2",
                            "--run-name", "g", "--no-save-model", *extra], tmp_path)
    assert rc == 0, out
    assert "step 2/2" in out
    episodes = read_rollouts(tmp_path / "g")
    assert episodes and all("seat" in e for e in episodes)
    scalars = read_scalars(tmp_path / "g")
    assert "selfplay/invalid_move_rate" in scalars and "eval/success_rate" in scalars
