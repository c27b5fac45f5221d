"""SFT's steps as TRL reads them: --max-steps is the number of optimizer steps and replaces --epochs (the rows
read as many times as it takes), --epochs counts passes when it is 0; the learning rate follows RL's schedule over
the run's steps."""

import json
from dataclasses import replace

import pytest

from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.supervised.sft import SFTRun, step_lr
from nanorllm.trainer.schedule import lr_at
from test_sft import write_jsonl
from test_sft_run import ROWS, run_sft


def rows_run(n_rows: int, **settings) -> SFTRun:
    """A run of `n_rows` rows (each its own index) whose steps and rows are asked, nothing loaded."""
    cfg = SFTConfig(**{**SFT_DEFAULTS, "data": "rows.jsonl", "out": "out", **settings})
    return SFTRun(cfg, None, None, [[i] for i in range(n_rows)], [], None)


def test_max_steps_is_the_number_of_steps_and_reads_the_rows_as_many_times_as_it_takes():
    run = rows_run(5, rows_per_step=2, max_steps=200)  # one epoch (the default) makes 3
    assert run.steps == 200
    drawn = [i for step in range(run.steps) for [i] in run.rows_of_step(step)]
    assert len(drawn) == 400 and all(len(run.rows_of_step(s)) == 2 for s in range(run.steps))
    assert all(sorted(drawn[e * 5:(e + 1) * 5]) == list(range(5)) for e in range(80))  # each pass every row once


def test_without_max_steps_the_epochs_decide_and_the_last_step_may_be_short():
    run = rows_run(5, rows_per_step=2, epochs=3)
    assert run.steps == 8
    assert [len(run.rows_of_step(s)) for s in range(run.steps)] == [2] * 7 + [1]
    assert sorted(i for s in range(run.steps) for [i] in run.rows_of_step(s)) == sorted(list(range(5)) * 3)


def test_the_learning_rate_is_rls_schedule_over_the_runs_steps():
    cfg = SFTConfig(**{**SFT_DEFAULTS, "lr": 1e-3, "lr_schedule": "cosine", "warmup_steps": 2})
    rates = [step_lr(cfg, s, 10) for s in range(10)]
    assert rates == [lr_at(s, lr=1e-3, schedule="cosine", warmup_steps=2, max_steps=10) for s in range(10)]
    assert rates[:3] == [pytest.approx(1e-3 / 3), pytest.approx(2e-3 / 3), 1e-3] and rates[-1] < rates[3] < 1e-3
    assert step_lr(SFTConfig(**SFT_DEFAULTS), 7, 10) == SFT_DEFAULTS["lr"]  # constant, no warmup: --lr


def test_the_schedule_fields_are_checked_naming_the_field():
    cfg = SFTConfig(**{**SFT_DEFAULTS, "data": "rows.jsonl", "out": "out", "warmup_steps": -1})
    assert "warmup_steps: must be >= 0, got -1" in cfg.validate()
    assert "warmup_steps: 4 is not below max_steps (4): the run never reaches --lr" in \
        replace(cfg, warmup_steps=4, max_steps=4).validate()


@pytest.mark.slow
def test_a_run_of_max_steps_past_one_epoch_trains_each_step_at_its_scheduled_rate(tmp_path):
    """8 rows, 3 a step, one epoch: --max-steps 5 trains 5 steps (past the data's end), warmup then linear decay,
    each step's rate in metrics.jsonl."""
    cfg = SFTConfig(**{**SFT_DEFAULTS, "model": "tiny-random", "data": write_jsonl(tmp_path / "rows.jsonl", ROWS),
                       "tools": "nanorllm/envs/calc_tool.py:calc", "rows_per_step": 3, "max_steps": 5, "lr": 1e-3,
                       "lr_schedule": "linear", "warmup_steps": 1, "threads": 1, "report_to": "jsonl",
                       "output_dir": str(tmp_path / "runs"), "run_name": "r", "out": str(tmp_path / "model")})
    metrics = run_sft(cfg)
    rates = [(m["step"], m["sft/lr"]) for m in metrics if "sft/lr" in m]
    assert rates == [(s + 1, pytest.approx(lr_at(s, lr=1e-3, schedule="linear", warmup_steps=1, max_steps=5)))
                     for s in range(5)]
    assert [r for _, r in rates][:2] == [pytest.approx(5e-4), pytest.approx(1e-3)]
    assert json.loads((tmp_path / "model" / "sft.json").read_text())["steps"] == 5
