"""The update: a step's samples -> micro-batches -> (collate -> forward -> loss -> backward) each -> clip
-> optimizer step, or no step when the loss or the gradient is not finite.

Gradients accumulate against the whole step's normaliser (token or sample count over every learner
rank), so the update equals one big batch whatever the micro-batching. The forward runs in eval mode
unless `disable_dropout` is off, so learner and sampler compute the same function; each token's policy
lag (policy.version - the version that sampled it) rides in the batch, so the sampler-vs-learner
mismatch is logged apart for lag 0 (numerics alone) and lag >= 1 (numerics plus drift). An off-policy
correction needs the learner's logprobs before the update (pi_prox): with one step per batch and a
deterministic forward that is the grad forward's own value, so no extra forward runs; with dropout on,
one no-grad forward in eval mode per micro-batch computes it.

Nothing in the micro-batch loop asks the device for a number: the metrics add up as tensors
(trainer/step_metrics.py), what the forward needs as a host number comes with the batch (its
`shared_columns`, policy/shared_columns.py), the head's rows are gathered by indices computed on
the device (HFCausalPolicy.forward), and the skip decision reads the metrics with the gradient norm
in the step's one host synchronisation, after the backward passes. On CUDA the optimizer is the
fused AdamW (one kernel for all parameters) and fp32 matmuls run on TF32 tensor cores (`cfg.tf32`,
trainer/precision.py).
"""

import math

import torch

from nanorllm.core.types import StepSample
from nanorllm.policy.lora import trainable_parameters
from nanorllm.ranks.group import LearnerRanks
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import compute_policy_loss, token_logprobs
from nanorllm.trainer.micro_batches import micro_batches, step_max_pad_frac, step_micro_batch_tokens
from nanorllm.trainer.step_metrics import StepSums


def make_optimizer(policy, cfg) -> torch.optim.Optimizer:
    """AdamW over the fp32 master weights (under LoRA the adapters alone); fused (one kernel per step) when
    they all live on CUDA."""
    params = [p for _, p in trainable_parameters(policy.model)]
    fused = all(p.is_cuda and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)


def step_micro_batches(policy, samples: list[StepSample], cfg) -> list[list[StepSample]]:
    """The step's passes as the learner fields say: sized for the device, padded and bucketed, or packed."""
    return micro_batches(samples, step_micro_batch_tokens(policy, cfg.micro_batch_tokens),
                         max_pad_frac=step_max_pad_frac(policy, cfg.max_pad_frac), pack=cfg.packing)


def score(policy, batch: dict):
    """The policy's forward over a collated batch, padded or packed: (N, V) logits at its positions."""
    return policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"], batch["shared_columns"],
                          position_ids=batch.get("position_ids"))


def update(policy, optimizer: torch.optim.Optimizer, samples: list[StepSample], cfg, *, ranks: LearnerRanks,
           ref_policy=None, teacher=None, host: dict[str, float], prox: dict[int, torch.Tensor] | None = None,
           loss_fn=None) -> dict[str, float]:
    """Train on this rank's `samples` (whole episodes); returns the step's sums over all ranks (with
    `host`'s counts), the gradient norm and `skipped_nan`, as numbers. `prox`: pi_prox per sample
    (id -> (R,) logprobs, `batch_proximal_logprobs`) when several optimizer steps share a rollout batch.
    `loss_fn`: a micro-batch's loss as `micro_batch_loss` computes it (its arguments, its (loss, metrics));
    supervised fine-tuning passes its own (supervised/sft.py), RL the clipped objective. `teacher`: the distillation
    teacher (trainer/teacher.py), scoring each micro-batch beside the reference."""
    correct = cfg.off_policy_correction != "none"
    optimizer.zero_grad(set_to_none=True)
    # The whole step's counts, over every rank's share: N ranks normalise as one would.
    step = ranks.all_sum({"samples": len(samples), "tokens": sum(len(s.response_ids) for s in samples)})
    chunks = []
    if step["samples"]:
        chunks = step_micro_batches(policy, samples, cfg)
    sums = StepSums(policy.device, {**host, "samples": len(samples), "padded_tokens": 0, "real_tokens": 0})
    if step["samples"]:
        policy.train_module.train(not cfg.disable_dropout)
        normalizer = step["tokens"] if cfg.loss_agg == "token-mean" else step["samples"]
        if cfg.loss_agg == "seq-mean-token-sum-norm":  # Dr. GRPO: a constant per sample, not its length
            normalizer = step["samples"] * cfg.max_new_tokens
        runs = ranks.micro_batch_count(len(chunks))  # with idle ones, so every rank runs the same collectives
        for i in range(runs):
            with ranks.accumulating(policy, last=i == runs - 1):
                if i >= len(chunks):
                    ranks.idle_backward(policy, proximal=correct and not cfg.disable_dropout and prox is None)
                    continue
                batch = collate_train_batch(chunks[i], pad_id=policy.pad_id, device=policy.device, pack=cfg.packing)
                if prox is not None:
                    batch["prox_logprobs"] = torch.cat([prox[id(s)] for s in chunks[i]])  # token order = sample order
                sums.host["padded_tokens"] += batch["input_ids"].numel()
                sums.host["real_tokens"] += batch["num_tokens"]
                loss, metrics = (loss_fn or micro_batch_loss)(policy, batch, cfg, ref_policy=ref_policy,
                                                              teacher=teacher, normalizer=normalizer)
                # DDP and FSDP average the ranks' gradients; the global normaliser already made them parts of one sum.
                (loss * ranks.world).backward()
                sums.add(loss, metrics)
    norm = None
    if step["samples"]:
        norm = torch.nn.utils.clip_grad_norm_(policy.train_module.parameters(), cfg.max_grad_norm)
    n = sums.numbers(ranks, norm)  # the one host synchronisation of the step
    n["skipped_nan"] = float(n["nonfinite"] > 0 or not math.isfinite(n.get("grad_norm", 0.0)))
    if step["samples"]:
        if n["skipped_nan"]:
            optimizer.zero_grad(set_to_none=True)  # a non-finite loss or gradient skips the update, on every rank
        else:
            optimizer.step()
            n.update(ranks.updated(policy))  # FSDP: the new weights gathered into rank 0's full model
        optimizer.zero_grad(set_to_none=True)
    n["micro_batches"] = len(chunks)
    return n


def micro_batch_loss(policy, batch: dict, cfg, *, ref_policy=None, teacher=None,
                     normalizer: float) -> tuple[torch.Tensor, dict]:
    """One micro-batch's forward(s) and loss, with its metrics as tensors."""
    batch["lag"] = policy.version - batch["policy_version"]  # (N,)
    prox_lp = batch.get("prox_logprobs")  # several steps on one batch: the batch's first policy, computed before
    if prox_lp is None and cfg.off_policy_correction != "none" and not cfg.disable_dropout:  # dropout: pi_prox apart
        prox_lp = proximal_logprobs(policy, batch, cfg.temperature)
    ref_lp = None
    if cfg.kl_coef > 0:
        with torch.no_grad():
            ref_out = score(ref_policy, batch)
            ref_lp, _ = token_logprobs(ref_out.logits, batch["targets"], cfg.temperature)
    teacher_logp = teacher.logprobs(batch) if teacher is not None else None  # (N, V)
    out = score(policy, batch)
    return compute_policy_loss(out.logits, batch, cfg, temperature=cfg.temperature, ref_logprobs=ref_lp,
                               normalizer=normalizer, prox_logprobs=prox_lp, norm_tokens=cfg.max_new_tokens,
                               teacher_logprobs=teacher_logp, distill=cfg)


def batch_proximal_logprobs(policy, samples: list[StepSample], cfg, *, ranks: LearnerRanks) -> dict[int, torch.Tensor]:
    """pi_prox for every sample at the current weights (the rollout batch's first policy), one no-grad forward
    per micro-batch: id(sample) -> (R,) logprobs. Needed by a correction when several optimizer steps train on
    one batch, since after the first step the grad forward's own value no longer is the batch's policy. Every
    rank runs as many forwards (an idle one where it has fewer), as DDP and FSDP forwards are collectives."""
    out: dict[int, torch.Tensor] = {}
    chunks = step_micro_batches(policy, samples, cfg) if samples else []
    for i in range(ranks.micro_batch_count(len(chunks))):
        if i >= len(chunks):
            ids = torch.full((1, 2), policy.pad_id, dtype=torch.long, device=policy.device)
            with torch.no_grad():
                policy.forward(ids, torch.ones_like(ids), torch.zeros((1, 2), dtype=torch.long, device=policy.device), 0)
            continue
        batch = collate_train_batch(chunks[i], pad_id=policy.pad_id, device=policy.device, pack=cfg.packing)
        lp = proximal_logprobs(policy, batch, cfg.temperature)
        for s, part in zip(chunks[i], lp.split([len(s.response_ids) for s in chunks[i]])):
            out[id(s)] = part
    return out


def proximal_logprobs(policy, batch: dict, temperature: float) -> torch.Tensor:
    """(N,) the learner's logprobs at its current weights, no grad, no dropout: one extra forward."""
    training = policy.train_module.training
    policy.train_module.eval()
    with torch.no_grad():
        out = score(policy, batch)
        lp, _ = token_logprobs(out.logits, batch["targets"], temperature)
    policy.train_module.train(training)
    return lp
