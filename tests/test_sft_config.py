"""SFT's config holds what an SFT run reads and nothing RL-only: its --help names no RL flag, and a run reads
every field it has."""

import dataclasses
import re

import pytest
import tyro

from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.run.sft_program import main
from test_sft import write_jsonl
from test_sft_run import ROWS

RL_ONLY = """--kl-coef --clip-low --clip-high --loss-agg --off-policy-correction --entropy-coef --fill-batch
    --mask-truncated --overlong-buffer --tasks-per-step --num-samples-per-task --adv-estimator --turn-credit
    --updates-per-batch --reward --reward-model --reward-mode --judge --teacher --agent --tool-parser --max-tool-calls
    --num-workers --serial --max-policy-lag --queue-size --temperature --top-p
    --max-turns --max-new-tokens --max-prompt-tokens --grader-timeout-s --env-timeout-s --max-batch-episodes
    --cuda-graphs --collapse-alarm-steps --tool-alarm-steps --lora-merged
    --sample-every --rollout-dump-size --save-model --resume-new-data --eval-tasks""".split()
FIELDS = {f.name for f in dataclasses.fields(SFTConfig)}


def test_the_help_lists_each_sft_field_and_no_rl_only_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    entries = re.findall(r"^\W{0,2}(--[a-z][a-z0-9-]*(?:, --[a-z][a-z0-9-]*)*)", capsys.readouterr().out, re.M)
    flags = {flag for entry in entries for flag in entry.split(", ")}  # each option's names, not the docs' mentions
    assert stop.value.code == 0
    assert {f"--{name.replace('_', '-')}" for name in FIELDS} <= flags
    assert flags & set(RL_ONLY) == set()


def test_the_help_says_what_sft_reads_in_task_fields_max_steps_and_epochs(capsys):
    """--task-fields names SFT's own keys, --max-steps says it is the steps and replaces --epochs (TRL's reading)."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "launch/sft.py's --data rows: keys messages, prompt, completion, tools, text" in text
    assert "launch/sft.py: the steps the run makes, over the data as many times as they take, in place of --epochs, " \
           "as TRL's max_steps (0: as many as --epochs make)" in text
    assert "launch/sft.py: over the data, when --max-steps is 0" in text and "--lr-schedule" in text


READ: set[str] = set()


class Recorded(SFTConfig):
    """An SFTConfig that notes each field the program reads; its checks and config.json, which read them all,
    are not a use."""

    def __getattribute__(self, name):
        if name in FIELDS:
            READ.add(name)
        return super().__getattribute__(name)

    def validate(self) -> list[str]:
        before = set(READ)
        out = super().validate()
        READ.intersection_update(before)
        return out

    def saved(self) -> dict:
        before = set(READ)
        out = super().saved()
        READ.intersection_update(before)
        return out


@pytest.mark.slow
def test_an_sft_run_reads_every_field_of_its_config(tmp_path, monkeypatch):
    """Two tiny runs of the program read them all: --data with held-out rows, and --demos of an env under LoRA
    (the LoRA shape, the env's tasks and first prompt); each field is read, whatever its value."""
    base = dict(SFT_DEFAULTS, model="tiny-random", threads=1, report_to="jsonl", output_dir=str(tmp_path / "runs"))
    data = Recorded(**base, data=write_jsonl(tmp_path / "rows.jsonl", ROWS), eval_frac=0.5, eval_every=1,
                    run_name="data", out=str(tmp_path / "data"), tools="nanorllm/envs/calc_tool.py:calc")
    demos = Recorded(**base, demos=2, lora_rank=2, out=str(tmp_path / "demos"))  # a run folder named by exp_name
    for cfg in (data, demos):
        monkeypatch.setattr(tyro, "cli", lambda *args, cfg=cfg, **kwargs: cfg)
        assert main([]) == 0
        if cfg is data:
            assert {"data", "limit", "eval_every", "memory_plan_only"} <= READ and not {"env", "lora_alpha"} & READ
    assert FIELDS - READ == set()
