"""RunParts: what a run is made of before any model loads, built once by its assembly (nanorllm/run/assembly.py)
and handed to the memory plan, `TrainingRun.setup` and the workers' start message, so no consumer builds
the env, loads the tasks or resolves the devices again."""

from dataclasses import dataclass, field

from nanorllm.config import TrainConfig
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.registry import EnvSpec
from nanorllm.policy.lora import LoraSpec
from nanorllm.utils.devices import DeviceMap


@dataclass
class RunParts:
    cfg: TrainConfig  # its task specs resolved to what was loaded (config.json records them)
    env_spec: EnvSpec  # what the workers build their bundle from
    env: EnvBundle  # this process's bundle: the held-out eval and the serial loop's episodes
    lora: LoraSpec | None  # None: a full fine-tune
    devices: DeviceMap
    train_tasks: list[dict]
    eval_tasks: list[dict]  # held out: removed from training
    eval_sets: dict[str, list[dict]] = field(default_factory=dict)  # --eval-set name=spec: evaluated only
    dropped_heldout: int = 0  # training tasks left out because they are held out
    task_order: dict | None = None  # the fingerprint checkpoints carry (trainer/fingerprint.py)
    precision: str = ""  # how cfg.dtype was chosen (utils/precision.py): printed, and kept in config.json
