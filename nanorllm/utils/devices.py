"""Which device each process uses, and how many CPU threads it may take.

`--devices cuda:0,cuda:1,cuda:2,cuda:3`: the learner takes the first, workers share the rest
round-robin (with one device, learner and workers share it). `auto` is every visible GPU, else cpu.
On CPU every process gets cores / processes threads, so N workers + 1 learner do not oversubscribe.
"""

import os
from dataclasses import dataclass

import torch


@dataclass
class DeviceMap:
    learner: str
    workers: list[str]


def resolve_devices(spec: str, num_workers: int, *, serial: bool = False) -> DeviceMap:
    if spec == "auto":
        n = torch.cuda.device_count()
        spec = ",".join(f"cuda:{i}" for i in range(n)) if n else "cpu"
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    if not devices:
        raise ValueError(f"devices: no device in {spec!r}")
    for d in devices:
        if d.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"devices: {d} requested but CUDA is not available")
    pool = devices[1:] or devices[:1]
    workers = [] if serial else [pool[i % len(pool)] for i in range(num_workers)]
    return DeviceMap(learner=devices[0], workers=workers)


def configure_threads(device: str, threads: int | None, num_processes: int) -> int:
    """Set this process's torch threads (CPU only) and flush denormals; returns the thread count."""
    torch.set_flush_denormal(True)  # tiny or random weights make denormals that slow CPU matmuls
    if not device.startswith("cpu"):
        return torch.get_num_threads()
    n = threads or max(1, (os.cpu_count() or 1) // max(num_processes, 1))
    torch.set_num_threads(n)
    return n
