"""On-policy distillation (`--teacher`): the reverse-KL advantage against a direct computation, every group
training, the teacher's vocabulary and memory checked before anything loads, and real runs (serial and
pipeline) whose reverse KL is 0 against the student's own weights and above 0 against another model's."""

import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from nanorllm.config import TrainConfig
from nanorllm.config.cli import parse_config
from nanorllm.config.errors import ConfigError
from nanorllm.memory.plan import model_config, parameter_counts, plan_run
from nanorllm.policy.byte_tokenizer import tiny_tokenizer
from nanorllm.policy.models import tiny_model
from nanorllm.run.world import World
from nanorllm.trainer.loss import compute_policy_loss
from nanorllm.trainer.step import train_step
from nanorllm.trainer.teacher import Teacher
from nanorllm.trainer.update import make_optimizer
from tests import forked
from tests.procs import HANG_S, ROOT, child_env
from tests.runs import SERIAL, length_rule_grading
from tests.test_memory import on
from tests.test_train_step import build_results, config


def three_tokens(env_adv: float = 0.5):
    """A hand-made micro-batch of 3 sampled tokens over a vocabulary of 4, the sampler's logprobs equal to the
    learner's (ratio 1), and a teacher's log-distributions."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, requires_grad=True)
    teacher = F.log_softmax(torch.randn(3, 4), dim=-1)
    targets = torch.tensor([1, 3, 0])
    student = F.log_softmax(logits.detach(), dim=-1)
    batch = {"targets": targets, "old_logprobs": student.gather(-1, targets[:, None])[:, 0],
             "advantages": torch.full((3,), env_adv), "sample_index": torch.zeros(3, dtype=torch.long)}
    return logits, teacher, batch, student


@pytest.mark.parametrize("only", [False, True])
def test_the_reverse_kl_advantage_of_three_tokens_is_the_direct_computation(only):
    logits, teacher, batch, student = three_tokens()
    cfg = TrainConfig(distill_coef=0.7, distill_only=only, temperature=1.0)
    loss, m = compute_policy_loss(logits, batch | {"teacher_logits": teacher}, cfg)
    t = batch["targets"]
    s_lp, t_lp = student[range(3), t], teacher[range(3), t]
    adv = (0.0 if only else 0.5) - 0.7 * (s_lp - t_lp)  # per token: A_env - coef x (log p_s - log p_t)
    # ratio 1: the clipped term is -A x ratio, its mean over the 3 tokens, and its gradient -A x grad log p_s
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    loss.backward()
    direct = logits.detach().clone().requires_grad_(True)
    (-(adv * F.log_softmax(direct, -1)[range(3), t]).mean()).backward()
    assert torch.allclose(logits.grad, direct.grad, atol=1e-6)
    exact = (student.exp() * (student - teacher)).sum(-1)
    assert m["distill_kl"].item() == pytest.approx(exact.sum().item(), abs=1e-6)
    assert m["distill_kl_sampled"].item() == pytest.approx((s_lp - t_lp).sum().item(), abs=1e-6)
    assert m["teacher_lp"].item() == pytest.approx(t_lp.sum().item(), abs=1e-6)


def test_a_student_that_is_its_teacher_gets_no_distillation_signal():
    logits, _, batch, _ = three_tokens()
    cfg = TrainConfig(distill_only=True, temperature=1.0)
    loss, m = compute_policy_loss(logits, batch | {"teacher_logits": logits.detach()}, cfg)
    assert loss.item() == 0 and m["distill_kl"].item() == pytest.approx(0, abs=1e-7)


def test_with_a_teacher_every_group_trains_even_one_whose_rewards_are_equal(tiny_policy_factory):
    """Without a teacher a group of equal rewards has no signal and is dropped; the teacher scores its tokens."""
    rewards = {"g0": [1.0, 1.0], "g1": [0.0, 1.0]}
    plain = train_step(p := tiny_policy_factory(), make_optimizer(p, config()), build_results(p, rewards), config())
    teacher = Teacher("tiny-random", device="cpu", dtype="float32")
    cfg = config(teacher="tiny-random")
    distilled = train_step(p := tiny_policy_factory(), make_optimizer(p, cfg), build_results(p, rewards), cfg,
                           teacher=teacher)
    assert plain["frac_reward_zero_std"] == distilled["frac_reward_zero_std"] == 0.5
    assert distilled["train/samples"] > plain["train/samples"] > 0
    assert distilled["distill/reverse_kl"] == pytest.approx(0, abs=1e-6)  # the teacher is the student's weights


def test_distillation_settings_are_checked_naming_the_field():
    with pytest.raises(ConfigError) as e:
        parse_config(["--distill-only", "--distill-coef", "-1", "--teacher-device", "gpu0"])
    text = str(e.value)
    assert "distill_only: trains on a --teacher's signal alone" in text and "distill_coef: must be >= 0" in text
    with pytest.raises(ConfigError) as e:
        parse_config(["--teacher", "tiny-random", "--teacher-device", "gpu0"])
    assert "teacher_device: must be cpu, cuda or cuda:N, got 'gpu0'" in str(e.value)


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line_before_anything_loads(tmp_path):
    cfg = TrainConfig(model="tiny-random", teacher="preset:smollm2-135m", output_dir=str(tmp_path))
    [line] = [p for p in World().problems(cfg) if p.startswith("teacher:")]
    assert "another vocabulary" in line and "49152 vs" in line and "\n" not in line
    same = TrainConfig(model="tiny-random", teacher="tiny-random", output_dir=str(tmp_path))
    assert not [p for p in World().problems(same) if p.startswith("teacher:")]


def test_a_teacher_path_with_nothing_at_it_is_named_as_a_path_not_as_a_bad_hub_id(tmp_path):
    """Training's check before anything loads, and the teacher's own load, say the path holds nothing; neither
    speaks of the form of hub repo ids, which the user did not write."""
    from nanorllm.trainer.teacher import load_teacher

    missing = str(tmp_path / "runs" / "teacher")
    cfg = TrainConfig(model="tiny-random", teacher=missing, output_dir=str(tmp_path))
    [line] = [p for p in World().problems(cfg) if p.startswith("teacher:")]
    assert line == (f"teacher: cannot read the tokenizer of the teacher {missing!r}: no such file or folder (nor is "
                    "it a hub repo id)")
    with pytest.raises(ConfigError) as e:
        load_teacher(cfg, "cpu")
    assert e.value.problems == [f"teacher: cannot load {missing!r}: no such file or folder (nor is it a hub repo id)"]


@pytest.mark.slow
def test_the_launch_refuses_another_vocabulary_with_exit_2_and_writes_nothing(tmp_path):
    r = forked.run([sys.executable, str(ROOT / "launch" / "train.py"), "--model", "tiny-random", "--teacher",
                    "preset:smollm2-135m", "--output-dir", str(tmp_path / "runs")],
                   env=child_env(), capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 2, r.stderr
    assert "teacher: 'preset:smollm2-135m' has another vocabulary" in r.stderr
    assert "[models]" not in r.stdout and not (tmp_path / "runs").exists()


def test_the_memory_plan_holds_the_teacher_on_its_device():
    cfg = TrainConfig(model="preset:smollm2-135m", teacher="preset:qwen2.5-0.5b", dtype="bf16")
    plan = plan_run(on(cfg), free={"cpu": 200 * 10**9}, shm_free=100 * 10**9)
    learner = {p.name: p for p in plan.processes[0].parts}
    total, _ = parameter_counts(model_config("preset:qwen2.5-0.5b"), None)
    assert total * 2 < learner["teacher"].nbytes < total * 2 + 2 * 10**9  # bf16 weights and one no-grad forward
    without = plan_run(on(TrainConfig(model="preset:smollm2-135m", dtype="bf16")), free={"cpu": 200 * 10**9},
                       shm_free=100 * 10**9)
    assert plan.need()["cpu"] - without.need()["cpu"] == learner["teacher"].nbytes
    assert "teacher" not in {p.name for p in without.processes[0].parts}


def save_other_teacher(folder) -> str:
    """The tiny model with other random weights (seed 1), saved as a model folder with the same tokenizer."""
    tok = tiny_tokenizer()
    tiny_model(tok, seed=1).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def distill_run(tmp_path, name: str, teacher: str, *args: str) -> list[dict]:
    """A 2-step distillation-only run; its metrics.jsonl's steps."""
    from nanorllm.run.lifecycle import main

    with length_rule_grading():
        rc = main([*SERIAL, "--max-steps", "2", "--teacher", teacher, "--distill-only", "--report-to", "jsonl",
                   "--output-dir", str(tmp_path), "--run-name", name, "--no-save-model", *args])
    assert rc == 0
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "distill/reverse_kl" in m]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--serial"], ["--num-workers", "1", "--max-policy-lag", "0"]],
                         ids=["serial", "pipeline"])
def test_reverse_kl_is_0_against_the_students_own_weights_and_above_0_against_another_model(tmp_path, mode):
    pipeline = [] if mode == ["--serial"] else ["--no-serial", *mode]
    own = distill_run(tmp_path, "own", "tiny-random", *pipeline)
    other = distill_run(tmp_path, "other", save_other_teacher(tmp_path / "teacher"), *pipeline)
    assert [m["step"] for m in own] == [m["step"] for m in other] == [1, 2]
    # the same weights: the same logits, no signal, so the student never moves and step 2 is 0 again
    assert all(abs(m["distill/reverse_kl"]) < 1e-6 and m["grad_norm"] == 0 for m in own)
    assert all(m["distill/reverse_kl"] > 1e-3 and math.isfinite(m["distill/teacher_logprob"]) for m in other)
    assert all(m["grad_norm"] > 0 for m in other)


@pytest.mark.slow
def test_two_learner_ranks_distill_as_one(tmp_path):
    """Each rank loads its own teacher and scores its share; the step's sums are the whole step's."""
    teacher = save_other_teacher(tmp_path / "teacher")
    pipeline = ["--no-serial", "--devices", "cpu", "--num-workers", "1", "--max-policy-lag", "0"]
    one = distill_run(tmp_path, "one", teacher, *pipeline)
    two = distill_run(tmp_path, "two", teacher, *pipeline, "--learner-devices", "2")
    for a, b in zip(one, two):
        for key in ("distill/reverse_kl", "distill/teacher_logprob", "grad_norm", "train/samples"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_a_resumed_run_distills_from_the_saved_teacher(tmp_path):
    """The teacher is frozen and named in config.json: a resume reloads it and needs nothing else."""
    from nanorllm.run.lifecycle import main

    teacher = save_other_teacher(tmp_path / "teacher")
    distill_run(tmp_path, "run", teacher)
    with length_rule_grading():
        assert main(["--resume", str(tmp_path / "run"), "--max-steps", "3"]) == 0
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [third] = [m for m in steps if m.get("step") == 3]
    assert third["distill/reverse_kl"] > 1e-3 and third["grad_norm"] > 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["teacher"] == teacher
