"""launch/train.py end to end in serial mode: files, metrics, checkpoints, resume, bad input.

The tiny random model never writes a \\boxed{} answer, so these tests swap the grader for a rule it
can meet (an even sum of character codes: about half the responses): rewards then differ inside groups, advantages are
non-zero and every update really moves the weights.
"""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import nanorllm.envs.math_env as math_env
from nanorllm.envs.grader import Verdict
from nanorllm.trainer.lifecycle import main
from tests.procs import ROOT, TINY_ARGS, child_env, read_scalars

BASE = [*TINY_ARGS, "--serial", "--lr", "1e-3", "--no-drop-zero-std-groups"]


@pytest.fixture
def length_rule_grader(monkeypatch):
    monkeypatch.setattr(math_env, "judge", lambda response, gold, **kw: Verdict(sum(map(ord, response)) % 2 == 0, "x"))


def train(tmp_path, name, *args):
    rc = main([*BASE, "--output-dir", str(tmp_path), "--run-name", name, *args])
    assert rc == 0
    return tmp_path / name


def weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.slow
def test_run_writes_metrics_eval_dump_checkpoints_and_model(tmp_path, length_rule_grader):
    run = train(tmp_path, "r", "--max-steps", "4", "--save-every", "1", "--keep-checkpoints", "2",
                "--rollout-dump-size", "5", "--sample-every", "2", "--eval-every", "2")
    scalars = read_scalars(run)
    for tag in ["reward/mean", "reward/std", "success_rate", "success_rate/first_turn", "episode/num_turns",
                "episode/termination/correct", "episode/termination/truncated", "frac_reward_zero_std",
                "groups/solve_none", "groups/solve_all", "groups/solve_partial", "completions/mean_length",
                "completions/clipped_ratio", "loss/policy", "clip_ratio/low", "clip_ratio/high", "approx_kl",
                "entropy", "grad_norm", "lr", "advantage/mean", "advantage/std", "perf/step_s",
                "perf/rollout_s", "perf/train_s", "perf/tokens_per_s"]:
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4], tag
    assert [s for s, _ in scalars["eval/success_rate"]] == [0, 2, 4]
    assert "loss/kl" not in scalars  # only when kl_coef > 0
    assert 0.0 < scalars["reward/mean"][0][1] < 1.0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    text_tags = acc.Tags()["tensors"]
    assert any("hyperparameters" in t for t in text_tags) and any("samples" in t for t in text_tags)

    config = json.loads((run / "config.json").read_text())
    assert config["max_steps"] == 4 and config["model"] == "tiny-random"
    summary = json.loads((run / "eval.json").read_text())
    assert set(summary) == {"before", "after", "gain"} and summary["after"]["n"] == 4
    dump = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(dump) == 5
    assert {"task_id", "question", "answer", "turns", "final_reward", "advantage", "termination_reason",
            "policy_version", "worker_id"} <= set(dump[0])
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_3", "step_4"]
    model = AutoModelForCausalLM.from_pretrained(run / "final_model")
    assert model.config.vocab_size > 256


@pytest.mark.slow
def test_resume_continues_like_an_uninterrupted_run(tmp_path, length_rule_grader):
    full = train(tmp_path, "full", "--max-steps", "6")
    part = train(tmp_path, "part", "--max-steps", "2")
    assert main(["--resume", str(part), "--max-steps", "6"]) == 0
    a, b = weights(full / "final_model"), weights(part / "final_model")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    initial = weights(part / "checkpoints" / "step_2" / "model") if (part / "checkpoints" / "step_2").exists() else None
    assert initial is None or any(not torch.equal(initial[k], b[k]) for k in b)
    steps = [s for s, _ in read_scalars(part)["reward/mean"]]
    assert steps == [1, 2, 3, 4, 5, 6]  # appended to the same run, no step twice
    state = json.loads((part / "checkpoints" / "step_6" / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["stream_position"] == 6 * 4
    opt = torch.load(part / "checkpoints" / "step_6" / "optimizer.pt", weights_only=True)
    assert all(s["step"] == 6 for s in opt["state"].values())  # Adam moments carried over, not restarted


@pytest.mark.slow
def test_damaged_checkpoints_are_skipped_on_resume(tmp_path, length_rule_grader, capsys):
    run = train(tmp_path, "d", "--max-steps", "2", "--save-every", "1")
    (run / "checkpoints" / ".tmp-step_3-999").mkdir()  # a crash mid-write
    st = run / "checkpoints" / "step_2" / "model" / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])  # truncated
    assert main(["--resume", str(run), "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "skipping" in out and "step_2" in out and "from " + str(run / "checkpoints" / "step_1") in out
    state = json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["step"] == 3


@pytest.mark.slow
def test_train_script_smoke_run_in_a_subprocess(tmp_path):
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *BASE, "--max-steps", "2",
           "--output-dir", str(tmp_path), "--run-name", "smoke"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2/2" in proc.stdout and "[done] held-out success" in proc.stdout
    run = tmp_path / "smoke"
    assert {"config.json", "eval.json", "rollouts.jsonl", "final_model", "checkpoints"} <= {p.name for p in run.iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in run.iterdir())


@pytest.mark.slow
def test_bad_task_file_stops_before_anything_is_written(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"task_id": "a", "question": "1+1?", "answer": "2"}\n{"task_id": "a", "question": "", '
                   '"answer": "3"}\nnot json\n')
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *BASE, "--tasks", str(bad),
           "--output-dir", str(tmp_path / "out"), "--run-name", "x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 2
    assert f"{bad}:2: field 'question' is empty" in proc.stderr
    assert f"{bad}:2: field 'task_id' duplicates line 1" in proc.stderr
    assert f"{bad}:3: invalid JSON" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_flags_are_all_reported(capsys):
    assert main(["--max-steps", "0", "--lr", "-1", "--loss-agg", "mean"]) == 2
    err = capsys.readouterr().err
    assert "max_steps: must be >= 1" in err and "lr: must be > 0" in err and "loss_agg:" in err
