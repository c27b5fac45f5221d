"""SFT's memory plan: the RL learner's parts for the same model and settings, its own activations and nothing
else, printed alone under --memory-plan-only (nothing loaded, nothing written), and a plan that does not fit
refused in one line before anything loads."""

import pytest

from nanorllm.config import TrainConfig
from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.config.specs import lora_spec
from nanorllm.memory.plan import GB, activation_bytes, model_config, parameter_counts, plan_run
from nanorllm.memory.sft_plan import plan_sft
from nanorllm.memory.tasks import TaskShape
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.run.sft_program import main
from nanorllm.utils.devices import DeviceMap
from tests.test_memory import on

FREE = {"cpu": 10**12, "cuda:0": 10**12}


@pytest.mark.parametrize("model, lora_rank, dtype, checkpointing, device", [
    ("smollm2-135m-instruct", 0, "float32", False, "cpu"),
    ("smollm2-135m-instruct", 16, "bf16", True, "cpu"),
    ("tiny-random", 4, "float32", False, "cuda:0")])
def test_the_sft_learner_holds_the_rl_learners_model_parts_and_its_own_activations(model, lora_rank, dtype,
                                                                                 checkpointing, device):
    settings = dict(model=model, lora_rank=lora_rank, dtype=dtype, grad_checkpointing=checkpointing,
                    micro_batch_tokens=2048)
    rl = plan_run(on(TrainConfig(**settings), DeviceMap([device], [device])), free=FREE, shm_free=10**12,
                  tasks=TaskShape(first=84, shared=71))
    cfg = SFTConfig(**{**SFT_DEFAULTS, **settings})
    sft = plan_sft(cfg, device, free=FREE)
    learner = {p.name: p.nbytes for p in rl.processes[0].parts}
    parts = {p.name: p.nbytes for p in sft.processes[0].parts}
    same = ["weights", "grads", "adam", "runtime"] + (["cuda context"] if device != "cpu" else [])
    assert list(parts) == ["weights", "grads", "adam", "activations", *same[3:]]  # no kv, reference or shm block
    assert {k: parts[k] for k in same} == {k: learner[k] for k in same}
    config = model_config(model)
    acts = activation_bytes(config, 2048, scored=2048, dtype_bytes=2 if dtype == "bf16" else 4,
                            checkpointing=checkpointing, lora=lora_spec(cfg))
    assert parts["activations"] == acts and "2048 tokens, each scored" in sft.table()
    assert sft.processes[0].total == sum(learner[k] for k in same) + acts
    assert len(sft.processes) == 1 and sft.shm_bytes == 0  # no workers, no shared weight block
    trainable = parameter_counts(config, lora_spec(cfg))[1]
    assert (parts["grads"], parts["adam"]) == (4 * trainable, 8 * trainable)  # fp32, AdamW's two moments


def test_a_row_longer_than_the_budget_is_planned_as_its_own_pass():
    cfg = SFTConfig(**{**SFT_DEFAULTS, "model": "tiny-random", "micro_batch_tokens": 1024, "max_tokens": 3000})
    assert "3000 tokens, each scored" in plan_sft(cfg, "cpu", free=FREE).table()


def loads_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(HFCausalPolicy, "from_name", refuse)


def test_memory_plan_only_prints_the_plan_and_loads_and_writes_nothing(tmp_path, capsys, monkeypatch):
    loads_nothing(monkeypatch)
    rc = main(["--model", "tiny-random", "--data", str(tmp_path / "no-such-rows.jsonl"), "--out", str(tmp_path / "out"),
               "--output-dir", str(tmp_path / "runs"), "--devices", "cpu", "--memory-plan-only"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("[memory] learner cpu: weights ") and "worker" not in out and "kv" not in out
    assert sorted(tmp_path.iterdir()) == []  # no run folder, no model; the rows were not read


def test_a_plan_that_does_not_fit_is_refused_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch):
    loads_nothing(monkeypatch)
    monkeypatch.setattr("nanorllm.policy.slot_cache.host_memory", lambda: (2 * 10**9, "MemAvailable"))
    args = ["--demos", "4", "--out", str(tmp_path / "out"), "--output-dir", str(tmp_path / "runs"), "--devices", "cpu"]
    need = plan_sft(SFTConfig(**{**SFT_DEFAULTS, "demos": 4, "out": "o"}), "cpu", free=FREE).need()["cpu"]
    assert main(args) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: the plan needs {need / GB:.1f} GB on the host (all CPU processes, every runtime; "
                           f"MemAvailable), 2.0 GB is free there; biggest: activations learner")
    assert line.endswith("Shrink it with --lora-rank 16, --dtype bf16, --grad-checkpointing, --micro-batch-tokens")
    assert sorted(tmp_path.iterdir()) == []
