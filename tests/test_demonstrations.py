"""An env's own gold as SFT rows: each env's `demonstrations(task)` played through the env scores full reward,
and its rows open with the prompt the RL episode opens with."""

import pytest

from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.envs.base import EnvBundle
from nanorllm.utils.modules import EnvSpecError
from nanorllm.envs.registry import EnvSpec, load_bundle, load_env_tasks, resolve_task_specs, training_tasks
from nanorllm.supervised.demos import demonstration_conversations
from nanorllm.supervised.sft import sft_rows

CALC = "nanorllm.envs.calc_tool:CalcTasks"
CALC_TOOL = "nanorllm/envs/calc_tool.py:calc"
ENVS = [("math", None), (CALC, CALC_TOOL), ("reasoning-gym:spell_backward", None)]


def config(env: str, tools: str | None, **kw) -> SFTConfig:
    return SFTConfig(**{**SFT_DEFAULTS, "model": "tiny-random", "env": env, "tools": tools, "demos": 3, "out": "o",
                        **kw})


def played(bundle, task: dict, replies: list[str]) -> tuple[float, bool]:
    """The reward and done of the env's last step, the replies sent as the policy's."""
    env = bundle.make_env()
    env.reset(task)
    for text in replies:
        _, reward, done, _ = env.step(text)
    return reward, done


@pytest.mark.parametrize("env, tools", ENVS)
def test_every_demonstration_scores_full_reward_as_the_policy_would_write_it(tiny_policy, env, tools):
    cfg = config(env, tools)
    bundle = load_bundle(EnvSpec(env=env, tools=tools), rewards=False)
    bundle.use_tokenizer(tiny_policy.tokenizer)
    rows = sft_rows(cfg, tiny_policy)
    tasks = training_tasks(bundle, None, limit=3)
    assert len(rows) == 3
    for task, row in zip(tasks, rows):
        replies = [tiny_policy.tokenizer.decode(s.response_ids[:-1]) for s in row]  # the end-of-turn token: a stop
        assert played(bundle, task, replies) == (1.0, True)
    assert len(rows[0]) == (2 if tools else 1)  # the tool run calls calc once, then answers


def test_a_demonstration_opens_with_the_rl_episodes_first_prompt_and_trains_no_worked_example(tiny_policy):
    cfg = config(CALC, CALC_TOOL)
    bundle = load_bundle(EnvSpec(env=CALC, tools=CALC_TOOL), rewards=False)
    task = bundle.load_tasks(bundle.default_tasks, limit=1)[0]
    env, agent = bundle.make_env(), bundle.make_agent()
    agent.reset(task, env.reset(task))
    first = sft_rows(config(CALC, CALC_TOOL, demos=1), tiny_policy)[0][0]
    assert first.prompt_ids == tiny_policy.first_prompt_ids(agent.messages, agent.tools)
    assert any(m["role"] == "assistant" for m in agent.messages)  # the worked exchange: prompt, not a trained turn
    (_, messages, start), = demonstration_conversations(bundle.inner, [task])
    assert start == len(agent.messages) and messages[:start] == agent.messages


def test_demonstrations_leave_out_the_tasks_the_training_run_holds_out(tiny_policy, tmp_path):
    """--tasks FILE: a training run holds out a seeded tenth of it, so the demonstrations (and the rejection
    sampler, the same `training_tasks`) are drawn from the other nine tenths, however many are asked for."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"task_id": "q{i}", "question": "What is {i} + 1?", "answer": "{i + 1}"}}\n'
                            for i in range(40)))
    bundle = load_bundle(EnvSpec(env="math"), rewards=False)
    held = {t["task_id"] for t in load_env_tasks(bundle, resolve_task_specs(str(path), None, bundle)[1])}
    assert 0 < len(held) < 10
    rows = sft_rows(config("math", None, tasks=str(path), demos=40), tiny_policy)
    drawn = {row[0].task_id for row in rows}
    assert len(rows) == 40 - len(held) and not drawn & held
    assert [t["task_id"] for t in training_tasks(bundle, str(path), limit=5)] == sorted(
        drawn, key=lambda i: int(i[1:]))[:5]
    own = load_env_tasks(bundle, f"holdout:frac=0.5,seed=1:{path}")  # a given held-out set is the one left out
    assert len(training_tasks(bundle, str(path), f"holdout:frac=0.5,seed=1:{path}")) == 40 - len(own) < 40


def test_an_env_without_demonstrations_is_refused_in_one_line():
    class NoGold(EnvBundle):
        name = "no-gold"

    with pytest.raises(EnvSpecError, match="has no demonstrations"):
        demonstration_conversations(NoGold(), [{"task_id": "t", "question": "q", "answer": "1"}])
