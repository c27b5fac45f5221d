"""The memory plan's activation constants against what a layer's forward really saves for the backward.

Measured, not assumed: the learner's own forward (HFCausalPolicy.forward over padded rows, its held bf16 weights,
its LoRA adapters, its checkpointing) runs once with one decoder layer and once with two, under saved-tensor
hooks that record every tensor autograd keeps (each storage once, the weights and their held copies left out);
the difference, per token, is one layer's share, which the plan's `activation_bytes` must give within 10% for
every way the learner computes, on SmolLM2's widths and on Qwen2.5's (another family, other ratios).
"""

import pytest
import torch

from nanorllm.memory.plan import activation_bytes
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import LoraSpec, add_adapters
from nanorllm.policy.presets import PRESETS, preset_tokenizer
from nanorllm.trainer.held_weights import held_weights

VOCAB, ROWS, WIDTH = 512, 2, 96
WAYS = {  # name: (weights stored in, autocast to, LoRA targets or None, --grad-checkpointing)
    "fp32": (torch.float32, None, None, False),
    "bf16 autocast, held weights": (torch.float32, torch.bfloat16, None, False),
    "LoRA on a bf16 base": (torch.bfloat16, torch.bfloat16, "attn-mlp", False),
    "LoRA on a bf16 base, q and v only": (torch.bfloat16, torch.bfloat16, "q_proj,v_proj", False),
    "LoRA in fp32": (torch.float32, None, "attn-mlp", False),
    "fp32, checkpointed": (torch.float32, None, None, True),
    "bf16 autocast, checkpointed": (torch.float32, torch.bfloat16, None, True),
    "LoRA on a bf16 base, checkpointed": (torch.bfloat16, torch.bfloat16, "attn-mlp", True),
}


def config_of(preset: str, layers: int):
    cls, config_cls, shape = PRESETS[preset]
    return cls, config_cls(**{**shape, "num_hidden_layers": layers, "vocab_size": VOCAB})


def spec_of(targets: str | None) -> LoraSpec | None:
    return None if targets is None else LoraSpec(rank=16, alpha=32.0, targets=targets)


def saved_bytes(preset: str, layers: int, way: str) -> int:
    """Bytes autograd keeps from one training forward of ROWS x WIDTH tokens (one row left-padded by a third)."""
    stored, compute, targets, checkpointing = WAYS[way]
    torch.manual_seed(0)
    cls, config = config_of(preset, layers)
    model = cls(config).to(stored)
    policy = HFCausalPolicy(model, preset_tokenizer(VOCAB), compute_dtype=compute)
    if targets is not None:
        policy.peft = add_adapters(model, spec_of(targets), base_name=preset)
    if checkpointing:
        policy.enable_grad_checkpointing()
    model.eval()
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH))
    mask = torch.ones(ROWS, WIDTH, dtype=torch.long)
    mask[0, :WIDTH // 3] = 0
    positions = torch.stack(torch.where(mask.bool()), 1)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with held_weights(policy) as held:
        if held is not None:
            weights |= {h.copy.untyped_storage().data_ptr() for h in held.held}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = policy.forward(ids, mask, positions, shared=0).logits
    assert logits.requires_grad  # a training forward: what it kept is what its backward reads
    return sum(kept.values())


@pytest.mark.parametrize("preset", ["smollm2-135m", pytest.param("qwen2.5-0.5b", marks=pytest.mark.slow)])
@pytest.mark.parametrize("way", list(WAYS))
def test_the_plan_counts_what_a_layer_saves_for_the_backward(preset, way):
    torch.set_num_threads(1)
    tokens = ROWS * WIDTH
    measured = (saved_bytes(preset, 2, way) - saved_bytes(preset, 1, way)) / tokens
    stored, compute, targets, checkpointing = WAYS[way]
    dtype_bytes = 2 if compute is not None else 4

    def planned(layers: int) -> int:
        return activation_bytes(config_of(preset, layers)[1], tokens, scored=tokens, dtype_bytes=dtype_bytes,
                                checkpointing=checkpointing, lora=spec_of(targets))

    planned_layer = (planned(2) - planned(1)) / tokens
    assert measured > 0
    assert abs(planned_layer / measured - 1) < 0.10, (way, preset, planned_layer, measured)
