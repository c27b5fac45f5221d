"""Startup check: the learner scores a sample exactly as the sampler drew it.

The PPO ratio exp(learner logprob - sampler logprob) is only meaningful if both sides compute the
same distribution. They are different code paths (a KV-cached decode vs one forward over the
whole sequence), and a model family whose forward post-processes its logits (soft-capping,
scaling), a tokenizer/template mismatch or a precision problem can make them disagree silently: the
run would train on noise. So before training we sample one short response from the real model,
score it with the learner's path and stop with an error naming the model class if they differ.
"""

import time

import torch

from nanorllm.core.types import StepSample
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import token_logprobs

# (mean, max) |learner - sampler| logprob per token. fp32 paths agree to ~1e-5; in bf16 a cached
# decode and a full forward round differently (a bf16 logit near 20 has a 0.125 ulp): on the
# default model ~0.05 mean, ~0.3 max. A model whose head is not applied right is off by units.
TOLERANCE = {torch.float32: (1e-3, 1e-2), torch.bfloat16: (0.1, 1.5)}
PROBE = [{"role": "user", "content": "What is 3 + 4? Put the answer in \\boxed{}."}]


class LogitParityError(RuntimeError):
    pass


@torch.no_grad()
def logprob_gaps(policy, *, temperature: float = 1.0, max_new_tokens: int = 8, seed: int = 0,
                 scorer=None) -> tuple[float, float]:
    """(mean, max) |learner logprob - sampler logprob| over one sampled response to a fixed prompt.
    `scorer` is the learner-side policy when it is not the sampling one (a bf16 replica's sample)."""
    state = policy.generator.get_state()  # leave the run's sampling stream as it was
    policy.generator.manual_seed(seed)
    prompt = policy.first_prompt_ids(PROBE)
    gen = policy.generate([PROBE], [prompt], SamplingParams(max_new_tokens=max_new_tokens,
                                                            temperature=temperature))[0]
    policy.generator.set_state(state)
    sample = StepSample(task_id="parity", episode_id="parity", turn=0, prompt_ids=prompt,
                        response_ids=gen.response_ids, rollout_logprobs=gen.logprobs)
    scorer = scorer or policy
    batch = collate_train_batch([sample], pad_id=scorer.pad_id, device=scorer.device)
    was_training = scorer.model.training
    scorer.model.eval()
    logits = scorer.forward(batch["input_ids"], batch["attention_mask"], batch["positions"]).logits
    scorer.model.train(was_training)
    learner, _ = token_logprobs(logits, batch["targets"], temperature)
    gap = (learner - batch["old_logprobs"].to(learner.device)).abs()
    return float(gap.mean()), float(gap.max())


def check_logit_parity(policy, *, temperature: float = 1.0, tolerance: tuple[float, float] | None = None) -> dict:
    """Raise LogitParityError naming the model class if sampler and learner disagree; else
    {"gap_mean", "gap_max", "seconds"}."""
    t0 = time.perf_counter()
    dtype = policy.forward_dtype()
    tol_mean, tol_max = tolerance or TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16])
    mean, worst = logprob_gaps(policy, temperature=temperature)
    if not (mean <= tol_mean and worst <= tol_max):
        raise LogitParityError(
            f"{type(policy.model).__name__}: on a fresh sample the learner's token logprobs differ from the "
            f"sampler's by {mean:.4g} on average and {worst:.4g} at most (tolerance {tol_mean:g} / {tol_max:g}), "
            "so PPO ratios would not start at 1. Its forward must call its output embedding on the final "
            "hidden states and return the logits it samples from.")
    return {"gap_mean": mean, "gap_max": worst, "seconds": time.perf_counter() - t0}


def startup_parity_line(policy, *, temperature: float = 1.0) -> str:
    """Run the check (raises on a mismatch) and describe it in one console line."""
    r = check_logit_parity(policy, temperature=temperature)
    return (f"[parity] {type(policy.model).__name__}: sampler vs learner token logprobs differ by "
            f"{r['gap_mean']:.2g} mean, {r['gap_max']:.2g} max ({r['seconds']:.1f} s)")
