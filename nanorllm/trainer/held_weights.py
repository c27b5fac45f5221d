"""The update's Linear weights held in the compute dtype: cast once per update, not at every use.

Under bf16 autocast over fp32 masters, every matmul casts its fp32 weight to bf16 in the forward (cached
within one forward only) and casts its bf16 gradient back to fp32 in the backward: a copy of every weight
per forward (each micro-batch, each pi_prox forward) and per backward, which on an H200 cost more GPU time
than the matmuls themselves. Here each Linear's weight and bias is copied once per update into a preallocated
buffer of the compute dtype (nano-vllm and gpt-fast keep one dtype throughout; this keeps the fp32 masters for
AdamW), the Linear reads that buffer as its parameter for the whole update, and after each backward the buffer's
gradient is added into the master's fp32 `.grad` (a mixed-dtype add: no separate copy), then dropped.

Only Linear weights are held: an embedding, a norm's weight and a head tied to the embedding stay fp32 masters
as before (the tied head gets its own held copy, its gradient added to the embedding's), so the forward computes
the same bits as autocast did (it rounded the same fp32 weights the same way) and the residual stream stays
fp32. Held only where that is all there is to it: no LoRA (peft's adapters, a frozen bf16 base) and no DDP /
FSDP wrapper (their gradient hooks sit on the masters); those runs keep autocast's own casts.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class Held:
    """One held parameter: `module`'s `name` is `copy` (compute dtype, a leaf of its own) during the update."""

    module: torch.nn.Module
    name: str
    master: torch.nn.Parameter
    copy: torch.nn.Parameter


class HeldWeights:
    """The held copies of one policy's Linear weights, built once and refilled at each update."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.held = [Held(module, name, p, torch.nn.Parameter(torch.empty_like(p, dtype=dtype)))
                     for module in model.modules() if isinstance(module, torch.nn.Linear)
                     for name, p in module.named_parameters(recurse=False)
                     if p.requires_grad and p.is_floating_point() and p.dtype != dtype]

    @contextlib.contextmanager
    def holding(self) -> Iterator["HeldWeights"]:
        """The masters copied into the held buffers once, and the Linears reading those until the block ends."""
        with torch.no_grad():
            for h in self.held:
                h.copy.copy_(h.master)
        for h in self.held:
            h.module._parameters[h.name] = h.copy
        try:
            yield self
        finally:
            for h in self.held:
                h.module._parameters[h.name] = h.master
                h.copy.grad = None

    @torch.no_grad()
    def collect(self) -> None:
        """After a backward: each held gradient added into its master's fp32 `.grad` (accumulated there across
        micro-batches, as autocast's cast-back did), and dropped."""
        for h in self.held:
            if h.copy.grad is None:
                continue
            if h.master.grad is None:
                h.master.grad = torch.zeros_like(h.master)
            h.master.grad.add_(h.copy.grad)
            h.copy.grad = None


def holds(policy) -> bool:
    """Whether `policy`'s update may hold its weights: autocast over fp32 masters, no LoRA, no DDP/FSDP wrapper."""
    return (policy.compute_dtype is not None and policy.hold_weights and policy.peft is None
            and policy.train_module is policy.model)


@contextlib.contextmanager
def held_weights(policy) -> Iterator[HeldWeights | None]:
    """The update's block with `policy`'s Linear weights held in its compute dtype (None where it does not hold:
    `holds`); the buffers are made at the first update and kept on the policy."""
    if not holds(policy):
        yield None
        return
    if policy.held is None:
        policy.held = HeldWeights(policy.model, policy.compute_dtype)
    with policy.held.holding() as held:
        yield held
