"""--dtype auto: bf16 where every device the run uses has bf16 units, fp32 elsewhere; forcing works; the choice and
why are printed and kept in config.json, and a resumed run reads it back as a config."""

import json

import pytest

from nanorllm.config import TrainConfig
from nanorllm.config.fields import DTYPE_CHOICE
from nanorllm.run.assembly import assemble
from nanorllm.utils import precision
from nanorllm.utils.precision import choose_precision


@pytest.fixture
def cpu(monkeypatch):
    """Pretend this machine's CPU reports `flags` (x86)."""
    monkeypatch.delenv(precision.AUTO_ENV, raising=False)  # the suite pins auto (tests/conftest.py): not here

    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(precision, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    return set_flags


def test_a_cpu_without_bf16_units_keeps_fp32(cpu):
    cpu("avx", "avx2", "fma")
    chosen = choose_precision("auto", ["cpu"])
    assert chosen.name == "float32" and "neither avx512_bf16 nor amx_bf16" in chosen.why and "--dtype bf16" in chosen.why


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_a_cpu_with_bf16_units_computes_in_bf16(cpu, flag):
    cpu("avx2", "avx512f", flag)
    chosen = choose_precision("auto", ["cpu"])
    assert chosen.name == "bfloat16" and "--dtype fp32 forces fp32" in chosen.why


@pytest.mark.parametrize("spec, name", [("fp32", "float32"), ("float32", "float32"), ("bf16", "bfloat16"),
                                        ("bfloat16", "bfloat16")])
def test_a_given_dtype_is_forced_whatever_the_hardware(cpu, spec, name):
    cpu("avx2")
    assert choose_precision(spec, ["cpu"]).name == name
    cpu("avx512_bf16")
    assert choose_precision(spec, ["cpu"]) == precision.Precision(name, f"--dtype {spec}")


def test_one_device_without_bf16_units_keeps_the_whole_run_in_fp32(cpu, monkeypatch):
    cpu("avx512_bf16")
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda dev: (7, 0))
    chosen = choose_precision("auto", ["cpu", "cuda:0"])
    assert chosen.name == "float32" and "compute capability 7.0" in chosen.why


def test_the_run_assembly_resolves_auto_and_the_memory_plan_counts_its_bytes(cpu):
    from nanorllm.memory.plan import compute_bytes

    cpu("avx512_bf16")
    parts = assemble(TrainConfig(model="tiny-random", serial=True, tasks="arith:count=8", eval_tasks=""))
    assert parts.cfg.dtype == "bfloat16" and parts.precision.startswith("auto: the CPU has bf16 units")
    assert compute_bytes("auto", "cpu") == 2
    cpu("avx2")
    parts = assemble(TrainConfig(model="tiny-random", serial=True, tasks="arith:count=8", eval_tasks=""))
    assert parts.cfg.dtype == "float32" and compute_bytes("auto", "cpu") == 4


def test_config_json_keeps_the_choice_and_reads_back_as_a_config(tmp_path):
    saved = {**TrainConfig(dtype="float32").saved(), DTYPE_CHOICE: "auto: this CPU has no bf16 units"}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    again = TrainConfig.from_saved(json.loads((tmp_path / "config.json").read_text()))
    assert again.dtype == "float32" and again == TrainConfig(dtype="float32")


def test_a_resumed_run_keeps_the_reason_its_start_recorded(tmp_path):
    from nanorllm.trainer.run_folder import first_choice

    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16", DTYPE_CHOICE: "auto: the CPU has bf16 units"}))
    assert first_choice(tmp_path, "bfloat16") == "auto: the CPU has bf16 units"
    assert first_choice(tmp_path, "float32") is None and first_choice(tmp_path / "none", "bfloat16") is None


def test_the_environment_can_name_what_auto_means_and_a_bad_name_is_refused(monkeypatch):
    monkeypatch.setenv(precision.AUTO_ENV, "bf16")
    chosen = choose_precision("auto", ["cpu"])
    assert chosen.name == "bfloat16" and chosen.why == "auto: NANORLLM_AUTO_DTYPE=bf16"
    assert choose_precision("fp32", ["cpu"]).name == "float32"  # a given dtype still wins
    monkeypatch.setenv(precision.AUTO_ENV, "fp16")
    with pytest.raises(ValueError, match="NANORLLM_AUTO_DTYPE='fp16': expected one of"):
        choose_precision("auto", ["cpu"])
