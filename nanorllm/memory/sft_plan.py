"""A supervised run's memory plan (launch/sft.py): its one process, the learner, counted by plan.py's parts.

    learner   weights, grads and AdamW's two moments as RL's learner holds them (fp32 masters; under LoRA the
              frozen base in --dtype + fp32 adapters, only the adapters trained), the activations of its
              largest pass, its runtime (and a CUDA context on a GPU)

and nothing else: no workers, no shared weight block, no KV cache (SFT decodes nothing). The largest pass
holds the micro-batch's token budget (--micro-batch-tokens; unset, the CPU learner's 4096), packed or padded,
or one row of --max-tokens where that is longer (a row over the budget passes alone), every token scored by
the head: the rows are not read before the plan, so it counts `--sft-loss all`'s pass, an upper bound of an
assistant-only one, with no prompt prefix shared.
"""

from nanorllm.config.sft import SFTConfig
from nanorllm.config.specs import lora_spec
from nanorllm.memory.plan import (SHRINK_LEARNER, MemoryPlan, Part, Process, activation_bytes, budget_tokens,
                                  compute_bytes, model_config, parameter_counts, process_overheads, read_free,
                                  shm_free_bytes, trained_parts)


def plan_sft(cfg: SFTConfig, device: str, *, config=None, free: dict[str, int] | None = None) -> MemoryPlan | None:
    """The plan of the SFT run `cfg` with its learner on `device`; None where the model's config cannot be read
    without loading it. `free`: what the devices have free (read here by default)."""
    config = config if config is not None else model_config(cfg.model)
    if config is None:
        return None
    lora = lora_spec(cfg)
    total, trainable = parameter_counts(config, lora)
    compute = compute_bytes(cfg.dtype, device)
    tokens = max(budget_tokens(cfg.micro_batch_tokens), cfg.max_tokens or 0)
    acts = activation_bytes(config, tokens, scored=tokens, dtype_bytes=compute, checkpointing=cfg.grad_checkpointing,
                            lora=lora)
    learner = Process("learner", device, [*trained_parts(total, trainable, lora=lora is not None, dtype_bytes=compute),
                                          Part("activations", acts, f"{tokens} tokens, each scored"),
                                          *process_overheads(device)])
    host_source = "given"
    if free is None:
        free, host_source = read_free({"cpu", device})
    return MemoryPlan(processes=[learner], shm_bytes=0, shm_free=shm_free_bytes(), free=dict(free),
                      micro_batch_tokens=budget_tokens(cfg.micro_batch_tokens), shrink=SHRINK_LEARNER,
                      host_source=host_source)
