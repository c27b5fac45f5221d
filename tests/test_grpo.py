import math

import pytest

from nanorllm.algos.advantages import carries_signal, compute_advantage, turn_returns
from nanorllm.algos.groups import drop_failed, flatten_step_samples, group_by_task_id
from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory


def episode(task_id, k, reward, *, turns=1, group_id=""):
    samples = [StepSample(task_id=task_id, episode_id=f"{task_id}#{k}", turn=t, prompt_ids=[5] * (t + 1),
                          response_ids=[6], rollout_logprobs=[-1.0]) for t in range(turns)]
    return RolloutResult(trajectory=Trajectory(task_id=task_id, final_reward=reward), step_samples=samples,
                         group_id=group_id)


def advantages(results):
    return [r.step_samples[0].advantage for r in results]


def test_known_example_with_std_normalisation():
    results = [episode("a", k, r) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    compute_advantage(group_by_task_id(results))
    std = math.sqrt(0.1875)
    assert std == pytest.approx(0.4330127)
    assert advantages(results) == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-5)
    assert advantages(results) == pytest.approx([1.7320508, -0.5773503, -0.5773503, -0.5773503], rel=1e-5)


def test_known_example_without_std_normalisation():
    results = [episode("a", k, r) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    compute_advantage(group_by_task_id(results), normalize_std=False)
    assert advantages(results) == [0.75, -0.25, -0.25, -0.25]


@pytest.mark.parametrize("normalize_std", [True, False])
def test_zero_mean_per_group(normalize_std):
    rewards = {"a": [1.0, 0.0, 1.0], "b": [0.2, 0.9, 0.4, 0.0, 0.5]}
    results = [episode(t, k, r) for t, rs in rewards.items() for k, r in enumerate(rs)]
    groups = compute_advantage(group_by_task_id(results), normalize_std=normalize_std)
    for rs in groups.values():
        advs = advantages(rs)
        assert sum(advs) == pytest.approx(0.0, abs=1e-9)
        assert any(a != 0 for a in advs)


def test_normalised_group_has_unit_population_std():
    results = [episode("b", k, r) for k, r in enumerate([0.2, 0.9, 0.4, 0.0, 0.5])]
    compute_advantage(group_by_task_id(results), eps=0.0)
    advs = advantages(results)
    assert math.sqrt(sum(a * a for a in advs) / len(advs)) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("reward", [0.0, 1.0, 0.3])
def test_constant_reward_group_gets_exact_zero(normalize_std, reward):
    results = [episode("c", k, reward) for k in range(4)]
    for r in results:
        r.step_samples[0].advantage = 123.0
    compute_advantage(group_by_task_id(results), normalize_std=normalize_std)
    assert advantages(results) == [0.0, 0.0, 0.0, 0.0]
    assert not carries_signal(results)


def test_constant_non_dyadic_reward_gives_no_nan_and_negligible_advantage():
    results = [episode("c", k, 0.1) for k in range(3)]
    compute_advantage(group_by_task_id(results))
    assert all(abs(a) < 1e-9 for a in advantages(results))


CONSTANT_GROUP_BUG = (
    "compute_advantage relies on r - mean == 0 for a constant group, but mean is a float sum: "
    "for rewards [0.1]*3 r - mean == -1.39e-17 == -std, so with adv_eps=0 (accepted by "
    "TrainConfig.validate) every advantage is -1.0, and for [1.0]*4 it raises ZeroDivisionError")



def test_constant_group_with_zero_eps_gets_zero_advantage():
    results = [episode("c", k, 0.1) for k in range(3)]
    compute_advantage(group_by_task_id(results), eps=0.0)
    assert advantages(results) == [0.0, 0.0, 0.0]



def test_constant_integer_group_with_zero_eps_does_not_raise():
    results = [episode("c", k, 1.0) for k in range(4)]
    compute_advantage(group_by_task_id(results), eps=0.0)
    assert advantages(results) == [0.0] * 4


def test_group_of_one_gets_zero():
    results = [episode("solo", 0, 1.0)]
    compute_advantage(group_by_task_id(results))
    assert advantages(results) == [0.0]


def test_every_turn_of_an_episode_gets_its_advantage():
    results = [episode("a", 0, 1.0, turns=1), episode("a", 1, 0.0, turns=3)]
    compute_advantage(group_by_task_id(results), normalize_std=False)
    assert [s.advantage for s in results[0].step_samples] == [0.5]
    assert [s.advantage for s in results[1].step_samples] == [-0.5, -0.5, -0.5]


def test_group_by_task_id_keeps_arrival_order():
    results = [episode("b", 0, 0.0), episode("a", 0, 1.0), episode("b", 1, 1.0), episode("a", 1, 0.0)]
    groups = group_by_task_id(results)
    assert list(groups) == ["b", "a"]
    assert groups["b"] == [results[0], results[2]]
    assert groups["a"] == [results[1], results[3]]


def test_group_by_prefers_group_id():
    results = [episode("a", 0, 1.0, group_id="a@r1"), episode("a", 1, 0.0, group_id="a@r2"),
               episode("a", 2, 0.0, group_id="a@r1"), episode("b", 0, 0.0)]
    groups = group_by_task_id(results)
    assert list(groups) == ["a@r1", "a@r2", "b"]
    assert groups["a@r1"] == [results[0], results[2]]
    compute_advantage(groups, normalize_std=False)
    assert advantages(results) == [0.5, 0.0, -0.5, 0.0]


def test_flatten_keeps_episodes_contiguous_in_turn_order():
    results = [episode("a", 0, 1.0, turns=2), episode("a", 1, 0.0, turns=3), episode("b", 0, 0.5, turns=1)]
    samples = flatten_step_samples(group_by_task_id(results))
    assert [(s.episode_id, s.turn) for s in samples] == [
        ("a#0", 0), ("a#0", 1), ("a#1", 0), ("a#1", 1), ("a#1", 2), ("b#0", 0)]


def test_flatten_drop_zero_std_drops_constant_groups_only():
    results = [episode("a", 0, 1.0, turns=2), episode("a", 1, 0.0),
               episode("c", 0, 1.0), episode("c", 1, 1.0),
               episode("z", 0, 0.0, turns=2), episode("z", 1, 0.0)]
    groups = compute_advantage(group_by_task_id(results))
    kept = flatten_step_samples(groups, drop_zero_std=True)
    assert [(s.episode_id, s.turn) for s in kept] == [("a#0", 0), ("a#0", 1), ("a#1", 0)]
    assert len(flatten_step_samples(groups)) == 8
    assert [carries_signal(rs) for rs in groups.values()] == [True, False, False]


# ---- turn-level credit ----------------------------------------------------------------------

def multi_turn(task_id, k, turn_rewards):
    """An episode whose turn t got turn_rewards[t] from the env (1 = solved on that turn)."""
    r = episode(task_id, k, turn_rewards[-1], turns=len(turn_rewards))
    r.trajectory.steps = [Step(observation="q", reward=x) for x in turn_rewards]
    return r


def test_turn_returns_are_own_reward_plus_discounted_later_outcome():
    assert turn_returns(multi_turn("a", 0, [0.0, 1.0]), 0.5) == [0.5, 1.0]
    assert turn_returns(multi_turn("a", 0, [1.0]), 0.5) == [1.0]
    assert turn_returns(multi_turn("a", 0, [0.0, 0.0, 1.0]), 0.9) == pytest.approx([0.81, 0.9, 1.0])
    assert turn_returns(episode("a", 0, 1.0, turns=2), 0.5) == [0.5, 1.0]  # no recorded steps: final reward last


@pytest.mark.parametrize("normalize_std", [True, False])
def test_turn_credit_zero_mean_per_group_and_turn_index(normalize_std):
    turns = {"a": [[1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0]], "b": [[0.0, 0.0, 1.0], [1.0], [0.0, 1.0]]}
    results = [multi_turn(t, k, rs) for t, eps in turns.items() for k, rs in enumerate(eps)]
    groups = compute_advantage(group_by_task_id(results), normalize_std=normalize_std, turn_credit="turn",
                               turn_gamma=0.5)
    for rs in groups.values():
        for t in range(3):
            advs = [r.step_samples[t].advantage for r in rs if len(r.step_samples) > t]
            assert sum(advs) == pytest.approx(0.0, abs=1e-9)
            assert all(math.isfinite(a) for a in advs)


def test_turn_credit_first_try_success_beats_a_fixed_wrong_answer():
    results = [multi_turn("a", 0, [1.0]), multi_turn("a", 1, [0.0, 1.0]), multi_turn("a", 2, [0.0, 0.0])]
    compute_advantage(group_by_task_id(results), turn_credit="turn", turn_gamma=0.5)
    first, fixed, failed = (r.step_samples[0].advantage for r in results)
    assert first > fixed > failed
    assert results[1].step_samples[1].advantage > 0 > results[2].step_samples[1].advantage
    compute_advantage(group_by_task_id(results))  # episode credit: the wrong first answer ties the success
    assert results[0].step_samples[0].advantage == results[1].step_samples[0].advantage


def test_turn_credit_constant_sets_get_exact_zero():
    results = [multi_turn("a", k, [0.0, 0.3]) for k in range(3)] + [multi_turn("b", 0, [0.0, 1.0])]
    compute_advantage(group_by_task_id(results), turn_credit="turn", turn_gamma=0.7, eps=0.0)
    assert all(s.advantage == 0.0 for r in results for s in r.step_samples)


def test_drop_zero_std_keeps_a_solved_group_whose_turns_differ():
    # every episode solved, one only on its retry: the episode rewards are constant, the turns are not
    results = [multi_turn("a", 0, [1.0]), multi_turn("a", 1, [0.0, 1.0])]
    groups = compute_advantage(group_by_task_id(results), turn_credit="turn", turn_gamma=0.5)
    assert not carries_signal(groups["a"]) and carries_signal(groups["a"], turn_credit="turn", turn_gamma=0.5)
    assert len(flatten_step_samples(groups, drop_zero_std=True)) == 3
    groups = compute_advantage(group_by_task_id(results))
    assert flatten_step_samples(groups, drop_zero_std=True) == []


def test_env_error_episodes_leave_their_group_which_trains_short_or_is_dropped():
    def ep(gid, reward, reason):
        return RolloutResult(trajectory=Trajectory(task_id=gid, final_reward=reward, termination_reason=reason),
                             step_samples=[], group_id=gid)

    whole = [ep("a", 1.0, "correct"), ep("a", 0.0, "max_turns")]
    short = [ep("b", 1.0, "correct"), ep("b", 0.0, "error"), ep("b", 0.0, "max_turns"), ep("b", 1.0, "correct")]
    lost = [ep("c", 0.0, "error"), ep("c", 1.0, "correct")]
    kept, n_short, n_dropped = drop_failed(whole + short + lost)
    assert (n_short, n_dropped) == (1, 1)
    assert kept == whole + [short[0], short[2], short[3]]


# ---- the estimators' registry -----------------------------------------------------------------

def test_a_registered_estimator_is_one_function_and_the_configs_choices_are_the_registrys_names(monkeypatch):
    from nanorllm.algos import advantages as registry
    from nanorllm.config import TrainConfig

    assert tuple(registry.ESTIMATORS) == ("grpo", "rloo", "reinforce++", "rae")
    monkeypatch.setattr(registry, "ESTIMATORS", dict(registry.ESTIMATORS))
    refused = [p for p in TrainConfig(adv_estimator="best-of-group").validate() if p.startswith("adv_estimator")]
    assert refused == ["adv_estimator: must be one of grpo, rloo, reinforce++, rae, got 'best-of-group' (or a user "
                       "estimator, path/to/file.py:fn or module.path:fn)"]

    @registry.register_estimator("best-of-group")
    def best_of_group(sets, spec):
        return [[1.0 if x == max(r for r, _ in items) else 0.0 for x, _ in items] for items in sets]

    assert TrainConfig(adv_estimator="best-of-group").validate() == []  # registered in Python: a choice
    results = [episode("a", k, r) for k, r in enumerate([0.2, 0.9, 0.4])]
    compute_advantage(group_by_task_id(results), estimator="best-of-group")
    assert advantages(results) == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="'grpo' is registered already"):
        registry.register_estimator("grpo")(best_of_group)
    with pytest.raises(ValueError, match="estimator must be one of .*, best-of-group, got 'ppo'"):
        compute_advantage(group_by_task_id(results), estimator="ppo")


USER_ESTIMATOR = """
def best_of_group(sets, spec):
    return [[1.0 if x == max(r for r, _ in items) else 0.0 for x, _ in items] for items in sets]
"""


def test_a_user_estimator_spec_is_imported_and_registered_under_the_spec(tmp_path, monkeypatch):
    from nanorllm.algos import advantages as registry
    from nanorllm.run.world import estimator_problems

    monkeypatch.setattr(registry, "ESTIMATORS", dict(registry.ESTIMATORS))
    (tmp_path / "mine.py").write_text(USER_ESTIMATOR)
    spec = f"{tmp_path / 'mine.py'}:best_of_group"
    results = [episode("a", k, r) for k, r in enumerate([0.2, 0.9, 0.4])]
    compute_advantage(group_by_task_id(results), estimator=spec)
    assert advantages(results) == [0.0, 1.0, 0.0] and spec in registry.ESTIMATORS
    from nanorllm.config import TrainConfig

    assert estimator_problems(TrainConfig(adv_estimator=f"{tmp_path / 'mine.py'}:nope")) == [
        f"adv_estimator: '{tmp_path / 'mine.py'}:nope': {tmp_path / 'mine.py'} has no function 'nope'"]
    assert estimator_problems(TrainConfig(adv_estimator=f"{tmp_path / 'absent.py'}:f"))[0].startswith(
        "adv_estimator: ") and "not found" in estimator_problems(TrainConfig(adv_estimator=f"{tmp_path / 'absent.py'}:f"))[0]


def test_an_unknown_estimator_exits_2_naming_the_field_and_the_registered_names(tmp_path, capsys):
    from nanorllm.run.lifecycle import main

    assert main(["--adv-estimator", "ppo", "--output-dir", str(tmp_path), "--run-name", "r"]) == 2
    assert "adv_estimator: must be one of grpo, rloo, reinforce++, rae, got 'ppo'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_help_lists_the_built_in_estimators(capsys):
    from nanorllm.config import parse_config

    with pytest.raises(SystemExit):
        parse_config(["--help"])
    assert "{grpo,rloo,reinforce++,rae}|FILE.py:FN" in capsys.readouterr().out


@pytest.mark.slow
def test_a_user_estimator_chosen_by_flag_trains_and_a_resume_imports_it_again(tmp_path, monkeypatch):
    import json

    from nanorllm.algos import advantages as registry
    from nanorllm.run.lifecycle import main
    from tests.runs import length_rule_grading, train_in_process

    monkeypatch.setattr(registry, "ESTIMATORS", dict(registry.ESTIMATORS))
    (tmp_path / "mine.py").write_text(USER_ESTIMATOR)
    spec = f"{tmp_path / 'mine.py'}:best_of_group"
    train_in_process(tmp_path, "run", ["--adv-estimator", spec, "--max-steps", "1", "--save-every", "1"])
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["adv_estimator"] == spec
    del registry.ESTIMATORS[spec]  # as in a fresh process: the resume imports the spec again
    with length_rule_grading():
        assert main(["--resume", str(run), "--max-steps", "2"]) == 0
    assert spec in registry.ESTIMATORS
