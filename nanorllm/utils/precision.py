"""Which dtype a run computes in: `--dtype auto` picks bf16 on hardware with bf16 units and fp32 elsewhere.

Why by the hardware's units and not by a timing at start: a timing on a busy machine would pick differently from
run to run, and a run's numerics must not depend on what else ran beside it. The units decide it because they
decide the speed: a CPU with AVX512-BF16 or AMX multiplies bf16 matrices 3-5x faster than fp32 (one core of
a Xeon with avx512_bf16: 170-360 against 63-68 GFLOP/s), while a CPU without them emulates bf16 (one core of an
AMD EPYC with AVX2 only: 0.6 against 20 GFLOP/s, 33x slower); a GPU from compute capability 8.0 (Ampere) on has
bf16 tensor cores, an older one emulates them.
"""

import os
import platform
from dataclasses import dataclass

import torch

NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 /proc/cpuinfo flags; aarch64 calls its own "bf16"
AUTO_ENV = "NANORLLM_AUTO_DTYPE"  # set (fp32, bf16, ...): what auto means on this machine, whatever its units


@dataclass(frozen=True)
class Precision:
    name: str  # "float32" or "bfloat16"
    why: str  # one line: how it was chosen


def choose_precision(spec: str, devices: list[str]) -> Precision:
    """`spec` ("auto", or a dtype name or alias that forces it) resolved for a run on `devices`: bf16 under auto
    only when every device has bf16 units, unless NANORLLM_AUTO_DTYPE names what auto means on this machine (a
    site that wants every program's default in fp32, or a test suite whose figures must not follow the box)."""
    if spec != "auto":
        return Precision(NAMES[spec], f"--dtype {spec}")
    if pinned := os.environ.get(AUTO_ENV):
        if pinned not in NAMES:
            raise ValueError(f"{AUTO_ENV}={pinned!r}: expected one of {', '.join(NAMES)}")
        return Precision(NAMES[pinned], f"auto: {AUTO_ENV}={pinned}")
    missing = [(d, why) for d in dict.fromkeys(devices) if (why := missing_bf16_units(d)) is not None]
    if missing:
        return Precision("float32", f"auto: {missing[0][1]}; --dtype bf16 forces bf16")
    kinds = " and ".join(sorted({torch.device(d).type.upper().replace("CUDA", "GPU") for d in devices}))
    return Precision("bfloat16", f"auto: the {kinds} {'have' if ' and ' in kinds else 'has'} bf16 units; "
                                 "--dtype fp32 forces fp32")


def resolve(spec: str, device: str) -> str:
    """The dtype name `spec` means on `device` ("auto" chosen as above)."""
    return choose_precision(spec, [device]).name


def missing_bf16_units(device: str) -> str | None:
    """Why `device` has no bf16 units (a sentence), or None when it has them."""
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return None if major >= 8 else f"{dev} (compute capability {major}.{minor}) has no bf16 tensor cores"
    if dev.type == "cpu":
        flags = cpu_flags()
        if platform.machine() in ("aarch64", "arm64"):
            return None if "bf16" in flags else "this CPU has no bf16 units (its features name no bf16)"
        if any(f in flags for f in CPU_BF16_FLAGS):
            return None
        return "this CPU has no bf16 units (its flags name neither avx512_bf16 nor amx_bf16)"
    return f"{dev.type} is not known to have bf16 units"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's `flags`, or `Features` on ARM); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()
