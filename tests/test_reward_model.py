"""--reward-model: a local sequence classifier as a reward source: what it reads, how its score is normalised,
what is refused at start, what the memory plan counts, and real runs (serial and with a worker) scored by it."""

import math

import pytest

from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory
from nanorllm.rewards.model import RewardModel, encode, render
from nanorllm.rewards.norm import RunningNorm, group_norm
from nanorllm.run.lifecycle import main
from tests.procs import read_scalars
from nanorllm.faultsuite.suite import headless_reward_model
from tests.reward_models import relabelled, tiny_reward_model
from tests.runs import TINY_ARGS


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm")


def episodes(pairs, group="g"):
    out = []
    for i, (q, a) in enumerate(pairs):
        traj = Trajectory(task_id=f"t{i}", task={"task_id": f"t{i}", "question": q},
                          steps=[Step(observation=str(q), model_response=a)], termination_reason="max_turns")
        out.append(RolloutResult(trajectory=traj, group_id=group, step_samples=[StepSample(
            task_id=f"t{i}", episode_id=f"e{i}", turn=0, prompt_ids=[1], response_ids=[2], rollout_logprobs=[0.0])]))
    return out


def test_group_norm_z_scores_within_each_group_and_keeps_failed_scores_failed():
    out = group_norm([1.0, 3.0, math.nan, 5.0, 5.0, 7.0], ["a", "a", "a", "b", "b", "c"])
    assert out[:2] == pytest.approx([-1.0, 1.0], abs=1e-5)  # mean 2, population std 1
    assert math.isnan(out[2])
    assert out[3:] == [0.0, 0.0, 0.0]  # equal values, a group of one: 0


def test_running_norm_is_welfords_mean_and_std_over_every_score_so_far():
    norm = RunningNorm()
    assert norm([2.0, 4.0]) == pytest.approx([-1.0, 1.0], abs=1e-5)
    out = norm([6.0, math.nan])  # 2, 4, 6: mean 4, std sqrt(8/3)
    assert (norm.count, norm.mean) == (3, 4.0)
    assert out[0] == pytest.approx(2.0 / math.sqrt(8 / 3), abs=1e-5) and math.isnan(out[1])


def test_pairs_are_rendered_with_the_reward_models_own_template_and_cut_from_the_left(rm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    text, templated = render(tok, "1+1?", "2")
    assert templated and text.index("1+1?") < text.index("2", text.index("1+1?") + 4)
    assert "assistant" in text and "user" in text
    tok.chat_template = None
    assert render(tok, "1+1?", "2") == ("1+1?\n\n2", False)
    full = encode(tok, "a long question " * 20, "the answer", 10_000)
    cut = encode(tok, "a long question " * 20, "the answer", 12)
    assert len(cut) == 12 and cut == full[-12:]


@pytest.mark.parametrize("num_labels", [1, 2])
def test_the_model_scores_a_batch_as_it_scores_each_pair_alone_and_logs_its_raw_scores(tmp_path, num_labels):
    path = tiny_reward_model(tmp_path / "rm", num_labels=num_labels)
    pairs = [("1+1?", "2"), ("2+2?", "it is four"), ("3+3?", "6, surely")]
    batch = episodes(pairs)
    rm = RewardModel(path=path, batch_size=2)
    scores = rm(batch, "math")  # padded batches of 2 and 1
    alone = [RewardModel(path=path, batch_size=1)([r], "math")[0] for r in episodes(pairs)]
    assert scores == pytest.approx(alone, abs=1e-5) and len(set(scores)) == 3
    model, _, _ = rm.loaded
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    m = rm.metrics(batch)
    assert m["reward/model_mean"] == pytest.approx(sum(scores) / 3)
    grouped = RewardModel(path=path, norm="group")(batch, "math")
    assert sum(grouped) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: str(tmp / "nowhere"), "reward_model: '{p}' is no folder"),
    (lambda tmp: tiny_reward_model(tmp / "lm", architecture="LlamaForCausalLM"), "is not a sequence classifier"),
    (lambda tmp: tiny_reward_model(tmp / "three", num_labels=3), "has num_labels 3"),
    (lambda tmp: headless_reward_model(tmp / "headless"), "its weights lack score.weight (a causal LM's weights"),
    (lambda tmp: relabelled(tiny_reward_model(tmp / "two", num_labels=2), num_labels=1, id2label={"0": "LABEL_0"}),
     "its weights' score.weight is [2, 32], its config wants [1, 32] (num_labels 1): the head does not fit"),
    (lambda tmp: tiny_reward_model(tmp / "small", extra_tokens=3), "tokens, its model embeds"),
], ids=["no-folder", "causal-lm", "three-labels", "no-head", "head-of-another-shape", "tokenizer-too-large"])
def test_a_reward_model_that_cannot_be_one_is_refused_at_start_in_one_line(tmp_path, capsys, make, expected):
    path = make(tmp_path)
    assert main([*TINY_ARGS, "--serial", "--reward-model", path, "--output-dir", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "reward_model:" in line]
    assert len(err) == 1 and expected.replace("{p}", path) in err[0]
    assert not (tmp_path / "out").exists()


def test_the_memory_plan_counts_the_reward_model_in_each_process_that_scores(rm_dir):
    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import model_config, plan_run
    from nanorllm.memory.tasks import TaskShape
    from tests.test_memory import on
    from nanorllm.utils.devices import DeviceMap

    def parts(cfg, devices):
        plan = plan_run(on(cfg, devices), config=model_config("tiny-random"), free={"cpu": 10**12}, shm_free=10**12,
                        tasks=TaskShape(first=64, shared=0, eval_tasks=0))
        return {p.name: [x.nbytes for x in p.parts if x.name == "reward model"] for p in plan.processes}

    from transformers import AutoModelForSequenceClassification

    n = sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(rm_dir).parameters())
    cfg = TrainConfig(model="tiny-random", reward_model=rm_dir, reward_model_batch_size=2, reward_model_max_tokens=16)
    got = parts(cfg, DeviceMap(["cpu"], ["cpu", "cpu"]))
    assert got["learner"] == [] and len(got["worker 0"]) == len(got["worker 1"]) == 1  # no held-out set to score
    assert n * 4 < got["worker 0"][0] < n * 4 + 2 * 16 * 10**4  # its fp32 weights and one batch's forward
    serial = parts(TrainConfig(model="tiny-random", reward_model=rm_dir, serial=True), DeviceMap(["cpu"], []))
    assert len(serial["learner"]) == 1
    assert parts(TrainConfig(model="tiny-random"), DeviceMap(["cpu"], ["cpu"]))["worker 0"] == []


def test_a_registered_sources_held_model_is_counted_as_the_built_in_reward_model_is(rm_dir, monkeypatch):
    from dataclasses import dataclass, replace

    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import model_config, plan_run
    from nanorllm.memory.tasks import TaskShape
    from nanorllm.rewards import sources
    from nanorllm.utils.devices import DeviceMap
    from tests.test_memory import on

    monkeypatch.setattr(sources, "REWARD_SOURCES", dict(sources.REWARD_SOURCES))

    @dataclass(frozen=True)
    class CriticSpec:
        path: str

    sources.register_reward_source("critic", CriticSpec, lambda spec: [], held=lambda spec: [
        sources.HeldModel("critic", spec.path, batch_tokens=2 * 16, dtype_bytes=2, device=None, note="bf16")])
    built_in = on(TrainConfig(model="tiny-random", reward_model=rm_dir, reward_model_batch_size=2,
                              reward_model_max_tokens=16, reward_model_dtype="bfloat16"), DeviceMap(["cpu"], ["cpu"]))
    user = on(TrainConfig(model="tiny-random"), DeviceMap(["cpu"], ["cpu"]))
    user.env_spec = replace(user.env_spec, reward_sources=(CriticSpec(rm_dir),))

    def held(parts, name):
        plan = plan_run(parts, config=model_config("tiny-random"), free={"cpu": 10**12}, shm_free=10**12,
                        tasks=TaskShape(first=64, shared=0, eval_tasks=0))
        return [x.nbytes for x in plan.processes[1].parts if x.name == name]

    rm = held(built_in, "reward model")
    assert len(rm) == 1 and held(user, "critic") == rm  # the same model, batch and dtype: the same bytes


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1"]], ids=["serial", "worker"])
def test_a_run_scored_by_a_reward_model_in_place_of_the_env_trains(rm_dir, tmp_path, mode):
    from tests.procs import run_train

    rc, out, _ = run_train([*mode, "--env", "math", "--reward-model", rm_dir, "--reward-mode", "replace",
                            "--max-steps", "2", "--eval-tasks", "", "--no-drop-zero-std-groups", "--run-name", "r"],
                           tmp_path)
    assert rc == 0, out[-3000:]
    scalars = read_scalars(tmp_path / "r")
    means = [v for _, v in scalars["reward/model_mean"]]
    assert len(means) == 2 and all(math.isfinite(v) and v != 0 for v in means)
    assert [v for _, v in scalars["reward/mean"]] == pytest.approx(means, abs=1e-5)  # replace, weight 1, no norm
    assert [v for _, v in scalars["reward/failed/model"]] == [0, 0]
    assert all(v > 0 for _, v in scalars["reward/model_std"])
