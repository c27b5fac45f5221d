"""The SFT program end to end: resume equals an uninterrupted run, bad input exits 2 with nothing written,
launch/train.py starts from the folder it writes, and what it teaches is what the RL rollout parses."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.envs.registry import EnvSpec, load_bundle
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.supervised.sft import sft_rows, start_run, train_sft
from test_sft import TOOL_ROW, write_jsonl
from tests import forked

ROOT = Path(__file__).resolve().parents[1]
ROWS = [TOOL_ROW] + [{"prompt": f"What is {i} + {i}?", "completion": f"\\boxed{{{2 * i}}}"} for i in range(7)]

pytestmark = pytest.mark.slow


def run_sft(cfg: SFTConfig) -> list[dict]:
    run, start = start_run(cfg, lambda policy: sft_rows(cfg, policy), say=lambda _: None)
    try:
        train_sft(run, start, say=lambda _: None)
    finally:
        run.folder.close()
    return [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_sft_run_ends_with_the_uninterrupted_runs_weights(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    base = SFTConfig(**{**SFT_DEFAULTS, "model": "tiny-random", "data": data, "rows_per_step": 3, "epochs": 2,
                        "lr": 1e-3, "threads": 1, "report_to": "jsonl", "output_dir": str(tmp_path / "runs"),
                        "tools": "nanorllm/envs/calc_tool.py:calc"})
    whole = run_sft(replace(base, run_name="whole", out=str(tmp_path / "whole")))
    cut = replace(base, run_name="cut", out=str(tmp_path / "cut"))
    run_sft(replace(cut, max_steps=2))
    resumed = run_sft(replace(cut, resume=str(tmp_path / "runs" / "cut")))
    assert [m["step"] for m in whole if "sft/loss" in m] == [1, 2, 3, 4, 5, 6]
    loss = {m["step"]: m["sft/loss"] for m in whole if "sft/loss" in m}
    assert [(m["step"], m["sft/loss"]) for m in resumed if "sft/loss" in m] == list(loss.items())  # 1-2 kept, 3-6 new
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loss[6] < loss[1]


def sft(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return forked.run([sys.executable, str(ROOT / "launch" / "sft.py"), "--model", "tiny-random", "--threads", "1",
                       *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_bad_rows_and_flags_exit_2_naming_each_and_write_nothing(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [ROWS[1], {"messages": [{"role": "user", "content": "x"}]},
                                               {"prompt": "x", "completion": ""}])
    out = sft("--data", bad, "--out", str(tmp_path / "model"), "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"{bad}:2: no assistant message" in out.stderr and f"{bad}:3: message 1 (assistant): nothing" in out.stderr
    flags = sft("--lr", "0", "--data", bad, cwd=tmp_path)
    assert flags.returncode == 2 and "lr: must be > 0" in flags.stderr and "out: give --out" in flags.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_train_starts_from_the_merged_lora_folder_sft_writes(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    done = sft("--data", data, "--out", str(tmp_path / "model"), "--output-dir", str(tmp_path / "runs"),
               "--lora-rank", "4", "--epochs", "1", "--tools", str(ROOT / "nanorllm/envs/calc_tool.py") + ":calc",
               "--eval-frac", "0.25", "--report-to", "jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (metrics,) = (tmp_path / "runs").glob("*/metrics.jsonl")
    held_out = [(m["step"], m["sft/eval_loss"]) for m in map(json.loads, metrics.read_text().splitlines())
                if "sft/eval_loss" in m]
    assert [s for s, _ in held_out] == [0, 1] and all(loss > 0 for _, loss in held_out)  # 6 rows, 6 a step
    assert (tmp_path / "model" / "config.json").is_file() and not (tmp_path / "model" / "adapter_config.json").exists()
    train = forked.run([sys.executable, str(ROOT / "launch" / "train.py"), "--model", str(tmp_path / "model"),
                        "--serial", "--max-steps", "1", "--tasks-per-step", "2", "--num-samples-per-task", "2",
                        "--max-new-tokens", "8", "--eval-tasks", "", "--threads", "1", "--output-dir",
                        str(tmp_path / "rl"), "--no-save-model"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    assert "step 1/1" in train.stdout


def test_a_policy_fine_tuned_on_one_tool_demonstration_writes_the_call_the_rl_rollout_parses(tmp_path):
    """The warm start teaches exactly what the RL parser reads: overfit tiny-random on one calculator-tool
    demonstration, then a --tools rollout of the same task (greedy, the run's engine, env and parser) parses
    that `calc` call, runs it, and the episode ends with the gold answer."""
    calc_env, tools = "nanorllm.envs.calc_tool:CalcTasks", "nanorllm/envs/calc_tool.py:calc"
    cfg = SFTConfig(**{**SFT_DEFAULTS, "model": "tiny-random", "env": calc_env, "tools": tools, "demos": 1,
                       "epochs": 150, "rows_per_step": 1, "lr": 3e-3, "threads": 1, "report_to": "jsonl",
                       "output_dir": str(tmp_path / "runs"), "out": str(tmp_path / "model")})
    metrics = run_sft(cfg)
    assert [m["sft/loss"] for m in metrics if "sft/loss" in m][-1] < 0.01
    policy = HFCausalPolicy.from_name(str(tmp_path / "model"))
    bundle = load_bundle(EnvSpec(env=calc_env, tools=tools), rewards=False)
    task = bundle.load_tasks(bundle.default_tasks, limit=1)[0]
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=96, greedy=True), env=bundle)
    (result,) = engine.run([task]).results
    first = result.trajectory.steps[0].info
    expression = task["question"].removeprefix("What is ").removesuffix("?")
    assert first["tool_calls"] == [{"name": "calc", "arguments": {"expression": expression}}]
    assert first["tool_results"][0]["content"] == task["answer"] and first["tool_parse_failures"] == 0
    assert result.trajectory.final_reward == 1.0
