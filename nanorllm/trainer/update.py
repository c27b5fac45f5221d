"""The update: a step's samples -> micro-batches -> (collate -> forward -> loss -> backward) each -> clip
-> optimizer step, or no step when the loss or the gradient is not finite.

The micro-batch's loss is the update's argument (trainer/loss.py): RL's clipped objective (`PolicyLoss`, which reads
the loss, episode and distillation fields) or supervised fine-tuning's cross-entropy (`SFTLoss`); the update itself
reads only the learner, optimizer and forward fields, so SFT's config holds no RL field. Gradients accumulate
against the whole step's normaliser (the loss's, from the token and sample counts over every learner
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

from nanorllm.config.fields import AdamWSettings, AllOf, Learner, LearnerForward
from nanorllm.core.types import StepSample
from nanorllm.policy.slot_cache import trim_host_heap
from nanorllm.policy.lora import trainable_parameters
from nanorllm.ranks.group import LearnerRanks
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.held_weights import held_weights
from nanorllm.trainer.logprobs import token_logprobs
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


def update(policy, optimizer: torch.optim.Optimizer, samples: list[StepSample],
           cfg: AllOf[Learner, AdamWSettings, LearnerForward], *, ranks: LearnerRanks, loss,
           host: dict[str, float]) -> dict[str, float]:
    """Train on this rank's `samples` (whole episodes) with `loss` (trainer/loss.py): RL's `PolicyLoss`, or
    supervised fine-tuning's `SFTLoss`, each a micro-batch's (loss, metrics) from (policy, batch, its samples, the
    step's normaliser), with `normalizer(step counts)` and `proximal` (whether it runs a no-grad forward first).
    Returns the step's sums over all ranks (with `host`'s counts), the gradient norm and `skipped_nan`, as numbers."""
    optimizer.zero_grad(set_to_none=True)
    # The whole step's counts, over every rank's share: N ranks normalise as one would.
    step = ranks.all_sum({"samples": len(samples), "tokens": sum(len(s.response_ids) for s in samples)})
    chunks = []
    if step["samples"]:
        chunks = step_micro_batches(policy, samples, cfg)
    sums = StepSums(policy.device, {**host, "samples": len(samples), "padded_tokens": 0, "real_tokens": 0})
    if step["samples"]:
        policy.train_module.train(not cfg.disable_dropout)
        normalizer = loss.normalizer(step)
        with held_weights(policy) as held:  # bf16 copies of the Linear weights, cast once for the whole update
            for chunk in ranks.passes(policy, chunks, proximal=loss.proximal):  # + idle ones: the same collectives
                batch = collate_train_batch(chunk, pad_id=policy.pad_id, device=policy.device, pack=cfg.packing)
                sums.host["padded_tokens"] += batch["input_ids"].numel()
                sums.host["real_tokens"] += batch["num_tokens"]
                value, metrics = loss(policy, batch, chunk, normalizer)
                ranks.backward(value)
                if held is not None:
                    held.collect()  # into the fp32 masters' gradients
                sums.add(value, metrics)
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
    trim_host_heap(policy.device)  # what the passes freed, back to the system before the next update's sizes
    return n


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
