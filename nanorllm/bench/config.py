"""The speed benchmark's settings and the training config its runs share."""

from dataclasses import dataclass, replace

import torch

from nanorllm.config import TrainConfig


@dataclass
class BenchConfig:
    quick: bool = False
    """tiny-random everywhere and few steps (minutes on a 2-core CPU)."""
    model: str = "smollm2-135m-instruct"
    """Model for the full run (ignored with --quick)."""
    steps: int = 5
    """Learner updates per timed run (the first is warm-up and not timed)."""
    json: str | None = None
    """Also write the figures here."""
    devices: str = "auto"
    """Devices for the pipeline runs (see launch/train.py --devices)."""


def train_config(b: BenchConfig, **kw) -> TrainConfig:
    model = "tiny-random" if b.quick else b.model
    # Keep zero-variance groups: speed figures must not depend on how many rewards happen to differ.
    base = TrainConfig(model=model, max_steps=b.steps, tasks_per_step=4, num_samples_per_task=4,
                       max_new_tokens=32 if not b.quick else 48, devices=b.devices, seed=0,
                       drop_zero_std_groups=False)
    return replace(base, **kw)


def on_cpu(b: BenchConfig) -> bool:
    return b.devices == "cpu" or (b.devices == "auto" and not torch.cuda.is_available())
