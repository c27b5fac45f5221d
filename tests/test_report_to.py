"""--report-to: the same scalars, step by step, to TensorBoard, metrics.jsonl and Weights & Biases."""

import json
import sys
import types
from pathlib import Path

import pytest

from nanorllm.run.lifecycle import main
from tests.procs import read_scalars
from tests.runs import TINY_ARGS, copy_run

BASE = [*TINY_ARGS, "--serial", "--eval-limit", "2"]


def jsonl_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_jsonl_holds_one_object_per_step_with_tensorboards_names_and_values_and_a_resume_cuts_it_back(
        serial_runs, tmp_path):
    """The shared 2-step run reports to TensorBoard and metrics.jsonl; a copy of it is resumed."""
    run = copy_run(Path(serial_runs["part"]), tmp_path)
    rows = jsonl_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    scalars = read_scalars(run)
    from_tb = {(step, tag): value for tag, points in scalars.items() for step, value in points}
    from_jsonl = {(r["step"], k): v for r in rows for k, v in r.items() if k != "step"}
    assert from_jsonl.keys() == from_tb.keys()
    assert all(from_jsonl[k] == pytest.approx(from_tb[k], rel=1e-6) for k in from_tb)  # TB stores float32
    (run / "checkpoints" / "step_2").rename(run / "checkpoints" / "gone")  # resume from step 1: step 2 again
    assert main(["--resume", str(run), "--max-steps", "3"]) == 0
    assert [r["step"] for r in jsonl_rows(run)] == [0, 1, 2, 3]


@pytest.mark.slow
def test_jsonl_alone_writes_no_tensorboard_events(tmp_path):
    assert main([*BASE, "--report-to", "jsonl", "--max-steps", "1", "--eval-tasks", "", "--output-dir", str(tmp_path),
                 "--run-name", "only"]) == 0
    run = tmp_path / "only"
    assert not any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    assert [r["step"] for r in jsonl_rows(run)] == [1] and "reward/mean" in jsonl_rows(run)[0]


@pytest.mark.slow
def test_wandb_gets_the_same_scalar_names_and_the_runs_config(tmp_path, monkeypatch):
    calls = {"init": [], "log": [], "finish": 0}

    class Run:
        def log(self, metrics, step):
            calls["log"].append((step, dict(metrics)))

        def finish(self):
            calls["finish"] += 1

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls["init"].append(kw) or Run()
    fake.__spec__ = types.SimpleNamespace(name="wandb")
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    assert main([*BASE, "--report-to", "wandb,jsonl", "--max-steps", "1", "--output-dir", str(tmp_path),
                 "--run-name", "w"]) == 0
    (init,) = calls["init"]
    assert init["name"] == "w" and init["config"]["max_steps"] == 1 and init["config"]["report_to"] == "wandb,jsonl"
    logged = {}
    for step, metrics in calls["log"]:
        logged.setdefault(step, {}).update(metrics)
    assert logged == {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in jsonl_rows(tmp_path / "w")}
    assert calls["finish"] == 1


@pytest.mark.slow
def test_wandb_offline_runs_with_no_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main([*BASE, "--report-to", "wandb", "--max-steps", "1", "--eval-tasks", "", "--output-dir", str(tmp_path),
                 "--run-name", "off"]) == 0
    (offline,) = (tmp_path / "off" / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))  # the run's records, for `wandb sync` later


def test_an_unknown_reporter_is_refused_at_start(tmp_path, capsys):
    assert main([*BASE, "--report-to", "tensorboard,mlflow", "--output-dir", str(tmp_path / "out")]) == 2
    assert "report_to: expected a comma list of tensorboard, jsonl, wandb, got 'tensorboard,mlflow'" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()
