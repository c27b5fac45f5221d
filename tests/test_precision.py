"""--dtype bfloat16: fp32 master weights and optimizer state, bf16 compute, bf16 replicas and broadcast."""

import pytest
import torch

from nanorllm.config import TrainConfig
from nanorllm.pipeline.weights import SharedWeights
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import compute_policy_loss
from nanorllm.trainer.precision import matmul_precision
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from helpers import loss_settings
from test_train_step import build_results


def changed_fraction(policy, results, cfg) -> float:
    before = [p.detach().clone() for p in policy.parameters()]
    train_step(policy, make_optimizer(policy, cfg), results, cfg)
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(policy.parameters(), before))
    return changed / sum(b.numel() for b in before)


def test_bf16_master_weights_keep_a_default_lr_step():
    """At the default lr (6e-6) AdamW's first step moves each weight by ~6e-6, below half a bf16 ulp of most
    weights: on bf16 parameters it rounds away, on fp32 masters it lands."""
    cfg = TrainConfig(model="tiny-random", temperature=1.0, micro_batch_tokens=128)
    assert cfg.lr == 6e-6
    fp32 = HFCausalPolicy.from_name("tiny-random")
    results = build_results(fp32)
    f32 = changed_fraction(fp32, results, cfg)
    bf16 = HFCausalPolicy.from_name("tiny-random", dtype="bfloat16")
    assert next(bf16.model.parameters()).dtype == torch.float32 and bf16.compute_dtype == torch.bfloat16
    mixed = changed_fraction(bf16, results, cfg)
    pure = changed_fraction(HFCausalPolicy.from_name("tiny-random", dtype="bfloat16", replica=True), results, cfg)
    assert f32 > 0.9 and mixed > 0.97 * f32
    assert pure < 0.5 * f32  # what training bf16 parameters directly did


def test_bf16_loss_follows_fp32_on_a_fixed_batch():
    fp32 = HFCausalPolicy.from_name("tiny-random")
    bf16 = HFCausalPolicy.from_name("tiny-random", dtype="bf16")
    results = build_results(fp32)
    samples = [s for r in results for s in r.step_samples]
    for i, s in enumerate(samples):
        s.advantage = (-1.0) ** i
    batch = collate_train_batch(samples, pad_id=fp32.pad_id)
    out = {}
    for name, policy in [("fp32", fp32), ("bf16", bf16)]:
        logits = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"]).logits
        loss, m = compute_policy_loss(logits, batch, loss_settings())
        out[name] = (loss.item(), m["approx_kl"] / m["tokens"])
    assert abs(out["bf16"][0] - out["fp32"][0]) < 1e-3  # measured 5e-5 on a loss of -0.077
    assert out["fp32"][1] < 1e-9 and out["bf16"][1] < 1e-3  # k3(sampler || learner) per token


def test_the_broadcast_moves_bf16_and_replicas_get_the_rounded_masters():
    learner = HFCausalPolicy.from_name("tiny-random", dtype="bfloat16")
    opt = make_optimizer(learner, TrainConfig(lr=1e-2))
    store = SharedWeights(learner.model, opt)
    numel = sum(p.numel() for p in learner.parameters())
    assert store.flat.dtype == torch.bfloat16 and store.nbytes == 2 * numel  # half of fp32
    assert not store.in_place  # fp32 masters are not the bf16 buffer: a publish is one cast-copy
    replica = HFCausalPolicy.from_name("tiny-random", dtype="bfloat16", replica=True)
    assert next(replica.model.parameters()).dtype == torch.bfloat16
    block = store.attach(replica.model)
    loss = sum(p.float().square().sum() for p in learner.parameters())
    loss.backward()
    opt.step()
    store.publish(version=1)
    assert store.load_into(block)[0] == 1
    for master, copy in zip(learner.parameters(), replica.parameters()):
        assert torch.equal(master.detach().to(torch.bfloat16), copy.detach())


def test_dtype_names():
    assert not TrainConfig(dtype="bf16").validate() and not TrainConfig(dtype="fp32").validate()
    assert any(p.startswith("dtype:") for p in TrainConfig(dtype="half").validate())


def tf32_as_cublas_sees_it() -> bool:
    """What a CUDA fp32 matmul asks (`allowTF32CuBLAS`); it raises when the legacy and per-backend settings
    disagree, which would fail every matmul of the update."""
    legacy = torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() in ("high", "medium", "highest")
    assert (torch.backends.cuda.matmul.fp32_precision == "tf32") == legacy
    return legacy


def test_tf32_is_the_updates_on_cuda_only_and_nothing_on_cpu():
    assert TrainConfig().tf32 and not tf32_as_cublas_sees_it()
    with matmul_precision("cpu", tf32=True):
        assert not tf32_as_cublas_sees_it()
    with matmul_precision("cuda:0", tf32=False):
        assert not tf32_as_cublas_sees_it()
    with pytest.raises(RuntimeError, match="the update failed"), matmul_precision("cuda:0", tf32=True):
        assert tf32_as_cublas_sees_it()
        raise RuntimeError("the update failed")
    assert not tf32_as_cublas_sees_it()  # restored: sampling in this process stays full fp32


def test_adamw_is_fused_only_where_every_parameter_is_on_cuda(tiny_policy):
    assert not make_optimizer(tiny_policy, TrainConfig()).param_groups[0]["fused"]
    if torch.cuda.is_available():
        gpu = HFCausalPolicy.from_name("tiny-random", device="cuda")
        assert make_optimizer(gpu, TrainConfig()).param_groups[0]["fused"]
