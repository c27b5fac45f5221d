"""The update's Linear weights held in bf16 (trainer/held_weights.py) against autocast's casts at every use:
the same logprobs (to the bit), gradients and optimizer step within bf16's tolerance, fp32, LoRA and wrapped
runs untouched, the masters back in place after the update."""

import pytest
import torch

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import LoraSpec
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.held_weights import held_weights
from nanorllm.trainer.logprobs import token_logprobs
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer, score
from test_train_step import build_results, config

BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-5}


def bf16_policy(hold: bool) -> HFCausalPolicy:
    policy = HFCausalPolicy.from_name("tiny-random", dtype="bfloat16")
    policy.hold_weights = hold
    return policy


def fixed_batch(policy) -> dict:
    samples = [s for r in build_results(HFCausalPolicy.from_name("tiny-random")) for s in r.step_samples]
    return collate_train_batch(samples, pad_id=policy.pad_id)


def logprobs_and_grads(policy, batch: dict, *, checkpointing: bool = False):
    if checkpointing:
        policy.enable_grad_checkpointing()
    policy.model.zero_grad(set_to_none=True)
    with held_weights(policy) as held:
        lp, _ = token_logprobs(score(policy, batch).logits, batch["targets"])
        (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
        if held is not None:
            held.collect()
    return lp.detach(), {n: p.grad for n, p in policy.model.named_parameters()}


def test_held_weights_give_autocasts_logprobs_and_gradients():
    today, held = bf16_policy(hold=False), bf16_policy(hold=True)
    batch = fixed_batch(today)
    lp, grads = logprobs_and_grads(today, batch)
    lp_held, grads_held = logprobs_and_grads(held, batch)
    assert held.held is not None and len(held.held.held) > 0
    assert torch.equal(lp_held, lp)  # the same weights rounded the same way, once instead of per forward
    assert grads.keys() == grads_held.keys()
    for name, g in grads.items():
        assert grads_held[name].dtype == torch.float32
        torch.testing.assert_close(grads_held[name], g, **BF16_TOL, msg=name)


def test_held_weights_under_grad_checkpointing_give_the_same_gradients():
    batch = fixed_batch(bf16_policy(hold=False))
    _, grads = logprobs_and_grads(bf16_policy(hold=False), batch)
    _, grads_held = logprobs_and_grads(bf16_policy(hold=True), batch, checkpointing=True)
    for name, g in grads.items():
        torch.testing.assert_close(grads_held[name], g, **BF16_TOL, msg=name)


def test_an_update_with_held_weights_steps_the_fp32_masters_as_autocast_did():
    """Two micro-batches, so the held gradients accumulate across backwards into the fp32 masters."""
    cfg = config(dtype="bfloat16", micro_batch_tokens=64)
    after = {}
    for hold in (False, True):
        policy = bf16_policy(hold)
        results = build_results(HFCausalPolicy.from_name("tiny-random"))
        m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
        assert m["perf/micro_batches"] >= 2
        after[hold] = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    for name, w in after[False].items():
        assert after[True][name].dtype == torch.float32
        torch.testing.assert_close(after[True][name], w, **BF16_TOL, msg=name)


def test_after_the_update_every_module_reads_its_fp32_master_again():
    policy = bf16_policy(hold=True)
    masters = {n: p for n, p in policy.model.named_parameters()}
    with held_weights(policy):
        held = dict(policy.model.named_parameters(remove_duplicate=False))
        assert held["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
        assert held["model.embed_tokens.weight"].dtype == torch.float32  # an embedding is not held
    assert {n: p for n, p in policy.model.named_parameters()} == masters
    assert all(p.dtype == torch.float32 for p in masters.values())
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight  # the tie is whole again


def test_fp32_lora_and_wrapped_policies_hold_nothing():
    """A DDP or FSDP wrapper's gradient hooks sit on the masters: a wrapped train_module keeps autocast's casts."""
    fp32 = HFCausalPolicy.from_name("tiny-random")
    lora = HFCausalPolicy.from_name("tiny-random", dtype="bfloat16", lora=LoraSpec(rank=4, alpha=8))
    wrapped = bf16_policy(hold=True)
    wrapped.train_module = torch.nn.ModuleList([wrapped.model])
    for policy in (fp32, lora, wrapped):
        with held_weights(policy) as held:
            assert held is None
        assert policy.held is None


def test_an_fp32_update_is_the_same_bits_whether_or_not_the_policy_may_hold():
    cfg = config()
    after = []
    for hold in (False, True):
        policy = HFCausalPolicy.from_name("tiny-random")
        policy.hold_weights = hold
        train_step(policy, make_optimizer(policy, cfg), build_results(HFCausalPolicy.from_name("tiny-random")), cfg)
        after.append([p.detach().clone() for p in policy.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*after))


@pytest.mark.slow
def test_a_held_update_casts_no_weight_in_its_forwards():
    """The quick benchmark's toy: 2 layers x 7 Linears + the tied head, each cast once per micro-batch's forward
    under autocast, never under the held update (which copies them once, before its first forward)."""
    from nanorllm.bench.casts import update_ops

    autocast, held = update_ops("bfloat16", False, 128), update_ops("bfloat16", True, 128)
    assert autocast["micro_batches"] == held["micro_batches"] > 1
    assert autocast["aten::_to_copy"] - held["aten::_to_copy"] == 15 * held["micro_batches"]
    assert autocast["aten::mm"] == held["aten::mm"]
