"""Building the training RolloutEngine from a TrainConfig.

It lives beside the engine so that everything that samples (the serial loop, a pipeline worker,
the benchmarks, evaluation) reaches down to one place instead of up into the training loop.
"""

from nanorllm.agents.math_agent import DEFAULT_EXAMPLE, DEFAULT_SYSTEM_PROMPT
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine


def sampling_params(cfg) -> SamplingParams:
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)


def agent_kwargs(cfg) -> dict:
    return {"system_prompt": cfg.system_prompt if cfg.system_prompt is not None else DEFAULT_SYSTEM_PROMPT,
            "example": DEFAULT_EXAMPLE if cfg.worked_example else None}


def training_engine(policy, cfg) -> RolloutEngine:
    """The sampling engine every training rollout uses, serial or in a worker."""
    return RolloutEngine(policy, sampling=sampling_params(cfg), max_turns=cfg.max_turns,
                         max_batch_episodes=cfg.max_batch_episodes, agent_kwargs=agent_kwargs(cfg),
                         grader_timeout_s=cfg.grader_timeout_s)
