"""Building the training RolloutEngine from a TrainConfig.

It lives beside the engine so that everything that samples (the serial loop, a pipeline worker,
the benchmarks, evaluation) reaches down to one place instead of up into the training loop. The
env comes from `cfg.env` (a spec string: a spawned worker imports it again from the string).
"""

from nanorllm.envs.registry import env_from_config
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import RolloutEngine


def sampling_params(cfg) -> SamplingParams:
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)


def training_engine(policy, cfg) -> RolloutEngine:
    """The sampling engine every training rollout uses, serial or in a worker."""
    return RolloutEngine(policy, sampling=sampling_params(cfg), env=env_from_config(cfg),
                         max_batch_episodes=cfg.max_batch_episodes)
