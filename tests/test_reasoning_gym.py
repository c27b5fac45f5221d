"""--env reasoning-gym:NAME: rg: task specs, refusals, scoring in both answer formats, retry turns, held-out
questions kept out of training, and two training steps on the tiny model, serial and in the pipeline."""

import json

import pytest

from helpers import ScriptedPolicy
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP
from nanorllm.config import parse_config
from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.reasoning_gym import (NO_ANSWER_FEEDBACK, RETRY_FEEDBACK, build_dataset, load_rg_tasks,
                                         parse_rg_spec)
from nanorllm.envs.registry import EnvSpecError, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.run.assembly import assemble
from tests.procs import read_rollouts, read_scalars, run_train

ENV = "reasoning-gym:basic_arithmetic"
SMALL = "rg:basic_arithmetic,size=6,seed=3"


def _bundle(max_turns=1, *args):
    return load_env(ENV, EpisodeSettings(max_turns=max_turns), list(args))


# ---- specs -----------------------------------------------------------------------------------------

def test_a_spec_names_size_seed_and_typed_config_keys():
    p = parse_rg_spec("rg:basic_arithmetic,size=5,seed=3,max_terms=3,allow_parentheses=false,format_style=simple")
    assert (p.size, p.seed) == (5, 3)
    assert p.datasets == (("basic_arithmetic", 1.0, (("allow_parentheses", False), ("format_style", "simple"),
                                                     ("max_terms", 3))),)
    p = parse_rg_spec("rg:basic_arithmetic=2+chain_sum=0.5,size=4,seed=1,chain_sum.min_terms=3")
    assert p.datasets == (("basic_arithmetic", 2.0, ()), ("chain_sum", 0.5, (("min_terms", 3),)))


def test_rows_carry_the_item_and_keys_reach_the_dataset():
    rows = load_rg_tasks("rg:basic_arithmetic,size=5,seed=3,max_terms=2,min_terms=2")
    assert len(rows) == 5 and len({r["task_id"] for r in rows}) == 5
    assert all(r["entry"]["metadata"]["num_terms"] == 2 for r in rows)
    assert json.loads(json.dumps(rows)) == rows  # rows are JSON as they are
    assert [r["question"] for r in load_rg_tasks("rg:basic_arithmetic,size=50,seed=3,max_terms=2,min_terms=2",
                                                 limit=5)] == [r["question"] for r in rows]


def test_a_composite_spec_mixes_datasets_by_weight():
    rows = load_rg_tasks("rg:basic_arithmetic=1+chain_sum=1,size=40,seed=1")
    sources = {r["entry"]["metadata"]["source_dataset"] for r in rows}
    assert sources == {"basic_arithmetic", "chain_sum"}
    only = load_rg_tasks("rg:basic_arithmetic=1000+chain_sum=0.001,size=20,seed=1")
    assert [r["entry"]["metadata"]["source_dataset"] for r in only].count("basic_arithmetic") >= 19


@pytest.mark.parametrize("spec, reason", [
    ("rg:basic_arithmetic,seed=1", "size=N is missing"),
    ("rg:basic_arithmetic,size=0,seed=1", "size=0: expected at least 1"),
    ("rg:basic_arithmetic,size=two,seed=1", "size=two: expected an int"),
    ("rg:basic_arithmetic=-1,size=2,seed=1", "positive weights, got 'basic_arithmetic=-1'"),
    ("rg:basic_arithmetic,size=2,seed=1,colour=red", "colour: basic_arithmetic has no config key 'colour' (valid: "),
    ("rg:basic_arithmetic+chain_sum,size=2,seed=1,max_terms=3", "max_terms: with several datasets write NAME."),
    ("rg:basic_arithmetic+chain_sum,size=2,seed=1,leg_counting.x=3", "'leg_counting' is not one of the datasets"),
    ("rg:basic_aritmetic,size=2,seed=1", "did you mean basic_arithmetic"),
    ("rg:composite,size=2,seed=1", "write a mix of datasets as NAME1=WEIGHT+NAME2=WEIGHT"),
    ("rg:basic_arithmetic,size=2,seed=1,min_terms=0", "the dataset refused its config: AssertionError: min_terms")])
def test_a_bad_spec_is_one_line_naming_the_field(spec, reason):
    with pytest.raises(TaskFileError) as err:
        load_rg_tasks(spec)
    (problem,) = err.value.problems
    assert problem.startswith(spec) and reason in problem and "\n" not in problem


def test_an_unknown_dataset_name_suggests_the_closest_ones():
    with pytest.raises(EnvSpecError, match=r"unknown reasoning-gym dataset 'basic_arithmetc' \(did you mean "
                                           r"basic_arithmetic, "):
        load_env("reasoning-gym:basic_arithmetc")
    with pytest.raises(EnvSpecError, match="answer_format='json': expected one of tags, boxed"):
        load_env(ENV, env_args=["answer_format=json"])


def test_the_env_has_its_own_training_and_held_out_sets():
    b = _bundle()
    assert (b.default_tasks, b.default_eval_tasks) == ("rg:basic_arithmetic,size=2000,seed=1",
                                                       "rg:basic_arithmetic,size=200,seed=1000000")
    train, held = b.load_tasks(b.default_tasks), b.load_tasks(b.default_eval_tasks)
    assert task_ids_differ(train, held)


def test_the_default_held_out_items_are_not_training_items_drawn_again():
    """reasoning-gym draws item i of seed S with Random(S + i): a held-out seed inside the training range would
    reproduce training items (seed 2 gave items 1-200 of seed 1, all 200 questions shared)."""
    b = _bundle()
    training = {r["question"] for r in b.load_tasks(b.default_tasks)}
    shared = [r for r in b.load_tasks(b.default_eval_tasks) if r["question"] in training]
    assert len(shared) <= 5  # a small question space repeats a few by chance, not the whole set
    assert sum(r["question"] in training for r in b.load_tasks("rg:basic_arithmetic,size=200,seed=2")) == 200


def task_ids_differ(a, b):
    return not {r["task_id"] for r in a} & {r["task_id"] for r in b}


# ---- scoring and turns -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, wrap", [("tags", "<answer>{}</answer>"), ("boxed", "\\boxed{{{}}}")])
def test_the_datasets_own_score_grades_both_formats(fmt, wrap):
    b = _bundle(1, f"answer_format={fmt}")
    (task,) = b.load_tasks(SMALL, limit=1)
    env = b.make_env()
    env.reset(task)
    obs, reward, done, info = env.step("So: " + wrap.format(task["answer"]))
    assert (obs, reward, done, info["reason"], info["action"], info["success"]) == (None, 1.0, True, "correct",
                                                                                     task["answer"], True)
    env.reset(task)
    obs, reward, done, info = env.step(wrap.format(int(task["answer"]) + 1))
    assert (obs, reward, done, info["reason"], info["success"]) == (None, 0.0, True, "wrong", False)
    env.reset(task)
    other = "\\boxed{{{}}}" if fmt == "tags" else "<answer>{}</answer>"
    assert env.step(other.format(task["answer"]))[1:3] == (0.0, True)  # the other format is no answer
    prompt = b.make_agent().system_prompt
    assert ("<answer>" in prompt) == (fmt == "tags") and ("\\boxed{}" in prompt) == (fmt == "boxed")


def test_the_score_of_the_rebuilt_item_is_the_score_of_the_json_one():
    rows = load_rg_tasks(SMALL)
    dataset = build_dataset(SMALL)
    env = _bundle().make_env()
    for row in rows:
        for answer in (row["answer"], "7"):
            env.reset(row)
            assert env.step(f"<answer>{answer}</answer>")[1] == dataset.score_answer(answer, row["entry"])


def test_a_wrong_answer_with_turns_left_gets_a_retry_turn():
    b = _bundle(3)
    (task,) = b.load_tasks(SMALL, limit=1)
    env = b.make_env()
    env.reset(task)
    assert env.step("no idea")[:3] == (NO_ANSWER_FEEDBACK["tags"], 0.0, False)
    assert env.step("<answer>nope</answer>")[:3] == (RETRY_FEEDBACK["tags"], 0.0, False)
    obs, reward, done, info = env.step(f"<answer>{task['answer']}</answer>")
    assert (obs, reward, done, info["turn"]) == (None, 1.0, True, 3)
    env.reset(task)
    env.step("x"), env.step("y")
    assert env.step("z")[1:3] == (0.0, True)  # the last turn ends it


def test_success_is_the_full_score_and_the_mean_reward_counts_partial_ones():
    from nanorllm.trainer.evaluate import evaluate

    b = _bundle(1)
    tasks = b.load_tasks(SMALL, limit=3)
    golds = [t["answer"] for t in tasks]
    # exact; the gold twice (the dataset's partial score: len(gold) / len(answer) = 0.5); no answer at all
    policy = ScriptedPolicy([[f"<answer>{golds[0]}</answer>", f"<answer>{golds[1] * 2}</answer>", "no idea"]])
    res = evaluate(policy, tasks, sampling=SamplingParams(), env=b)
    assert res["success_rate"] == pytest.approx(1 / 3)  # success is the full score: the partial one rewards only
    assert res["reasoning_gym/solved"] == pytest.approx(1 / 3)
    assert res["mean_reward"] == pytest.approx(1.5 / 3)


def test_a_score_answer_that_raises_or_gives_nan_is_an_env_error(monkeypatch):
    b = _bundle(1)
    tasks = b.load_tasks(SMALL, limit=2)
    cls = type(build_dataset(SMALL))
    monkeypatch.setattr(cls, "score_answer", lambda self, answer, entry: 1 / 0 if answer == "boom" else float("nan"))
    engine = RolloutEngine(ScriptedPolicy([["<answer>boom</answer>", "<answer>1</answer>"]]),
                           sampling=SamplingParams(), env=b)
    results = engine.run(tasks).results
    assert [r.trajectory.termination_reason for r in results] == ["error", "error"]
    assert "score_answer gave nan" in results[1].trajectory.steps[-1].info["error"]


def test_held_out_questions_are_removed_from_training():
    small = "min_terms=2,max_terms=2,min_digits=1,max_digits=1"  # a few hundred distinct questions: draws repeat
    cfg = parse_config(["--env", ENV, "--tasks", f"rg:basic_arithmetic,size=300,seed=1,{small}",
                        "--eval-tasks", f"rg:basic_arithmetic,size=100,seed=2,{small}", "--eval-limit", "100"])
    parts = assemble(cfg)
    held = {t["question"] for t in parts.eval_tasks}
    loaded = load_rg_tasks(f"rg:basic_arithmetic,size=300,seed=1,{small}")
    repeated = sum(t["question"] in held for t in loaded)
    assert repeated > 0 and parts.dropped_heldout == repeated and len(parts.train_tasks) == 300 - repeated
    assert not held & {t["question"] for t in parts.train_tasks}


# ---- training on the tiny model ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]])
def test_a_reasoning_gym_dataset_trains_two_steps(tmp_path, mode):
    rc, out, _ = run_train([*mode, "--env", ENV, "--max-turns", "2", "--max-steps", "2", "--run-name", "r",
                            "--no-save-model"], tmp_path / "runs")
    assert rc == 0, out
    assert f"[env] {ENV}" in out and "answer_format='tags'" in out and "step 2/2" in out
    run = tmp_path / "runs" / "r"
    episodes = read_rollouts(run)
    assert len(episodes) == 2 * TASKS_PER_STEP * SAMPLES
    assert all(e["task_id"].startswith("rg-basic_arithmetic-") for e in episodes)
    assert all(e["turns"][0]["observation"] == e["question"] and len(e["turns"]) <= 2 for e in episodes)
    retried = [e for e in episodes if len(e["turns"]) == 2]  # the tiny model writes no answer tags: it is asked again
    assert retried and all(e["turns"][0]["feedback"] in (NO_ANSWER_FEEDBACK["tags"], RETRY_FEEDBACK["tags"])
                           for e in retried)
    assert [v for _, v in read_scalars(run)["rollout/env_errors"]] == [0, 0]
    saved = json.loads((run / "config.json").read_text())
    assert (saved["tasks"], saved["eval_tasks"]) == ("rg:basic_arithmetic,size=2000,seed=1",
                                                     "rg:basic_arithmetic,size=200,seed=1000000")


@pytest.mark.slow
def test_the_adapter_bench_plays_the_same_tokens_through_the_adapter_and_a_jsonl_file(tmp_path):
    """launch/bench.py adapters at a tiny size: the same questions, prompts and sampled tokens both ways, so the
    episodes/s ratio measures only the scoring and rows."""
    from nanorllm.bench.adapters import AdapterBenchConfig, run_adapter_bench

    out = tmp_path / "adapters.json"
    assert run_adapter_bench(AdapterBenchConfig(model="tiny-random", episodes=8, max_new_tokens=6, repeats=1,
                                                json=str(out))) == 0
    figures = json.loads(out.read_text())["figures"]
    assert figures["same_tokens"] and figures["adapter"]["gen_tokens"] == figures["jsonl"]["gen_tokens"] > 8
    assert figures["adapter"]["env_errors"] == figures["jsonl"]["env_errors"] == 0
    assert figures["ratio"] == pytest.approx(figures["adapter"]["episodes_per_s"] / figures["jsonl"]["episodes_per_s"])


def test_a_worked_exchange_in_the_answer_format_comes_before_the_question_unless_turned_off():
    from nanorllm.envs.reasoning_gym import worked_example

    item = build_dataset("rg:basic_arithmetic,size=1,seed=0")[0]
    for fmt, answer in [("tags", f"<answer>{item['answer']}</answer>"), ("boxed", f"\\boxed{{{item['answer']}}}")]:
        assert worked_example("basic_arithmetic", fmt) == (item["question"], answer)
        agent = load_env(ENV, EpisodeSettings(max_turns=1), [f"answer_format={fmt}"]).make_agent()
        task = load_rg_tasks(SMALL)[0]
        agent.reset(task, task["question"])
        assert [m["role"] for m in agent.messages] == ["system", "user", "assistant", "user"]
        assert (agent.messages[1]["content"], agent.messages[2]["content"]) == (item["question"], answer)
    agent = load_env(ENV, EpisodeSettings(max_turns=1, worked_example=False)).make_agent()
    agent.reset(task, task["question"])
    assert [m["role"] for m in agent.messages] == ["system", "user"]
    assert worked_example("basic_arithmetic=2+chain_sum=1", "tags")[0] == item["question"]  # a mix: its first dataset
