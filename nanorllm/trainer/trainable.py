"""The policy a learner trains, loaded the one way every training program and learner rank loads it."""

from typing import Protocol

from nanorllm.config.errors import cannot_load
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import LoraSpec


class ModelSettings(Protocol):
    """What the load reads of a program's config (TrainConfig and SFTConfig both have it)."""

    model: str
    dtype: str
    seed: int
    grad_checkpointing: bool


def load_trainable(cfg: ModelSettings, *, device: str, lora: LoraSpec | None = None,
                   resumed: str | None = None) -> HFCausalPolicy:
    """--model on `device` in cfg.dtype, seeded, with LoRA adapters per `lora` and gradient checkpointing per
    --grad-checkpointing. `resumed`: a checkpoint's model/ folder, which holds the whole model, or under LoRA the
    adapters alone (the frozen base is --model's). A model that does not load: ConfigError naming --model."""
    name = resumed if resumed and lora is None else cfg.model
    try:
        policy = HFCausalPolicy.from_name(name, device=device, dtype=cfg.dtype, seed=cfg.seed, lora=lora,
                                          adapter=resumed if lora is not None else None)
    except (OSError, ValueError) as e:
        raise cannot_load("model", resumed or cfg.model, e, "--model") from None
    if cfg.grad_checkpointing:
        policy.enable_grad_checkpointing()
    return policy
