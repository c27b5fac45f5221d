"""The training RolloutEngine of a config: what the serial loop, a pipeline worker and the benchmarks sample
with. The engine below takes only its specs (sampling, the env bundle, a row limit); reading them off the
config is this floor's job."""

from nanorllm.config.specs import run_bundle, sampling_params
from nanorllm.envs.base import EnvBundle
from nanorllm.rollout.engine import RolloutEngine


def training_engine(policy, cfg, env: EnvBundle | None = None) -> RolloutEngine:
    """The sampling engine every training rollout uses, serial or in a worker, on `env` (the run's bundle,
    built once by the assembly) or, without one, the bundle the config names. A game's model --opponent is loaded
    here, frozen, on the policy's device: each process that rolls out holds one."""
    env = run_bundle(cfg, env)
    return RolloutEngine(policy, sampling=sampling_params(cfg), env=env, max_batch_episodes=cfg.max_batch_episodes,
                         opponent_policy=opponent_model(policy, cfg, env))


def opponent_model(policy, cfg, env: EnvBundle):
    """The frozen model `--opponent` names, for a game (None: self, random, or a one-player env)."""
    from nanorllm.rollout.games import OPPONENTS

    if getattr(env, "seats", 1) == 1 or cfg.opponent in OPPONENTS:
        return None
    from nanorllm.policy.chat_endpoint import ChatEndpointPolicy, is_endpoint
    from nanorllm.policy.hf_causal import HFCausalPolicy

    if is_endpoint(cfg.opponent):
        return ChatEndpointPolicy(cfg.opponent)

    model = HFCausalPolicy.from_name(cfg.opponent, device=str(policy.device), dtype=cfg.dtype, replica=True,
                                     seed=cfg.seed)
    model.model.requires_grad_(False)
    model.graphs_enabled = cfg.cuda_graphs  # as the policy's (its graphs are captured on first use)
    return model
