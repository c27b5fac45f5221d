"""`--env verifiers:MODULE[:LOADER]`: verifiers' own episodes and rubric on the rollout endpoint
(tests/verifiers_example.py), one training row per episode that extends its history, the refusals at start, a
rubric that raises or returns NaN,
2 training steps serial and in the pipeline, and launch/eval.py with pass@k."""

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP  # noqa: E402
from nanorllm.envs.base import EpisodeSettings  # noqa: E402
from nanorllm.envs.registry import EnvSpec, EnvSpecError, load_bundle, load_env  # noqa: E402
from nanorllm.policy.base import SamplingParams  # noqa: E402
from nanorllm.rollout.engine import RolloutEngine  # noqa: E402
from nanorllm.run.assembly import assemble  # noqa: E402
from nanorllm.run.lifecycle import main  # noqa: E402
from nanorllm.config import parse_config  # noqa: E402
from nanorllm.datasets.tasks import TaskFileError  # noqa: E402
from nanorllm.trainer.collate import collate_train_batch  # noqa: E402
from nanorllm.trainer.metrics import rollout_metrics  # noqa: E402
from tests import forked  # noqa: E402
from tests.procs import HANG_S, ROOT, child_env, read_rollouts, read_scalars, run_train  # noqa: E402
from tests.runs import TINY_ARGS  # noqa: E402

TESTS = str(Path(__file__).resolve().parent)  # verifiers imports a taskset by its top-level module name
EXAMPLE = "verifiers:verifiers_example"


@pytest.fixture
def on_path(monkeypatch):
    """The example importable by name here and in every process a run starts."""
    monkeypatch.syspath_prepend(TESTS)
    monkeypatch.setenv("PYTHONPATH", TESTS)


def _run(policy, spec, tasks, *, turns=2, samples=2, **env_spec):
    bundle = load_bundle(EnvSpec(env=spec, settings=EpisodeSettings(max_turns=turns), **env_spec))
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=8, temperature=0.7), env=bundle,
                           max_batch_episodes=16)
    try:
        return bundle, engine.run(tasks(bundle), num_samples=samples).results
    finally:
        engine.close()


def test_the_train_and_held_out_splits_are_disjoint_and_cover_the_taskset(on_path):
    bundle = load_env(EXAMPLE)
    train, held, every = (bundle.load_tasks(f"vf:{s}") for s in ("train", "eval", "all"))
    assert len(every) == 20 and len({t["task_id"] for t in every}) == 20
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in held} and len(train) + len(held) == 20
    assert held  # one task in ten, by its key
    assert bundle.load_tasks("vf:all,size=5") == every[:5] and len(bundle.load_tasks("vf:train", limit=3)) == 3
    assert every[0]["question"] == "What is 1 + 1? Reply with the number only." and every[0]["answer"] == "2"
    assert load_env(EXAMPLE, env_args=["size=8"]).load_tasks("vf:all") == every[:8]  # --env-arg reaches the loader


def test_a_reward_that_shells_out_to_install_finds_the_installers_offline_unless_the_run_allows_them(
        on_path, tiny_policy, monkeypatch):
    monkeypatch.delenv("UV_OFFLINE", raising=False)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    _, results = _run(tiny_policy, f"{EXAMPLE}:load_installing", lambda b: b.load_tasks("vf:all")[:1], samples=1)
    assert [r.trajectory.final_reward for r in results] == [1.0]  # the processes a reward starts are offline
    monkeypatch.setenv("UV_OFFLINE", "0")
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    load_env(EXAMPLE)
    assert (os.environ["UV_OFFLINE"], os.environ["PIP_NO_INDEX"]) == ("0", "0")  # the run's own setting is kept


def test_a_verifiers_episode_trains_the_sampled_tokens_and_its_rubric_is_the_reward(on_path, tiny_policy):
    bundle, results = _run(tiny_policy, f"{EXAMPLE}:load_parity", lambda b: b.load_tasks("vf:all")[:3])
    assert len(results) == 6
    for r in results:
        (s,) = r.step_samples
        verdict = "correct" if r.reward > 0 else "truncated" if s.truncated else "wrong"  # the env rule
        assert r.trajectory.termination_reason == verdict
        text = tiny_policy.tokenizer.decode(s.response_ids, skip_special_tokens=True)
        assert r.reward == float(sum(map(ord, text.strip())) % 2 == 0)  # the sampled text, as last_reply reads it
        assert "You are a careful calculator." in tiny_policy.tokenizer.decode(s.prompt_ids)  # the task's system prompt
        assert r.trajectory.steps[-1].info["returned"]["reward/correct"] == r.reward
    m = bundle.metrics(results)
    assert m["verifiers/reward/correct"] == pytest.approx(sum(r.reward for r in results) / 6)
    assert m["verifiers/metric/reply_chars"] > 0 and rollout_metrics(results)["rollout/env_errors"] == 0


def test_a_multi_turn_verifiers_env_trains_one_row_per_episode(on_path, tiny_policy):
    _, results = _run(tiny_policy, f"{EXAMPLE}:load_guessing", lambda b: b.load_tasks("vf:all")[:2], turns=2)
    for r in results:
        assert len(r.step_samples) == 2  # the tiny model never answers: the env asked again
        first, second = r.step_samples
        extended = first.prompt_ids + first.response_ids
        assert second.prompt_ids[:len(extended)] == extended
        assert "Try again" in tiny_policy.tokenizer.decode(second.prompt_ids[len(first.prompt_ids):])
        assert collate_train_batch(r.step_samples, pad_id=tiny_policy.pad_id)["input_ids"].shape[0] == 1
    assert rollout_metrics(results)["rollout/prefix_breaks"] == 0


@pytest.mark.parametrize("loader", ["load_raising", "load_nan"])
def test_a_rubric_that_raises_or_returns_nan_is_an_env_error_and_the_other_episodes_go_on(on_path, tiny_policy,
                                                                                        loader):
    def tasks(b):  # a = 1 (the rubric fails) then a = 2 (it scores 1.0)
        every = b.load_tasks("vf:all")
        return [every[0], every[4]]

    _, results = _run(tiny_policy, f"{EXAMPLE}:{loader}", tasks)
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "correct", "correct"]
    assert [len(r.step_samples) for r in results] == [0, 0, 1, 1]
    assert rollout_metrics(results)["rollout/env_errors"] == 2


@pytest.mark.slow  # a fault whose wait is the behaviour under test
def test_a_verifiers_episode_past_agent_timeout_s_is_ended_and_counted_and_the_tool_parser_reaches_its_endpoint(
        on_path, tiny_policy):
    def tasks(b):  # a = 1 (its grading sleeps 30 s) then a = 2
        every = b.load_tasks("vf:all")
        return [every[0], every[4]]

    # 10 s: room for the other episodes on a loaded machine (2 s was not); the 30 s grading is past it on any
    bundle, results = _run(tiny_policy, f"{EXAMPLE}:load_slow", tasks, agent_timeout_s=10.0, tool_parser="hermes")
    assert (bundle.timeout_s, bundle.tool_parser) == (10.0, "hermes")  # --agent-timeout-s, --tool-parser
    assert [r.trajectory.termination_reason for r in results] == ["error", "error", "correct", "correct"]
    assert rollout_metrics(results)["rollout/agent_timeouts"] == 2

@pytest.mark.parametrize("spec, reason", [
    ("verifiers:no_such_env_module", r"no module 'no_such_env_module'"),
    ("verifiers:json", r"'json' has no load_environment and exports no verifiers Taskset"),
    ("verifiers:verifiers_example:missing", r"has no function 'missing'"),
    ("verifiers:verifiers_example:loader_that_raises", r"the loader raised RuntimeError: no such dataset"),
    ("verifiers:verifiers_example:loader_that_exits", r"the loader raised SystemExit: 3"),
    ("verifiers:verifiers_example:not_an_env", r"returned dict, not a verifiers Env"),
])
def test_a_bad_verifiers_spec_is_refused_with_its_reason(on_path, spec, reason):
    with pytest.raises(EnvSpecError, match=reason):
        load_env(spec)


def test_train_refuses_a_bad_verifiers_env_in_one_line_with_exit_2_and_writes_nothing(on_path, tmp_path, capsys):
    rc = main([*TINY_ARGS, "--serial", "--env", "verifiers:verifiers_example:not_an_env",
               "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "not a verifiers Env" in err
    assert not (tmp_path / "runs").exists()


def train_two_steps(tmp_path, mode: list[str], loader: str) -> tuple[str, list[dict], dict]:
    """(what it printed, its rollouts dump, its scalars) of a 2-step run on the example's `loader`."""
    rc, out, _ = run_train([*mode, "--env", f"{EXAMPLE}:{loader}", "--max-steps", "2", "--run-name", "v",
                            "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    return out, read_rollouts(tmp_path / "runs" / "v"), read_scalars(tmp_path / "runs" / "v")


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_verifiers_env_trains_two_steps(on_path, tmp_path, mode):
    out, episodes, scalars = train_two_steps(tmp_path, mode, "load_parity")
    assert "[env] verifiers:verifiers_example:load_parity" in out and "step 2/2" in out
    assert "train tasks 17 " in out and "eval tasks 3 " in out  # vf:train and vf:eval by default
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES and all(e["task_id"].startswith("vf-") for e in episodes)
    assert [v for _, v in scalars["rollout/env_errors"]] == [0, 0]
    assert all(0 <= v <= 1 for _, v in scalars["verifiers/reward/correct"])


@pytest.mark.slow
def test_launch_eval_evaluates_a_verifiers_env_with_pass_at_k(on_path):
    proc = forked.run([sys.executable, str(ROOT / "launch" / "eval.py"), "--model", "tiny-random",
                       "--env", f"{EXAMPLE}:load_parity", "--tasks", "vf:all,size=3", "--eval-samples", "2",
                       "--max-new-tokens", "4", "--max-turns", "1"],
                      capture_output=True, text=True, env=child_env(), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["n"] == 3 and 0 <= row["pass@1"] <= row["pass@2"] <= 1


# ---- prompt-less tasksets, responses cut at --max-new-tokens ---------------------------------------------------

def test_a_taskset_without_prompts_keeps_every_training_task_the_held_out_split_does_not_hold(on_path):
    parts = assemble(parse_config(["--env", f"{EXAMPLE}:load_promptless", "--model", "tiny-random"]))
    assert {t["question"] for t in parts.train_tasks + parts.eval_tasks} == {""}  # nothing to compare but the id
    assert (len(parts.train_tasks), len(parts.eval_tasks), parts.dropped_heldout) == (18, 2, 0)
    with pytest.raises(TaskFileError) as err:  # a set held out whole: the message says which key removed it
        assemble(parse_config(["--env", f"{EXAMPLE}:load_promptless", "--model", "tiny-random", "--tasks", "vf:eval",
                               "--eval-tasks", "vf:all"]))
    assert "no training tasks left after removing the 2" in str(err.value)
    assert "2 by task_id, 0 by question alone" in str(err.value) and "an empty one never" in str(err.value)


def test_an_unrewarded_verifiers_episode_cut_at_max_new_tokens_ends_truncated(on_path, tiny_policy):
    _, results = _run(tiny_policy, f"{EXAMPLE}:load_promptless", lambda b: b.load_tasks("vf:all")[:4], turns=1)
    cut = [r.step_samples[-1].truncated and r.reward == 0 for r in results]  # a rewarded one is "correct"
    assert any(cut), "the tiny model writes no end of text in 8 tokens, nor the sum: some responses are cut"
    assert [r.trajectory.termination_reason == "truncated" for r in results] == cut
    assert rollout_metrics(results)["episode/termination/truncated"] == sum(cut) / len(results)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_promptless_verifiers_env_trains_on_its_whole_split_and_counts_its_cut_responses(on_path, tmp_path, mode):
    out, episodes, scalars = train_two_steps(tmp_path, mode, "load_promptless")
    assert "train tasks 18 (held-out removed: 0)" in out and "eval tasks 2 " in out
    cut = sum(e["termination_reason"] == "truncated" for e in episodes)
    truncated = [v for _, v in scalars["episode/termination/truncated"]]
    assert cut > 0 and sum(truncated) * TASKS_PER_STEP * SAMPLES == pytest.approx(cut)
