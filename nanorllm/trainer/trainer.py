"""One GRPO update, in the order of the design notes:

    results = collect_rollouts(engine, tasks, num_samples_per_task)
    groups  = group_by_task_id(results)
    groups  = compute_advantage(groups)
    samples = flatten_step_samples(groups)
    batch   = collate_train_batch(samples, pad_id=...)
    out     = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
    loss, _ = compute_policy_loss(out.logits, batch)
    loss.backward(); optimizer.step()

`train_step` is exactly that, with micro-batches so memory stays bounded (gradients accumulate
against the whole step's normaliser, so the update equals one big batch) and a guard that skips
the update when the loss or the gradient is not finite. The forward runs in eval mode unless
`disable_dropout` is off, so learner and sampler compute the same function; with
`mask_truncated`, episodes cut at max_new_tokens still count in their group's advantage but
contribute no gradient (DAPO's overlong filtering).

Each token's policy lag (policy.version - the version that sampled it) rides in the batch, so the
sampler-vs-learner mismatch is logged apart for lag 0 (numerics alone) and lag >= 1 (numerics plus
drift). An off-policy correction needs the learner's logprobs before the update (pi_prox): with one
step per batch and a deterministic forward that is the grad forward's own value, so no extra forward
runs; with dropout on, one no-grad forward in eval mode per micro-batch computes it.
"""

import math
import time

import torch

from nanorllm.algos.grpo import compute_advantage, flatten_step_samples, group_by_task_id, is_zero_std
from nanorllm.core.types import RolloutResult, StepSample
from nanorllm.ranks.group import ONE_RANK
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import compute_policy_loss, token_logprobs


def collect_rollouts(engine: RolloutEngine, tasks: list[dict], num_samples_per_task: int, *,
                     group_ids: list[str] | None = None, seed: int | None = None) -> list[RolloutResult]:
    """num_samples_per_task episodes for each task, all batched together by the engine."""
    return engine.run(tasks, num_samples=num_samples_per_task, group_ids=group_ids, seed=seed)


def micro_batches(samples: list[StepSample], max_tokens: int) -> list[list[StepSample]]:
    """Split into chunks of whole episodes whose padded size (rows x longest row) stays under
    max_tokens; an episode longer than max_tokens gets a chunk of its own."""
    episodes: list[list[StepSample]] = []
    for s in samples:
        if episodes and episodes[-1][0].episode_id == s.episode_id:
            episodes[-1].append(s)
        else:
            episodes.append([s])
    length = lambda ep: len(ep[-1].prompt_ids) + len(ep[-1].response_ids)  # noqa: E731
    episodes.sort(key=length)  # similar lengths together: less padding
    chunks, cur, longest = [], [], 0
    for ep in episodes:
        n = length(ep)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            chunks.append([s for e in cur for s in e])
            cur, longest = [], 0
        cur.append(ep)
        longest = max(longest, n)
    if cur:
        chunks.append([s for e in cur for s in e])
    return chunks


def make_optimizer(policy, cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def train_step(policy, optimizer: torch.optim.Optimizer, results: list[RolloutResult], cfg, *,
               ref_policy=None, ranks=None) -> dict:
    """group -> advantage -> flatten -> (collate -> forward -> loss -> backward) per micro-batch -> step.

    With learner `ranks` (ranks/group.py) `results` is this rank's share of the step (whole groups):
    the normaliser and every metric are the whole step's, over all ranks."""
    t0 = time.perf_counter()
    ranks = ranks or ONE_RANK
    groups = compute_advantage(group_by_task_id(results), normalize_std=cfg.adv_normalize_std, eps=cfg.adv_eps,
                               turn_credit=cfg.turn_credit, turn_gamma=cfg.turn_gamma)
    samples = flatten_step_samples(groups, drop_zero_std=cfg.drop_zero_std_groups)
    truncated = {s.episode_id for s in samples if s.truncated} if cfg.mask_truncated else set()
    samples = [s for s in samples if s.episode_id not in truncated]
    advs = [r.step_samples[0].advantage for rs in groups.values() for r in rs if r.step_samples]
    sums = {k: 0.0 for k in ("tokens", "clip_low", "clip_high", "approx_kl", "entropy", "kl", "is_weight_sum",
                             "is_truncated", "is_masked", "kl_same_weights", "tokens_same_weights", "kl_lagged",
                             "tokens_lagged", "loss", "padded_tokens", "skipped_nan")}
    is_weight_max = 0.0
    correct = cfg.off_policy_correction != "none"
    optimizer.zero_grad(set_to_none=True)
    # The whole step's counts, over every rank's share: N ranks normalise as one would.
    step = ranks.all_sum({"samples": len(samples), "tokens": sum(len(s.response_ids) for s in samples)})
    if step["samples"]:
        policy.train_module.train(not cfg.disable_dropout)
        normalizer = step["tokens"] if cfg.loss_agg == "token-mean" else step["samples"]
        chunks = micro_batches(samples, cfg.micro_batch_tokens)
        runs = ranks.micro_batch_count(len(chunks))  # with idle ones, so every rank runs the same collectives
        for i in range(runs):
            with ranks.accumulating(policy, last=i == runs - 1):
                if i >= len(chunks):
                    ranks.idle_backward(policy, proximal=correct and not cfg.disable_dropout)
                    continue
                chunk = chunks[i]
                batch = collate_train_batch(chunk, pad_id=policy.pad_id, device=policy.device)
                sums["padded_tokens"] += batch["input_ids"].numel()
                batch["lag"] = policy.version - batch["policy_version"]  # (N,)
                prox_lp = None
                if correct and not cfg.disable_dropout:  # the grad forward has dropout: pi_prox needs its own
                    prox_lp = proximal_logprobs(policy, batch, cfg.temperature)
                ref_lp = None
                if cfg.kl_coef > 0:
                    with torch.no_grad():
                        ref_out = ref_policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
                        ref_lp, _ = token_logprobs(ref_out.logits, batch["targets"], cfg.temperature)
                out = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
                loss, mm = compute_policy_loss(out.logits, batch, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                               temperature=cfg.temperature, loss_agg=cfg.loss_agg,
                                               kl_coef=cfg.kl_coef, ref_logprobs=ref_lp, normalizer=normalizer,
                                               correction=cfg.off_policy_correction, is_cap=cfg.is_cap,
                                               is_band=cfg.is_band, dual_clip=cfg.dual_clip, prox_logprobs=prox_lp)
                if not torch.isfinite(loss):
                    sums["skipped_nan"] = 1  # its gradient is no better: the update is skipped below, on every rank
                # DDP and FSDP average the ranks' gradients; the global normaliser already made them parts of one sum.
                (loss * ranks.world).backward()
                sums["loss"] += loss.item()
                for k in mm.keys() & sums.keys():
                    sums[k] += mm[k]
                is_weight_max = max(is_weight_max, mm["is_weight_max"])
    sums.update(zero_std=sum(is_zero_std(rs) for rs in groups.values()), groups=len(groups), adv_n=len(advs),
                adv_sum=sum(advs), adv_sq=sum(a * a for a in advs), masked_truncated=len(truncated))
    sums = ranks.all_sum(sums)
    m = {
        "frac_reward_zero_std": sums["zero_std"] / max(sums["groups"], 1),
        "advantage/mean": sums["adv_sum"] / max(sums["adv_n"], 1),
        "advantage/std": math.sqrt(max(sums["adv_sq"] / max(sums["adv_n"], 1)
                                       - (sums["adv_sum"] / max(sums["adv_n"], 1)) ** 2, 0.0)),
        "train/samples": int(step["samples"]),
        "train/skipped_nan": int(sums["skipped_nan"] > 0),
        "train/masked_truncated": int(sums["masked_truncated"]),  # episodes whose loss was masked
    }
    if step["samples"]:
        norm = torch.nn.utils.clip_grad_norm_(policy.train_module.parameters(), cfg.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: the global norm
        if m["train/skipped_nan"] or not math.isfinite(grad_norm):
            m["train/skipped_nan"] = 1  # a non-finite loss or gradient skips the update, counted
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.step()
            m.update(ranks.updated(policy))  # FSDP: the new weights gathered into rank 0's full model
            m["grad_norm"] = grad_norm
        optimizer.zero_grad(set_to_none=True)
    n = max(sums["tokens"], 1.0)
    m.update({
        "loss/policy": sums["loss"], "clip_ratio/low": sums["clip_low"] / n, "clip_ratio/high": sums["clip_high"] / n,
        "approx_kl": sums["approx_kl"] / n, "entropy": sums["entropy"] / n,
        "train/tokens": sums["tokens"], "train/padded_tokens": int(sums["padded_tokens"]),
        "lr": optimizer.param_groups[0]["lr"], "perf/train_s": time.perf_counter() - t0,
    })
    if cfg.kl_coef > 0:
        m["loss/kl"] = sums["kl"] / n
    for part in ("same_weights", "lagged"):  # k3 of sampler vs learner before the update, by policy lag
        if sums[f"tokens_{part}"]:
            m[f"mismatch/kl_{part}"] = sums[f"kl_{part}"] / sums[f"tokens_{part}"]
    if correct:
        m.update({"is_weight/mean": sums["is_weight_sum"] / n, "is_weight/max": ranks.all_max(is_weight_max),
                  "is_weight/truncated_frac": sums["is_truncated"] / n, "is_weight/masked_frac": sums["is_masked"] / n})
    return m


def proximal_logprobs(policy, batch: dict, temperature: float) -> torch.Tensor:
    """(N,) the learner's logprobs at its current weights, no grad, no dropout: one extra forward."""
    training = policy.train_module.training
    policy.train_module.eval()
    with torch.no_grad():
        out = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
        lp, _ = token_logprobs(out.logits, batch["targets"], temperature)
    policy.train_module.train(training)
    return lp
