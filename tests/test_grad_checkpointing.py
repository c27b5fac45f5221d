"""--grad-checkpointing: the learner's loss and gradients are those of the plain forward (fp32, 1e-6),
with the shared-prompt-prefix forward and with LoRA, and the decoder layers really are recomputed
in the backward (the learner's forward runs in eval mode, where transformers would not checkpoint)."""

import pytest
import torch

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import LoraSpec, trainable_parameters
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import compute_policy_loss
from helpers import loss_settings
from test_train_step import build_results


def loss_and_grads(policy: HFCausalPolicy, batch: dict) -> tuple[torch.Tensor, dict, int]:
    """(loss, gradient of every trained parameter, calls of layer 0's attention during forward + backward)."""
    calls = []
    attn = policy.model.get_decoder().layers[0].self_attn
    hook = attn.register_forward_hook(lambda *_: calls.append(1))
    policy.model.eval()  # --disable-dropout: the learner's forward in eval mode
    policy.model.zero_grad(set_to_none=True)
    try:
        logits = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"],
                                batch["shared_columns"]).logits
        loss, _ = compute_policy_loss(logits, batch, loss_settings())
        loss.backward()
    finally:
        hook.remove()
    return loss.detach(), {n: p.grad.clone() for n, p in trainable_parameters(policy.model)}, len(calls)


@pytest.mark.parametrize("lora", [None, LoraSpec(rank=4, alpha=8.0)], ids=["full", "lora"])
def test_loss_and_gradients_are_the_same_with_checkpointing(lora, tiny_policy):
    samples = [s for r in build_results(tiny_policy) for s in r.step_samples]
    for s in samples:
        s.advantage = 1.0 if len(s.response_ids) % 2 else -1.0
    batch = collate_train_batch(samples, pad_id=tiny_policy.pad_id)
    assert batch["shared_columns"] > 0  # the plain forward shares the prompt prefix
    plain = HFCausalPolicy.from_name("tiny-random", lora=lora)
    checkpointed = HFCausalPolicy.from_name("tiny-random", lora=lora)
    checkpointed.enable_grad_checkpointing()
    loss0, grads0, calls0 = loss_and_grads(plain, batch)
    loss1, grads1, calls1 = loss_and_grads(checkpointed, batch)
    assert (calls0, calls1) == (2, 2)  # plain: the prefix's forward and the rows'; checkpointed: the forward and its recompute
    assert not checkpointed.model.get_decoder().layers[0].training  # the layers are back in eval mode
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=1e-6)
    assert grads0.keys() == grads1.keys() and len(grads0) > 0
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-6, msg=name)
