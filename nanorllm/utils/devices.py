"""Which device each process uses, and how many CPU threads it may take.

`--devices cuda:0,cuda:1,cuda:2,cuda:3`: the learner takes the first, workers share the rest
round-robin (with one device, learner and workers share it). `auto` is every visible GPU, else cpu.
`--learner-devices` gives the learner several ranks (ranks/group.py): a count takes the first N
devices of `--devices`, a list names them; workers then share the devices no learner rank took (or,
when none is left, the learner's). On CPU every process gets cores / processes threads, so N workers
+ the learner ranks do not oversubscribe.
"""

import os
from dataclasses import dataclass

import torch


class DeviceError(ValueError):
    """A device setting names what cannot be used here; the message names the field."""


@dataclass
class DeviceMap:
    learners: list[str]  # one per learner rank on this machine
    workers: list[str]

    @property
    def learner(self) -> str:
        return self.learners[0]


def _parse(field: str, spec: str) -> list[str]:
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    if not devices:
        raise DeviceError(f"{field}: no device in {spec!r}")
    for d in devices:
        if d == "cpu":
            continue
        if not d.startswith("cuda"):
            raise DeviceError(f"{field}: {d!r} is neither 'cpu' nor 'cuda:N'")
        if not torch.cuda.is_available():
            raise DeviceError(f"{field}: {d} requested but CUDA is not available")
        index = d.partition(":")[2] or "0"
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise DeviceError(f"{field}: {d} does not exist here ({torch.cuda.device_count()} GPU(s) visible)")
    return devices


def resolve_devices(spec: str, num_workers: int, *, serial: bool = False, learner_spec: str | None = None) -> DeviceMap:
    if spec == "auto":
        n = torch.cuda.device_count()
        spec = ",".join(f"cuda:{i}" for i in range(n)) if n else "cpu"
    devices = _parse("devices", spec)
    if learner_spec is None:
        learners = devices[:1]
    elif learner_spec.isdigit():
        n = int(learner_spec)
        if n < 1 or (n > len(devices) and devices != ["cpu"]):
            raise DeviceError(f"learner_devices: {n} learner rank(s) asked for, --devices lists {len(devices)}")
        learners = devices[:n] if devices != ["cpu"] else ["cpu"] * n
    else:
        learners = _parse("learner_devices", learner_spec)
    if len(learners) > 1 and len(set(learners)) < len(learners) and learners[0] != "cpu":
        raise DeviceError(f"learner_devices: each learner rank needs its own device, got {learners}")
    left = [d for d in devices if d not in learners]
    pool = left or learners[:1]
    workers = [] if serial else [pool[i % len(pool)] for i in range(num_workers)]
    return DeviceMap(learners=learners, workers=workers)


def configure_threads(device: str, threads: int | None, num_processes: int) -> int:
    """Set this process's torch threads (CPU only) and flush denormals; returns the thread count."""
    torch.set_flush_denormal(True)  # tiny or random weights make denormals that slow CPU matmuls
    if not device.startswith("cpu"):
        return torch.get_num_threads()
    n = threads or max(1, (os.cpu_count() or 1) // max(num_processes, 1))
    torch.set_num_threads(n)
    return n


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on `device` (CUDA); a CPU's is already done. What a timer reads before it stops."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
