"""A response cut at --max-new-tokens that earned nothing ends its episode "truncated" in every env kind, whatever
the env said of it (its turn limit, a wrong answer, an invalid move): the engine knows the cut, the env does not."""

import sys
from pathlib import Path

import pytest

from helpers import ScriptedPolicy
from nanorllm.config import parse_config
from nanorllm.config.specs import env_spec
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import load_bundle, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import rollout_metrics

HERE = Path(__file__).resolve().parent
MATH_TASK = {"task_id": "t", "question": "What is 2 + 3?", "answer": "5"}
PROMPT_TASK = {"task_id": "t", "question": "Say hello."}
REWARDS_PY = "def nothing(completions, **kw):\n    return [0.0] * len(completions)\n"
CALC_TOOL = f"{HERE.parent / 'nanorllm' / 'envs' / 'calc_tool.py'}:calc"


def scored(tmp_path, *args):
    """The bundle of `--reward nothing ARGS` (no --env: the single-turn env)."""
    (tmp_path / "rewards.py").write_text(REWARDS_PY)
    argv = ["--reward", f"{tmp_path / 'rewards.py'}:nothing", "--model", "tiny-random", *args]
    return load_bundle(env_spec(parse_config(argv)))


def external(spec: str, module: str, tasks: str):
    pytest.importorskip(module)
    env = load_env(spec, EpisodeSettings(max_turns=1))
    return env, env.load_tasks(tasks)[:1]


# name: (tmp_path -> (bundle, tasks), the turn that is cut: the episode's last); verifiers' episodes, played on an
# endpoint, are tests/test_verifiers_env.py's
KINDS = {
    "math": (lambda tmp: (load_env("math", EpisodeSettings(max_turns=1)), [MATH_TASK]), 0),
    "math, the last of two turns": (lambda tmp: (load_env("math", EpisodeSettings(max_turns=2)), [MATH_TASK]), 1),
    "single": (lambda tmp: (scored(tmp), [PROMPT_TASK]), 0),
    "single with tools": (lambda tmp: (scored(tmp, "--tools", CALC_TOOL), [PROMPT_TASK]), 0),
    "math with a reward function": (lambda tmp: (scored(tmp, "--env", "math", "--max-turns", "1"), [MATH_TASK]), 0),
    "calc": (lambda tmp: (load_env("calc", EpisodeSettings(max_turns=1)), [MATH_TASK]), 0),
    "reasoning-gym": (lambda tmp: external("reasoning-gym:basic_arithmetic", "reasoning_gym",
                                           "rg:basic_arithmetic,size=1,seed=3"), 0),
    "textarena": (lambda tmp: external("textarena:GuessTheNumber-v0", "textarena", "ta:count=1,seed=7"), 0),
    "openenv": (lambda tmp: external(f"openenv:{HERE / 'openenv_example.py'}:GuessEnv", "openenv",
                                     "openenv:count=1,seed=7"), 0),
}


@pytest.fixture
def openenv_servers_stopped():
    yield
    if "nanorllm.envs.openenv_serve" in sys.modules:
        from nanorllm.envs.openenv_serve import stop_servers

        stop_servers()


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_unrewarded_response_cut_at_max_new_tokens_ends_its_episode_truncated_in_every_env_kind(
        kind, tmp_path, openenv_servers_stopped):
    build, cut_turn = KINDS[kind]
    env, tasks = build(tmp_path)

    def respond(call, row, messages):  # an unfinished answer on the cut turn, a wrong whole one before it
        return ("The answer is \\boxed{7", True) if call == cut_turn else ("\\boxed{99} [9]", False)

    (r,) = RolloutEngine(ScriptedPolicy(respond), sampling=SamplingParams(max_new_tokens=8), env=env).run(tasks).results
    assert (r.trajectory.num_turns, r.step_samples[-1].truncated, r.reward) == (cut_turn + 1, True, 0.0)
    assert r.trajectory.termination_reason == "truncated"
    assert rollout_metrics([r])["episode/termination/truncated"] == 1.0


def test_a_cut_response_that_earned_its_reward_keeps_the_envs_word_and_a_whole_one_keeps_the_turn_limit(tmp_path):
    env = load_env("calc", EpisodeSettings(max_turns=1))
    runs = {text: RolloutEngine(ScriptedPolicy([[(text, cut)]]), sampling=SamplingParams(max_new_tokens=8),
                                env=env).run([MATH_TASK]).results[0].trajectory.termination_reason
            for text, cut in (("\\boxed{5} because", True), ("I do not know.", False))}
    assert runs == {"\\boxed{5} because": "correct", "I do not know.": "max_turns"}
