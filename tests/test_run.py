"""launch/train.py end to end in serial mode: files, metrics, checkpoints, resume, bad input.

The runs grade with tests/runs.py's length rule, which the tiny random model meets about half the time:
rewards then differ inside groups, advantages are non-zero and every update really moves the weights.
The shared runs (`serial_runs`) train once a session; a test that resumes or damages one copies it first.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import nanorllm.envs.math_env as math_env
from nanorllm.run.lifecycle import main
from tests import forked
from tests.procs import HANG_S, ROOT, child_env, read_scalars
from tests.runs import SERIAL as BASE
from tests.runs import copy_run, length_rule


@pytest.fixture
def length_rule_grader(monkeypatch):
    monkeypatch.setattr(math_env, "judge", length_rule)


def train(tmp_path, name, *args):
    rc = main([*BASE, "--output-dir", str(tmp_path), "--run-name", name, *args])
    assert rc == 0
    return tmp_path / name


def weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.slow
def test_run_writes_metrics_eval_dump_checkpoints_and_model(serial_runs):
    """The shared 4-step run (checkpoints every step, 2 kept, a 5-record dump, samples and eval every 2)."""
    run = Path(serial_runs["full"])
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
def test_resume_continues_like_an_uninterrupted_run(serial_runs, tmp_path, length_rule_grader):
    """The shared 2-step run resumed to step 4 ends with the shared 4-step run's weights (that one also
    evaluates, dumps and samples on the way: none of it moves the training stream)."""
    full = Path(serial_runs["full"])
    part = copy_run(Path(serial_runs["part"]), tmp_path)
    assert main(["--resume", str(part), "--max-steps", "4"]) == 0
    a, b = weights(full / "final_model"), weights(part / "final_model")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    initial = weights(part / "checkpoints" / "step_2" / "model")
    assert any(not torch.equal(initial[k], b[k]) for k in b)  # the resumed steps trained
    steps = [s for s, _ in read_scalars(part)["reward/mean"]]
    assert steps == [1, 2, 3, 4]  # appended to the same run, no step twice
    state = json.loads((part / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["stream_position"] == 4 * 4
    opt = torch.load(part / "checkpoints" / "step_4" / "optimizer.pt", weights_only=True)
    assert all(s["step"] == 4 for s in opt["state"].values())  # Adam moments carried over, not restarted


@pytest.mark.slow
def test_damaged_checkpoints_are_skipped_on_resume(serial_runs, tmp_path, length_rule_grader, capsys):
    run = copy_run(Path(serial_runs["part"]), tmp_path)
    (run / "checkpoints" / "step_3.tmp").mkdir()  # a crash mid-write
    (run / "checkpoints" / ".tmp-step_3-999").mkdir()  # the same, under the name older versions wrote
    st = run / "checkpoints" / "step_2" / "model" / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])  # truncated
    (run / "rollouts.jsonl.tmp").write_text('{"step": 9')  # and a dump cut short
    (run / "config.json").write_text((run / "config.json").read_text()[:40])  # a full disk cut it
    assert main(["--resume", str(run), "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "[resume] config from" in out and "trainer_state.json" in out  # the checkpoint's copy
    assert "removed step_3.tmp" in out and "removed .tmp-step_3-999" in out and "removed rollouts.jsonl.tmp" in out
    assert not (run / "rollouts.jsonl.tmp").exists() and not list((run / "checkpoints").glob("*tmp*"))
    assert json.loads((run / "config.json").read_text())["max_steps"] == 3  # rewritten whole
    assert "skipping" in out and "step_2" in out and "from " + str(run / "checkpoints" / "step_1") in out
    state = json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["step"] == 3


@pytest.mark.slow
def test_train_script_smoke_run_in_a_subprocess(pipeline_run):
    """launch/train.py as a user starts it: the shared subprocess run (tests/runs.py, 2 workers, 4 steps),
    which trains once for this test and the pipeline's and metrics-doc's. It checks what the serial smoke
    run here checked: the exit, the step and done lines, the files and the TensorBoard events."""
    out = pipeline_run["output"]
    assert pipeline_run["rc"] == 0, out
    assert "step 4/4" in out and "[done] held-out success" in out
    run = Path(pipeline_run["run"])
    assert {"config.json", "eval.json", "rollouts.jsonl", "final_model", "checkpoints"} <= {p.name for p in run.iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in run.iterdir())


@pytest.mark.slow
def test_bad_task_file_stops_before_anything_is_written(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"task_id": "a", "question": "1+1?", "answer": "2"}\n{"task_id": "a", "question": "", '
                   '"answer": "3"}\nnot json\n')
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *BASE, "--tasks", str(bad),
           "--output-dir", str(tmp_path / "out"), "--run-name", "x"]
    proc = forked.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=child_env())
    assert proc.returncode == 2
    assert f"{bad}:2: field 'question' is empty" in proc.stderr
    assert f"{bad}:2: field 'task_id' duplicates line 1" in proc.stderr
    assert f"{bad}:3: invalid JSON" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_flags_are_all_reported(capsys):
    assert main(["--max-steps", "0", "--lr", "-1", "--loss-agg", "mean"]) == 2
    err = capsys.readouterr().err
    assert "max_steps: must be >= 1" in err and "lr: must be > 0" in err and "loss_agg:" in err


def test_non_finite_settings_are_refused_naming_the_field(capsys):
    assert main(["--lr", "inf", "--restart-backoff-s", "nan", "--is-band", "0.5", "nan"]) == 2
    err = capsys.readouterr().err
    assert "lr: must be a finite number, got inf" in err and "restart_backoff_s: must be a finite number, got nan" in err
    assert "is_band: must be a finite number" in err and "lr: must be > 0" not in err  # one line per field


def test_inf_is_no_limit_only_where_documented():
    from nanorllm.config import parse_config
    from nanorllm.ranks.group import _timedelta

    cfg = parse_config(["--learner-timeout-s", "inf", "--worker-timeout-s", "inf"])
    assert _timedelta(cfg.learner_timeout_s).days == 365  # timedelta(seconds=inf) raises OverflowError


@pytest.mark.slow
def test_an_update_that_leaves_non_finite_weights_stops_the_run_and_keeps_the_last_finite_checkpoint(
        tmp_path, length_rule_grader, capsys, monkeypatch):
    monkeypatch.setenv("NANORLLM_FAULT", "nan_weights:2")
    rc = main([*BASE, "--output-dir", str(tmp_path), "--run-name", "nan", "--max-steps", "3", "--save-every", "1"])
    assert rc == 1
    out = capsys.readouterr()
    assert "step 2's update left non-finite weights" in out.err and "[done]" not in out.out
    run = tmp_path / "nan"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert all(torch.isfinite(t).all() for t in weights(run / "checkpoints" / "step_1" / "model").values())


@pytest.mark.slow
def test_a_full_disk_at_a_periodic_save_is_reported_and_retried_while_the_run_goes_on(
        tmp_path, length_rule_grader, capsys, monkeypatch):
    monkeypatch.setenv("NANORLLM_FAULT", "disk_full:2")
    run = train(tmp_path, "full", "--max-steps", "3", "--save-every", "1", "--save-every-minutes", "0")
    out = capsys.readouterr().out
    assert "[checkpoint] step 2 not written (OSError: [Errno 28] No space left on device" in out
    assert "the last one on disk is step_1" in out and "step 3/3" in out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_3"]  # no step_2.tmp left


def _task_file(path, n):
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"{i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(n)))
    return path


@pytest.mark.slow
def test_resume_is_refused_when_the_task_order_or_the_model_would_change(tmp_path, length_rule_grader, capsys):
    tasks = _task_file(tmp_path / "tasks.jsonl", 10)
    run = train(tmp_path, "order", "--tasks", str(tasks), "--max-steps", "1", "--save-every", "1")
    config_before = (run / "config.json").read_text()
    with open(tasks, "a") as f:  # one line appended
        f.write(json.dumps({"task_id": "t10", "question": "10 + 1?", "answer": "11"}) + "\n")
    capsys.readouterr()
    assert main(["--resume", str(run), "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "training tasks (--tasks, --limit): 11 tasks" in err and "10 tasks" in err and "--resume-new-data" in err
    _task_file(tasks, 10)  # back as it was: only the seed differs
    assert main(["--resume", str(run), "--max-steps", "2", "--seed", "1"]) == 2
    assert "task-order seed (--seed): 1 now, 0 in the checkpoint" in capsys.readouterr().err
    assert main(["--resume", str(run), "--max-steps", "2", "--model", str(run / "checkpoints" / "step_1" / "model"),
                 "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "model: " in err and "dtype: 'bfloat16' given" in err and "cannot change on resume" in err
    assert (run / "config.json").read_text() == config_before  # nothing half-applied
    assert json.loads((run / "checkpoints" / "step_1" / "trainer_state.json").read_text())["step"] == 1


@pytest.mark.slow
def test_resume_new_data_starts_the_new_order_at_a_new_epoch(tmp_path, length_rule_grader, capsys):
    tasks = _task_file(tmp_path / "tasks.jsonl", 6)
    run = train(tmp_path, "grow", "--tasks", str(tasks), "--eval-tasks", "", "--max-steps", "1", "--save-every", "1",
                "--tasks-per-step", "4")  # every task trains: none held out
    _task_file(tasks, 7)
    assert main(["--resume", str(run), "--max-steps", "3", "--resume-new-data"]) == 0
    assert "epoch 0 of it starts at task-stream position 4" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    after = [r for r in records if r["step"] > 1]
    positions = sorted({int(r["group_id"].rsplit("@", 1)[1]) for r in after})
    assert positions == list(range(4, 12))  # one new epoch of 7, then the next one begins: no position twice
    first_epoch = {r["task_id"] for r in after if int(r["group_id"].rsplit("@", 1)[1]) < 11}
    assert len(first_epoch) == 7  # every task of the new list once, none twice
    state = json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["stream_origin"] == 4 and state["task_order"]["tasks"]["n"] == 7
    assert json.loads((run / "config.json").read_text())["resume_new_data"] is False  # never saved


@pytest.mark.parametrize("serial", [True, False])
def test_threads_flag_holds_alone_in_the_serial_loop_and_beside_workers(serial):
    """--threads is every phase's thread count (two runs can share a machine a core each); without it a
    process alone takes every core and a pipeline learner its share."""
    import os

    from nanorllm.config import TrainConfig
    from nanorllm.trainer.loop import TrainingRun
    from nanorllm.utils.devices import DeviceMap

    before = torch.get_num_threads()
    try:
        for threads, alone_n, beside_n in [(1, 1, 1), (None, os.cpu_count(), os.cpu_count() if serial else 1)]:
            run = TrainingRun(TrainConfig(model="tiny-random", serial=serial, threads=threads))
            run.devices = DeviceMap(learners=["cpu"], workers=[] if serial else ["cpu"] * (os.cpu_count() - 1))
            run.use_cores(alone=True)
            assert torch.get_num_threads() == alone_n
            run.use_cores(alone=False)
            assert torch.get_num_threads() == beside_n
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_a_reward_function_that_changes_directory_leaves_the_whole_run_in_one_folder(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rewards = tmp_path / "wanders.py"
    rewards.write_text(f"import os\n\ndef wanders(completions, **kw):\n    os.chdir({str(elsewhere)!r})\n"
                       "    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)  # put back after the test: the function moves this process
    assert main([*BASE, "--reward", f"{rewards}:wanders", "--max-steps", "2", "--save-every", "1",
                 "--output-dir", "runs", "--run-name", "r"]) == 0
    run = tmp_path / "runs" / "r"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]
    assert (run / "final_model").is_dir() and (run / "eval.json").is_file()
    assert list(elsewhere.iterdir()) == []  # nothing of the run under the directory the function moved to
